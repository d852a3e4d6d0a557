"""A sweep's plan: its jobs in Hydra's basic-sweeper order, their folders, and when two
overrides lists are the same job.

Our choices (not Hydra's): two overrides lists are "the same job" when they are equal after
dropping the keys in ``hydra.job.config.override_dirname.exclude_keys`` and
``settings.RUN_ONLY_KEYS`` (``trainer.device``, ``logger``, ``hydra/launcher``...: how a job
runs, not what it computes); a job that left no folder at all is ``missing``.
"""

from __future__ import annotations

import functools
from pathlib import Path

from omegaconf import OmegaConf

from ..errors import RunFolderConflict, UserError
from ..runfiles import holds_results, read_json
from ..settings import RUN_ONLY_KEYS, describe_changes, run_only

DEFAULT_EXCLUDE = ("trainer.device", "trainer.progress")


# ---------------------------------------------------------------------------- expansion
@functools.lru_cache(maxsize=None)
def _parser():
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from ..paths import config_dir

    return OverridesParser.create(
        config_loader=ConfigLoaderImpl(config_search_path=create_config_search_path(config_dir()))
    )


def expand(arguments: list[str], sweeper_params=None) -> list[list[str]]:
    """The jobs of a sweep, in Hydra's basic-sweeper order: one overrides list per job number."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    params = [f"{k}={v}" for k, v in (sweeper_params or {}).items()]
    parsed = _parser().parse_overrides(params + list(arguments))
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


def compose(overrides: list[str]):
    """The config of one job, Hydra's part included, composed by Hydra's own compose."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from ..paths import config_dir

    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return hydra_compose("config", overrides=list(overrides), return_hydra_config=True)


def fixed_config(arguments: list[str]):
    """The composed config of a sweep's overrides that do not sweep."""
    return compose(
        [o.input_line for o in _parser().parse_overrides(arguments) if not o.is_sweep_override()]
    )


def sweeper_params(cfg) -> dict:
    """``hydra.sweeper.params`` of a composed config (an experiment preset may sweep)."""
    params = OmegaConf.select(cfg, "hydra.sweeper.params")
    return dict(OmegaConf.to_container(params, resolve=False)) if params else {}


def expected_jobs(sweep_dir) -> list[list[str]] | None:
    """The jobs a sweep folder's multirun.yaml calls for, or None when that can't be known (no
    multirun.yaml, another sweeper, an unparsable sweep)."""
    import yaml

    try:
        conf = yaml.safe_load((Path(sweep_dir) / "multirun.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    hydra = conf.get("hydra") or {}
    sweeper = hydra.get("sweeper") or {}
    if not str(sweeper.get("_target_", "")).endswith("BasicSweeper"):
        return None
    try:
        return expand(
            list((hydra.get("overrides") or {}).get("task") or []), sweeper.get("params") or {}
        )
    except Exception:  # an unparsable sweep: the folders alone tell
        return None


# ---------------------------------------------------------------------------- job folders
def job_dirs(sweep_dir) -> list[Path]:
    """Every job folder under a sweep: folders holding ``.hydra/`` (Hydra writes it when a job
    starts)
    or ``summary.json``, in natural order (``2`` before ``10``)."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        return []
    marks = [*sweep_dir.rglob(".hydra"), *sweep_dir.rglob("summary.json")]
    dirs = {p.parent for p in marks if p.parent != sweep_dir}
    return sorted(
        dirs, key=lambda p: [int(s) if s.isdigit() else s for s in p.relative_to(sweep_dir).parts]
    )


def saved_overrides(job_dir: Path) -> list[str] | None:
    """The overrides a job folder was made with (.hydra/overrides.yaml, else summary.json)."""
    path = Path(job_dir) / ".hydra" / "overrides.yaml"
    if path.exists():
        try:
            return [str(o) for o in OmegaConf.load(path)]
        except Exception:
            return None
    summary = read_json(Path(job_dir) / "summary.json")
    return summary.get("overrides") if summary else None


# ---------------------------------------------------------------------------- the same job
def _settings(overrides, exclude) -> dict:
    """Overrides as {key: value} without how-to-run keys, in Hydra's normal form
    (``x=false`` and ``x=False`` are the same override)."""
    parsed = _parser().parse_overrides([str(o) for o in overrides])
    exclude = (*exclude, *RUN_ONLY_KEYS)
    return {
        o.get_key_element(): o.get_value_element_as_str()
        for o in parsed
        if not run_only(o.key_or_group, exclude)
    }


def job_key(overrides, exclude=DEFAULT_EXCLUDE) -> list[str]:
    """What makes two jobs the same job: their overrides without how-to-run keys."""
    return sorted(f"{k}={v}" for k, v in _settings(overrides, exclude).items())


def override_changes(old, new, exclude=DEFAULT_EXCLUDE) -> list[str]:
    """'key old -> new' for each override that differs; '(default)' where one side does not set
    it."""
    a, b = _settings(old, exclude), _settings(new, exclude)
    keys = [*b, *(k for k in a if k not in b)]
    return [
        f"{k} {a.get(k, '(default)')} -> {b.get(k, '(default)')}"
        for k in keys
        if a.get(k) != b.get(k)
    ]


def check_folder(sweep_dir, jobs: list[list[str]], exclude=DEFAULT_EXCLUDE) -> None:
    """UserError when a job folder of ``sweep_dir`` was made by a different job at its number."""
    sweep_dir = Path(sweep_dir)
    for num, overrides in enumerate(jobs):
        check_job(sweep_dir / str(num), overrides, exclude, sweep_dir)


def check_job(job_dir: Path, overrides, exclude, sweep_dir) -> None:
    old = saved_overrides(job_dir)
    if old is not None and job_key(old, exclude) != job_key(overrides, exclude):
        raise UserError(
            f"sweep folder {sweep_dir} holds jobs of a different sweep: job {job_dir.name} was run "
            f"with {' '.join(old) or '(no overrides)'}, this sweep's job {job_dir.name} is "
            f"{' '.join(overrides) or '(no overrides)'}; use another hydra.sweep.dir"
        )


def check_run_folder(run_dir, overrides, exclude=DEFAULT_EXCLUDE) -> None:
    """RunFolderConflict when ``run_dir`` holds a run that these overrides would continue (resume
    its checkpoint, or take its completed summary as theirs) but that was made with other ones.
    A folder whose run left nothing to continue (it failed on bad input) is free to reuse."""
    run_dir = Path(run_dir)
    old = saved_overrides(run_dir)
    if old is None or not holds_results(run_dir):
        return
    changes = override_changes(old, overrides, exclude)
    if changes:
        raise RunFolderConflict(
            f"run folder {run_dir} holds a run made with other settings "
            f"({describe_changes(changes)}); use another folder (hydra.run.dir=...), or delete "
            f"{run_dir} to start over"
        )
