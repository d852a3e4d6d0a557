"""Knowledge distillation from a trained run (``trainer.distill.*``; docs/distillation.md).

The teacher is rebuilt from a completed run folder (its config and its final or averaged
weights; the folder is only read), frozen and in eval mode. Its forward runs once per training
step, under no_grad, before the optimizer's step, and every pass of the step (both of SAM's,
any variant's) reuses its logits and features: SAM never perturbs it. Each micro-batch's
objective is

    (1 − w)·task + w·T²·KL(softmax(t/T) ‖ softmax(s/T)) + a·alignment

with the logged training loss the task's. ``align`` a > 0 adds our TALAS-style relational
alignment: at matched relative depths (the middle conv/linear layer, and the head's input, the
final embedding), the student's and teacher's batch similarity matrices (cosines between the
samples' pooled features, [B, B]) are matched by their mean squared difference. Comparing the
geometry of the batch needs no projection between different widths, so nothing is added to the
optimizer, the checkpoint or data-parallel synchronisation.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from .adapters import attach_adapters
from .data.sources import data_shape
from .errors import UserError, number, require
from .losses import distillation_loss_to, distillation_targets, select_targets
from .models import build_model, without_download
from .part import Part, PassInputs
from .rundir import CHECKPOINT, RunDir, check_weights, model_state
from .weight_decay import tracked_layers

if TYPE_CHECKING:
    from collections.abc import Iterator
    from contextlib import AbstractContextManager

    from omegaconf import DictConfig
    from torch import nn

    from .data import Data
    from .part import Run

KEY = "trainer.distill.teacher"


def settings(cfg: DictConfig) -> dict | None:
    """``trainer.distill``'s keys, checked (None when no teacher is set)."""
    d = cfg.trainer.get("distill") or {}
    temperature = number("trainer.distill.temperature", d.get("temperature", 4.0),
                         "a finite number > 0", lambda t: 0 < t < math.inf)  # fmt: skip
    weight = number("trainer.distill.weight", d.get("weight", 0.5), "a number in [0, 1]",
                    lambda w: 0 <= w <= 1)  # fmt: skip
    align = number("trainer.distill.align", d.get("align", 0.0), "a finite number >= 0",
                   lambda a: 0 <= a < math.inf)  # fmt: skip
    weights = check_weights(str(d.get("weights", "last")), "trainer.distill.weights")
    teacher = d.get("teacher")
    if teacher in (None, ""):
        return None
    return dict(teacher=str(teacher), temperature=temperature, weight=weight, align=align,
                weights=weights)  # fmt: skip


def check_teacher(cfg: DictConfig, run_dir: Path | None = None) -> RunDir | None:
    """The teacher's folder, refused in one line unless it is a completed run of the same input
    shape and class count, other than this run; None without a teacher."""
    s = settings(cfg)
    if s is None:
        return None
    path = Path(s["teacher"]).expanduser()
    shown = f"{KEY}={s['teacher']!r}"
    require(path.is_dir(), f"{shown} is not a folder; pass a completed sam-run run folder")
    run = RunDir(path)
    require(
        run.summary is not None or (path / CHECKPOINT).is_file(),
        f"{shown} is not a sam-run run folder (no summary, no checkpoint); pass one",
    )
    require(
        run.status == "completed",
        f"{shown} is not a completed run (status: {run.status}); train it to the end first",
    )
    require(
        run_dir is None or path.resolve() != Path(run_dir).resolve(),
        f"{shown} is this run's own folder; pass another, completed run",
    )
    t_cfg = run.omega_config(KEY)
    mine, theirs = data_shape(cfg.dataset), data_shape(t_cfg.dataset)
    require(
        mine == theirs,
        f"{shown} was trained on inputs {theirs[0]} with {theirs[1]} classes, this run has "
        f"{mine[0]} with {mine[1]}; pass a teacher of the same data",
    )
    return run


