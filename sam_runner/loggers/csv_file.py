"""logger=csv: every metrics line as a row of ``<run folder>/metrics.csv`` (one column per key
any line has had; blank where a line lacks it) and the summary's numbers as ``summary.csv``
(``key,value``): for a spreadsheet, without parsing JSON lines.

The file is rewritten (atomically) when a line brings a new key, else the row is appended. A
resumed run drops the rows the killed one wrote after its checkpoint (the checkpoint keeps the
row count), as metrics.jsonl drops its lines.
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import TYPE_CHECKING

from ..registry import LOGGERS
from ..runfiles import atomic_write_bytes, finite

if TYPE_CHECKING:
    from omegaconf import DictConfig

METRICS, SUMMARY = "metrics.csv", "summary.csv"


class CSVLogger:
    run_id = None

    def __init__(self, run_dir: Path | str) -> None:
        self.path = Path(run_dir) / METRICS
        self.summary_path = Path(run_dir) / SUMMARY
        self.columns: list[str] = []
        self.rows: list[dict] = []
        self.keep: int | None = None  # rows to keep on resume (None: a fresh run)

    def state_dict(self) -> dict:
        """The number of rows written, for a checkpoint."""
        return {"rows": len(self.rows)}

    def load_state_dict(self, state: dict) -> None:
        """Take the number of rows a resumed run keeps."""
        self.keep = state.get("rows")

    def start(self) -> None:
        """Read back the rows a resumed run keeps (those its checkpoint had)."""
        if self.keep is not None and self.path.is_file():
            with open(self.path, newline="") as f:
                self.rows = list(csv.DictReader(f))[: int(self.keep)]
            self.columns = list(dict.fromkeys(k for r in self.rows for k in r))
        self._rewrite()

    def _rewrite(self) -> None:
        buf = io.StringIO()
        w = csv.DictWriter(buf, self.columns, lineterminator="\n")
        w.writeheader()
        w.writerows(self.rows)
        atomic_write_bytes(self.path, buf.getvalue().encode())

    def log(self, row: dict) -> None:
        """A metrics row (its finite numbers and strings) appended; the file rewritten when it
        brings a new column."""
        row = {k: v for k, v in row.items() if finite(v) or isinstance(v, str)}
        self.rows.append(row)
        new = [k for k in row if k not in self.columns]
        if new:
            self.columns += new
            return self._rewrite()
        with open(self.path, "a", newline="") as f:
            csv.DictWriter(f, self.columns, lineterminator="\n").writerow(row)

    def summary(self, summary: dict) -> None:
        """The run's summary as a CSV of key, value."""
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["key", "value"])
        w.writerows([k, v] for k, v in summary.items() if finite(v) or isinstance(v, str))
        atomic_write_bytes(self.summary_path, buf.getvalue().encode())

    def finish(self, _status: str) -> None:
        """Nothing to finish: every row is already written."""
        pass


@LOGGERS.register("csv", "metrics.csv and summary.csv in the run folder (for spreadsheets)")
def build(_cfg: DictConfig, run_dir: Path | str, _full_cfg: DictConfig) -> CSVLogger:
    """The ``csv`` logger."""
    return CSVLogger(run_dir)
