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


def env_overrides(sweep_dir, storage: str | None, study: str, number: int) -> list[str]:
    """The overrides that tell trial ``number``'s job where its trial is (Hydra sets them as
    environment variables of the job, and they are no part of what the job computes)."""
    values = {"sweep_dir": str(Path(sweep_dir).absolute()), "storage": storage or ""}
    values.update(study=study, trial=str(number))
    return [f"hydra.job.env_set.{ENV[k]}='{v}'" for k, v in values.items()]


class TrialLink:
    """The running trial of this job, and the search's pruner."""

    def __init__(self, sweep_dir: str, storage: str, study_name: str, number: int):
        import optuna

        from .study import make_pruner, open_storage

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.storage = open_storage(Path(sweep_dir), storage or None, migrate=False)
        if isinstance(self.storage, str):
            self.storage = optuna.storages.get_storage(self.storage)
        self.study = optuna.load_study(study_name=study_name, storage=self.storage)
        self.pruner = make_pruner(self.study.user_attrs["pruner"])
        study_id = self.storage.get_study_id_from_name(study_name)
        self.trial_id = self.storage.get_trial_id_from_study_id_trial_number(study_id, number)
        self.number = number

    @classmethod
    def from_env(cls) -> TrialLink | None:
        """This job's trial, when a pruned search launched it (else None)."""
        given = {k: os.environ.get(v) for k, v in ENV.items()}
        if not given["trial"] or not given["sweep_dir"]:
            return None
        return cls(given["sweep_dir"], given["storage"], given["study"], int(given["trial"]))

    def should_stop(self, epoch: int, value) -> bool:
        """Report the objective at this epoch; whether the pruner stops the trial here."""
        import optuna

        if not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        try:
            self.storage.set_trial_intermediate_value(self.trial_id, int(epoch), float(value))
        except optuna.exceptions.UpdateFinishedTrialError:
            return False  # told already (another sweeper of the study): nothing to decide
        return bool(self.pruner.prune(self.study, self.storage.get_trial(self.trial_id)))
