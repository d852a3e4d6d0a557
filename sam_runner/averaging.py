"""Weight averaging (``trainer.weight_averaging=<name>``): ``none``, ``swa`` (Izmailov et al. 2018)
and ``ema``, on ``torch.optim.swa_utils``.

``swa``: from the first step of epoch ``trainer.swa_start`` the learning rate follows ``SWALR``
(cosine-annealed to ``trainer.swa_lr`` over ``trainer.swa_anneal_epochs``, then constant)
instead of the run's scheduler, or with ``trainer.swa_lr=[high, low]`` the cyclic rate of the
paper, one cycle an epoch (``CyclicSWASchedule``); the weights at the end of each epoch from
then on join an equal average. ``ema``: after every optimizer step, avg ← d·avg + (1 − d)·w with
d = ``trainer.ema_decay`` (the first step copies w), warmed up by default
(``trainer.ema_warmup``): the t-th update after the copy uses dₜ = min(d, (1 + t)/(10 + t)), as
timm's and TensorFlow's EMA offer, so early weights fade within a run's budget. Only parameters
are averaged; before each evaluation the averaged weights' BatchNorm statistics are recomputed
(``update_bn``) on the un-augmented training set, and the averaged weights are evaluated on the
test set (``avg_test_*``). Each checkpoint also writes ``checkpoints/averaged.pt``:
``{"model": state dict (the model's own keys, BatchNorm statistics recomputed), "kind",
"n_averaged", "epoch", "step"}``.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .errors import integer, number, require
from .part import Part
from .registry import WEIGHT_AVERAGING as AVERAGING
from .rundir import AVERAGED
from .runfiles import atomic_write

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable
    from typing import Any

    from omegaconf import DictConfig
    from torch import nn

    from .clock import Clock
    from .part import Run

LOGGED = ("test_acc", "test_loss", "test_ece")  # of the averaged weights, as avg_<key>


def validate(cfg: DictConfig) -> None:
    """``trainer.weight_averaging`` and the keys of the chosen averaging."""
    t = cfg.trainer
    name = AVERAGING.entry(t.get("weight_averaging", "none")).name
    if name == "swa":
        start = t.get("swa_start")
        if start is not None:
            integer(
                "trainer.swa_start",
                start,
                f"an epoch in [1, trainer.epochs={t.epochs}] (or null: the last quarter)",
                lambda s: 1 <= s <= int(t.epochs),
            )
        swa_lr_range(t.get("swa_lr", 0.05))
        integer(
            "trainer.swa_anneal_epochs",
            t.get("swa_anneal_epochs", 1),
            "an integer >= 0",
            lambda a: a >= 0,
        )
    if name == "ema":
        number(
            "trainer.ema_decay",
            t.get("ema_decay", 0.999),
            "a number in (0, 1)",
            lambda d: 0 < d < 1,
        )
        require(
            isinstance(t.get("ema_warmup", True), bool),
            f"trainer.ema_warmup={t.get('ema_warmup')} must be true or false",
        )


def swa_lr_range(value: float | list[float] | tuple[float, float]) -> tuple[float, float] | None:
    """``trainer.swa_lr``: a number (SWALR's constant rate) gives None; a pair [high, low]
    (Izmailov et al.'s cyclic rate, one cycle an epoch) gives (high, low)."""
    from omegaconf import ListConfig

    if isinstance(value, (list, tuple, ListConfig)):
        pair = list(value)
        ok = len(pair) == 2 and all(isinstance(v, (int, float)) and v > 0 for v in pair)
        require(
            ok and pair[0] >= pair[1],
            f"trainer.swa_lr={pair} must be a number > 0 or a cyclic range [high, low] with "
            "high >= low > 0",
        )
        return float(pair[0]), float(pair[1])
    number("trainer.swa_lr", value, "a number > 0 or a range [high, low]", lambda v: v > 0)
    return None


def swa_start(trainer_cfg: DictConfig) -> int:
    """The first averaged epoch: ``trainer.swa_start``, or the start of the last quarter."""
    start = trainer_cfg.get("swa_start")
    return int(start) if start is not None else math.floor(0.75 * int(trainer_cfg.epochs)) + 1


def build_averaging(
    cfg: DictConfig,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    clock: Clock,
    plain_batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    measure: Callable[[nn.Module], dict],
    lambda_max_of: Callable[[nn.Module], float | None] | None = None,
) -> Averaged | None:
    """The run's averaging, or None; ``measure(model)`` evaluates a model on the test set (a
    metrics row), ``plain_batches`` are the un-augmented training batches (BatchNorm
    statistics), ``lambda_max_of(model)`` the run's curvature measurement on other weights."""
    validate(cfg)
    entry = AVERAGING.entry(cfg.trainer.get("weight_averaging", "none"))
    part = entry.target(cfg.trainer, model, optimizer, clock, plain_batches, measure)
    if part is None:
        return None
    part.lambda_max_of = lambda_max_of or (lambda _model: None)
    return part


@AVERAGING.register("none", "the last weights only")
def no_averaging(*_args: object) -> None:
    """The ``none`` averaging: no part."""
    return None  # no part


def build_part(run: Run) -> Averaged | None:
    """The run's averaging (None for ``none``)."""
    measure = run.loop.test_set.measure
    return build_averaging(
        run.cfg, run.model, run.optimizer, run.clock, run.data.train_plain, measure,
        run.lambda_max_of,
    )  # fmt: skip


def check(cfg: DictConfig, where: object = None) -> None:  # noqa: ARG001 (every check's signature)
    """Validate the averaging keys (every check's signature)."""
    validate(cfg)


class Averaged(Part):
    """An ``AveragedModel`` of the run's model, its evaluation and its files."""

    name = "averaging"
    kind = ""

    def __init__(
        self,
        model: nn.Module,
        clock: Clock,
        plain_batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
        measure: Callable[[nn.Module], dict],
        **average: Any,
    ) -> None:
        from torch.optim.swa_utils import AveragedModel

        self.model, self.clock, self.plain, self.measure = model, clock, plain_batches, measure
        self.averaged = AveragedModel(model, use_buffers=False, **average)

    @property
    def n_averaged(self) -> int:
        """How many weights the average holds."""
        return int(self.averaged.n_averaged)

    def update(self) -> None:
        """Add the model's current weights to the average."""
        self.averaged.update_parameters(self.model)

    def prepared(self) -> torch.nn.Module:
        """The averaged weights with their BatchNorm statistics recomputed on the un-augmented
        training set (forked RNG: training draws alike with and without averaging)."""
        from torch.optim.swa_utils import update_bn

        module = self.averaged.module
        device = next(module.parameters()).device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            update_bn(self.plain, module)
        module.eval()
        return module

    def log_values(self) -> dict:
        """The averaged weights' test metrics as ``avg_<key>`` (None before anything is
        averaged)."""
        if self.n_averaged == 0:  # SWA before swa_start: nothing averaged yet
            return {f"avg_{k}": None for k in LOGGED}
        row = self.measure(self.prepared())
        return {f"avg_{k}": row.get(k) for k in LOGGED}

    def weights(self) -> dict:
        """averaged.pt's content (the module's own keys: loadable into the run's model)."""
        state = {k: v.detach().cpu() for k, v in self.averaged.module.state_dict().items()}
        return {
            "model": state,
            "kind": self.kind,
            "n_averaged": self.n_averaged,
            "epoch": int(self.clock.epoch),
            "step": int(self.clock.step),
        }

    def save_files(self, run_dir: Path) -> None:
        """checkpoints/averaged.pt, atomically, once something is averaged."""
        if self.n_averaged:
            weights = self.weights()
            atomic_write(Path(run_dir) / AVERAGED, lambda f: torch.save(weights, f))

    def summary_values(self, last: dict) -> dict:
        """avg_test_acc, avg_test_ece, avg_lambda_max (the run's curvature measurement on the
        averaged weights, as the last evaluation left their BatchNorm statistics)."""
        out = {k: last.get(k) for k in ("avg_test_acc", "avg_test_ece", "avg_test_loss")}
        measured = self.lambda_max_of(self.averaged.module) if self.n_averaged else None
        out["avg_lambda_max"] = measured
        out["weight_averaging"] = {"kind": self.kind, "n_averaged": self.n_averaged}
        return out

    def state_dict(self) -> dict:
        """The averaged model's state, for a checkpoint."""
        return {"averaged": self.averaged.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore the averaged model from a checkpoint's state."""
        self.averaged.load_state_dict(state["averaged"])


@AVERAGING.register("swa", "SWA: an equal average of epoch-end weights from trainer.swa_start")
class SWA(Averaged):
    kind = "swa"

    def __init__(
        self,
        trainer_cfg: DictConfig,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        clock: Clock,
        plain_batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
        measure: Callable[[nn.Module], dict],
    ) -> None:
        super().__init__(model, clock, plain_batches, measure)
        self.start = swa_start(trainer_cfg)
        self.optimizer = optimizer
        self.swa_lr = trainer_cfg.get("swa_lr", 0.05)
        self.cycle = swa_lr_range(self.swa_lr)  # None: SWALR's constant rate
        self.anneal_epochs = int(trainer_cfg.get("swa_anneal_epochs", 1))

    def schedule(self, scheduler: Any, steps_per_epoch: int) -> SWASchedule | CyclicSWASchedule:
        """Wrap the run's schedule: SWALR (or the cyclic rate) from ``trainer.swa_start`` on."""
        if self.cycle is not None:
            return CyclicSWASchedule(self, scheduler, steps_per_epoch)
        return SWASchedule(self, scheduler, steps_per_epoch)

    def end_epoch(self) -> None:
        """Average the epoch's final weights once ``trainer.swa_start`` is reached."""
        if self.clock.epoch >= self.start:
            self.update()


class SWASchedule:
    """The run's scheduler until epoch ``swa_start``, then ``SWALR`` (stepped per optimizer
    step, annealing over ``swa_anneal_epochs`` epochs' steps)."""

    def __init__(self, swa: SWA, base: Any, steps_per_epoch: int) -> None:
        self.swa, self.base, self.swalr = swa, base, None
        self.steps_per_epoch = steps_per_epoch

    def _swalr(self):
        from torch.optim.swa_utils import SWALR

        if self.swalr is None:
            steps = self.swa.anneal_epochs * self.steps_per_epoch
            self.swalr = SWALR(
                self.swa.optimizer,
                swa_lr=float(self.swa.swa_lr),
                anneal_epochs=steps,
                anneal_strategy="cos",
            )
        return self.swalr

    def step(self) -> None:
        """Step SWALR from the averaging's start, the run's own schedule before it."""
        if self.swa.clock.epoch >= self.swa.start:
            self._swalr().step()
        else:
            self.base.step()

    def get_last_lr(self) -> list[float]:
        """The learning rates of the schedule in charge."""
        return (self.swalr or self.base).get_last_lr()

    def state_dict(self) -> dict:
        """Both schedules' states (SWALR's without its anneal function)."""
        swa = None
        if self.swalr is not None:  # its anneal function is code, not data
            swa = {k: v for k, v in self.swalr.state_dict().items() if k != "anneal_func"}
        return {"base": self.base.state_dict(), "swa": swa}

    def load_state_dict(self, state: dict) -> None:
        """Restore both schedules from a checkpoint's state."""
        self.base.load_state_dict(state["base"])
        if state.get("swa") is not None:
            self._swalr().load_state_dict(state["swa"])


class CyclicSWASchedule:
    """The run's scheduler until epoch ``swa_start``, then Izmailov et al.'s cyclic rate with a
    cycle of one epoch: the j-th of an epoch's c steps uses (1 − j/c)·high + (j/c)·low, so the
    epoch-end weights that SWA averages come from a step at the low rate. The rate of a step
    follows from its number alone (nothing to save: a resumed run repeats it exactly)."""

    def __init__(self, swa: SWA, base: Any, steps_per_epoch: int) -> None:
        self.swa, self.base, self.steps_per_epoch = swa, base, steps_per_epoch
        if swa.clock.step == 0 and swa.start == 1:  # the very first step is already cyclic
            self._set(1)

    def rate(self, step: int) -> float | None:
        """The rate of the step numbered ``step`` (from 1), None before swa_start."""
        epoch, j = divmod(step - 1, self.steps_per_epoch)
        if epoch + 1 < self.swa.start:
            return None
        t = (j + 1) / self.steps_per_epoch
        high, low = self.swa.cycle
        return (1 - t) * high + t * low

    def _set(self, step: int) -> bool:
        lr = self.rate(step)
        if lr is not None:
            for group in self.swa.optimizer.param_groups:
                group["lr"] = lr
        return lr is not None

    def step(self) -> None:
        """Set the next step's cyclic rate, or step the run's schedule before the averaging's
        start."""
        # called after a step and before the clock counts it: the next step is clock.step + 2
        if not self._set(self.swa.clock.step + 2):
            self.base.step()

    def get_last_lr(self) -> list[float]:
        """The optimizer's current learning rates."""
        return [g["lr"] for g in self.swa.optimizer.param_groups]

    def state_dict(self) -> dict:
        """The run's schedule's state (the cyclic rate is a function of the step)."""
        return {"base": self.base.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        """Restore the run's schedule from a checkpoint's state."""
        self.base.load_state_dict(state["base"])


@AVERAGING.register("ema", "EMA of the weights after every step (trainer.ema_decay)")
class EMA(Averaged):
    kind = "ema"

    def __init__(
        self,
        trainer_cfg: DictConfig,
        model: nn.Module,
        _optimizer: torch.optim.Optimizer,
        clock: Clock,
        plain_batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
        measure: Callable[[nn.Module], dict],
    ) -> None:
        decay = float(trainer_cfg.get("ema_decay", 0.999))
        warmup = bool(trainer_cfg.get("ema_warmup", True))
        super().__init__(model, clock, plain_batches, measure, multi_avg_fn=ema_fn(decay, warmup))
        note = horizon_note(decay, warmup, int(clock.total_steps))
        if note and distributed_main():
            print(note, file=sys.stderr)

    def after_step(self, step: int) -> None:  # noqa: ARG002 (the hook's signature)
        """Fold the step's weights into the moving average."""
        self.update()


def ema_decay_at(decay: float, warmup: bool, t: int) -> float:
    """The decay of the t-th update after the first copy (t >= 1)."""
    return min(decay, (1 + t) / (10 + t)) if warmup else decay


def ema_fn(decay: float, warmup: bool) -> Callable[[list, list, torch.Tensor | int], None]:
    """AveragedModel's multi_avg_fn: avg ← dₜ·avg + (1 − dₜ)·w, t the number averaged so far."""

    @torch.no_grad()
    def update(averaged: list, current: list, n_averaged) -> None:
        d = ema_decay_at(decay, warmup, int(n_averaged))
        if torch.is_floating_point(averaged[0]):
            torch._foreach_lerp_(averaged, current, 1 - d)
        else:
            for a, w in zip(averaged, current, strict=True):
                a.copy_(a * d + w * (1 - d))

    return update


def horizon_note(decay: float, warmup: bool, total_steps: int) -> str | None:
    """A notice when the average's horizon 1/(1 − d) exceeds a quarter of the step budget: the
    average then still holds much of the early weights at the end."""
    horizon = 1 / (1 - decay)
    if total_steps <= 0 or horizon <= total_steps / 4:
        return None
    if warmup:
        why = "the warm-up (trainer.ema_warmup) keeps the early weights from dominating"
    else:
        why = f"the first step keeps {decay ** (total_steps - 1):.2f} of the final average"
    return (
        f"sam-run: notice: trainer.ema_decay={decay} averages over ~{horizon:.0f} steps, more "
        f"than a quarter of the run's {total_steps}; {why}"
    )


def distributed_main() -> bool:
    """Whether this process is the main one (or the only one)."""
    from . import distributed

    return distributed.current().is_main
