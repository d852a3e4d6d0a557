"""Loss and accuracy at many points of parameter space, with one model object moved in place.

At each point: the training subset (on the device, in batches of ``batch_size``: by default
all 4,096 samples of the default subset in one forward) and the test set (the run's own test
batches, as its test evaluation runs them). The loss is the run's criterion, computed as the
run's test evaluation computes ``test_loss`` (logits cast to float32 and concatenated, then the
mean per-sample loss), in eval mode: at the run's own weights the values are the run's own,
bit for bit. Where the logits are not finite the accuracy is NaN, as the loss is. The four
numbers of each point stay on the device until a sweep of points ends (no host
synchronisation per point).

BatchNorm (``bn``): ``eval`` normalises with the running statistics the weights came with
(interpolated along with the weights between two runs); ``recompute`` recomputes them at each
point from scratch: BatchNorm layers (only they) in train mode, momentum None (the cumulative
average of the batch statistics), forwards over ``bn_samples`` training samples without
augmentation in batches of the run's ``dataset.batch_size``, no gradient, no weight update;
then eval mode. Jordan et al. (2023) showed that this reset is what interpolated BatchNorm
networks need; its sample count and batches are our choices.

Image folders: both subsets (the evaluated one, and the BatchNorm one, drawn with seed + 1)
are kept in ``<run>/cache`` the first time they are decoded, and read back after.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from ..losses import token_pairs
from ..module_state import modes_restored
from ..progress import Counter
from .files import COLUMNS

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

    import numpy as np

    from ..rebuild import LoadedRun

__all__ = ["COLUMNS", "BN_MODES", "Evaluator", "progress_bar"]
BN_MODES = ("eval", "recompute")
BN_OFFSET = 1  # the BatchNorm samples: the subset drawn with seed + 1 (not the evaluated one)


def progress_bar(total: int, desc: str, mode: str, unit: str = "points") -> Counter:
    """Progress over ``total`` points (``trainer.progress``, the rule of progress.py): a tqdm bar
    on stderr, a line at the first point and every tenth (``lines``: a log, nohup), or nothing."""
    return Counter(total, desc, mode, "sam-landscape", unit)


class Evaluator:
    """The four numbers of ``COLUMNS`` at whatever weights ``run.model`` holds; ``sweep`` moves
    the model through a list of points and puts its weights back afterwards."""

    def __init__(
        self,
        run: LoadedRun,
        train_samples: int,
        batch_size: int,
        bn: str = "eval",
        bn_samples: int = 4096,
    ) -> None:
        self.run, self.model, self.bn = run, run.model, bn
        # an image folder's subsets go through the run's cache: decoded once, then read back
        x, y = run.train_subset(train_samples, keep=True)
        self.subset = (x, y)
        self.train = ([x[i : i + batch_size] for i in range(0, len(y), batch_size)], y)
        test = [(tx, ty) for tx, ty, _ in run.data.test]
        self.test = ([tx for tx, _ in test], torch.cat([ty for _, ty in test]))
        self.criterion, self.autocast = run.criterion(), run.autocast()
        self.bn_layers = [m for m in self.model.modules() if isinstance(m, _BatchNorm)]
        self.bn_inputs = []
        if bn == "recompute" and self.bn_layers:
            bx, _ = run.train_subset(bn_samples, BN_OFFSET, keep=True)
            step = int(run.cfg.dataset.batch_size)
            self.bn_inputs = [bx[i : i + step] for i in range(0, len(bx), step)]
        state = self.model.state_dict()
        # every floating-point tensor (parameters and BatchNorm statistics), in state-dict order
        self.names = [k for k, v in state.items() if v.is_floating_point()]
        self.floats = [state[k] for k in self.names]
        self.saved = [t.clone() for t in self.floats]
        self.counters = [(state[k], state[k].clone()) for k in state if k not in self.names]
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.theta = [p.detach().clone() for p in self.params]

    @property
    def sizes(self) -> dict:
        """The numbers of training and test samples the values are measured on."""
        return {"train_samples": len(self.train[1]), "test_samples": len(self.test[1])}

    @torch.no_grad()
    def measure(self) -> torch.Tensor:
        """[train_loss, test_loss, train_acc, test_acc] at the current weights, on the device."""
        if self.bn_inputs:
            self.recompute_bn()
        loss, acc = [], []
        for xs, y in (self.train, self.test):
            with self.autocast:
                logits = torch.cat([self.model(x).float() for x in xs])
            loss.append(self.criterion(logits, y).mean())
            # non-finite logits (extrapolated BatchNorm variances below 0) predict nothing: the
            # accuracy is undefined there, as the loss is, not argmax's class 0
            flat, labels = token_pairs(logits, y)  # a sequence model's: per token
            hits = (flat.argmax(1) == labels).float().mean()
            acc.append(torch.where(torch.isfinite(logits).all(), hits, torch.nan))
        return torch.stack(loss + acc)

    @torch.no_grad()
    def recompute_bn(self) -> None:
        """BatchNorm running statistics from scratch at the current weights (see the module)."""
        momenta = [m.momentum for m in self.bn_layers]
        with modes_restored(self.model):
            for m in self.bn_layers:
                m.reset_running_stats()
                m.momentum = None
                m.train()
            with self.autocast:
                for x in self.bn_inputs:
                    self.model(x)
        for m, momentum in zip(self.bn_layers, momenta):
            m.momentum = momentum

    @torch.no_grad()
    def sweep(
        self,
        points: Sequence | np.ndarray,
        place: Callable[[Any], None],
        desc: str = "",
        progress: str = "auto",
    ) -> np.ndarray:
        """``place(point)`` then ``measure()`` for each point: a float64 array [points, 4]; the
        model's weights and statistics are put back afterwards."""
        values = torch.empty(len(points), len(COLUMNS), device=self.theta[0].device)
        bar = progress_bar(len(points), desc, progress)
        try:
            for i, point in enumerate(points):
                place(point)
                values[i] = self.measure()
                bar.update(1)
        finally:
            bar.close()
            self.restore()
        return values.double().cpu().numpy()

    @torch.no_grad()
    def restore(self) -> None:
        """The weights and statistics the model had when this evaluator was made."""
        torch._foreach_copy_(self.floats, self.saved)
        for t, saved in self.counters:  # BatchNorm's num_batches_tracked
            t.copy_(saved)

    # ------------------------------------------------------------------ where the model is put
    @torch.no_grad()
    def move(self, directions: Sequence[Sequence[torch.Tensor]], coords: Sequence[float]) -> None:
        """θ = θ₀ + Σ cᵢ dᵢ on the trainable parameters (a zero coordinate adds nothing: at the
        origin the weights are θ₀ exactly)."""
        torch._foreach_copy_(self.params, self.theta)
        for d, c in zip(directions, coords):
            if c != 0:
                torch._foreach_add_(self.params, d, alpha=float(c))

    @torch.no_grad()
    def mix(self, a: list, b: list, alpha: float) -> None:
        """Every floating-point tensor (1 − α)·a + α·b (lerp: exactly a at 0 and b at 1)."""
        torch._foreach_copy_(self.floats, a)
        if alpha != 0:
            torch._foreach_lerp_(self.floats, b, float(alpha))

    def state_list(self, state: dict) -> list:
        """A state dict's floating-point tensors in this model's order, on its device."""
        device = self.theta[0].device
        return [state[k].to(device=device, dtype=t.dtype) for k, t in zip(self.names, self.floats)]
