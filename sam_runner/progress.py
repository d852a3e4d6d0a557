"""Progress output, one rule for every command (``trainer.progress``): ``auto`` is a tqdm bar on
a terminal and lines otherwise (a log file, nohup, SLURM), ``bar``, ``lines`` or ``none``. sam-run:
a bar per epoch, or one line per epoch and, within a long epoch, a line every
``trainer.progress_every_s`` seconds (steps/s and the epoch's time left); ``Counter``
(sam-landscape's points and curve steps): a bar, or a line at the first unit and at every
tenth."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from . import interrupts

if TYPE_CHECKING:
    from pathlib import Path


def resolve_mode(mode: str) -> str:
    """``auto`` as ``bar`` on a terminal (stderr), else ``lines``; the others as they are."""
    if mode == "auto":
        return "bar" if sys.stderr.isatty() else "lines"
    return mode


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    return f"{minutes}m{seconds:02d}s" if minutes < 60 else f"{minutes // 60}h{minutes % 60:02d}m"


class Counter:
    """Progress over ``total`` units (points of a slice, steps of a curve, a sweep's checks): a
    tqdm bar, or a line on stderr at the first unit and at every tenth (and each ``every``
    seconds, when given; after ``delay`` seconds, when given), with the time taken and the
    time left."""

    def __init__(
        self,
        total: int,
        desc: str,
        mode: str,
        prefix: str = "",
        unit: str = "points",
        every: float | None = None,
        delay: float = 0.0,
    ) -> None:
        self.mode, self.total, self.desc, self.unit = resolve_mode(mode), total, desc, unit
        self.prefix = f"{prefix}: " if prefix else ""
        self.done, self.start, self.bar = 0, time.monotonic(), None
        # lines: also one each ``every`` seconds; bar and lines: nothing in the first ``delay``
        # seconds (work that ends by then says nothing)
        self.every, self.delay, self.said = every, delay, None
        if self.mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(
                total=total,
                desc=desc,
                leave=False,
                dynamic_ncols=True,
                file=sys.stderr,
                delay=delay,
            )
        self.marks = {max(1, total * k // 10) for k in range(1, 11)} | {1}

    def update(self, n: int = 1) -> None:
        """Count ``n`` more done (a pending interrupt raised first) and show the progress."""
        interrupts.raise_pending()
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
        elif self.mode == "lines":
            now = time.monotonic()
            if now - self.start < self.delay:
                return
            due = self.said is None or self.done in self.marks
            if due or (self.every and now - self.said >= self.every):
                self.said = now
                print(self.line(), file=sys.stderr, flush=True)

    def line(self) -> str:
        """``done/total`` with the time taken and the time left at this pace."""
        took = time.monotonic() - self.start
        left = took / self.done * (self.total - self.done)
        rest = f", about {_duration(left)} left" if self.done < self.total else ""
        return (
            f"{self.prefix}{self.desc}: {self.done}/{self.total} {self.unit} "
            f"({100 * self.done // self.total}%), {_duration(took)}{rest}"
        )

    def close(self) -> None:
        """Close the bar, if there is one."""
        if self.bar is not None:
            self.bar.close()


class _NoBar:
    def update(self, *_stats):
        interrupts.raise_pending()

    def close(self):
        pass


class _Lines:
    """Within an epoch, a line on stderr every ``every`` seconds: the step, the loss and accuracy
    so far (read then: one device sync a line, none between), steps/s and the time left."""

    def __init__(self, epoch, epochs, steps, every: float, done: int = 0):
        self.head, self.steps, self.every = f"epoch {epoch}/{epochs}", steps, every
        self.n = self.first = done
        self.start = self.said = time.monotonic()

    def update(self, stats):
        interrupts.raise_pending()
        self.n += 1
        now = time.monotonic()
        if now - self.said < self.every or self.n >= self.steps:
            return
        self.said = now
        rate = (self.n - self.first) / max(now - self.start, 1e-9)
        left = (self.steps - self.n) / rate
        print(
            f"{self.head}: step {self.n}/{self.steps} ({100 * self.n // self.steps}%), "
            f"train_loss {float(stats.loss_sum) / stats.seen:.4f}, "
            f"train_acc {float(stats.count_predicted()) / stats.seen:.4f}, "
            f"{rate:.3g} steps/s, about {_duration(left)} left",
            file=sys.stderr,
            flush=True,
        )

    def close(self):
        pass


class _Bar:
    """tqdm over the steps of an epoch; the loss/accuracy postfix is refreshed every 20 steps
    (reading them costs a device sync)."""

    def __init__(self, epoch, epochs, steps, done: int = 0):
        from tqdm import tqdm

        self.bar = tqdm(
            initial=done,
            total=steps,
            desc=f"epoch {epoch}/{epochs}",
            leave=False,
            dynamic_ncols=True,
            file=sys.stderr,
        )
        self.n = 0

    def update(self, stats):
        interrupts.raise_pending()
        self.n += 1
        self.bar.update(1)
        if self.n % 20 == 0:
            seen = stats.seen
            self.bar.set_postfix(
                loss=f"{float(stats.loss_sum) / seen:.4f}",
                acc=f"{float(stats.count_predicted()) / seen:.3f}",
            )

    def close(self):
        self.bar.close()


class Progress:
    """A run's progress: ``mode`` (``trainer.progress``), its epochs and an epoch's steps; in
    ``lines`` mode a line within an epoch every ``every_s`` seconds (0: none)."""

    def __init__(
        self, mode: str, epochs: int, steps: int, enabled: bool = True, every_s: float | None = 30.0
    ) -> None:
        self.mode = resolve_mode(mode) if enabled else "none"
        self.epochs, self.steps, self.every_s = epochs, steps, float(every_s or 0)

    def epoch_bar(self, epoch: int, done: int = 0) -> _Bar | _Lines | _NoBar:
        """The epoch's progress, ``done`` of its steps already taken (a resumed epoch)."""
        if self.mode == "bar":
            return _Bar(epoch, self.epochs, self.steps, done)
        if self.mode == "lines" and self.every_s > 0:
            return _Lines(epoch, self.epochs, self.steps, self.every_s, done)
        return _NoBar()

    def epoch_line(self, row: dict) -> None:
        """An epoch's metrics line, printed unless the mode is ``none``."""
        if self.mode == "none":
            return
        parts = [
            f"epoch {row['epoch']}/{self.epochs}",
            f"train_loss {row['train_loss']:.4f}",
        ]
        # a classifier's accuracy and ECE; a density model's log-likelihoods (model=pc)
        for key in ("train_acc", "test_acc", "test_ece", "train_ll", "test_ll", "test_bpd"):
            if isinstance(row.get(key), (int, float)):
                parts.append(f"{key} {row[key]:.4f}")
        if row.get("lambda_max") is not None:
            parts.append(f"lambda_max {row['lambda_max']:{LAMBDA}}")
        for key in ("avg_test_acc", "avg_test_ece"):  # the averaged weights (SWA, EMA)
            if isinstance(row.get(key), (int, float)):
                parts.append(f"{key} {row[key]:.4f}")
        parts.append(f"elapsed {row['time_s']:.1f}s")
        print(" | ".join(parts), file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        """One line about what the run is doing (between epoch lines, e.g. a long measurement)."""
        if self.mode != "none":
            print(text, file=sys.stderr, flush=True)


LAMBDA = "#.4g"  # λ_max on the console: four significant digits, always (41.00 beside 59.46)


def _fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


# the closing line's figures: the digits a run reproduces. A 1,000-sample test set resolves
# accuracy to 0.001; beyond that, another CPU, thread count or torch build computes each sum in
# another order (its own SIMD kernels), training amplifies the last bits over the epochs, and
# the run ends a test sample or two apart (accuracy ±0.001-0.002, ECE ±0.001, λ_max ±2%):
# three digits, and summary.json keeps every digit
FINAL, FINAL_LAMBDA = ".3f", "#.3g"


def print_final(summary: dict, run_dir: Path | str, already: bool = False) -> None:
    """The line a run ends with: its status, the final metrics and its folder (``already``: run
    again after it ended)."""
    status = summary.get("status", "?")
    head = f"already {status}" if already else status  # completed, or pruned in a search
    if summary.get("test_bpd") is not None:  # a density model (model=pc)
        line = (
            f"{head}: test_ll={_fmt(summary.get('test_ll'), '.4f')} "
            f"test_bpd={_fmt(summary.get('test_bpd'), '.4f')} "
            f"hessian_trace_exact={_fmt(summary.get('hessian_trace_exact'), LAMBDA)} "
            f"lambda_max={_fmt(summary.get('lambda_max'), FINAL_LAMBDA)}"
        )
    else:
        line = (
            f"{head}: test_acc={_fmt(summary.get('test_acc'), FINAL)} "
            f"test_ece={_fmt(summary.get('test_ece'), FINAL)} "
            f"lambda_max={_fmt(summary.get('lambda_max'), FINAL_LAMBDA)}"
        )
    if summary.get("avg_test_acc") is not None:  # the averaged weights (SWA, EMA)
        line += (
            f" avg_test_acc={_fmt(summary.get('avg_test_acc'), FINAL)} "
            f"avg_test_ece={_fmt(summary.get('avg_test_ece'), FINAL)} "
            f"avg_lambda_max={_fmt(summary.get('avg_lambda_max'), FINAL_LAMBDA)}"
        )
    line += f"  ({run_dir})"
    if summary.get("error"):
        line += f"\n  {summary['error']}"
    print(line, flush=True)
