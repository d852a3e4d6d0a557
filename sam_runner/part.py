"""The one interface of a training-time feature: a :class:`Part` of a run.

A feature (averaging, weight decay, distillation, a regularizer, a sampler, MixUp, the curvature
tracker, robustness, adapters, a search trial's pruning, federation) is a ``Part`` subclass that
overrides the hooks it needs; every hook has a do-nothing default. The run builds its parts once
from the declared list (``sam_runner/training/parts.py``), in that list's order, and a
disabled feature builds to nothing, so it is simply absent. ``Parts`` dispatches each hook to the
parts that override it, in the list's order; the lists are computed once at setup, so a step
looks up no attribute by name.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ContextManager

import torch

#: the run a part is attached to (``sam_runner.training.run.Run``; typed loosely here so that
#: this interface sits below every feature in the import graph)
Run = Any


@dataclass
class PassInputs:
    """One micro-batch of one pass, as a loss term sees it.

    Attributes:
        model: the unwrapped model (no DDP, no compile).
        inputs: the micro-batch's inputs (after MixUp/CutMix).
        logits: the model's outputs on them.
        index: the micro-batch's place in the step (0-based).
        share: its share of the step's batch (the losses are weighted by it).
        rows: the rows of the micro-batch this pass runs on, or None for all (ESAM's descent
            pass keeps some).
    """

    model: torch.nn.Module
    inputs: torch.Tensor
    logits: torch.Tensor
    index: int
    share: float
    rows: torch.Tensor | None


class Part:
    """A training-time feature. Override only the hooks the feature needs.

    ``name`` is the part's key in the checkpoint (None: the part keeps no state). Hooks are
    called in the order of the run's list of parts; their order within a step is: ``batch``,
    ``begin_step``, then for each pass and micro-batch ``forward_context``, ``loss_term``,
    ``observe``; then ``after_step`` and ``measure_values``. At an epoch's end: ``end_epoch``;
    at an evaluation: ``log_values``, then ``stop_requested``; at a checkpoint ``state_dict`` and
    ``save_files``; at the end ``summary_values``.
    """

    name: str | None = None
    #: the loop that drives a run with this part, when not the epoch loop (federation's rounds)
    loop_class: type | None = None

    # ------------------------------------------------------------------ setup
    def param_groups(self, groups: list[dict], model: torch.nn.Module) -> list[dict]:
        """The optimizer's parameter groups, before the optimizer is built.

        Args:
            groups: the groups so far (``optim.build.parameter_groups``'s, or an earlier part's).
            model: the model (unwrapped).

        Returns:
            The groups to build the optimizer from (``groups`` itself when unchanged).
        """
        return groups

    def attach(self, run: Run) -> None:
        """Everything built: the optimizer, the wrapped model, the scheduler and the loggers.

        Args:
            run: the run; a part reads what it needs of it (``run.optimizer``, ``run.net``,
                ``run.clock``, ``run.data``, ...), once, here.
        """

    def schedule(self, scheduler: Any, steps_per_epoch: int) -> Any:
        """The learning rate's schedule (SWA takes it over from its start).

        Args:
            scheduler: the schedule so far, stepped once per optimizer step.
            steps_per_epoch: optimizer steps in an epoch.

        Returns:
            The schedule to step (``scheduler`` itself when unchanged).
        """
        return scheduler

    def start(self, resumed: bool) -> None:
        """The run starts training: from its checkpoint (``resumed``) or afresh.

        Args:
            resumed: whether the parts' states were just loaded from a checkpoint.
        """

    # ------------------------------------------------------------------ a step
    def batch(
        self, x: torch.Tensor, y: torch.Tensor, step: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A training batch before the step (MixUp/CutMix mixes it).

        Args:
            x: the inputs.
            y: the targets as the loss takes them (class indices, or soft targets).
            step: the optimizer steps taken so far.

        Returns:
            (inputs, targets) for the step's loss.
        """
        return x, y

    def begin_step(self, micro: list[tuple]) -> None:
        """Before a step's passes (a teacher's forward, once a step).

        Args:
            micro: the step's micro-batches, each (inputs, loss targets, labels, indices).
        """

    def forward_context(self, pass_index: int) -> ContextManager:
        """A context around each training forward (hooks that read activations).

        Args:
            pass_index: the optimizer's pass (0: at θ; 1: the perturbed pass).

        Returns:
            A context manager.
        """
        return contextlib.nullcontext()

    def loss_term(self, objective: torch.Tensor, inputs: PassInputs) -> torch.Tensor:
        """The objective a micro-batch backpropagates (the logged loss stays the task's).

        Args:
            objective: the objective so far (the task loss, weighted by the share).
            inputs: the micro-batch and its outputs.

        Returns:
            The objective with this part's term.
        """
        return objective

    def observe(
        self,
        pass_index: int,
        indices: torch.Tensor,
        targets: torch.Tensor,
        per_sample_loss: torch.Tensor,
    ) -> None:
        """The per-sample losses of a micro-batch's pass (detached).

        Args:
            pass_index: the optimizer's pass.
            indices: the samples' indices in the training set.
            targets: their labels.
            per_sample_loss: their losses.
        """

    def after_step(self, step: int) -> None:
        """After an optimizer step.

        Args:
            step: the optimizer steps taken so far (this one included).
        """

    def measure_values(self) -> dict:
        """A measurement due now (after a step, and at an epoch's end): its keys, else {}."""
        return {}

    def end_epoch(self) -> None:
        """After an epoch's (or a round's) training pass."""

    # ------------------------------------------------------------------ results
    def log_values(self) -> dict:
        """Keys for an evaluation's metrics line."""
        return {}

    def stop_requested(self, epoch: int, last: dict, final: bool) -> bool:
        """Whether training stops after this evaluation (a search trial's pruner).

        Args:
            epoch: the epoch just evaluated.
            last: its metrics line.
            final: whether it is the run's last.
        """
        return False

    def summary_values(self, last: dict) -> dict:
        """Keys for summary.json.

        Args:
            last: the run's last evaluation line ({} when none).
        """
        return {}

    def save_files(self, run_dir: Path) -> None:
        """Files beside the checkpoint, written with it (rank 0).

        Args:
            run_dir: the run folder.
        """

    def state_dict(self) -> dict:
        """The part's state, saved under ``name`` in the checkpoint."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Restore ``state_dict()``'s output."""