def pooled(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """[B, width] of a layer's output: a convolution's channels averaged over positions
    ([B, C, ...]), a linear layer's features over tokens ([B, ..., F])."""
    if x.ndim == 2:
        return x
    if channels_last:
        return x.flatten(1, -2).mean(1)
    return x.flatten(2).mean(2)


def similarity(features: torch.Tensor) -> torch.Tensor:
    """The batch's cosine similarity matrix [B, B] of [B, width] features (float32 at least)."""
    dtype = torch.promote_types(features.dtype, torch.float32)
    f = F.normalize(features.to(dtype), dim=1)
    return f @ f.T


def middle_index(n: int) -> int:
    """The middle of ``n`` layers, one rule for teacher and student: the ⌈n/2⌉-th (0-based
    (n − 1) // 2), the lower middle when n is even, so that half of the body lies at or below
    it in both models (Python's round() halves to even: it took the lower middle of 2 and 6
    layers and the upper of 4 and 8)."""
    return (n - 1) // 2


class Taps:
    """Forward hooks keeping the output of the middle conv/linear layer and the head's input."""

    def __init__(self, model: nn.Module) -> None:
        layers = list(tracked_layers(model, trainable=False).values())
        require(bool(layers), f"{KEY}: the models need conv or linear layers to distill into")
        body, head = layers[:-1], layers[-1]
        self.active, self.features = False, {}
        if body:
            middle = body[middle_index(len(body))]
            linear = isinstance(middle, torch.nn.Linear)
            middle.register_forward_hook(lambda _m, _i, out: self._keep("middle", out, linear))
        head_linear = isinstance(head, torch.nn.Linear)
        head.register_forward_pre_hook(lambda _m, i: self._keep("embedding", i[0], head_linear))

    def _keep(self, name, x, linear: bool):
        if self.active:
            self.features[name] = pooled(x, linear)

    @contextlib.contextmanager
    def on(self, active: bool = True) -> Iterator[dict]:
        """A context in which the hooks record the layers' features (a fresh dict it yields)."""
        self.active, self.features = active, {}
        try:
            yield self.features
        finally:
            self.active = False


def load_teacher(
    run: RunDir, weights: str, input_shape: tuple[int, ...], num_classes: int, device: torch.device
) -> nn.Module:
    """The teacher's model at its weights, frozen, in eval mode, on ``device``."""
    cfg = run.omega_config(KEY)
    torch.manual_seed(int(cfg.seed))
    model = build_model(without_download(cfg.model), input_shape, num_classes)
    attach_adapters(cfg.model, model)  # a PEFT teacher's checkpoint holds its adapters too
    try:
        model.load_state_dict(model_state(run, weights))
    except (RuntimeError, KeyError, ValueError) as e:
        raise UserError(
            f"{KEY}: {run.path / CHECKPOINT} does not fit the model its config builds "
            f"({type(e).__name__})"
        ) from None
    return model.to(device).eval().requires_grad_(False)


class Distiller(Part):
    """The distillation objective of a student run (stateless: the teacher's files are read)."""

    def __init__(
        self,
        teacher: nn.Module,
        student: nn.Module,
        temperature: float,
        weight: float,
        align: float,
        autocast: AbstractContextManager | None = None,
    ) -> None:
        self.teacher, self.temperature = teacher, temperature
        self.weight, self.align = weight, align
        self.autocast = autocast or contextlib.nullcontext()
        self.teacher_taps = Taps(teacher) if align > 0 else None
        self.student_taps = Taps(student) if align > 0 else None
        # counted by a hook on the teacher: the samples it saw, and the steps' samples
        self.teacher_samples, self.step_samples = 0, 0
        self.taught: list = []  # the current step's teacher outputs, per micro-batch
        teacher.register_forward_hook(lambda _m, i, _o: self._count(i[0]))

    def _count(self, x) -> None:
        self.teacher_samples += len(x)

    def begin_step(self, micro: list[tuple]) -> None:
        """The teacher's targets for the step's micro-batches, once before its passes."""
        self.taught = self.teach(micro)

    @torch.no_grad()
    def teach(self, micro: list[tuple]) -> list:
        """The teacher's (soft targets, feature similarities) of each micro-batch of a step: once,
        before its passes."""
        out = []
        for xm, *_ in micro:
            taps = self.teacher_taps.on() if self.teacher_taps else contextlib.nullcontext({})
            with taps as features, self.autocast:
                logits = self.teacher(xm)
            self.step_samples += len(xm)
            sims = {k: similarity(v) for k, v in features.items()}
            # its soft targets too: the teacher's half of the loss, not recomputed by each pass
            out.append((distillation_targets(logits, self.temperature), sims))
        return out

    def summary_values(self, last: dict) -> dict:  # noqa: ARG002 (the hook's signature)
        """``teacher_forwards_per_step``: the teacher's forwards over the batch per step, counted
        (1 whatever the variant)."""
        return {"teacher_forwards_per_step": self.teacher_samples / max(self.step_samples, 1)}

    def forward_context(self, pass_index: int) -> AbstractContextManager:  # noqa: ARG002 (the hook's signature)
        """Around the student's training forward: its features for the alignment."""
        return self.student_taps.on() if self.student_taps else contextlib.nullcontext()

    def alignment(self, teacher_sims: dict) -> torch.Tensor:
        """The mean squared gap between the student's and the teacher's feature similarities."""
        mine = self.student_taps.features  # the depths both models have
        terms = [(similarity(mine[k]) - t).square().mean() for k, t in teacher_sims.items()
                 if k in mine]  # fmt: skip
        return torch.stack(terms).mean()

    def loss_term(self, objective: torch.Tensor, inputs: PassInputs) -> torch.Tensor:
        """``objective`` (the task's share of the step's loss) as the distillation objective;
        ``inputs.rows``: the rows of the micro-batch this pass runs on, when not all (ESAM's
        descent pass), whose teacher targets and similarities it takes."""
        return self.add(objective, inputs.logits, self.taught, inputs.index, inputs.share,
                        inputs.rows)  # fmt: skip

    def add(
        self,
        objective: torch.Tensor,
        logits: torch.Tensor,
        taught: list,
        i: int,
        share: float,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The distillation objective of micro-batch ``i`` (``loss_term`` with its parts)."""
        targets, sims = taught[i]
        if rows is not None:
            targets = select_targets(targets, rows)
            sims = {k: v[rows][:, rows] for k, v in sims.items()}
        kd = distillation_loss_to(logits, targets, self.temperature)
        out = (1 - self.weight) * objective + self.weight * share * kd
        if self.align > 0:
            out = out + self.align * share * self.alignment(sims)
        return out


def build_part(run: Run) -> Distiller | None:
    """The run's distillation part (None without a teacher)."""
    return build_distiller(run.cfg, run.model, run.data, run.device, run.loop.autocast, run.run_dir)


def check(cfg: DictConfig, where: object = None) -> None:
    """``trainer.distill``'s keys and the teacher's folder (not the run's own, when known)."""
    check_teacher(cfg, getattr(where, "run_dir", None))


def build_distiller(
    cfg: DictConfig,
    student: nn.Module,
    data: Data,
    device: torch.device,
    autocast: AbstractContextManager | None = None,
    run_dir: Path | None = None,
) -> Distiller | None:
    """The run's distillation (None without ``trainer.distill.teacher``)."""
    run = check_teacher(cfg, run_dir)
    if run is None:
        return None
    s = settings(cfg)
    teacher = load_teacher(run, s["weights"], data.input_shape, data.num_classes, device)
    return Distiller(teacher, student, s["temperature"], s["weight"], s["align"], autocast)
