"""An analysis command's config (conf/eval.yaml, conf/landscape.yaml) composed with its
overrides by Hydra's own compose, with one-line errors naming the key as the user typed it; and
whether its ``hydra/launcher`` is a job array."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import UserError, first_line

if TYPE_CHECKING:
    from omegaconf import DictConfig


def array_launcher(cfg: DictConfig) -> tuple[str, dict] | None:
    """(submitit cluster, ``hydra.launcher`` as plain data) when ``hydra/launcher`` of a composed
    config is a job array (slurm, submitit_local); None for this machine's basic launcher."""
    from omegaconf import OmegaConf

    from .jobarray import cluster_of

    cluster = cluster_of(OmegaConf.select(cfg, "hydra.launcher._target_"))
    if cluster is None:
        return None
    return cluster, OmegaConf.to_container(cfg.hydra.launcher, resolve=True)


def compose_command(config: str, overrides: list[str], sweep_dir: Path) -> DictConfig:
    """conf/<config>.yaml with ``overrides`` (Hydra's part included, its sweep folder
    ``sweep_dir``: where an array's submitit files go); one-line errors."""
    from hydra.errors import (
        ConfigCompositionException,
        MissingConfigException,
        OverrideParseException,
    )

    from .preflight import unknown_option
    from .sweep.plan import compose

    folder = [f"hydra.sweep.dir={Path(sweep_dir).absolute()}"]
    try:
        cfg = compose([*overrides, *folder], config)
        _require_added_keys_exist(config, overrides, folder)
        return cfg
    except OverrideParseException as e:
        raise UserError(
            f"{e.override} is not a valid override ({first_line(e.message)}); see "
            "https://hydra.cc/docs/advanced/override_grammar/basic/"
        ) from None
    except MissingConfigException as e:
        raise UserError(unknown_option(e)) from None
    except ConfigCompositionException as e:
        bad = re.match(r"Could not override '([^']+)'", str(e))
        if bad is None:
            raise UserError(first_line(str(e.__cause__ or e))) from None
        raise UserError(_unknown_key(config, bad.group(1), overrides, folder)) from None


def _require_added_keys_exist(config: str, overrides: list[str], folder: list[str]) -> None:
    """A key added with ``+`` (``sam-eval RUN +foo=1``) that the command's config does not have
    is read by nothing: refused, as sam-run refuses one (Hydra's own keys and groups excepted)."""
    from omegaconf import OmegaConf

    from .paths import config_dir
    from .settings import override_key
    from .sweep.plan import compose

    for o in overrides:
        key = override_key(o)
        if not o.startswith("+") or key.startswith("hydra") or "/" in key:
            continue
        if "." not in key and (Path(config_dir()) / key).is_dir():  # a config group
            continue
        without = compose([x for x in overrides if x is not o] + folder, config)
        absent = object()
        if OmegaConf.select(without, key, default=absent) is absent:
            raise UserError(
                f"{_unknown_key(config, key, overrides, folder)} (a key added with + must be one "
                f"sam-{config} reads)"
            )


def _unknown_key(config: str, key: str, overrides: list[str], folder: list[str]) -> str:
    """``landscape.pionts is not a key; did you mean landscape.points?`` (the keys of the
    config without the override), else the sections it has."""
    from omegaconf import OmegaConf

    from .preflight import config_paths
    from .settings import override_key
    from .sweep.plan import compose

    try:
        cfg = compose([o for o in overrides if override_key(o) != key] + folder, config)
    except Exception:
        return f"{key} is not a key of sam-{config}'s settings"
    if key.startswith("hydra.launcher."):
        keys = [k for k in cfg.hydra.launcher if k != "_target_"]
        if not keys:  # the basic launcher: jobs one after another here, nothing to set
            return (
                f"{key} sets a job array's launcher: add hydra/launcher=slurm (or submitit_local)"
            )
        near = difflib.get_close_matches(key.split(".", 2)[2], keys, n=1)
        hint = f" (did you mean hydra.launcher.{near[0]}?)" if near else ""
        return f"{key} is not a key of this launcher{hint}; its keys are {', '.join(keys)}"
    tree = {k: v for k, v in OmegaConf.to_container(cfg).items() if k != "hydra"}
    paths = config_paths(tree)
    # a key without its section (points=11): the section's key of that name, not a look-alike
    within = [p for p in paths if p.rsplit(".", 1)[-1] == key] if "." not in key else []
    near = within or difflib.get_close_matches(key, paths, n=1)
    if near:
        return f"{key} is not a key; did you mean {near[0]}?"
    return f"{key} is not a key; sam-{config}'s keys are {', '.join(f'{k}.*' for k in tree)}"