HOOKS = tuple(
    n
    for n, v in vars(Part).items()
    if callable(v) and not n.startswith("_") and n not in ("state_dict", "load_state_dict")
)


class Parts:
    """A run's parts in their declared order, each hook dispatched to the parts that override it
    (lists computed once)."""

    def __init__(self, parts: list[Part]) -> None:
        self.all = list(parts)
        self._by_hook = {
            hook: [getattr(p, hook) for p in self.all if _overrides(p, hook)] for hook in HOOKS
        }
        self.context_hooks = self._by_hook["forward_context"]
        self.loss_hooks = self._by_hook["loss_term"]
        self.observe_hooks = self._by_hook["observe"]

    def stateful(self) -> dict[str, Part]:
        """The parts saved in the checkpoint, by name."""
        return {p.name: p for p in self.all if p.name is not None}

    def call(self, hook: str, *args: Any) -> None:
        """Call a hook that returns nothing on every part that has it."""
        for fn in self._by_hook[hook]:
            fn(*args)

    def chain(self, hook: str, value: Any, *args: Any) -> Any:
        """Pass ``value`` through a hook that returns it changed (groups, schedule)."""
        for fn in self._by_hook[hook]:
            value = fn(value, *args)
        return value

    def merged(self, hook: str, *args: Any) -> dict:
        """The union of a hook's dicts (metrics-line and summary keys), in the parts' order."""
        out: dict = {}
        for fn in self._by_hook[hook]:
            out.update(fn(*args))
        return out

    def any(self, hook: str, *args: Any) -> bool:
        """Whether a boolean hook holds for any part (every part is asked)."""
        return any([fn(*args) for fn in self._by_hook[hook]])

    def batch(
        self, x: torch.Tensor, y: torch.Tensor, step: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch through every part's ``batch`` hook, in order."""
        for fn in self._by_hook["batch"]:
            x, y = fn(x, y, step)
        return x, y

    def forward_context(self, pass_index: int) -> ContextManager:
        """Every part's forward context for pass ``pass_index``, entered together."""
        if not self.context_hooks:
            return _NOTHING  # no stack to build and unwind each pass
        stack = contextlib.ExitStack()
        for fn in self.context_hooks:
            stack.enter_context(fn(pass_index))
        return stack

    def loss(self, objective: torch.Tensor, inputs: PassInputs) -> torch.Tensor:
        """``objective`` with every part's loss term added, in order."""
        for fn in self.loss_hooks:
            objective = fn(objective, inputs)
        return objective


#: the context of a pass no part reads (reusable: entering a nullcontext changes nothing)
_NOTHING = contextlib.nullcontext()


def _overrides(part: Part, hook: str) -> bool:
    return getattr(type(part), hook) is not getattr(Part, hook)


#: builds a part from the run (after its data and model), or None when the feature is off
PartBuilder = Callable[[Run], "Part | None"]
#: checks a feature's keys before anything is built or written (one-line UserErrors)
PartCheck = Callable[[Any], None]
