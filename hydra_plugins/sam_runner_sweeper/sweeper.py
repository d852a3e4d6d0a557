"""The sweeper of ``sam-run -m``: Hydra's basic sweeper, the jobs that repeat another left out
(``plan.collapse``: a ``base`` job does not run once per swept ρ), and the jobs whose folder
holds them completed left out before anything is composed (``plan.completed_jobs``): resuming
a finished study costs a file read per job, not a Hydra composition."""

from __future__ import annotations

import sys
from pathlib import Path

from omegaconf import OmegaConf

from sam_runner import preflight
from sam_runner.sweep import hydra_api
from sam_runner.sweep.plan import (
    collapse,
    completed_jobs,
    exclude_keys,
    numbered_batches,
    product,
    report_completed,
)


class Sweeper(hydra_api.basic_sweeper_class()):
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

    def sweep(self, arguments):
        """Hydra's ``BasicSweeper.sweep`` without the completed jobs: the others launch in
        runs of consecutive numbers, each job in the folder of its number."""
        parsed = hydra_api.parse_overrides([*hydra_api.sweeper_params(self), *arguments])
        (jobs,) = self.split_arguments(parsed, None)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        done = completed_jobs(sweep_dir, jobs, exclude_keys(self.config))
        report_completed(sweep_dir, done)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        returns = []
        for first, numbers in numbered_batches(len(jobs), done, self.max_batch_size):
            batch = [jobs[n] for n in numbers]
            if not preflight.checked:  # preflight composed and checked each already
                self.validate_batch_is_legal(batch)
            results = self.launcher.launch(batch, initial_job_idx=first)
            for r in results:
                _ = r.return_value  # a job's exception, raised here as Hydra's sweeper does
            returns.append(results)
        return returns
