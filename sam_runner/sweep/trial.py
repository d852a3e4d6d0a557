"""A search trial's side in its own job: report ``trainer.objective`` after every evaluation to
the trial in the shared study, and ask the search's pruner whether to stop.

The sweeper tells each job which trial it is through ``hydra.job.env_set`` (``ENV``: the sweep
folder, the storage URL when it is not the folder's journal, the study's name and the trial's
number), so a job finds its trial the same way in the sweeper's process (the local launcher),
in a worker process or in a SLURM task: it opens the study's storage itself. Everything here is
Optuna's public API: the storage's ``get_study_id_from_name``,
``get_trial_id_from_study_id_trial_number``, ``set_trial_intermediate_value`` and
``get_trial``, and the pruner's ``prune(study, trial)``, the pruner rebuilt from the settings
the sweeper recorded in the study (``study.user_attrs["pruner"]``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

ENV = {
    "sweep_dir": "SAM_RUNNER_SEARCH_DIR",
    "storage": "SAM_RUNNER_SEARCH_STORAGE",
    "study": "SAM_RUNNER_SEARCH_STUDY",
    "trial": "SAM_RUNNER_SEARCH_TRIAL",
}


def env_overrides(sweep_dir: Path | str, storage: str | None, study: str, number: int) -> list[str]:
    """The overrides that tell trial ``number``'s job where its trial is (Hydra sets them as
    environment variables of the job, and they are no part of what the job computes)."""
    values = {"sweep_dir": str(Path(sweep_dir).absolute()), "storage": storage or ""}
    values.update(study=study, trial=str(number))
    return [f"++hydra.job.env_set.{ENV[k]}='{v}'" for k, v in values.items()]


class TrialLink:
    """The running trial of this job, and the search's pruner: plain names until first used
    (a job of ``trainer.devices`` processes hands it to its rank 0, which opens it)."""

    def __init__(self, sweep_dir: str, storage: str, study_name: str, number: int) -> None:
        self.where = (str(sweep_dir), storage or "", str(study_name), int(number))
        self.opened = None

    @classmethod
    def from_env(cls) -> TrialLink | None:
        """This job's trial, when a pruned search launched it (else None)."""
        given = {k: os.environ.get(v) for k, v in ENV.items()}
        if not given["trial"] or not given["sweep_dir"]:
            return None
        return cls(given["sweep_dir"], given["storage"], given["study"], int(given["trial"]))

    def __getstate__(self) -> dict:
        return {"where": self.where, "opened": None}

    def open(self) -> tuple:
        """(storage, study, pruner, trial id), opened once."""
        if self.opened is None:
            import optuna

            from .study import make_pruner, open_storage

            optuna.logging.set_verbosity(optuna.logging.WARNING)
            sweep_dir, url, name, number = self.where
            storage = open_storage(Path(sweep_dir), url or None, migrate=False)
            if isinstance(storage, str):
                storage = optuna.storages.get_storage(storage)
            study = optuna.load_study(study_name=name, storage=storage)
            study_id = storage.get_study_id_from_name(name)
            trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, number)
            self.opened = (storage, study, make_pruner(study.user_attrs["pruner"]), trial_id)
        return self.opened

    def should_stop(self, epoch: int, value: float, last: bool = False) -> bool:
        """Report the objective at this epoch; whether the pruner stops the trial here (never
        at the ``last`` epoch: the trial is complete)."""
        import optuna

        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        storage, study, pruner, trial_id = self.open()
        try:
            storage.set_trial_intermediate_value(trial_id, int(epoch), float(value))
        except optuna.exceptions.UpdateFinishedTrialError:
            return False  # told already (another sweeper of the study): nothing to decide
        return not last and bool(pruner.prune(study, storage.get_trial(trial_id)))
