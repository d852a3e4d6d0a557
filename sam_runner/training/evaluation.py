"""What an evaluation line holds of the training pass, the test set and the validation split."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..metrics.evaluate import evaluate, token_values
from ..rundir import METRICS
from ..settings import objective_keys


class EpochStats:
    """The training loss and accuracy of one epoch, summed on the device (no host sync per step),
    and the first step whose loss was not finite."""

    def __init__(self, device, dist):
        self.dist = dist
        self.loss_sum = torch.zeros((), device=device)
        self.correct = torch.zeros((), device=device)
        self.seen = 0
        self.first_bad = torch.full((), -1, dtype=torch.long, device=device)

    def add(self, loss, correct, n: int, step: int) -> None:
        self.first_bad = torch.where(
            (self.first_bad < 0) & ~torch.isfinite(loss), step, self.first_bad
        )
        self.loss_sum += loss.detach() * n
        self.correct += correct
        self.seen += n

    def diverged_at(self) -> int | None:
        """The first non-finite step of any process, or None (an all-reduce: every process
        agrees)."""
        bad = int(self.dist.max(self.first_bad))
        return bad if bad >= 0 else None

    def log_values(self) -> dict:
        seen = self.seen * self.dist.world  # every process saw an equal share of each global batch
        return {
            "train_loss": float(self.dist.sum(self.loss_sum) / seen),
            "train_acc": float(self.dist.sum(self.correct) / seen),
        }


class TestSet:
    """The test-set keys of an evaluated metrics line (and the reliability bins, for
    summary.json).

    Args:
        net: the model as trained (DDP-wrapped when parallel).
        data: the run's data.
        criterion: the per-example loss.
        autocast: the training precision's autocast context.
        dist: the run's processes.
        metrics_cfg: the ``metrics`` group.
    """

    def __init__(self, net, data, criterion, autocast, dist, metrics_cfg):
        self.net, self.data, self.criterion = net, data, criterion
        self.autocast, self.dist, self.metrics_cfg = autocast, dist, metrics_cfg
        self.reliability = None

    def log_values(self) -> dict:
        d = self.data
        row = evaluate(self.net, d.test, self.criterion, self.autocast, self.dist,
                       self.metrics_cfg, d.class_counts)  # fmt: skip
        self.reliability = row.pop("reliability", None)  # diagram bins go to summary.json only
        if len(d.input_shape) == 1:  # token sequences: perplexity and bits per token
            row.update(token_values(row["test_loss"]))
        return row

    def measure(self, model) -> dict:
        """The test-set keys of another model (the averaged weights)."""
        return evaluate(model, self.data.test, self.criterion, self.autocast, self.dist,
                        self.metrics_cfg)  # fmt: skip


class ValSet(TestSet):
    """The validation-split keys of an evaluated metrics line (none without
    ``dataset.val_split``) and, for summary.json, the final and the best validation accuracy with
    its epoch."""

    KEYS = ("loss", "acc", "ece", "nll")

    def log_values(self) -> dict:
        if self.data.val is None:
            return {}
        row = evaluate(self.net, self.data.val, self.criterion, self.autocast, self.dist,
                       self.metrics_cfg)  # fmt: skip
        out = {f"val_{k}": row[f"test_{k}"] for k in self.KEYS}
        if len(self.data.input_shape) == 1:
            out.update(token_values(row["test_loss"], "val"))
        return out

    def summary_values(self, cfg, run_dir: Path) -> dict:
        keys, out = objective_keys(cfg), {}
        if keys:  # a model chosen on test data is no held-out result: say so
            on_test = any(k.startswith("test_") for k in keys)
            out.update(objective=keys[0] if len(keys) == 1 else keys, selected_on_test=on_test)
        path = run_dir / METRICS  # every evaluation, resumed runs' included
        lines = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
        lines = [x for x in lines if isinstance(x.get("val_acc"), (int, float))]
        if lines:
            best = max(lines, key=lambda x: x["val_acc"])  # the first of equals: the earliest
            out.update(
                val_acc=lines[-1]["val_acc"],
                best_val_acc=best["val_acc"],
                best_val_epoch=best["epoch"],
            )
        return out
