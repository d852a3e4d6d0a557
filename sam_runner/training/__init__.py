"""Training one run: ``train(cfg, run_dir, overrides, trial)`` (run.py) builds a ``Run`` of its
data, model, optimizer and parts (parts.py, each feature behind ``sam_runner.part.Part``) and
runs its loop (loop.py)."""
