"""What an evaluation line holds of the training pass, the test set and the validation split."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..losses import token_pairs
from ..metrics.evaluate import evaluate, token_values
from ..rundir import METRICS
from ..settings import objective_keys

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractContextManager

    from omegaconf import DictConfig
    from torch import nn

    from ..data import Data
    from ..distributed import Topology


FOLD_COUNTS = 32  # steps whose predictions wait to be compared with their labels in one go


def count_correct(logits: torch.Tensor, labels: torch.Tensor, counts: dict) -> None:
    """Add a micro-batch's predictions, beside its labels, to ``counts["predicted"]``, and its
    targets to ``counts["targets"]`` (per predicted position for a sequence model), on the
    device. ``EpochStats`` compares and sums the predictions of many steps at once."""
    pred, labels = token_pairs(logits, labels)
    counts.setdefault("predicted", []).append((pred.argmax(1), labels))
    counts["targets"] += labels.shape[0]


class EpochStats:
    """The training loss and accuracy of one epoch, summed on the device (no host sync per step),
    and the first step whose loss was not finite."""

    def __init__(self, device: torch.device, dist: Topology) -> None:
        self.dist = dist
        self.loss_sum = torch.zeros((), device=device)
        self.correct = torch.zeros((), device=device)
        self.seen, self.batches = 0, 0  # samples and batches of the epoch so far
        self.first_bad = torch.full((), -1, dtype=torch.long, device=device)
        self._predicted: list = []  # (predictions, labels) not yet counted into ``correct``
        self._losses: list = []  # the losses of consecutive steps not yet checked for finiteness
        self._first_waiting = 0  # the step of the first of them

    def add(self, loss: torch.Tensor, predicted: list, n: int, step: int) -> None:
        """One step's mean loss over its ``n`` samples and its (predictions, labels) pairs
        (``count_correct``'s); the pairs counted and the losses checked for finiteness every
        FOLD_COUNTS steps and whenever read."""
        if self._losses and step != self._first_waiting + len(self._losses):
            self.check_losses()  # not the next step (a resumed epoch): those waiting first
        if not self._losses:
            self._first_waiting = step
        loss = loss.detach() if loss.requires_grad else loss  # a detach is an op, every step
        self._losses.append(loss)
        self.loss_sum += loss * n
        self._predicted += predicted
        if len(self._losses) >= FOLD_COUNTS or len(self._predicted) >= FOLD_COUNTS:
            self.count_predicted()
            self.check_losses()
        self.seen += n
        self.batches += 1

    def count_predicted(self) -> torch.Tensor:
        """``correct``, the waiting predictions counted in: one compare and one sum for all of
        them, not three kernels a step (the same integer count)."""
        if self._predicted:
            preds, labels = zip(*self._predicted)
            self._predicted = []
            self.correct += (torch.cat(preds) == torch.cat(labels)).sum()
        return self.correct

    def check_losses(self) -> None:
        """``first_bad`` with the waiting steps checked: the first of them whose loss was not
        finite (one check for them all, not five kernels a step)."""
        if not self._losses:
            return
        bad = ~torch.isfinite(torch.stack(self._losses))
        self._losses = []
        first = self._first_waiting + torch.argmax(bad.int())  # the first True
        self.first_bad = torch.where((self.first_bad < 0) & bad.any(), first, self.first_bad)

    def state_dict(self) -> dict:
        """The epoch's sums so far (a checkpoint within the epoch)."""
        keys = ("loss_sum", "correct", "seen", "first_bad", "batches")
        self.count_predicted()
        self.check_losses()
        return {k: v.cpu() if torch.is_tensor(v) else v for k, v in vars(self).items() if k in keys}

    def load_state_dict(self, state: dict) -> None:
        """The sums ``state_dict`` saved, on this device."""
        device = self.loss_sum.device
        self.loss_sum, self.correct = state["loss_sum"].to(device), state["correct"].to(device)
        self.seen, self.first_bad = int(state["seen"]), state["first_bad"].to(device)
        self.batches = int(state["batches"])

    def diverged_at(self) -> int | None:
        """The first non-finite step of any process, or None (an all-reduce: every process
        agrees)."""
        self.check_losses()
        bad = int(self.dist.max(self.first_bad))
        return bad if bad >= 0 else None

    def log_values(self) -> dict:
        """``train_loss`` and ``train_acc`` of the epoch so far, over every process."""
        # the samples counted on every process (one whose passes count none, in a variant's
        # process roles, adds 0): one all-reduce, none on one process
        seen = int(self.dist.sum(torch.tensor(self.seen, device=self.loss_sum.device)))
        self.count_predicted()
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

    def __init__(
        self,
        net: nn.Module,
        data: Data,
        criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        autocast: AbstractContextManager,
        dist: Topology,
        metrics_cfg: DictConfig,
    ) -> None:
        self.net, self.data, self.criterion = net, data, criterion
        self.autocast, self.dist, self.metrics_cfg = autocast, dist, metrics_cfg
        self.reliability = None

    def log_values(self) -> dict:
        """The test_* keys of the model being trained (perplexity too, on token sequences)."""
        d = self.data
        row = evaluate(self.net, d.test, self.criterion, self.autocast, self.dist,
                       self.metrics_cfg, d.class_counts)  # fmt: skip
        self.reliability = row.pop("reliability", None)  # diagram bins go to summary.json only
        if len(d.input_shape) == 1:  # token sequences: perplexity and bits per token
            row.update(token_values(row["test_loss"]))
        return row

    def measure(self, model: nn.Module) -> dict:
        """The test-set keys of another model (the averaged weights)."""
        return evaluate(model, self.data.test, self.criterion, self.autocast, self.dist,
                        self.metrics_cfg)  # fmt: skip


class ValSet(TestSet):
    """The validation-split keys of an evaluated metrics line (none without
    ``dataset.val_split``) and, for summary.json, the final and the best validation accuracy with
    its epoch."""

    KEYS = ("loss", "acc", "ece", "nll")

    def log_values(self) -> dict:
        """The val_* keys (none without a validation split)."""
        if self.data.val is None:
            return {}
        row = evaluate(self.net, self.data.val, self.criterion, self.autocast, self.dist,
                       self.metrics_cfg)  # fmt: skip
        out = {f"val_{k}": row[f"test_{k}"] for k in self.KEYS}
        if len(self.data.input_shape) == 1:
            out.update(token_values(row["test_loss"], "val"))
        return out

    def summary_values(self, cfg: DictConfig, run_dir: Path) -> dict:
        """The objective, and the final and best ``val_acc`` (with its epoch) of metrics.jsonl."""
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
