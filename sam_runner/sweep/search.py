"""A resumable Optuna search over Hydra's override grammar, with the grid sweeps' folder rule.

Optuna is used through its public ask-and-tell API (sweep/study.py builds the space, the sampler
and the storage). The study lives in the sweep folder (``optuna.journal``, Optuna's journal
storage, or ``hydra.sweeper.storage=URL``), trial *n* runs in ``<sweep dir>/<n>``, and the same
command continues the same study: trials that completed are not run again, a trial that was
running when the command was killed is run again in its folder (``train()`` resumes it from its
checkpoint), and new trials are asked until the study holds ``n_trials``. A job returns its
objective (sweep/objective.py), or several (``trainer.objective`` a list, one direction each:
a multi-objective study); one that failed or diverged returns the worst value and the search
goes on. With ``pruner`` (median, asha, hyperband) each job reports to its trial after every
evaluation and may stop early (sweep/trial.py); the sweeper then tells the study the trial is
pruned, a finished trial like a completed one.
"""

from __future__ import annotations

import math
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import optuna
from omegaconf import DictConfig, OmegaConf

from ..errors import UserError
from ..lock import held_by
from ..rundir import RunDir
from . import objective
from .callback import _exclude, fail
from .objective import STORAGE_FILE, STUDY_NAME
from .plan import check_job, job_key
from .study import make_sampler, open_storage, parse_space, pruner_settings, set_aside
from .study_folders import add_folder_trials, trial_folders
from .trial import env_overrides

if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

    from hydra.core.utils import JobReturn
    from hydra.types import HydraContext, TaskFunction

LIVE = (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING)
KEYS = ("direction", "directions", "study_name", "storage", "n_trials", "n_jobs", "sampler")
KEYS += ("pruner", "pruning", "params")
WAYS = ("maximize", "minimize")
# how the line of a rebuilt study names the trials of each state
WORDS = {"complete": "completed", "pruned": "pruned", "running": "to run again"}
WORDS["fail"] = "numbers without a job"


def plain(conf: dict | DictConfig | None) -> dict:
    """``hydra.sweeper.sampler``/``pruner`` as a plain dict (refused when built by a
    ``_target_``)."""
    if conf is not None and not isinstance(conf, (dict, DictConfig)):  # built by a _target_
        fail(
            f"hydra.sweeper.sampler is a built {type(conf).__name__}; name it instead "
            f"(hydra.sweeper.sampler.name=tpe, random, nsgaii, ...) so its settings are recorded"
        )
    return OmegaConf.to_container(conf) if isinstance(conf, DictConfig) else dict(conf or {})


def orphaned(trial: optuna.trial.FrozenTrial, sweep_dir: Path) -> bool:
    """Whether a running trial was left by a killed command (run it again) rather than being
    run now by another sweeper of the same study: its job holds no lock in its folder and the
    sweeper that asked it is not alive on this host (another host's is judged by the lock)."""
    if held_by(sweep_dir / str(trial.number), "train"):
        return False
    pid, _, host = str(trial.user_attrs.get("sweeper", "")).partition(" ")
    if host != socket.gethostname() or not pid.isdigit() or int(pid) == os.getpid():
        return True
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


