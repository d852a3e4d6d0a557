"""``sam-run``: the Hydra entry point around ``train(cfg)``."""
from __future__ import annotations

import hashlib
import os
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from .errors import UserError
from .paths import config_dir


def run_name(override_dirname: str) -> str:
    """The run folder name for a set of overrides: readable, filesystem-safe, bounded."""
    if not override_dirname:
        return "default"
    name = override_dirname.replace("/", "_")
    if len(name) > 120:
        name = name[:100] + "-" + hashlib.sha1(name.encode()).hexdigest()[:10]
    return name


def register_resolvers() -> None:
    if not OmegaConf.has_resolver("run_name"):
        OmegaConf.register_new_resolver("run_name", run_name)


def run_job(cfg: DictConfig):
    """The task Hydra runs for each job: train, turning user errors into one line."""
    from .train import train
    hc = HydraConfig.get()
    run_dir, overrides = hc.runtime.output_dir, list(hc.overrides.task)
    try:
        return train(cfg, run_dir, overrides)
    except UserError as e:
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        print(f"sam-run: error: {e}", file=sys.stderr)
        sys.exit(2)


register_resolvers()


@hydra.main(version_base="1.3", config_path=config_dir(), config_name="config")
def _main(cfg: DictConfig):
    return run_job(cfg)


def main() -> None:
    _main()


if __name__ == "__main__":
    main()
