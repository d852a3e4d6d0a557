"""The sweeper of ``hparams_search=...``: a resumable Optuna search (sam_runner.sweep.search).

Optuna is imported when a search starts, not when Hydra scans its plugins on every ``sam-run``.
"""

from __future__ import annotations

from hydra.plugins.sweeper import Sweeper


class SearchSweeper(Sweeper):
    def __init__(self, **settings) -> None:  # the keys of conf/hydra/sweeper/optuna.yaml
        from sam_runner.sweep.search import Search

        self.search = Search(**settings)

    def setup(self, *, hydra_context, task_function, config) -> None:
        self.search.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments):
        return self.search.sweep(arguments)
