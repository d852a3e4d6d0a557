"""Progress output: a tqdm bar per epoch on a terminal, one line per epoch otherwise."""

from __future__ import annotations

import sys


def _mode(mode: str) -> str:
    if mode == "auto":
        return "bar" if sys.stderr.isatty() else "lines"
    return mode


class _NoBar:
    def update(self, *a):
        pass

    def close(self):
        pass


class _Bar:
    """tqdm over the steps of an epoch; the loss/accuracy postfix is refreshed every 20 steps
    (reading them costs a device sync)."""

    def __init__(self, epoch, epochs, steps):
        from tqdm import tqdm

        self.bar = tqdm(
            total=steps,
            desc=f"epoch {epoch}/{epochs}",
            leave=False,
            dynamic_ncols=True,
            file=sys.stderr,
        )
        self.n = 0

    def update(self, loss_sum, correct, seen):
        self.n += 1
        self.bar.update(1)
        if self.n % 20 == 0:
            self.bar.set_postfix(
                loss=f"{float(loss_sum) / seen:.4f}", acc=f"{float(correct) / seen:.3f}"
            )

    def close(self):
        self.bar.close()


class Progress:
    def __init__(self, mode: str, epochs: int, steps: int, enabled: bool = True):
        self.mode = _mode(mode) if enabled else "none"
        self.epochs, self.steps = epochs, steps

    def epoch_bar(self, epoch):
        return _Bar(epoch, self.epochs, self.steps) if self.mode == "bar" else _NoBar()

    def epoch_line(self, row: dict) -> None:
        if self.mode == "none":
            return
        parts = [
            f"epoch {row['epoch']}/{self.epochs}",
            f"train_loss {row['train_loss']:.4f}",
            f"train_acc {row['train_acc']:.4f}",
            f"test_acc {row['test_acc']:.4f}",
            f"test_ece {row['test_ece']:.4f}",
        ]
        if row.get("lambda_max") is not None:
            parts.append(f"lambda_max {row['lambda_max']:.4g}")
        parts.append(f"elapsed {row['time_s']:.1f}s")
        print(" | ".join(parts), file=sys.stderr, flush=True)

    def note(self, text: str) -> None:
        """One line about what the run is doing (between epoch lines, e.g. a long measurement)."""
        if self.mode != "none":
            print(text, file=sys.stderr, flush=True)


def _fmt(v, spec):
    return "n/a" if v is None else format(v, spec)


def print_final(summary: dict, run_dir, already: bool = False) -> None:
    head = "already completed" if already else summary.get("status", "?")
    line = (
        f"{head}: test_acc={_fmt(summary.get('test_acc'), '.4f')} "
        f"test_ece={_fmt(summary.get('test_ece'), '.4f')} "
        f"lambda_max={_fmt(summary.get('lambda_max'), '.4g')}  ({run_dir})"
    )
    if summary.get("error"):
        line += f"\n  {summary['error']}"
    print(line, flush=True)
