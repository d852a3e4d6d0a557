"""A search's study rebuilt from its trial folders, when its storage lost them (the journal
deleted, unreadable and moved aside, or cut short): trial *n* ran in ``<sweep dir>/<n>``, and
each folder the study lacks becomes the trial of its number again, through Optuna's public API
(``optuna.trial.create_trial``, ``Study.add_trial``).

What a folder says of its trial: the searched values (the job's overrides, as the sweeper
wrote them) and its outcome (its summary): ``completed``, ``diverged`` and ``failed`` are
complete trials with the value the sweeper told (the objective; the worst value for the other
two), ``pruned`` a pruned trial; a folder without a final summary was running when the command
stopped, and is a running trial again, which the search runs again in its folder (from its
checkpoint). With a pruner, the objective of each evaluation line is the trial's intermediate
value at that epoch, as the job reported it. A number without a folder below the last one (a
batch stopped before that job began) is a failed trial: numbers stay folder numbers. A folder
whose job is not one of this search (a value outside the space, other fixed settings) is
refused, as a grid sweep refuses a folder of another sweep.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import optuna

from ..errors import UserError
from ..rundir import RunDir
from ..settings import override_key
from .objective import outcome_value
from .plan import same_job

if TYPE_CHECKING:
    from typing import Any

FINISHED = ("completed", "diverged", "failed")
State = optuna.trial.TrialState
FAIL = State.FAIL


def trial_folders(sweep_dir: Path | str) -> dict[int, RunDir]:
    """{number: folder} of the numbered folders directly in the sweep folder."""
    sweep_dir = Path(sweep_dir)
    if not sweep_dir.is_dir():
        return {}
    return {int(p.name): RunDir(p) for p in sweep_dir.iterdir() if p.name.isdigit() and p.is_dir()}


def add_folder_trials(
    study: optuna.Study, folders: dict[int, RunDir], search: Any
) -> dict[str, int]:
    """Add a trial to ``study`` for each folder numbered at or past its trials, in number
    order; {state name: count} of what was added. ``search`` gives the space (``space``: key
    -> distribution), the fixed overrides (``fixed``), the objective keys and directions
    (``keys``, ``ways``), the keys that are not part of a job (``exclude``) and whether each
    evaluation is an intermediate value (``reports``). UserError naming a folder of another
    search (nothing is added then)."""
    start = len(study.trials)
    numbers = [n for n in sorted(folders) if n >= start]
    trials = []
    for number in range(start, numbers[-1] + 1 if numbers else start):
        run = folders.get(number)
        trials.append(folder_trial(run, search) if run else optuna.trial.create_trial(state=FAIL))
    added: dict[str, int] = {}
    for trial in trials:
        study.add_trial(trial)
        added[trial.state.name.lower()] = added.get(trial.state.name.lower(), 0) + 1
    return added


def folder_trial(run: RunDir, search: Any) -> optuna.trial.FrozenTrial:
    """The trial a folder records (see the module docstring)."""
    overrides = run.saved_overrides
    if overrides is None:  # a folder made, no job begun in it
        return optuna.trial.create_trial(state=FAIL)
    given = {override_key(o): o for o in overrides if "=" in o}
    params = {}
    for key, dist in search.space.items():
        line = given.get(key)
        value = None if line is None else searched_value(line.split("=", 1)[1], dist)
        if value is None:
            why = f"{line} is outside its space {dist!r}" if line else f"it sets no {key}"
            raise not_this_search(run, why)
        params[key] = value
    job = [given[k] for k in search.space] + list(search.fixed)
    if not same_job(overrides, job, search.exclude):
        raise not_this_search(run, f"it was run with {' '.join(overrides)}")
    summary = run.summary or {}
    status = summary.get("status")
    common = {"params": params, "distributions": dict(search.space)}
    if search.reports and len(search.keys) == 1:
        common["intermediate_values"] = evaluations(run, search.keys[0])
    if status == "pruned":
        return optuna.trial.create_trial(state=State.PRUNED, **common)
    if status not in FINISHED:  # killed while running: the search runs it again
        return optuna.trial.create_trial(state=State.RUNNING, **common)
    values = [outcome_value(run.path, summary, k, w) for k, w in zip(search.keys, search.ways)]
    return optuna.trial.create_trial(state=State.COMPLETE, values=values, **common)


def searched_value(text: str, dist: optuna.distributions.BaseDistribution) -> Any:
    """A searched value as the sweeper wrote it (``key=value``), in its distribution's type;
    None when it is not one of the distribution's."""
    d = optuna.distributions
    if isinstance(dist, d.CategoricalDistribution):
        return next((c for c in dist.choices if str(c) == text), None)
    try:
        value = int(text) if isinstance(dist, d.IntDistribution) else float(text)
    except ValueError:
        return None
    return value if dist.low <= value <= dist.high else None


def evaluations(run: RunDir, key: str) -> dict[int, float]:
    """{epoch: objective} of the run's evaluation lines (a pruned search's reports)."""
    out = {}
    for row in run.rows():
        epoch, value = row.get("epoch"), row.get(key)
        if isinstance(epoch, int) and isinstance(value, (int, float)) and math.isfinite(value):
            out[epoch] = float(value)
    return out


def not_this_search(run: RunDir, why: str) -> UserError:
    """The UserError of a folder holding a job of another search (``why``)."""
    return UserError(
        f"sweep folder {run.path.parent} holds a job of another search: job {run.path.name} "
        f"cannot be a trial of this one ({why}); use another hydra.sweep.dir"
    )
