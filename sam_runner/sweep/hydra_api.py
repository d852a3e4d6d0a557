"""The third-party internals the runner relies on, in one place: Hydra's overrides parser, the
basic sweeper's job order and params, the config composer and the command-line parser,
submitit's shared parameter names, plus what the runner knows of each sweeper (whether its jobs
are known in advance, or whether it searches a space).

Hydra keeps these under ``hydra._internal`` or in plugins, submitit under private names (the
search uses Optuna's public API alone: sweep/study.py and sweep/trial.py); no other module of
the runner imports a private name of theirs (tests/test_structure.py checks it). The runner's
checks (preflight.py)
and its plan (plan.py) only use the functions here, so a Hydra upgrade or another sweeper is a
change to this module alone: register a search sweeper's ``_target_`` in ``SEARCH_SWEEPERS``
and preflight validates its space and refuses it without an objective.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import argparse

    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import Override
    from omegaconf import DictConfig

# sweepers whose jobs are the Cartesian product of the swept overrides (numbers known upfront)
GRID_SWEEPERS = ("BasicSweeper", "sam_runner_sweeper.sweeper.Sweeper")
# sweepers that search a space (interval, tag(log, interval), choice, range) for an objective
# (hydra-optuna-sweeper's OptunaSweeper is no longer installed: a config naming it fails in
# Hydra's own instantiation, not in a search check that would take it for ours)
SEARCH_SWEEPERS = ("sam_runner_sweeper.search.SearchSweeper",)


def args_parser() -> argparse.ArgumentParser:
    """Hydra's own command-line parser (``-m``, ``--cfg``, overrides ...)."""
    from hydra._internal.utils import get_args_parser

    return get_args_parser()


@functools.lru_cache(maxsize=None)
def overrides_parser() -> OverridesParser:
    """Hydra's overrides parser, with the runner's config tree as its search path."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra._internal.utils import create_config_search_path
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from ..paths import config_dir

    return OverridesParser.create(
        config_loader=ConfigLoaderImpl(config_search_path=create_config_search_path(config_dir()))
    )


def parse_overrides(lines: list[str]) -> list[Override]:
    """Override lines parsed by Hydra's parser (with the runner's config path)."""
    return overrides_parser().parse_overrides(list(lines))


def basic_sweeper_class() -> type[BasicSweeper]:
    """Hydra's basic sweeper (the base of the runner's grid sweeper)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    return BasicSweeper


def sweeper_params(sweeper: BasicSweeper) -> list[str]:
    """A basic sweeper's ``hydra.sweeper.params`` as override lines (``key=value``), as Hydra's
    own sweep reads them before the command's overrides."""
    return [f"{k}={v}" for k, v in (sweeper.params or {}).items()]


def submitit_shared_parameters() -> set[str]:
    """The executor parameters every submitit cluster shares (the others take a
    ``<cluster>_`` prefix)."""
    import submitit

    return set(submitit.AutoExecutor._valid_parameters())


def basic_product(parsed: list[Override]) -> list[list[str]]:
    """Every combination of parsed overrides, in Hydra's basic-sweeper order."""
    batches = basic_sweeper_class().split_arguments(parsed, None)
    return [job for batch in batches for job in batch]


def compose(overrides: list[str], config_name: str = "config") -> DictConfig:
    """One job's config, Hydra's part included, composed by Hydra's own compose."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from ..paths import config_dir

    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return hydra_compose(config_name, overrides=list(overrides), return_hydra_config=True)


def task_record(cfg: DictConfig, overrides: list[str]) -> tuple[list[str], str]:
    """(``hydra.overrides.task``, ``hydra.job.override_dirname``) of a config composed with
    ``overrides``, as Hydra's compose sets them: the overrides that are not Hydra's, in order,
    and their folder name by the config's ``kv_sep``, ``item_sep`` and ``exclude_keys``."""
    from hydra._internal.config_loader_impl import get_overrides_dirname

    task = [o for o in parse_overrides(overrides) if not o.is_hydra_override()]
    settings = cfg.hydra.job.config.override_dirname
    dirname = get_overrides_dirname(
        overrides=task,
        kv_sep=settings.kv_sep,
        item_sep=settings.item_sep,
        exclude_keys=settings.exclude_keys,
    )
    return [o.input_line for o in task], dirname


def knows_jobs(sweeper_target: str | None) -> bool:
    """Whether a sweeper's jobs are known in advance (Hydra's basic sweeper, and ours on it)."""
    return str(sweeper_target).endswith(GRID_SWEEPERS)


def is_search(sweeper_target: str | None) -> bool:
    """Whether a sweeper searches a space for an objective (ours, on Optuna)."""
    return str(sweeper_target).endswith(SEARCH_SWEEPERS)


# ---------------------------------------------------------------------------- search spaces
@dataclass
class Searched:
    """One searched key: its override text, the values at its bounds (every value of a choice),
    whether the space is logarithmic, and a reason the space itself is malformed (or None)."""

    key: str
    text: str
    bounds: list[str]
    log: bool = False
    malformed: str | None = None


def search_space(lines: list[str]) -> list[Searched]:
    """The searched keys among ``key=value`` lines (the sweeper's params, then the command's
    sweep overrides): ``interval(a, b)``, ``tag(log, interval(a, b))``, ``choice(...)``,
    ``a,b,c`` and ``range(...)``. Lines that set a single value are not searched."""
    out = []
    for o in parse_overrides(lines):
        if o.is_sweep_override():
            out.append(_searched(o))
    return out


def _searched(o) -> Searched:
    key, text = o.get_key_element(), o.input_line.split("=", 1)[1]
    if o.is_interval_sweep():
        v = o.value()
        log = "log" in v.tags
        item = Searched(key, text, [_show(v.start), _show(v.end)], log)
        if not v.start < v.end:
            item.malformed = f"its lower bound {_show(v.start)} is not below {_show(v.end)}"
        elif log and v.start <= 0:
            item.malformed = f"a log interval needs bounds > 0, and {_show(v.start)} is not"
        return item
    values = list(o.sweep_string_iterator())
    if o.is_range_sweep():  # the first and last values are its bounds
        values = values[:1] + values[-1:] if len(values) > 1 else values
    item = Searched(key, text, values)
    if not values:
        item.malformed = "it holds no value"
    return item


def _show(x) -> str:
    return repr(x) if isinstance(x, float) else str(x)
