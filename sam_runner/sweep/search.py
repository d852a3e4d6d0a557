"""A resumable Optuna search: hydra-optuna-sweeper's search space, sampler and study, with the
grid sweeps' folder rule.

hydra-optuna-sweeper numbers its jobs from 0 on every start and asks ``n_trials`` new trials
each time, so running its command again would reuse the folders of other trials' runs and never
end. Here the study lives in the sweep folder (``optuna.db``, SQLite), trial *n* runs in
``<sweep dir>/<n>``, and the same command continues the same study: trials that completed are
not run again, a trial that was running when the command was killed is run again in its folder
(``train()`` resumes it from its checkpoint), and new trials are asked until the study holds
``n_trials``. A job returns its objective (sweep/objective.py); one that failed or diverged
returns the worst value and the search goes on.
"""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path

import optuna
from omegaconf import OmegaConf

from ..errors import UserError
from . import hydra_api, objective
from .callback import _exclude, fail
from .objective import STORAGE_FILE, STUDY_NAME
from .plan import check_job, job_key

OptunaSweeperImpl, create_params_from_overrides = hydra_api.optuna_sweeper_impl()

LIVE = (optuna.trial.TrialState.RUNNING, optuna.trial.TrialState.WAITING)


class Search(OptunaSweeperImpl):
    def sweep(self, arguments: list[str]) -> None:
        if isinstance(self.sampler, functools.partial):  # GridSampler: built from the space
            fail(
                "hydra/sweeper/sampler=grid is not supported by the resumable search; a grid "
                "sweep (key=a,b,c without hparams_search) runs every combination"
            )
        self._process_searchspace_config()
        space, fixed = create_params_from_overrides(
            self._parse_sweeper_params_config() + list(arguments)
        )
        for name in fixed:
            space.pop(name, None)
        self.space, self.fixed = space, [f"{k}={v}" for k, v in fixed.items()]
        self.way = self._direction()
        self.key = objective.objective_key(self.config)
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # our own lines say what runs
        study = self.open_study()
        # trials a killed command left running: run again in their folders, from checkpoints
        for batch in self.batches([t.number for t in study.trials if t.state in LIVE]):
            self.run(study, [study.trials[n] for n in batch])
        while len(study.trials) < self.n_trials:
            size = min(self.n_jobs, self.n_trials - len(study.trials))
            self.run(study, [study.ask(self.space) for _ in range(size)])
        self.announce(study)

    def _direction(self) -> str:
        way = self.direction.name if hasattr(self.direction, "name") else str(self.direction)
        return objective.direction(self.config) if way == "auto" else way

    def open_study(self):
        """The study of this sweep folder (created on the first start). A folder holding a
        study of another search (other space, settings or direction) is refused."""
        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
        sweep_dir.mkdir(parents=True, exist_ok=True)
        storage = self.storage or f"sqlite:///{sweep_dir / STORAGE_FILE}"
        study = optuna.create_study(
            study_name=self.study_name or STUDY_NAME,
            storage=storage,
            sampler=self.sampler,
            direction=self.way,
            load_if_exists=True,
        )
        self.continue_sampling(study)
        what = {
            "space": {k: repr(d) for k, d in self.space.items()},
            "settings": job_key(self.fixed, _exclude(self.config)),
            "direction": self.way,
        }
        held = study.user_attrs.get("search")
        if held is None:
            study.set_user_attr("search", what)
        elif held != what:
            differs = ", ".join(k for k in what if held.get(k) != what[k])
            fail(
                f"sweep folder {sweep_dir} holds the Optuna study of another search (its {differs} "
                "differ); use another hydra.sweep.dir, or delete the folder to start over"
            )
        return study

    def continue_sampling(self, study) -> None:
        """A resumed study's sampler, seeded ``seed + trials so far``: the sampler made afresh
        with the preset's seed would draw the first trials' values again."""
        conf = OmegaConf.select(self.config, "hydra.sweeper.sampler")
        seed = OmegaConf.select(self.config, "hydra.sweeper.sampler.seed")
        if study.trials and conf is not None and seed is not None:
            from hydra.utils import instantiate

            study.sampler = instantiate(conf, seed=int(seed) + len(study.trials))

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

    def overrides(self, trial) -> list[str]:
        return [*(f"{k}={v}" for k, v in trial.params.items()), *self.fixed]

    def run(self, study, trials) -> None:
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
        returns = self.launcher.launch(jobs, initial_job_idx=trials[0].number)
        for t, ret in zip(trials, returns):
            study.tell(t.number, self.value(t.number, ret))

    def value(self, number: int, ret) -> float:
        """A job's objective; the worst one when the job raised or returned no number."""
        try:
            value = float(ret.return_value)
        except Exception as e:  # the job's own error was printed by it
            print(f"sam-run: trial #{number} returned no objective ({e})", file=sys.stderr)
            return objective.worst(self.way)
        return value if not math.isnan(value) else objective.worst(self.way)

    def announce(self, study) -> None:
        """The best trial, as a line and as Hydra's optimization_results.yaml."""
        done = [t for t in study.trials if t.value is not None and math.isfinite(t.value)]
        sweep_dir = str(self.config.hydra.sweep.dir)
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
