"""The sweeper of ``sam-run -m``: Hydra's basic sweeper, the jobs that repeat another left out
(``plan.collapse``: a ``base`` job does not run once per swept ρ)."""

from __future__ import annotations

import sys

from sam_runner.sweep.hydra_api import basic_sweeper_class
from sam_runner.sweep.plan import collapse, product


class Sweeper(basic_sweeper_class()):
    @staticmethod
    def split_arguments(overrides, max_batch_size):
        jobs, left_out = collapse(product(overrides))
        if left_out:
            print(
                f"sam-run: {len(left_out)} job(s) left out, each the same as one that runs "
                f"(the variant ignores the swept option): {'; '.join(left_out)}",
                file=sys.stderr,
            )
        if max_batch_size is None:
            return [jobs]
        return [jobs[i : i + max_batch_size] for i in range(0, len(jobs), max_batch_size)]
