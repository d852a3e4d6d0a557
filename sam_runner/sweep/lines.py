"""``sam-sweep-lines``: a sweep as one line of overrides per job, for a SLURM array
(``scripts/slurm_array.sbatch``: line i runs in ``<sweep dir>/<i>``, the layout of ``sam-run
-m``)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from ..cli_words import say_version
from ..errors import UserError, first_line, require
from ..interrupts import raise_pending
from . import hydra_api
from .callback import fail, print_report, report
from .plan import expand, fixed_config, sweeper_params

if TYPE_CHECKING:
    from collections.abc import Sequence

PROG = "sam-sweep-lines"


def lines_main(argv: Sequence[str] | None = None) -> None:
    """``sam-sweep-lines``: a sweep's jobs, one line of overrides each (``--report``: a sweep
    folder's report)."""
    if say_version(sys.argv[1:] if argv is None else argv):
        return
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Expand a sweep into one line of overrides per job (job i on line i+1), for "
        "`sbatch --array=0-$((N-1))%P scripts/slurm_array.sbatch LINES SWEEP_DIR`. With --report "
        "SWEEP_DIR: print the end-of-sweep report of a sweep folder instead.",
    )
    ap.add_argument(
        "overrides", nargs="*", help="the overrides you would give `sam-run -m` (e.g. seed=0,1,2)"
    )
    ap.add_argument(
        "--report",
        metavar="SWEEP_DIR",
        help="report a sweep folder; exit 1 if any job failed or did not finish",
    )
    ap.add_argument(
        "--jobs", type=int, help="with --report: how many jobs the sweep has (missing ones count)"
    )
    args = ap.parse_args(argv)
    try:
        if args.report:
            require(
                args.jobs is None or args.jobs >= 1,
                f"--jobs {args.jobs} must be an integer >= 1 (the sweep's number of jobs)",
            )
            if not Path(args.report).is_dir():
                raise UserError(
                    f"--report {args.report}: no such folder; pass the sweep folder the jobs "
                    "write into (the SWEEP_DIR given to scripts/slurm_array.sbatch)"
                )
            print_report(*report(args.report, args.jobs), prog=PROG)
            return
        fixed = fixed_config(args.overrides)
        if hydra_api.is_search(OmegaConf.select(fixed, "hydra.sweeper._target_", default="")):
            raise UserError(
                "a search asks its trials one batch at a time, so it has no lines to list; run "
                "it with sam-run -m (hydra/launcher=slurm submits each batch as a job array)"
            )
        jobs = expand(args.overrides, sweeper_params(fixed))
        from ..preflight import check_jobs  # every job checked as sam-run -m checks it

        message, _ = check_jobs(hydra_api.args_parser().parse_args(["-m", *args.overrides]))
        require(message is None, str(message))
    except UserError as e:
        fail(str(e), 2, PROG)
    except Exception as e:  # Hydra's grammar and config errors
        raise_pending()  # Ctrl-C inside Hydra's compose comes out as Hydra's own error
        fail(
            f"cannot expand {' '.join(args.overrides)}: {first_line(str(e)) or type(e).__name__}",
            2,
            PROG,
        )
    for job in jobs:
        print(" ".join(shlex.quote(o) for o in job))


if __name__ == "__main__":
    lines_main()
