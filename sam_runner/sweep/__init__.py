"""Sweeps that never lose or repeat a job.

The rule: a job's folder is ``<hydra.sweep.dir>/<job number>``, and job numbers come from
Hydra's basic sweeper (the Cartesian product of the swept overrides, in order). Running the
same sweep command again with the same ``hydra.sweep.dir`` therefore finds each job in its old
folder, where ``train()`` skips it when its summary.json says completed, resumes it from
checkpoints/last.pt when it was interrupted, and runs it from the start otherwise.

- plan.py: a sweep's jobs (expansion, job folders, which overrides are the same job), shared
  by ``sam-run``'s checks, the Hydra callback and ``sam-report``;
- jobs.py: running one job, in one process or in ``trainer.devices`` processes, and recording
  a failed job;
- callback.py: the Hydra callback (checks before a sweep, one line per job after it);
- lines.py: ``sam-sweep-lines``, a sweep as one line of overrides per job for a SLURM array.
- search.py: the resumable Optuna search of ``hparams_search=...`` (its study in the sweep
  folder); study.py: its space, sampler, pruner and storage in Optuna's public API;
  objective.py: the number(s) each job returns to it (``trainer.objective``); trial.py: a
  pruned search's job reporting to its trial;
- hydra_api.py: the Hydra internals all of these use (overrides parser, basic sweeper, compose,
  which sweepers grid and which search);
- stages.py: presets in stages (``stages:``), their plan and the ``stage:NAME`` references
  resolved to an earlier stage's job folder; staged.py: running them, stage by stage;
- array.py: a submitit job array of per-job work for the commands that look at finished runs
  (``sam-eval``, ``sam-landscape``), with sam-run's launcher presets.
"""
