"""A quadratic Bézier curve between two runs, φ(t) = (1 − t)²·θ_A + 2t(1 − t)·θ_C + t²·θ_B,
whose control point θ_C is trained (Garipov et al. 2018): θ_C starts at the midpoint of the
end points, and each step draws t ~ U(0, 1) and descends the loss at φ(t) with respect to θ_C.

The training is the runner's: run A's training batches (its loader, augmentation and labels),
its optimizer group built by ``build_optimizer`` over a model that holds θ_C (so a SAM variant
perturbs θ_C, and its ε moves φ(t) by 2t(1 − t)·ε), its scheduler over the curve's epochs and
its closure style (zero the gradients, forward, per-sample loss, the variant's
``reduce_loss``, backward). The curve is trained in the mode it is evaluated in (our choice):
with ``landscape.bn=eval`` BatchNorm normalises with statistics blended like the weights
(θ_C's are the end points' mean, so along the curve they are (1 − t)·A + t·B) and other modules
(dropout) train as usual; with ``landscape.bn=recompute`` BatchNorm uses batch statistics in
training, as Garipov et al. do, and the evaluation recomputes the running statistics at each t.
t's draws come from ``landscape.seed``. It is evaluated at the points of the α grid in [0, 1].

Weight decay, as Garipov et al. train curves: on the curve point, not on θ_C. The base
optimizer is built with weight decay 0, and the run's ``base_optimizer.weight_decay`` w enters
the loss as ½·w·‖φ(t)‖² over the trainable parameters (its gradient in θ_C is
w·2t(1 − t)·φ(t)). Under a SAM variant the penalty enters the gradient ε is built from only
with ``optimizer.perturb_with_weight_decay=true``, as in training (default: ε from the loss's
gradient alone); the descent pass always has it. The epoch losses reported are of that
penalised loss at θ_C, the one descended.
"""

from __future__ import annotations

import copy
import functools
from typing import TYPE_CHECKING

import numpy as np
import torch
from omegaconf import OmegaConf
from torch.nn.modules.batchnorm import _BatchNorm

from ..module_state import frozen_running_stats
from ..optim.build import build_optimizer
from ..schedulers import build_scheduler
from .evaluate import COLUMNS, Evaluator, progress_bar
from .geometry import barrier

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractContextManager

    from omegaconf import DictConfig
    from torch import nn

    from ..optim.engine import SharpnessAware
    from ..rebuild import LoadedRun
    from .options import Options


def weights(t: float) -> tuple[float, float, float]:
    """The quadratic Bernstein weights of (θ_A, θ_C, θ_B) at ``t``."""
    return (1 - t) ** 2, 2 * t * (1 - t), t**2


class BezierCurve:
    """The end points (lists of tensors in the evaluator's order) and a model holding θ_C."""

    def __init__(self, ev: Evaluator, state_a: dict, state_b: dict) -> None:
        self.names = ev.names
        self.a, self.b = ev.state_list(state_a), ev.state_list(state_b)
        self.control = copy.deepcopy(ev.model)  # once: the curve's one trainable model
        own = self.control.state_dict()
        self.c = [own[k] for k in self.names]
        with torch.no_grad():
            torch._foreach_copy_(self.c, self.a)
            torch._foreach_lerp_(self.c, self.b, 0.5)

    def point(self, t: float) -> dict:
        """φ(t) by name (parameters and floating buffers), differentiable in θ_C."""
        wa, wc, wb = weights(t)
        named = dict(self.control.named_parameters())
        named.update({n: b for n, b in self.control.named_buffers()})
        return {n: wa * a + wc * named[n] + wb * b for n, a, b in zip(self.names, self.a, self.b)}

    def forward(self, x: torch.Tensor, t: float) -> torch.Tensor:
        """The model at φ(t), differentiable in θ_C."""
        return torch.func.functional_call(self.control, self.point(t), (x,))

    def squared_norm(self, t: float) -> torch.Tensor:
        """‖φ(t)‖² over the trainable parameters (what weight decay acts on)."""
        trainable = {n for n, p in self.control.named_parameters() if p.requires_grad}
        return sum(v.square().sum() for n, v in self.point(t).items() if n in trainable)

    @torch.no_grad()
    def place(self, ev: Evaluator, t: float) -> None:
        """The evaluator's model at φ(t) (exactly θ_A at 0 and θ_B at 1)."""
        wa, wc, wb = weights(t)
        torch._foreach_copy_(ev.floats, self.a)
        torch._foreach_mul_(ev.floats, wa)
        torch._foreach_add_(ev.floats, self.c, alpha=wc)
        torch._foreach_add_(ev.floats, self.b, alpha=wb)


