"""Training losses (``trainer.loss=<name>``): per-example losses from logits and integer labels,
or soft targets (N, classes) where MixUp/CutMix mixed the batch.

Everything that uses the loss takes it from here: the training passes (per example, for the
samplers and CSAM), the test loss, the Hessian and every sharpness measure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .errors import require
from .registry import LOSSES

if TYPE_CHECKING:
    from collections.abc import Callable


def token_pairs(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [N, C], targets) of any model's output: a sequence model's ``[B, T, V]`` logits
    against ``[B, T]`` targets are the B·T next-token predictions, flattened (every loss and
    measure is then per token); against one label per sequence ``[B]`` (modular arithmetic),
    the last position's prediction. Class logits ``[N, C]`` pass as they are."""
    if logits.dim() != 3:
        return logits, targets
    if targets.dim() == 2 and not targets.is_floating_point():
        return logits.reshape(-1, logits.shape[-1]), targets.reshape(-1)
    return logits[:, -1], targets


def per_sequence(
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """A per-example loss whose example is a whole sequence: a sequence model's per-token losses
    averaged over each window (``[B]``; their mean is the per-token mean, every window being
    equally long), so that what selects or weighs examples (ESAM, CSAM, samplers) sees
    windows."""

    def wrapped(logits, targets):
        rows = loss(*token_pairs(logits, targets))
        if logits.dim() == 3 and rows.numel() == targets.numel() and targets.dim() == 2:
            return rows.view(targets.shape).mean(dim=1)
        return rows

    return wrapped


@LOSSES.register("cross_entropy", "softmax cross-entropy (trainer.label_smoothing applies)")
def cross_entropy(
    label_smoothing: float = 0.0,
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The per-example softmax cross-entropy (hard or soft targets), with ``label_smoothing``."""

    def loss(logits, targets):
        # soft targets: F.cross_entropy takes class probabilities as they are
        targets = targets.float() if targets.is_floating_point() else targets
        if logits.dtype != torch.float32:  # a no-op cast is still a dispatch, every pass
            logits = logits.float()
        return F.cross_entropy(logits, targets, label_smoothing=label_smoothing, reduction="none")

    return per_sequence(loss)


@LOSSES.register("mse", "½‖f(x) − e_y‖² per example, on one-hot targets (as Cohen et al. 2021)")
def mse(label_smoothing: float = 0.0) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The per-example ½‖f(x) − e_y‖² on one-hot targets (no label smoothing)."""
    require(
        label_smoothing == 0,
        f"trainer.label_smoothing={label_smoothing} does not apply to "
        "trainer.loss=mse (one-hot targets); set it to 0",
    )

    def loss(logits, targets):
        logits = logits.float()
        return 0.5 * (logits - target_vectors(targets, logits)).square().sum(dim=1)

    return per_sequence(loss)


@LOSSES.register(
    "nll", "−log p(x) per example of a density model (model=pc; the labels are not read)"
)
def nll(label_smoothing: float = 0.0) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The per-example −log p(x) of a density model's outputs (the labels are not read; no label
    smoothing)."""
    require(
        label_smoothing == 0,
        f"trainer.label_smoothing={label_smoothing} does not apply to trainer.loss=nll "
        "(no labels); set it to 0",
    )

    def loss(log_likelihood, _targets):
        return -log_likelihood.float()

    return loss


def target_vectors(targets: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """One-hot vectors of integer labels; soft targets (N, classes) as they are."""
    if targets.is_floating_point():
        return targets.to(logits.dtype)
    return F.one_hot(targets, logits.shape[1]).to(logits.dtype)


def per_example(
    name: str, label_smoothing: float = 0.0
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The per-example loss ``trainer.loss`` names (label smoothing for training only)."""
    return LOSSES.build(name, label_smoothing)


def mean_loss(name: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """The loss measurements use: the mean over examples, never label-smoothed."""
    per = per_example(name)

    def loss(logits, targets):
        return per(logits, targets).mean()

    return loss


def skew_jsd(p: torch.Tensor, q: torch.Tensor, alpha: float) -> torch.Tensor:
    """The α-skew Jensen–Shannon divergence of two ``[N, C]`` probability tensors, one value per
    row: α·KL(p‖m) + (1−α)·KL(q‖m), m = αp + (1−α)q, natural log (α = ½: the Jensen–Shannon
    divergence). Zero probabilities contribute 0 (x log x → 0)."""
    m = alpha * p + (1 - alpha) * q

    def kl_to_m(a):
        return (torch.xlogy(a, a) - torch.xlogy(a, m)).sum(dim=-1)

    return alpha * kl_to_m(p) + (1 - alpha) * kl_to_m(q)


def distillation_loss(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, temperature: float
) -> torch.Tensor:
    """Hinton et al.'s distillation term: T²·KL(softmax(t/T) ‖ softmax(s/T)), the batch mean (in
    float32 at least: half-precision logits are promoted). The T² keeps its gradient's scale
    comparable to the task loss's as T changes."""
    targets = distillation_targets(teacher_logits, temperature)
    return distillation_loss_to(student_logits, targets, temperature)


def distillation_targets(
    teacher_logits: torch.Tensor, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's half of ``distillation_loss``: its soft targets p = softmax(t/T) (float32 at
    least) and each row's Σ p·log p (minus its entropy). A distilled step computes them once and
    every pass of the step reuses them (``distillation_loss_to``), or the rows it runs on
    (``select_targets``: ESAM's descent pass)."""
    dtype = torch.promote_types(teacher_logits.dtype, torch.float32)
    log_t = F.log_softmax(teacher_logits.to(dtype) / float(temperature), dim=1)
    p = log_t.exp()
    return p, (p * log_t).sum(dim=1)


def select_targets(
    targets: tuple[torch.Tensor, torch.Tensor], rows: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``distillation_targets`` of the rows ``rows`` (an index or mask) alone."""
    p, neg_entropy = targets
    return p[rows], neg_entropy[rows]


def distillation_loss_to(
    student_logits: torch.Tensor, targets: tuple[torch.Tensor, torch.Tensor], temperature: float
) -> torch.Tensor:
    """``distillation_loss`` against the teacher's ``distillation_targets``: T²·(the soft-target
    cross-entropy − the teacher's entropy). One fused cross-entropy instead of the KL's separate
    operations; its gradient in the student's logits is bit for bit the KL's (the entropy is a
    constant), only the value's last bits differ from summing p·(log p − log q)."""
    p, neg_entropy = targets
    dtype = torch.promote_types(torch.promote_types(student_logits.dtype, torch.float32), p.dtype)
    t = float(temperature)
    soft_ce = F.cross_entropy(student_logits.to(dtype) / t, p.to(dtype))
    return t * t * (soft_ce + neg_entropy.mean())
