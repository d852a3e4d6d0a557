"""What a run writes as it goes: its metrics lines (and the logger's), its checkpoint, its progress,
and how it stands (status, error, the last evaluation, the step the checkpoint holds)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from ..errors import one_line
from ..loggers import NullLogger
from ..rundir import CHECKPOINT, METRICS
from ..runfiles import Checkpoint, MetricsLog


class RunRecord:
    """The run folder's files as a run writes them, and the run's standing.

    Args:
        run_dir: the run folder.
        is_main: whether this process writes (rank 0).
    """

    def __init__(self, run_dir: Path, is_main: bool):
        self.is_main = is_main
        self.checkpoint = Checkpoint(run_dir / CHECKPOINT)
        self.log = MetricsLog(run_dir / METRICS)
        self.logger = NullLogger()  # until setup: a run that fails before it still finishes one
        self.progress = None
        self.fingerprint: dict = {}  # what a checkpoint must match (checkpoint.fingerprint)
        self.status, self.error, self.last = "completed", None, {}
        self.saved = (0, 0)  # (epoch, step) the checkpoint holds
        self.started = time.perf_counter()

    def fail(self, status: str, error: str) -> None:
        self.status, self.error = status, error

    def line(self, row: dict) -> None:
        """A metrics.jsonl line (and the logger's), timed from the run's start."""
        row["time_s"] = time.perf_counter() - self.started
        if self.is_main:
            self.log.append(row)
            self.logger.log(row)

    def close_logger(self, error: BaseException) -> None:
        """Finish the logger of a run that stops early: ``interrupted`` (Ctrl-C), ``preempted``
        (SystemExit: submitit's requeue), else ``failed`` with the error."""
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            status = "interrupted" if isinstance(error, KeyboardInterrupt) else "preempted"
            summary = {"status": status}
        else:
            status, summary = "failed", {"status": "failed", "error": one_line(error)}
        try:
            self.logger.summary(summary)
            self.logger.finish(status)
        except Exception as e:  # the run's own error is the one to report
            print(f"sam-run: warning: logger not finished ({one_line(e)})", file=sys.stderr)