def curve_optimizer(
    cfg: DictConfig, control: nn.Module, total_steps: int, steps_per_epoch: int | None = None
) -> tuple[SharpnessAware, float]:
    """(the run's optimizer over θ_C with weight decay 0, the run's weight decay: the penalty's);
    ``steps_per_epoch`` places a ``perturb_from`` given as an epoch in the curve's epochs."""
    wd = float(cfg.base_optimizer.get("weight_decay", 0.0) or 0.0)
    without = copy.deepcopy(cfg)
    OmegaConf.update(without, "base_optimizer.weight_decay", 0.0, force_add=True)
    return build_optimizer(without, control, total_steps, steps_per_epoch=steps_per_epoch), wd


def _closure(optimizer, curve, criterion, autocast, scaler, wd, x, y, t):
    optimizer.zero_grad(set_to_none=True)
    x, y = optimizer.select_rows(x, y)  # all rows, except in ESAM's descent pass
    with autocast:
        out = curve.forward(x, t)
    per_sample = criterion(out.float(), y)
    loss = optimizer.reduce_loss(per_sample, out, y)
    if not wd:
        scaler.scale(loss).backward()
        return loss.detach()
    # Garipov et al.'s weight decay: on the curve point φ(t). A SAM variant's ascent pass (the
    # gradient ε is built from) leaves it out unless perturb_with_weight_decay, as in training
    penalised = loss + 0.5 * wd * curve.squared_norm(t)
    ascent = getattr(optimizer, "last_perturbed", False) and optimizer.pass_index == 0
    plain = ascent and not getattr(optimizer, "perturb_with_weight_decay", False)
    scaler.scale(loss if plain else penalised).backward()
    return penalised.detach()


def curve_step(
    optimizer: SharpnessAware,
    curve: BezierCurve,
    criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    autocast: AbstractContextManager,
    scaler: torch.amp.GradScaler,
    wd: float,
    x: torch.Tensor,
    y: torch.Tensor,
    t: float,
) -> torch.Tensor:
    """One step of θ_C on the batch (x, y) at t; the penalised loss before the step."""
    step = functools.partial(_closure, optimizer, curve, criterion, autocast, scaler, wd)
    return optimizer.step(functools.partial(step, x, y, t))


def train_curve(run: LoadedRun, curve: BezierCurve, epochs: int, opt: Options) -> list[float]:
    """Train θ_C for ``epochs`` epochs of run A's data; the mean training loss of each epoch."""
    cfg, data, control = run.cfg, run.data, curve.control
    per_epoch = len(data.train)
    optimizer, wd = curve_optimizer(cfg, control, per_epoch * epochs, per_epoch)
    scheduler = build_scheduler(cfg.scheduler, optimizer, per_epoch, per_epoch * epochs)
    scaler = torch.amp.GradScaler(run.device.type, enabled=cfg.trainer.precision == "fp16")
    optimizer.bind(
        model=control, grad_scaler=scaler, clip_grad_norm=cfg.trainer.get("gradient_clip")
    )
    criterion, autocast = run.criterion(), run.autocast()
    draws = torch.Generator().manual_seed(int(opt.seed))
    control.train()
    for m in control.modules():
        if isinstance(m, _BatchNorm) and opt.bn == "eval":
            m.eval()
    bar, losses = (
        progress_bar(per_epoch * epochs, "Bézier curve training", opt.progress, "steps"),
        [],
    )
    with frozen_running_stats(control.modules()):
        for epoch in range(1, epochs + 1):
            data.train.set_epoch(epoch)
            total = torch.zeros((), device=run.device)
            for x, y, _ in data.train:
                t = float(torch.rand((), generator=draws))
                total += curve_step(optimizer, curve, criterion, autocast, scaler, wd, x, y, t)
                scheduler.step()
                scaler.update()
                bar.update(1)
            losses.append(float(total) / per_epoch)
    bar.close()
    control.eval()
    return losses


def bezier_curve(
    run_a: LoadedRun,
    run_b: LoadedRun,
    ev: Evaluator,
    opt: Options,
    alphas: np.ndarray,
    line_values: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, dict]:
    """Train the curve, evaluate it at the α grid's points in [0, 1]: (t, values, summary)."""
    epochs = opt.curve_epochs or int(run_a.cfg.trainer.epochs)
    curve = BezierCurve(ev, run_a.state, run_b.state)
    losses = train_curve(run_a, curve, epochs, opt)
    a = np.asarray(alphas)
    inside = (a >= 0) & (a <= 1)
    ts = a[inside]
    values = ev.sweep(ts, lambda t: curve.place(ev, t), "Bézier curve points", opt.progress)
    line_inside = line_values[inside]
    summary = {"kind": "quadratic Bézier", "epochs": epochs, "epoch_train_loss": losses}
    for k, name in enumerate(COLUMNS):
        series = values[:, k] if name.endswith("loss") else 1 - values[:, k]
        key = name.replace("acc", "error")
        summary[f"barrier_{key}"] = barrier(ts, series)["barrier"]
        summary[f"mean_{key}"] = float(np.mean(series))
        line_series = line_inside[:, k] if name.endswith("loss") else 1 - line_inside[:, k]
        summary[f"line_mean_{key}"] = float(np.mean(line_series))
    return ts, values, summary
