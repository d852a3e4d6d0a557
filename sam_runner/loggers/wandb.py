"""logger=wandb: mirror a run's metrics.jsonl and summary.json to Weights & Biases.

One W&B run per job. In a Hydra multirun the runs of a sweep share a W&B *group* (the
sweep folder's name) and each run's *job type* is its variant (``optimizer.name``), so
the W&B UI can compare variants within a sweep. The resolved config is the run config.

Choices of ours, and why:
- W&B step = the row's optimizer ``step``, and ``epoch`` is declared the x-axis of every
  chart (``define_metric("*", step_metric="epoch")``). A natural choice is "epoch as step",
  but W&B merges everything logged at one step into one row, so with step=epoch a
  mid-epoch curvature measurement (``metrics.hessian.every_n_steps``) would be
  overwritten by the epoch-end one. The optimizer step is monotonic and distinct per
  measurement, and the charts still plot against epochs.
- ``step`` itself is not logged as a metric (it is W&B's own ``_step``).
- Online mode without credentials (no ``WANDB_API_KEY``/``WANDB_IDENTITY_TOKEN_FILE``,
  no ~/.netrc entry for the W&B host) falls back to offline with a one-line notice, so
  a job never waits on a login prompt. So does an online ``wandb.init`` that fails
  (network, bad key): W&B is a mirror, it never costs a run.
- W&B's files go in ``<run folder>/wandb/``; console capture is off (metrics.jsonl and
  summary.json hold what W&B shows, and a redirected stderr would hide the terminal from the
  progress bar).
- ``finish`` is idempotent; exit code 0 for ``completed``, 1 otherwise (diverged and
  failed runs show as failed in W&B; ``summary.status`` says which).
"""

from __future__ import annotations

import math
import netrc
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from ..errors import one_line, require
from ..registry import LOGGERS

if TYPE_CHECKING:
    from omegaconf import DictConfig

MODES = ("online", "offline", "disabled")


def has_credentials() -> bool:
    """Whether W&B could log in without asking: an API key in the environment or ~/.netrc."""
    if os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    host = (
        urlsplit(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname
        or "api.wandb.ai"
    )
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        return netrc.netrc(path).authenticators(host) is not None
    except (OSError, netrc.NetrcParseError):
        return False


def sweep_group() -> str | None:
    """The sweep folder's name in a Hydra multirun; None outside one (or outside Hydra).

    Hydra's default sweep folder is ``multirun/<date>/<time>``: its bare name (a time of
    day) would merge sweeps of different days, so the date is kept in front of it.
    """
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
    except (ImportError, ValueError):  # ValueError: Hydra is not running this job
        return None
    if hc.mode != RunMode.MULTIRUN:
        return None
    path = Path(str(hc.sweep.dir))
    if re.fullmatch(r"\d\d-\d\d-\d\d", path.name) and re.fullmatch(
        r"\d{4}-\d\d-\d\d", path.parent.name
    ):
        return f"{path.parent.name}_{path.name}"
    return path.name


def _job_name() -> str | None:
    try:
        from hydra.core.hydra_config import HydraConfig

        return str(HydraConfig.get().job.override_dirname) or None
    except (ImportError, ValueError):
        return None


def _config_dict(full_cfg) -> dict:
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(full_cfg, resolve=True)
    except Exception:  # an unresolvable interpolation must not cost the run its logging
        return OmegaConf.to_container(full_cfg, resolve=False)


def _loggable(v) -> bool:
    return isinstance(v, (int, float, str, bool, list, dict)) and not (
        isinstance(v, float) and math.isnan(v)
    )


class WandbLogger:
    def __init__(self, cfg: DictConfig, run_dir: Path | str, full_cfg: DictConfig) -> None:
        self.mode = str(cfg.get("mode", "online"))
        require(
            self.mode in MODES,
            f"logger.mode={self.mode!r} is unknown; choose one of {', '.join(MODES)}",
        )
        tags = cfg.get("tags") or []
        require(
            not isinstance(tags, str),
            f"logger.tags={tags!r} must be a list, e.g. logger.tags=[a,b]",
        )
        self.cfg, self.run_dir, self.full_cfg, self.tags = (
            cfg,
            Path(run_dir).resolve(),
            full_cfg,
            tags,
        )
        self.run_id, self.run, self._finished = None, None, False

    def state_dict(self) -> dict:
        """The W&B run id, for a checkpoint (a resumed job continues its run)."""
        return {"run_id": self.run_id}

    def load_state_dict(self, state: dict) -> None:
        """Take the W&B run id a resumed job continues."""
        self.run_id = state.get("run_id")  # a resumed job continues its W&B run

    def start(self) -> None:
        """Start (or resume) the W&B run, in the configured mode and project."""
        import wandb

        cfg, mode = self.cfg, self.mode
        # W&B's own files (and wandb-core's logs) stay in the run
        os.environ["WANDB_DIR"] = str(self.run_dir)
        os.environ["WANDB_SILENT"] = "true"
        if mode == "online" and not has_credentials():
            print(
                "sam-run: W&B has no credentials here (set WANDB_API_KEY or run `wandb login`); "
                "logging offline, sync later with `wandb sync`",
                file=sys.stderr,
            )
            mode = "offline"
        group = cfg.get("group") or sweep_group()
        kwargs = dict(
            project=cfg.get("project") or "sam-runner",
            entity=cfg.get("entity") or None,
            group=group,
            job_type=str(self.full_cfg.optimizer.name),
            tags=[str(t) for t in self.tags],
            name=_job_name(),
            config=_config_dict(self.full_cfg),
            dir=str(self.run_dir),
            id=self.run_id,
            resume="allow" if self.run_id else None,
        )
        settings = wandb.Settings(silent=True, console="off")
        try:
            self.run = wandb.init(mode=mode, settings=settings, **kwargs)
        except Exception as e:
            if mode != "online":
                raise
            print(
                f"sam-run: W&B online init failed ({one_line(e)}); logging offline, sync later "
                "with `wandb sync`",
                file=sys.stderr,
            )
            self.run = wandb.init(mode="offline", settings=settings, **kwargs)
        self.run_id = None if mode == "disabled" else self.run.id
        self.run.define_metric("epoch")
        self.run.define_metric("*", step_metric="epoch")

    def log(self, row: dict) -> None:
        """A metrics row, at its step (values W&B cannot show left out)."""
        step = int(row.get("step", 0))
        self.run.log({k: v for k, v in row.items() if k != "step" and _loggable(v)}, step=step)

    def summary(self, summary: dict) -> None:
        """The run's final values into the W&B run's summary."""
        # curvature, calibration, status and error: the final values, not the last logged ones
        if self.run is not None:
            self.run.summary.update({k: v for k, v in summary.items() if _loggable(v)})

    def finish(self, status: str) -> None:
        """Finish the W&B run once, with the run's status (nothing if it never started)."""
        # never started: a run that failed before its first line
        if self._finished or self.run is None:
            return
        self._finished = True
        self.run.summary["status"] = status
        if status in ("interrupted", "preempted"):  # resumable: W&B shows it preempted, not failed
            self.run.mark_preempting()
        self.run.finish(exit_code=0 if status == "completed" else 1)


@LOGGERS.register(
    "wandb",
    "Weights & Biases: one run per job, grouped by sweep (logger.mode=offline works offline)",
)
def build(cfg: DictConfig, run_dir: Path | str, full_cfg: DictConfig) -> WandbLogger:
    """The ``wandb`` logger."""
    return WandbLogger(cfg, run_dir, full_cfg)
