"""The Optuna side of a search, through Optuna's public API only: the space from Hydra's override
grammar, the sampler and the pruner with their settings pinned, and the study's storage (a
journal file in the sweep folder by default, safe for several processes; an older search's
SQLite file is migrated into it once).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import optuna

from . import hydra_api
from .callback import fail
from .objective import OLD_STORAGE_FILE, STORAGE_FILE

if TYPE_CHECKING:
    from hydra.core.override_parser.types import Override

# the samplers a search may name (hydra.sweeper.sampler.name, or a preset of
# conf/hydra/sweeper/sampler/); the grid is a grid sweep's job, not a search's
SAMPLERS = {
    "tpe": "TPESampler",
    "random": "RandomSampler",
    "nsgaii": "NSGAIISampler",
    "cmaes": "CmaEsSampler",
    "qmc": "QMCSampler",
}


def make_sampler(conf: dict, seed: int | None) -> tuple[optuna.samplers.BaseSampler, dict]:
    """The sampler ``hydra.sweeper.sampler`` names, built with exactly its keys (the presets
    write every setting a result depends on), and those settings as recorded in the study."""
    conf = dict(conf or {})
    name = str(conf.pop("name", "tpe"))
    if name not in SAMPLERS:
        fail(f"hydra.sweeper.sampler.name={name} is unknown; choose one of {', '.join(SAMPLERS)}")
    target = SAMPLERS[name]
    conf.pop("seed", None)
    try:
        sampler = getattr(optuna.samplers, target)(seed=seed, **conf)
    except TypeError as e:
        fail(f"hydra.sweeper.sampler ({target}): {e}")
    return sampler, {"name": name, **conf}


# the pruners a search may name (hydra.sweeper.pruner), each with the hydra.sweeper.pruning keys
# it reads; an evaluation (an epoch, as trainer.eval_every_n_epochs has it) is a pruner's step
PRUNERS = {
    "none": ("NopPruner", ()),
    "median": ("MedianPruner", ("n_startup_trials", "n_warmup_steps")),
    "asha": ("SuccessiveHalvingPruner", ("min_resource", "reduction_factor")),
    "hyperband": ("HyperbandPruner", ("min_resource", "max_resource", "reduction_factor")),
}


def pruner_settings(name: str, conf: dict, epochs: int) -> dict:
    """The settings ``hydra.sweeper.pruner=name`` runs with (the keys it reads of
    ``hydra.sweeper.pruning``, hyperband's ``max_resource: auto`` as ``trainer.epochs``), as
    recorded in the study: the job rebuilds its pruner from them."""
    if name not in PRUNERS:
        fail(f"hydra.sweeper.pruner={name} is unknown; choose one of {', '.join(PRUNERS)}")
    settings = {k: conf.get(k) for k in PRUNERS[name][1]}
    if settings.get("max_resource") in (None, "auto"):
        settings = {**settings, "max_resource": int(epochs)} if name == "hyperband" else settings
    for k, v in settings.items():
        low = 0 if k == "n_warmup_steps" else 1
        if not isinstance(v, int) or isinstance(v, bool) or v < low:
            fail(f"hydra.sweeper.pruning.{k}={v} must be a whole number >= {low} (pruner={name})")
    return {"name": name, **settings}


def make_pruner(settings: dict) -> optuna.pruners.BasePruner:
    """The Optuna pruner of recorded settings (``pruner_settings``)."""
    settings = dict(settings)
    target = PRUNERS[settings.pop("name")][0]
    if target == "SuccessiveHalvingPruner":  # ASHA as its paper has it: no bootstrap trials
        settings.update(min_early_stopping_rate=0, bootstrap_count=0)
    return getattr(optuna.pruners, target)(**settings)


def parse_space(lines: list[str]) -> tuple[dict, list[str]]:
    """``key=value`` lines (the sweeper's params, then the command's): the searched keys as
    Optuna distributions (later lines replace earlier ones) and the fixed ones as overrides."""
    space, fixed = {}, {}
    for o in hydra_api.parse_overrides(lines):
        key = o.get_key_element()
        space.pop(key, None)
        fixed.pop(key, None)
        if o.is_sweep_override():
            space[key] = distribution(o)
        else:
            fixed[key] = o.input_line
    return space, list(fixed.values())


def distribution(o: Override) -> optuna.distributions.BaseDistribution:
    """The Optuna distribution of a searched key's override: an interval (int or float, log when
    tagged), an integer range, or a categorical choice."""
    key, d = o.get_key_element(), optuna.distributions
    if o.is_interval_sweep():
        v = o.value()
        log = "log" in v.tags
        if "int" in v.tags:
            return d.IntDistribution(int(v.start), int(v.end), log=log)
        return d.FloatDistribution(float(v.start), float(v.end), log=log)
    values = list(o.sweep_iterator())
    if not values:
        fail(f"the search space {o.input_line} holds no value; give {key} at least one")
    ints = all(isinstance(x, int) and not isinstance(x, bool) for x in values)
    if o.is_range_sweep() and ints and len(values) > 1:
        return d.IntDistribution(values[0], values[-1], step=values[1] - values[0])
    return d.CategoricalDistribution(values)


def open_storage(
    sweep_dir: Path, url: str | None, migrate: bool = True
) -> optuna.storages.BaseStorage | str:
    """``url`` (an RDB, e.g. ``postgresql://...``) or the sweep folder's journal file. A folder
    holding only an older search's ``optuna.db`` has its studies copied into the journal (with a
    notice; the SQLite file is left as it was)."""
    if url:
        return str(url)
    from optuna.storages import JournalStorage
    from optuna.storages.journal import JournalFileBackend, JournalFileOpenLock

    journal, old = sweep_dir / STORAGE_FILE, sweep_dir / OLD_STORAGE_FILE
    carry = old.is_file() and not journal.exists()
    if carry and not migrate:
        return f"sqlite:///{old.absolute()}"
    path = str(journal.absolute())
    storage = JournalStorage(JournalFileBackend(path, lock_obj=JournalFileOpenLock(path)))
    if carry:
        sqlite = f"sqlite:///{old.absolute()}"
        try:
            for s in optuna.get_all_study_summaries(sqlite):
                optuna.copy_study(
                    from_study_name=s.study_name, from_storage=sqlite, to_storage=storage
                )
        except Exception:  # an unreadable SQLite file: no half-copied journal is left
            journal.unlink(missing_ok=True)
            raise
        print(
            f"sam-run: the study in {old} was copied into {journal}, where the search continues",
            file=sys.stderr,
            flush=True,
        )
    return storage


def set_aside(sweep_dir: Path) -> tuple[Path, Path] | None:
    """(the sweep folder's study file, where it was moved): the journal, else the older SQLite
    file, renamed ``<name>.unreadable`` (``.unreadable.2``, ... when that is taken), kept for
    a look and out of the search's way; None when the folder has neither."""
    journal, old = sweep_dir / STORAGE_FILE, sweep_dir / OLD_STORAGE_FILE
    bad = journal if journal.exists() else old
    if not bad.exists():
        return None
    aside, n = bad.with_name(f"{bad.name}.unreadable"), 1
    while aside.exists():
        n += 1
        aside = bad.with_name(f"{bad.name}.unreadable.{n}")
    bad.rename(aside)
    return bad, aside