class Search:
    def __init__(self, **settings: Any) -> None:  # the keys of conf/hydra/sweeper/optuna.yaml
        unknown = sorted(set(settings) - set(KEYS))
        if unknown:
            fail(
                f"hydra.sweeper.{unknown[0]} is not a key of the search sweeper; its keys: "
                f"{', '.join(KEYS)}"
            )
        self.direction = settings.get("direction") or "auto"
        self.study_name = settings.get("study_name")
        self.storage = settings.get("storage")
        self.n_trials = int(settings.get("n_trials", 20))
        self.n_jobs = int(settings.get("n_jobs", 1))
        self.sampler_conf = plain(settings.get("sampler"))
        self.params = plain(settings.get("params"))
        self.directions = settings.get("directions")
        self.pruner = str(settings.get("pruner") or "none")
        self.pruning = plain(settings.get("pruning"))
        self.set_aside = None  # what create_study moved out of the search's way, and why
        if self.n_trials < 1:
            fail(f"hydra.sweeper.n_trials={self.n_trials} must be at least 1")

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        """Keep the job's config and make the launcher Hydra configured."""
        from hydra.core.plugins import Plugins

        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> None:
        """Run the search: the trials a killed command left, then new ones until ``n_trials``;
        announce the best."""
        lines = [f"{k}={v}" for k, v in self.params.items()] + list(arguments)
        self.space, self.fixed = parse_space(lines)
        self.check(self.config)
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # our own lines say what runs
        study = self.open_study()
        # trials a killed command left running: run again in their folders, from checkpoints
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        left = [t.number for t in study.trials if t.state in LIVE and orphaned(t, sweep_dir)]
        for batch in self.batches(left):
            self.run(study, [study.trials[n] for n in batch])
        while len(study.trials) < self.n_trials:
            size = min(self.n_jobs, self.n_trials - len(study.trials))
            self.run(study, [self.ask(study) for _ in range(size)])
        self.announce(study)

    def check(self, config: DictConfig) -> None:
        """The settings against the job's config (``sam-run`` checks them before anything is
        written, the sweeper again): one direction per objective, a known sampler and pruner,
        and no pruning of several objectives (one line, exit 2)."""
        self.keys = objective.objective_keys(config)
        self.key = ", ".join(self.keys)
        self.ways = self._directions(config)
        self.way = self.ways[0] if len(self.ways) == 1 else self.ways
        self.several = len(self.ways) > 1
        make_sampler(self.sampler_conf, None)
        self.pruned = pruner_settings(self.pruner, self.pruning, int(config.trainer.epochs))
        if self.several and self.pruner != "none":
            fail(
                f"hydra.sweeper.pruner={self.pruner} cannot prune a search of {len(self.ways)} "
                "objectives (Optuna's pruners compare one objective); use hydra.sweeper.pruner=none"
            )

    def ask(self, study: optuna.Study) -> optuna.trial.Trial:
        """A new trial, marked with this process (another sweeper of the study leaves it be)."""
        trial = study.ask(self.space)
        trial.set_user_attr("sweeper", f"{os.getpid()} {socket.gethostname()}")
        return trial

    def _directions(self, config) -> list[str]:
        """One direction per objective key: ``directions`` when given (as many as keys), else
        ``direction`` for one key, else each key's own (accuracies up, the rest down)."""
        keys, given = self.keys, self.directions
        if given is not None:
            ways = [str(w) for w in ([given] if isinstance(given, str) else list(given))]
            bad = [w for w in ways if w not in WAYS]
            if bad or not ways:
                fail(
                    f"hydra.sweeper.directions={ways} holds {bad[0] if bad else 'nothing'}; give "
                    f"maximize or minimize per objective"
                )
            if len(ways) != len(keys):
                fail(
                    f"hydra.sweeper.directions has {len(ways)} direction(s) ({', '.join(ways)}) "
                    f"and trainer.objective {len(keys)} key(s) ({', '.join(keys)}); give one "
                    "direction per objective key"
                )
            return ways
        if len(keys) > 1:
            return [objective.direction(config, k) for k in keys]
        way = str(self.direction)
        return [objective.direction(config) if way == "auto" else way]

    def open_study(self) -> optuna.Study:
        """The study of this sweep folder (created on the first start). A folder holding a
        study of another search (other space, settings or direction) is refused; trial folders
        the study lacks (its storage deleted, unreadable or cut short) are added to it again
        (sweep/study_folders.py)."""
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        seed = self.sampler_conf.get("seed")
        sampler, pinned = make_sampler(self.sampler_conf, seed)
        folders = trial_folders(sweep_dir)  # listed before the study is read: see rebuild()
        study = self.create_study(sweep_dir, sampler)
        what = {
            "space": {k: repr(d) for k, d in self.space.items()},
            "settings": job_key(self.fixed, _exclude(self.config)),
            "direction": self.way,
        }
        if self.pruner != "none":  # a study from before pruning has no such key
            what["pruner"] = self.pruned
        self.check_same_search(study, what, sweep_dir)
        self.rebuild(study, sweep_dir, folders)
        if study.trials and seed is not None:
            # seeded afresh with the preset's seed it would draw the first trials' values again
            study.sampler = make_sampler(self.sampler_conf, int(seed) + len(study.trials))[0]
        study.set_user_attr("objectives", self.keys)  # the report names each one by its key
        study.set_user_attr("sampler", {**pinned, "seed": seed})
        study.set_user_attr("pruner", self.pruned)  # what each job rebuilds its pruner from
        return study

    def create_study(self, sweep_dir: Path, sampler: optuna.samplers.BaseSampler) -> optuna.Study:
        """The study in its storage; the folder's journal (or older SQLite file) moved aside
        when it cannot be read (one line says so; the study is then rebuilt from the folders)."""
        self.set_aside = None

        def create():
            return optuna.create_study(
                study_name=self.study_name or STUDY_NAME,
                storage=open_storage(sweep_dir, self.storage),
                sampler=sampler,
                directions=self.ways,
                load_if_exists=True,
            )

        moved = []
        while True:  # the journal, then an older SQLite file, may be the unreadable one
            try:
                study = create()
                break
            except OSError:  # a full disk or a folder that cannot be written: not the file's
                raise
            except Exception as e:  # a database's driver, or a journal line, raises its own
                reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                if self.storage:
                    fail(f"hydra.sweeper.storage={self.storage} cannot be opened ({reason})")
                aside = set_aside(sweep_dir)
                if aside is None:  # no file of ours to blame
                    raise
                moved.append(
                    f"{aside[0]} cannot be read ({type(e).__name__}: {reason}); moved to {aside[1]}"
                )
        self.set_aside = "; ".join(moved) or None
        return study

    def rebuild(self, study: optuna.Study, sweep_dir: Path, folders: dict[int, RunDir]) -> None:
        """The trials of the folders the study lacks, added (listed before the study was read:
        a folder is made after its trial is asked, so another sweeper's new trial is never
        taken for a lost one); one line says what was rebuilt."""
        fresh = not study.trials
        self.exclude, self.reports = _exclude(self.config), self.pruner != "none"
        try:
            added = add_folder_trials(study, folders, self)
        except UserError as e:
            fail(str(e))
        if self.set_aside is None and not added:
            return
        n = sum(added.values())
        said = ", ".join(f"{count} {WORDS[state]}" for state, count in added.items())
        what = f"rebuilt study from {n} trial folders ({said})" if n else "a new study begins"
        where = self.storage or sweep_dir / STORAGE_FILE
        why = self.set_aside or (
            f"no study of the trial folders in {where} (deleted?)"
            if fresh
            else f"the study in {where} lacked trials #{len(study.trials) - n} on"
        )
        print(f"sam-run: {why}: {what}; the search goes on", file=sys.stderr, flush=True)

    @staticmethod
    def check_same_search(study: optuna.Study, what: dict, sweep_dir: Path) -> None:
        """UserError when the study in ``sweep_dir`` was made by another search (space,
        objective)."""
        held = study.user_attrs.get("search")
        if held is None:
            study.set_user_attr("search", what)
            return
        if "UniformDistribution" in str(held.get("space")):  # an Optuna 2 study: keys only
            held = {**held, "space": {k: what["space"].get(k) for k in held["space"]}}
        if held != what:
            differs = ", ".join(k for k in what if held.get(k) != what[k])
            fail(
                f"sweep folder {sweep_dir} holds the Optuna study of another search (its {differs} "
                "differ); use another hydra.sweep.dir, or delete the folder to start over"
            )

    def batches(self, numbers: list[int]) -> list[list[int]]:
        """Runs of consecutive trial numbers, at most ``n_jobs`` each (one launch each: a
        launcher numbers the jobs of a launch consecutively)."""
        out = []
        for n in sorted(numbers):
            if out and n == out[-1][-1] + 1 and len(out[-1]) < self.n_jobs:
                out[-1].append(n)
            else:
                out.append([n])
        return out

    def overrides(self, trial: optuna.trial.BaseTrial) -> list[str]:
        """A trial's job: its sampled values, then the fixed overrides."""
        return [*(f"{k}={v}" for k, v in trial.params.items()), *self.fixed]

    def run(
        self, study: optuna.Study, trials: Sequence[optuna.trial.Trial | optuna.trial.FrozenTrial]
    ) -> None:
        """Launch trials (consecutive numbers) at once; tell the study each one's value."""
        jobs = [self.overrides(t) for t in trials]
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        for t, job in zip(trials, jobs):
            try:
                check_job(sweep_dir / str(t.number), job, _exclude(self.config), sweep_dir)
            except UserError as e:
                fail(str(e))
            searched = " ".join(f"{k}={v}" for k, v in t.params.items())
            print(f"trial #{t.number} of {self.n_trials}: {searched}", flush=True)
        if self.pruner != "none":  # each job reports to its trial (sweep/trial.py)
            name = self.study_name or STUDY_NAME
            jobs = [
                [*job, *env_overrides(sweep_dir, self.storage, name, t.number)]
                for t, job in zip(trials, jobs)
            ]
        returns = self.launcher.launch(jobs, initial_job_idx=trials[0].number)
        for t, ret in zip(trials, returns):
            summary = RunDir(sweep_dir / str(t.number)).summary or {}
            try:
                if summary.get("status") == "pruned":
                    study.tell(t.number, state=optuna.trial.TrialState.PRUNED)
                    print(
                        f"trial #{t.number} pruned at epoch {summary.get('pruned_epoch')} "
                        f"({self.key}={summary.get('pruned_value')})",
                        flush=True,
                    )
                else:
                    value = self.value(t.number, ret)
                    # the numbers the search selects on (a job's own line shows its test_acc)
                    values = value if self.several else [value]
                    said = ", ".join(f"{k}={v:.4f}" for k, v in zip(self.keys, values))
                    print(f"trial #{t.number}: {said} ({', '.join(self.ways)})", flush=True)
                    study.tell(t.number, value)
            except (RuntimeError, ValueError) as e:  # told already, by another sweeper
                print(f"sam-run: trial #{t.number} not told again ({e})", file=sys.stderr)

    def value(self, number: int, ret: JobReturn) -> float | list[float]:
        """A job's objective (a list for several); the worst one where the job raised or
        returned no number."""
        worst = [objective.worst(w) for w in self.ways]
        try:
            got = ret.return_value
            values = [float(v) for v in (got if isinstance(got, (list, tuple)) else [got])]
            if len(values) != len(self.ways):
                raise ValueError(f"{len(values)} value(s) for {len(self.ways)} objective(s)")
        except Exception as e:  # the job's own error was printed by it
            print(f"sam-run: trial #{number} returned no objective ({e})", file=sys.stderr)
            values = worst
        values = [w if math.isnan(v) else v for v, w in zip(values, worst)]
        return values if self.several else values[0]

    def announce(self, study: optuna.Study) -> None:
        """The best trial (the Pareto front's, with several objectives), as a line and as
        Hydra's optimization_results.yaml."""
        sweep_dir = str(self.config.hydra.sweep.dir)
        if self.several:
            return self.announce_front(study, sweep_dir)
        done = [t for t in study.trials if t.value is not None and math.isfinite(t.value)]
        if not done:
            print(f"search {sweep_dir}: no trial has a finite {self.key}", flush=True)
            return
        best = study.best_trial
        params = " ".join(f"{k}={v}" for k, v in best.params.items())
        print(
            f"search {sweep_dir}: best trial #{best.number} {self.key}={best.value:.4f} "
            f"({self.way}) {params}",
            flush=True,
        )
        OmegaConf.save(
            OmegaConf.create(
                {"name": "optuna", "best_params": dict(best.params), "best_value": best.value}
            ),
            Path(sweep_dir) / "optimization_results.yaml",
        )

    def announce_front(self, study: optuna.Study, sweep_dir: str) -> None:
        """The Pareto front's trials with finite values, as lines and as
        optimization_results.yaml."""
        finite = [
            t
            for t in study.best_trials
            if t.values is not None and all(math.isfinite(v) for v in t.values)
        ]
        if not finite:
            print(f"search {sweep_dir}: no trial has finite {self.key}", flush=True)
            return
        ways = ", ".join(f"{k} ({w})" for k, w in zip(self.keys, self.ways))
        shown = "; ".join(
            f"#{t.number} " + " ".join(f"{k}={v:.4g}" for k, v in zip(self.keys, t.values))
            for t in finite
        )
        print(
            f"search {sweep_dir}: {len(finite)} trial(s) on the Pareto front of {ways}: {shown}",
            flush=True,
        )
        front = [
            {"number": t.number, "params": dict(t.params), "values": list(t.values)} for t in finite
        ]
        OmegaConf.save(
            OmegaConf.create({"name": "optuna", "pareto_front": front}),
            Path(sweep_dir) / "optimization_results.yaml",
        )
