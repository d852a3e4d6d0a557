"""``sam-eval PATH [overrides]``: measure trained runs after the fact (docs/evaluation.md).

- settings.py: the eval config (conf/eval.yaml: the ``metrics`` group as in training, ``eval.*``,
  ``hydra/launcher``) composed from the command's overrides, checked, and the settings a
  measurement depends on (``eval_settings``);
- plan.py: the job folders of PATH, and which of them to measure, to skip or to leave alone;
- job.py: one job measured at its final weights, into its eval.json;
- launch.py: the jobs run in this process, in a local pool of ``eval.workers`` processes, or as
  a submitit (SLURM) array, with a progress bar over jobs;
- cli.py: the command.
"""
