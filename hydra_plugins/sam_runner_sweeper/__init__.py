"""sam-runner's sweeper, where Hydra looks for plugins (the ``hydra_plugins`` namespace)."""
