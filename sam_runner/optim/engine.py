"""The shared two-pass engine every SAM variant is built on.

A variant only says how it perturbs (``compute_perturbation``); the engine does
the rest: closures, the first and second pass, BatchNorm statistics, the fp16
gradient scaler, gradient clipping, DDP synchronisation, the ρ schedule,
``interval`` and ``perturb_schedule`` (schedule.py), the count of passes, the parameters a
pass may skip (``first_pass_skips``, ``run_pass(skip=...)``) and the base optimizer's step.
Arithmetic runs on whole parameter lists (``torch._foreach_*``) with persistent buffers and no
host syncs (the ``adaptive`` schedule's decision and ESAM's draws aside).

Sharded parameters (FSDP2): the lists are this process's local shards and every norm and dot
reduces over the processes, except for ``sync_perturbation=false``: then a perturbing step builds
each process's own ε on FSDP2's gathered parameters (``_own_sharpness_step``; the lists are
then the gathered whole tensors and their unreduced gradients, norms local, as under DDP), and
the rest of the step (the descent gradient, ``after_second_pass``, the base step) runs on the
shards (a rule whose update reads the first pass's g takes the shards of its mean over the
processes, ``shards_of_mean``, as DDP averages it). A variant whose rule or update cannot run so
says why in ``fsdp_own_perturbation_refused``.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Callable

import torch
from torch.nn.modules.batchnorm import _BatchNorm
from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

from ..module_state import (
    frozen_running_stats,
    gathered_kept,
    gathered_parameters,
    gradient_sync_paused,
    gradients_skipped,
    reshard_gathered,
    running_stats_restored,
)
from .schedule import PerturbSchedule, check_schedule

if TYPE_CHECKING:
    from torch.optim.optimizer import ParamsT

RHO_SCHEDULES = ("constant", "lr", "cosine")
# a parameter's structure in the runner's groups: one list entry per parameter (optim/build.py)
PER_PARAMETER = {"block": "blocks", "kind": "kinds", "hidden": "hidden_flags"}
Tensors = list[torch.Tensor]  # one tensor per parameter with a gradient, in the groups' order
NO_CONTEXT = contextlib.nullcontext()  # reusable: entering it changes nothing
FOLD_NORMS = 64  # steps whose first-pass ‖g‖ wait, unreduced, for the running max


def _step_observed(optimizer: torch.optim.Optimizer) -> bool:
    """Whether a profiler or a step hook watches ``optimizer``'s steps: only then is torch's
    wrapper of ``step`` (a profiler range, the hooks: tens of µs of host time a step) run."""
    return bool(
        torch._C._autograd._profiler_enabled()
        or optimizer._optimizer_step_pre_hooks
        or optimizer._optimizer_step_post_hooks
        or _global_optimizer_pre_hooks
        or _global_optimizer_post_hooks
    )


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def cosine_factor(step: int, total: int) -> float:
    """Cosine decay 1 → 0 for step k (1-based, counted at the start of the step) of ``total``:
    t = (k − 1) / total, so the first step uses the full value."""
    t = min(max(step - 1, 0) / total, 1.0)
    return 0.5 * (1 + math.cos(math.pi * t))


def _check_engine_options(base_optimizer, rho, rho_schedule, interval, total_steps) -> None:
    _check(
        isinstance(base_optimizer, type) and issubclass(base_optimizer, torch.optim.Optimizer),
        "base_optimizer must be an optimizer class such as torch.optim.SGD, "
        f"got {base_optimizer!r}",
    )
    _check(
        rho is not None and float(rho) >= 0 and math.isfinite(float(rho)),
        f"rho must be a finite number >= 0, got {rho}",
    )
    _check(
        rho_schedule in RHO_SCHEDULES,
        f"rho_schedule must be one of {RHO_SCHEDULES}, got {rho_schedule!r}",
    )
    _check(int(interval) >= 1, f"interval must be an integer >= 1, got {interval}")
    _check(
        rho_schedule != "cosine" or (total_steps or 0) > 0,
        "rho_schedule='cosine' needs total_steps > 0",
    )


def _reuse_first(
    closure: Callable[[], torch.Tensor], loss: torch.Tensor
) -> Callable[[], torch.Tensor]:
    """The closure, except that its first call returns ``loss`` (that pass has already run and
    its gradients are in place)."""
    done = []

    def again() -> torch.Tensor:
        """The pass that already ran gives its loss; later calls run the closure."""
        if not done:
            done.append(True)
            return loss
        return closure()

    return again


class _Buffers(dict):
    """``_lists``' cache; its per-parameter buffers ``theta`` (θ saved) and ``eps`` (ε, zeros)
    made on first use, so that a variant that never reads one holds none (``base``: neither,
    ``SAM``: no ε, which it builds in the gradients)."""

    MAKE = {"theta": torch.empty_like, "eps": torch.zeros_like}

    def __missing__(self, key):
        if key not in self.MAKE:
            raise KeyError(key)
        self[key] = [self.MAKE[key](p) for p in self["params"]]
        return self[key]


class SharpnessAware(torch.optim.Optimizer):
    """Base class of every variant: ``Variant(params, base_optimizer, rho=..., **base_kwargs)``.

    ``step(closure)`` calls ``closure()`` once per pass. The closure zeroes the
    gradients, computes the loss, calls backward and returns the loss (the
    ``torch.optim.LBFGS`` convention). After ``step`` the parameters hold the
    updated values. ``pass_index`` tells a closure which pass it is running
    (0 = at θ) and ``pass_syncs`` whether DDP should all-reduce its gradients.

    Call ``bind(model=..., grad_scaler=..., clip_grad_norm=...)`` (or pass ``model=``)
    to let the engine keep BatchNorm running statistics to the first pass (required
    for models with BatchNorm: without the model both passes update them), drive
    DDP's gradient synchronisation and handle fp16 scaling.
    """

    # What a variant is (also the registry's metadata, read off the class): ...
    passes = 2  # forward-backward passes on a perturbing step
    # True where a perturbing step is a single pass at θ+ε (MSAM): schedules apply all the same
    single_pass_perturbation = False
    # True where the update reads L(θ) and L(θ+ε): first_step/second_step then need loss=
    step_needs_losses = False
    has_rho = True  # whether ``rho`` is a perturbation radius (logged as ``rho``)
    # without a fixed radius: why ``rho`` is refused, what to set instead
    rho_refused: str | None = None
    # True where the variant computes its own step size (the lr is not the step)
    replaces_lr = False
    # options a swept config may set that change nothing for this variant (a sweep runs it once)
    ignored_options: tuple = ()
    variant_options: dict = {}  # ... and its own keywords with their defaults
    # why the variant cannot run on sharded parameters (trainer.strategy=fsdp); None: it can
    fsdp_refused: str | None = None
    # why it cannot build each process's own ε sharded (sync_perturbation=false under fsdp)
    fsdp_own_perturbation_refused: str | None = None
    # sharded parameters (FSDP2's DTensors): the process group their shards span, else None
    _shard_group = None
    # sharded, each process's own ε: sharded parameter -> its gathered one while the engine's
    # lists are the gathered parameters (_on_gathered), else None; whether this step reuses a
    # synchronised first pass (the adaptive schedule's)
    _gathered: dict | None = None
    _first_reused = False

    def __init__(
        self,
        params: ParamsT,
        base_optimizer: Callable[..., torch.optim.Optimizer],
        rho: float = 0.05,
        rho_schedule: str = "constant",
        interval: int = 1,
        perturb_schedule: str = "every",
        perturb_prob: float = 0.5,
        perturb_from: float | int = 0.0,
        perturb_delta: float = 0.9,
        perturb_lambda1: float = -1.0,
        perturb_lambda2: float = 1.0,
        perturb_seed: int = 0,
        sync_perturbation: bool = False,
        perturb_with_weight_decay: bool = False,
        total_steps: int | None = None,
        steps_per_epoch: int | None = None,
        model: torch.nn.Module | None = None,
        **kwargs: Any,
    ) -> None:
        own = {k: kwargs.pop(k, v) for k, v in self.variant_options.items()}
        _check_engine_options(base_optimizer, rho, rho_schedule, interval, total_steps)
        problem = check_schedule(perturb_schedule, perturb_prob, perturb_from, interval,
                                 total_steps, perturb_delta, steps_per_epoch)  # fmt: skip
        _check(problem is None, problem or "")
        super().__init__(params, dict(rho=float(rho)))
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        # one set of groups, shared with the base
        self.param_groups = self.base_optimizer.param_groups
        self.defaults.update(self.base_optimizer.defaults)
        self.rho = float(rho)
        self.rho_schedule = rho_schedule
        self.interval = int(interval)
        self.perturb_schedule = perturb_schedule
        self.schedule = PerturbSchedule(
            perturb_schedule, interval, perturb_prob, perturb_from, perturb_delta,
            perturb_lambda1, perturb_lambda2, perturb_seed, total_steps, steps_per_epoch,
        )  # fmt: skip
        self.sync_perturbation, self.total_steps = bool(sync_perturbation), total_steps
        self.perturb_with_weight_decay = bool(perturb_with_weight_decay)
        for k, v in own.items():
            setattr(self, k, v)
        self.lr0 = self.param_groups[0]["lr"]
        self.step_count, self.pass_index, self.pass_syncs, self.last_perturbed = 0, 0, True, False
        # passes the closure ran (grad_evals) and what its next call costs (see count_pass)
        self.grad_evals, self.pass_share = 0.0, 1.0
        # ‖g‖ of the gradients ε is built from (device tensor), set before compute_perturbation
        self.g_norm = None
        # the loss whose gradient the base step uses: L(θ+ε), or L(θ) on a plain step
        self.descent_loss = None
        # max of the first-pass ‖g‖ since log_values() (device), and the norms not yet folded in
        self._grad_norm_max, self._step_norms = None, []
        self._step_norm_parts = []  # per-tensor norms of steps whose ‖g‖ waits (CPU, see later)
        self.model, self.grad_scaler, self.clip_grad_norm, self._cache = None, None, None, {}
        self._bn, self._bn_kept = [], frozen_running_stats  # BatchNorm layers, how kept (bind)
        # a training feature's hooks (federated algorithms): add_perturbation_filter/_adjuster
        self._perturbation_filters, self._gradient_adjusters = [], []
        if model is not None:
            self.bind(model=model)

    @classmethod
    def process_roles(cls, world: int, sharded: bool, options: dict) -> int:  # noqa: ARG003
        """Into how many roles a data-parallel job's processes split, each role's processes
        together covering every global batch (SAMPa's two gradients, one a role); 1: plain data
        parallelism, every process a share of the batch. A ValueError where the variant cannot
        run on such a job.

        Args:
            world: the job's number of processes.
            sharded: whether the parameters are sharded (trainer.strategy=fsdp).
            options: the variant's keywords (``variant_options`` as configured).
        """
        return 1

    @staticmethod
    def profile_hook_step(func: Callable[..., Any]) -> Callable[..., Any]:
        """torch's wrapper of ``step`` (its step hooks and profiler range) where it does something:
        under a profiler or with a hook registered. Otherwise ``step`` itself: the range alone
        costs tens of µs of host time a step, on every step.

        Args:
            func: the class's ``step``.
        """
        hooked = torch.optim.Optimizer.profile_hook_step(func)

        @functools.wraps(func)
        def step(self, *args: Any, **kwargs: Any) -> Any:
            if _step_observed(self):
                return hooked(self, *args, **kwargs)
            return func(self, *args, **kwargs)

        return step

    # ------------------------------------------------------------------ wiring
    def bind(
        self,
        model: torch.nn.Module | None = None,
        grad_scaler: torch.amp.GradScaler | None = None,
        clip_grad_norm: float | None = None,
    ) -> SharpnessAware:
        """Attach the model (BatchNorm, DDP), a ``torch.amp.GradScaler`` and a clipping norm."""
        if model is not None:
            self.model = model
            self._bn = [m for m in model.modules() if isinstance(m, _BatchNorm)]
            # later passes keep BatchNorm's running statistics by their flag (no copy), or for a
            # compiled model (which guards on the flag) by a copy put back after the pass
            compiled = hasattr(model, "_orig_mod")  # torch.compile's OptimizedModule
            self._bn_kept = running_stats_restored if compiled else frozen_running_stats
        if grad_scaler is not None and grad_scaler.is_enabled():
            self.grad_scaler = grad_scaler
        self.clip_grad_norm = clip_grad_norm
        return self

    def zero_grad(self, set_to_none: bool = True) -> None:
        """torch's ``zero_grad``, without its profiler range and per-device grouping when the
        gradients are set to None (every pass's closure calls it)."""
        if not set_to_none:
            super().zero_grad(set_to_none=False)
            return
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None

    def add_perturbation_filter(self, fn: Callable[[list, list], None]) -> None:
        """Run ``fn(params, eps)`` on every ε the variant computes, before θ moves: it may edit
        ε in place (FedFFT's low-frequency filter) or only read it (a measure).

        Args:
            fn: called with the parameter list and the ε buffers, one per parameter.
        """
        self._perturbation_filters.append(fn)

    def add_gradient_adjuster(self, fn: Callable[[list, list], list]) -> None:
        """Adjust the gradients ε is built from and those the base step descends along:
        ``fn(params, grads)`` returns the adjusted list (``grads`` itself when unchanged).

        Args:
            fn: called with the parameter list and a gradient list; returns a gradient list.
        """
        self._gradient_adjusters.append(fn)

    def _lists(self):
        """Flat lists of the parameters with gradients, plus per-group slices (cached).

        Sharded parameters (FSDP2's DTensors) are listed as this process's local shards (views:
        an in-place change moves the parameter), their gradients likewise; the variant's rule
        then runs on the shards, and ``global_norm``, ``dot``, ``tensor_norms`` and
        ``tensor_dots`` reduce over the processes. While each process's own ε is built sharded
        (``_on_gathered``) they are FSDP2's gathered parameters instead, whole, with the
        process's unreduced gradients."""
        groups = self.param_groups
        if self._gathered is None:  # every step's case: the parameters themselves
            params = [p for g in groups for p in g["params"] if p.grad is not None]
        else:
            params = [
                w for g in groups for p in g["params"] if (w := self._held(p)).grad is not None
            ]
        key = tuple(map(id, params))  # the parameter set: the buffers are rebuilt when it changes
        if self._cache.get("key") != key:
            slices, start = [], 0
            for g in groups:
                n = sum(self._held(p).grad is not None for p in g["params"])
                slices.append((start, start + n))
                start += n
            self._cache = _Buffers(key=key, params=params, slices=slices)
            self._local_shards(self._cache)
        c = self._cache
        if "sharded" in c:
            with torch.no_grad():
                return c["params"], [p.grad.to_local() for p in c["sharded"]], c["slices"]
        return c["params"], [p.grad for p in c["params"]], c["slices"]

    def per_parameter(
        self, key: str, default: Callable[[torch.Tensor, int], Any], with_grads: bool = True
    ) -> list:
        """Each parameter's ``key`` (``block``, ``kind`` or ``hidden``), in the order of the
        engine's flat lists: the group's per-parameter list (``PER_PARAMETER[key]``, the
        runner's groups), else the group's own ``key`` (groups built by hand), else
        ``default(parameter, group index)``.

        Args:
            key: ``block``, ``kind`` or ``hidden``.
            default: the value of a parameter whose group says nothing.
            with_grads: only the parameters with a gradient (``_lists()``'s); False: all.
        """
        out = []
        for gi, g in enumerate(self.param_groups):
            listed, own = g.get(PER_PARAMETER[key]), g.get(key)
            for i, p in enumerate(g["params"]):
                if with_grads and self._held(p).grad is None:
                    continue
                out.append(
                    listed[i] if listed is not None else own if own is not None else default(p, gi)
                )
        return out

    def _held(self, p: torch.Tensor) -> torch.Tensor:
        """The tensor the engine's lists hold for parameter ``p``: ``p``, or while a per-process ε
        is built sharded, the gathered parameter FSDP2 made of it (``_on_gathered``)."""
        return p if self._gathered is None else self._gathered.get(p, p)

    def _local_shards(self, c) -> None:
        """Under sharding: ``params`` become the local shards (``sharded`` the parameters), and
        per-parameter state is keyed by the shard the variant sees."""
        from torch.distributed.tensor import DTensor

        params = c["params"]
        if not params or not isinstance(params[0], DTensor):
            return
        local = self.shards(params)
        c["sharded"], c["params"] = params, local
        self._shard_group = params[0].device_mesh.get_group()
        for p, lp in zip(params, local):
            if p in self.state:
                self.state[lp] = self.state.pop(p)

    def shards(self, params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
        """This process's local shards of ``params`` (an unsharded parameter: itself), always the
        same view of a parameter, the one ``_lists`` lists: a variant keys its state by it."""
        from torch.distributed.tensor import DTensor

        views = self.__dict__.setdefault("_views", {})
        out = []
        for p in params:
            if isinstance(p, DTensor):
                if id(p) not in views:
                    with torch.no_grad():
                        views[id(p)] = p.to_local()
                    self._shard_group = p.device_mesh.get_group()
                p = views[id(p)]
            out.append(p)
        return out

    def gathered(self, flat: torch.Tensor) -> tuple[torch.Tensor, int]:
        """(every process's ``flat`` concatenated in rank order, where this process's begins):
        for a rule that ranks all coordinates at once (FlatPO's mask). Unsharded: (flat, 0)."""
        if self._shard_group is None:
            return flat, 0
        dist, group = torch.distributed, self._shard_group
        n = torch.tensor([flat.numel()], device=flat.device)
        sizes = [torch.zeros_like(n) for _ in range(dist.get_world_size(group))]
        dist.all_gather(sizes, n, group=group)
        sizes = [int(x) for x in sizes]
        padded = flat.new_zeros(max(sizes))
        padded[: flat.numel()] = flat
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded, group=group)
        rank = dist.get_rank(group)
        return torch.cat([x[:k] for x, k in zip(parts, sizes)]), sum(sizes[:rank])

    def _reduce_sum_(self, tensor):
        """Sum a tensor over the processes that hold the shards (in place; unsharded: as is)."""
        if self._shard_group is not None:
            torch.distributed.all_reduce(tensor, group=self._shard_group)
        return tensor

    # ------------------------------------------------------------------ ρ
    @property
    def rho_factor(self) -> float:
        """The factor ``rho_schedule`` puts on every radius of the current step (a Python float:
        no host sync): lr / initial lr ('lr'), the cosine decay ('cosine'), or 1."""
        if self.rho_schedule == "lr":
            return self.param_groups[0]["lr"] / self.lr0 if self.lr0 else 1.0
        if self.rho_schedule == "cosine":
            return cosine_factor(self.step_count, self.total_steps)
        return 1.0

    @property
    def current_rho(self) -> float:
        """ρ of the current step under ``rho_schedule``; after a step, the ρ that step used (for
        'lr', until the learning rate moves)."""
        return self.rho * self.rho_factor

    # ------------------------------------------------------------------ passes
    def run_pass(
        self,
        closure: Callable[[], torch.Tensor],
        index: int,
        sync: bool = True,
        skip: Iterable[torch.nn.Parameter] = (),
    ) -> torch.Tensor:
        """One forward-backward. Unsynchronised passes run forward and backward with the
        gradient synchronisation paused (``gradient_sync_paused``: DDP's no_sync).
        ``skip``: parameters this pass computes no gradient for (``requires_grad`` off during
        the pass, so autograd skips their weight gradients; see ``first_pass_skips``)."""
        self.pass_index, self.pass_syncs = index, sync
        paused = not sync and self.model is not None
        ctx = gradient_sync_paused(self.model) if paused else NO_CONTEXT
        # later passes normalise with batch statistics; the running statistics are the first
        # pass's when they end (no BatchNorm layer: nothing to keep)
        frozen = self._bn_kept(self._bn) if index > 0 and self._bn else NO_CONTEXT
        skipped = gradients_skipped(skip) if skip else NO_CONTEXT
        with ctx, frozen, skipped, torch.enable_grad():
            return closure()

    def _unscale(self, grads):
        """Undo fp16 loss scaling in place; accumulates inf/NaN into the step's found_inf."""
        if self.grad_scaler is None or not grads:
            return
        scale = self.grad_scaler._scale
        if self._found_inf is None:
            self._found_inf = torch.zeros(1, device=scale.device)
        torch._amp_foreach_non_finite_check_and_unscale_(
            grads, self._found_inf, scale.double().reciprocal().float()
        )

    def _track_grad_norm(self, grads):
        """‖g‖ of the first pass, kept for the running max ``log_values`` reads (no host sync,
        and no device work per step beyond the norm: the max is taken every FOLD_NORMS steps)."""
        norm = self.global_norm(grads)
        self._step_norms.append(norm)
        if len(self._step_norms) >= FOLD_NORMS:
            self._folded_grad_norm_max()
        return norm

    def _track_grad_norm_later(self, grads) -> None:
        """``_track_grad_norm`` where nothing reads this step's ‖g‖ (a step that perturbs not):
        on the CPU only its per-tensor norms now, their ‖·‖ taken when folded, for every waiting
        step in one reduction (row by row the bits of one step's, on the CPU; a CUDA reduction
        may add up a row in another order, so there, and sharded, the norm is taken now)."""
        if self._shard_group is not None or not grads or grads[0].device.type != "cpu":
            self._track_grad_norm(grads)
            return
        self._step_norm_parts.append(torch._foreach_norm(grads))
        if len(self._step_norms) + len(self._step_norm_parts) >= FOLD_NORMS:
            self._folded_grad_norm_max()

    def _norms_of_parts(self) -> torch.Tensor:
        """‖g‖ of each step in ``_step_norm_parts`` (``global_norm``'s ops, its bits), emptied."""
        parts, self._step_norm_parts = self._step_norm_parts, []
        width = len(parts[0])
        rows = torch.stack([n for step in parts for n in step])
        if rows.dtype == torch.float32 and all(len(step) == width for step in parts):
            return torch.linalg.vector_norm(rows.view(len(parts), width), dim=1)
        return torch.stack([torch.linalg.vector_norm(torch.stack(step)) for step in parts])

    def _folded_grad_norm_max(self) -> torch.Tensor | None:
        """The max of the first-pass ‖g‖ since the last reset (None: no step since), with the
        waiting steps' norms folded in; a non-finite norm (a found-inf fp16 step) is left out."""
        waiting = [torch.stack(self._step_norms)] if self._step_norms else []
        if self._step_norm_parts:
            waiting.append(self._norms_of_parts())
        if waiting:
            norms = torch.cat(waiting) if len(waiting) > 1 else waiting[0]
            self._step_norms = []
            # the finite norms' max, 0 when none (norms are ≥ 0): the exact max, in any order
            top = torch.where(torch.isfinite(norms), norms, 0).max()
            seen = self._grad_norm_max
            self._grad_norm_max = top if seen is None else torch.maximum(seen, top)
        return self._grad_norm_max

    def all_reduce_mean_(self, tensor: torch.Tensor) -> torch.Tensor:
        """Average a tensor across data-parallel processes in place (a no-op on one process).

        Variants call it on the few scalars that steer the update (e.g. a step size), so that
        every process takes the same step when perturbations are per-process."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(tensor)
            tensor.div_(dist.get_world_size())
        return tensor

    def all_reduce_mean_list_(self, tensors: Tensors) -> None:
        """``all_reduce_mean_`` over a list of tensors in place, as one flat buffer (one
        collective).
        """
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return
        flat = self.all_reduce_mean_(torch.cat([t.reshape(-1) for t in tensors]))
        torch._foreach_copy_(
            tensors,
            [f.view_as(t) for f, t in zip(flat.split([t.numel() for t in tensors]), tensors)],
        )

    def keep_if_overflow(self, new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
        """``new``, or ``old`` when this step's fp16 gradients held inf/NaN (the step is skipped):
        adaptive variant state must not absorb a skipped step. No host sync."""
        if self._found_inf is None:
            return new
        return torch.where(self._found_inf.reshape(()) > 0, old, new)

    def overflowed(self) -> bool:
        """Whether this step's fp16 gradients held inf/NaN, so that the base step was skipped (a
        host sync, fp16 only; False without a scaler). For host-side variant state (a count, a
        generator) that must not absorb a skipped step."""
        return self._found_inf is not None and bool(self._found_inf.item())

    def perturbation_grads(self, params: Tensors, grads: Tensors) -> Tensors:
        """The gradient ε is built from: g, plus weight decay when asked for, then the added
        adjusters.

        Args:
            params: the parameters with a gradient.
            grads: their gradients at θ (fp16 scaling undone).
        """
        out = grads
        if self.perturb_with_weight_decay:
            out = list(grads)
            for (a, b), g in zip(self._lists()[2], self.param_groups):
                if g.get("weight_decay", 0):
                    out[a:b] = torch._foreach_add(grads[a:b], params[a:b], alpha=g["weight_decay"])
        for adjust in self._gradient_adjusters:
            out = adjust(params, out)
        return out

    def perturbation_into(self, params: Tensors, grads: Tensors, eps: Tensors) -> None:
        """ε from the variant's rule (``compute_perturbation``), then the added filters."""
        self.compute_perturbation(params, grads, eps)
        for edit in self._perturbation_filters:
            edit(params, eps)

    # ------------------------------------------------------------------ step
    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor:
        """One optimizer step: the variant's passes through ``closure`` (zero the grads, forward,
        backward, return the loss), then the base optimizer's update; returns the loss at θ."""
        if closure is None:
            raise ValueError(
                f"{type(self).__name__}.step needs a closure that recomputes the loss (zero grads, "
                "forward, backward, return loss)"
            )
        self._found_inf = None
        self.step_count += 1
        closure = self._counted(closure)
        first = None
        perturbs = self.passes > 1 or self.single_pass_perturbation
        if perturbs and self.schedule.needs_grad_norm:
            # AE-SAM decides on this step's ‖g‖²: the first pass runs (synchronised, so that every
            # process decides alike) before the decision, and a perturbing step reuses it
            first = self.run_pass(closure, 0, sync=True)
            perturb = self.schedule.decide(self.step_count, self._raw_sq_norm())
        else:
            perturb = perturbs and self.schedule.decide(self.step_count)
        self.last_perturbed = perturb  # a variant may clear it (LookSAM's reuse steps)
        self._first_reused = first is not None
        if perturb:
            loss = self.sharpness_step(closure if first is None else _reuse_first(closure, first))
        else:
            loss = self.run_pass(closure, 0, sync=True) if first is None else first
            params, grads, _ = self._lists()
            self._unscale(grads)
            self._track_grad_norm_later(grads)
            self.descent_loss = loss
        self.schedule.perturbed += self.last_perturbed
        self._finish()
        return loss

    def _counted(self, closure):
        """The closure, counting each call as ``pass_share`` of a gradient evaluation (1 unless a
        variant says otherwise for its next pass: ESAM's no-grad forward, its partial batch)."""

        def counted() -> torch.Tensor:
            """The closure, its pass counted."""
            self.count_pass(self.pass_share)
            return closure()

        return counted

    def count_pass(self, share: float) -> None:
        """Count ``share`` of a forward-backward pass over the batch: a pass over part of it
        counts as that part, a forward without backward as 1/3 (variants that run such passes
        outside the closure call this)."""
        self.grad_evals += share

    def _raw_sq_norm(self) -> float:
        """‖g‖² of the gradients now held, fp16 scaling undone (one host sync)."""
        norm = self.global_norm(self._lists()[1])
        if self.grad_scaler is not None:
            norm = norm.double() / self.grad_scaler._scale.double()
        return float(norm.double()) ** 2

    def sharpness_step(self, closure: Callable[[], torch.Tensor]) -> torch.Tensor:
        """First pass at θ, perturb to θ+ε, second pass, restore θ (the descent gradient stays)."""
        if self._own_perturbation_sharded():
            return self._own_sharpness_step(closure)
        loss, params, pgrads = self.first_pass(closure)
        self.perturb_(params, pgrads)
        # the first pass's gradients (SAM's ε) let go: the second pass's closure frees them
        # before its backward allocates its own (set_to_none), not after
        del pgrads
        self.descend(closure, 1, loss)
        return loss

    def perturb_(self, params: Tensors, pgrads: Tensors) -> None:
        """θ saved, then θ ← θ + ε with ε from ``compute_perturbation`` (into the ``eps``
        buffers, where a variant may read it after the second pass)."""
        c = self._cache
        self.perturbation_into(params, pgrads, c["eps"])
        self.save_theta(params)
        torch._foreach_add_(params, c["eps"])

    def save_theta(self, params: Tensors) -> None:
        """θ into its buffer, for the restore after the perturbed pass; nothing while the lists are
        gathered parameters (their reshard drops θ + ε, the shards still hold θ)."""
        if self._gathered is None:
            torch._foreach_copy_(self._cache["theta"], params)

    # ------------------------------------------------------------------ per-process ε, sharded
    def _own_perturbation_sharded(self) -> bool:
        """Whether this perturbing step builds each process's own ε on FSDP2's gathered
        parameters: a sharded model, ``sync_perturbation`` off, and no synchronised first pass
        already run (the ``adaptive`` schedule's, which ε then reuses as under DDP)."""
        sharded = hasattr(self.model, "set_reshard_after_backward")  # FSDP2's FSDPModule
        return sharded and not self.sync_perturbation and not self._first_reused

    @contextlib.contextmanager
    def _on_gathered(self):
        """Inside, the engine's lists are the gathered parameters (this process's whole tensors)
        and their gradients (its own, unreduced): the variant's rule, its norms and dots run as
        on one process's gradient under DDP; its buffers (ε) are whole tensors, apart from the
        sharded lists' and let go on leaving (ε is then in the parameters: the descent pass runs
        without them, and no whole tensor stays between steps)."""
        sharded_cache, group = self._cache, self._shard_group
        self._gathered, self._shard_group, self._cache = gathered_parameters(self.model), None, {}
        try:
            yield
        finally:
            self._cache, self._shard_group, self._gathered = sharded_cache, group, None

    def shards_of_mean(self, whole: Tensors) -> Tensors:
        """While each process's own ε is built sharded (the lists gathered): the mean over the
        processes of ``whole`` (one tensor per listed parameter, as DDP averages a process's own
        g: one all-reduce, whole), cut to this process's shards as the sharded lists hold them.
        For a rule whose update, on the shards, reads the first pass's gradient.

        Args:
            whole: one tensor per parameter of the gathered lists (``_lists()``), in their order.
        """
        from torch.distributed.tensor import distribute_tensor

        mean = [w.clone() for w in whole]
        self.all_reduce_mean_list_(mean)
        out = []
        for m, p in zip(mean, self.state_owners()):
            # every process holds the same mean: each cuts its own shard, no communication
            local = distribute_tensor(m, p.device_mesh, p.placements, src_data_rank=None)
            out.append(local.to_local())
        return out

    def state_owners(self) -> list[torch.Tensor]:
        """The parameters of the engine's listed tensors (``_lists()``'s, in their order), as the
        base optimizer keys its state: the tensors themselves, or under sharding the DTensor
        parameters whose shards, or gathered copies, are listed."""
        c = self._cache
        if self._gathered is not None:
            sharded = {id(w): p for p, w in self._gathered.items()}
            return [sharded[id(w)] for w in c["params"]]
        return c.get("sharded", c["params"])

    def _own_sharpness_step(self, closure: Callable[[], torch.Tensor]) -> torch.Tensor:
        """SAM's step with each process's own ε under FSDP2. The pass at θ runs unsynchronised
        and keeps its gathered parameters, whose ``.grad`` is then the process's whole gradient;
        ε from it is added to them in place (the shards keep θ). The descent pass runs on those
        θ + ε_k without gathering again, reduce-scatters the mean of ∇L_k(θ + ε_k), and the
        reshard after it drops the perturbed copies: θ needs no restore."""
        with gathered_kept(self.model):
            loss = self.run_pass(closure, 0, sync=False)
        with self._on_gathered():
            params, grads, _ = self._lists()
            self.perturb_(params, self.prepare_perturbation(params, grads))
            for p in params:  # the descent pass's reduce-scatter takes its own gradient alone
                p.grad = None
            del grads
        try:
            with gathered_kept(self.model, through_forward=True):
                perturbed_loss = self.run_pass(closure, 1, sync=True)
        finally:
            reshard_gathered(self.model)
        self.descent_loss = perturbed_loss
        # each process's own losses, as under DDP: a rule reading them averages what it needs
        self.after_second_pass(loss, perturbed_loss)
        return loss

    def first_pass(
        self, closure: Callable[[], torch.Tensor]
    ) -> tuple[torch.Tensor, Tensors, Tensors]:
        """The pass at θ (synchronised only with ``sync_perturbation``), unscaled: its loss, the
        parameters and the gradients ε is built from (their norm in ``self.g_norm``)."""
        skip = self.first_pass_skips()
        if skip and self.sync_perturbation and hasattr(self.model, "no_sync"):
            skip = ()  # DDP expects a gradient of every parameter in a synchronised pass
        loss = self.run_pass(closure, 0, sync=self.sync_perturbation, skip=skip)
        for p in skip:  # no gradient is a zero one (the parameter lists stay those of every pass)
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        params, grads, _ = self._lists()
        self._unscale(grads)
        return loss, params, self.prepare_perturbation(params, grads)

    def descend(self, closure: Callable[[], torch.Tensor], index: int, loss: torch.Tensor) -> None:
        """The descent pass at the perturbed point: its gradient stays, θ is restored, then the
        variant's ``after_second_pass`` sees L(θ) and L(θ+ε)."""
        perturbed_loss = self.run_pass(closure, index, sync=True)
        torch._foreach_copy_(self._cache["params"], self._cache["theta"])
        if self.grad_scaler is not None:
            self._unscale(self._lists()[1])
        self.descent_loss = perturbed_loss
        self.after_second_pass(*self._step_losses(loss, perturbed_loss))

    def _step_losses(self, loss, perturbed_loss):
        """L(θ) and L(θ+ε) as the update reads them: sharded, the means over every process's
        batch (one all-reduce), as one process on the whole batch sees them."""
        if self._shard_group is None or loss is None or perturbed_loss is None:
            return loss, perturbed_loss
        both = torch.stack([loss.detach().float(), perturbed_loss.detach().float()])
        both = self._reduce_sum_(both) / torch.distributed.get_world_size(self._shard_group)
        return both[0].to(loss.dtype), both[1].to(perturbed_loss.dtype)

    def prepare_perturbation(self, params: Tensors, grads: Tensors) -> Tensors:
        """Track the first-pass ‖g‖; return the gradients ε is built from, with their norm in
        ``self.g_norm``."""
        norm = self._track_grad_norm(grads)
        pgrads = self.perturbation_grads(params, grads)
        self.g_norm = norm if pgrads is grads else self.global_norm(pgrads)
        return pgrads

    def _finish(self):
        """Clip, then the base step (skipped when fp16 scaling found inf/NaN)."""
        if self.clip_grad_norm:
            params, grads, _ = self._lists()
            if self._shard_group is None:
                torch.nn.utils.clip_grad_norm_(params, self.clip_grad_norm, foreach=True)
            else:  # clip_grad_norm_'s rule on the shards, with the global norm
                coef = self.clip_grad_norm / (self.global_norm(grads) + 1e-6)
                torch._foreach_mul_(grads, coef.clamp(max=1.0))
        if self.grad_scaler is None:
            self._descend()
            return
        found = (
            self._found_inf
            if self._found_inf is not None
            else torch.zeros(1, device=self.grad_scaler._scale.device)
        )
        if not found.item():  # the one host sync, fp16 only (GradScaler.step does the same)
            self._descend()
        # hand the inf/NaN finding to the scaler so that scaler.update() adjusts the scale
        from torch.amp.grad_scaler import OptState

        state = self.grad_scaler._per_optimizer_states[id(self)]
        state["found_inf_per_device"] = {found.device: found}
        state["stage"] = OptState.STEPPED

    def _descend(self) -> None:
        """The added gradient adjusters, then the base step."""
        if self._gradient_adjusters:
            params, grads, _ = self._lists()
            adjusted = grads
            for adjust in self._gradient_adjusters:
                adjusted = adjust(params, adjusted)
            if adjusted is not grads:
                torch._foreach_copy_(grads, adjusted)
        self.base_step()

    def base_step(self) -> None:
        """The base optimizer's update with the gradients in place (a hook: FedVSSAM adjusts):
        its class's step without torch's wrapper where nothing observes it, as ``step``'s own."""
        base = self.base_optimizer
        unwrapped = getattr(type(base).step, "__wrapped__", None)
        if unwrapped is None or "step" in vars(base) or _step_observed(base):
            base.step()  # not torch's wrapper, an instance's own step, or hooks and profiler
        else:
            unwrapped(base)

    # ------------------------------------------------------------------ davda54/sam's API
    def _two_step_check(self, method: str) -> None:
        name = type(self).__name__
        _check(
            not self._own_perturbation_sharded(),
            f"{name}.{method}: with sync_perturbation off on a sharded model each process's ε is "
            "built on FSDP2's gathered parameters: use step(closure)",
        )
        _check(
            self.passes == 2 and type(self).sharpness_step is SharpnessAware.sharpness_step,
            f"{name}.{method}: {name} runs passes of its own (more or fewer than two, or on part "
            "of the batch): use step(closure)",
        )

    @torch.no_grad()
    def first_step(self, zero_grad: bool = False, *, loss: torch.Tensor | None = None) -> None:
        """davda54/sam's first step: with the gradient at θ in ``.grad`` (the caller ran the
        backward pass), save θ and move to θ + ε. ``loss``: L(θ), for the variants whose update
        reads it (``step_needs_losses``). Between the two steps BatchNorm layers of a bound model
        keep their running statistics (the second forward does not move them)."""
        self._two_step_check("first_step")
        name = type(self).__name__
        _check(
            getattr(self, "_between_steps", None) is None,
            f"{name}.first_step called twice without second_step in between",
        )
        _check(
            not self.step_needs_losses or loss is not None,
            f"{name}.first_step needs loss= (L(θ)): its update reads the losses",
        )
        self._found_inf = None
        self.step_count += 1
        self.last_perturbed = True
        self.count_pass(1.0)
        params, grads, _ = self._lists()
        self._unscale(grads)
        pgrads = self.prepare_perturbation(params, grads)
        SharpnessAware.perturb_(self, params, pgrads)  # ε into its buffers, the gradients kept
        self._first_loss = loss
        stack = contextlib.ExitStack()
        stack.enter_context(self._bn_kept(self._bn))
        self._between_steps = stack
        # the caller's next forward is the perturbed pass (reduce_loss reads it)
        self.pass_index = 1
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad: bool = False, *, loss: torch.Tensor | None = None) -> None:
        """davda54/sam's second step: with the gradient at θ + ε in ``.grad``, restore θ and take
        the base optimizer's step with that gradient (the variant's own update included).
        ``loss``: L(θ + ε), for the variants whose update reads it."""
        self._two_step_check("second_step")
        name = type(self).__name__
        stack = getattr(self, "_between_steps", None)
        _check(stack is not None, f"{name}.second_step called without first_step before it")
        _check(
            not self.step_needs_losses or loss is not None,
            f"{name}.second_step needs loss= (L(θ + ε)): its update reads the losses",
        )
        stack.close()
        self._between_steps, self.pass_index = None, 0
        self.count_pass(1.0)
        torch._foreach_copy_(self._cache["params"], self._cache["theta"])
        if self.grad_scaler is not None:
            self._unscale(self._lists()[1])
        self.descent_loss = loss
        self.after_second_pass(*self._step_losses(self._first_loss, loss))
        self.schedule.perturbed += 1
        self._finish()
        if zero_grad:
            self.zero_grad()

    # ------------------------------------------------------------------ variant hooks
    def compute_perturbation(self, params: Tensors, grads: Tensors, eps: Tensors) -> None:
        """The variant's rule: write ε into the persistent buffers ``eps``.

        Args:
            params: the parameters with a gradient, at θ.
            grads: the gradients ε is built from (``perturbation_grads``); their global norm is
                ``self.g_norm``.
            eps: one buffer per parameter, to fill in place.
        """
        raise NotImplementedError

    def first_pass_skips(self) -> list[torch.nn.Parameter]:
        """Parameters whose gradient at θ nothing needs this step (ESAM's tensors left
        unperturbed): the first pass skips them, and they hold a zero gradient after it. Asked
        once a perturbing step, before the first pass; here none."""
        return []

    def select_rows(self, *tensors: torch.Tensor | None) -> tuple:
        """The rows of one micro-batch's tensors that the current pass runs on; here all of
        them. A training loop calls it on each micro-batch before its forward and weights the
        losses by the rows kept (ESAM's descent pass keeps the samples whose loss rose most).

        Args:
            tensors: the micro-batch's inputs, targets, ... (None passes through).

        Returns:
            The same tensors, each cut to the kept rows.
        """
        return tensors

    def reduce_loss(
        self,
        per_sample_loss: torch.Tensor,
        logits: torch.Tensor,  # noqa: ARG002 (the hook's signature)
        targets: torch.Tensor,  # noqa: ARG002
    ) -> torch.Tensor:
        """The loss a pass backpropagates (CSAM reweights the descent pass); here the mean.

        Args:
            per_sample_loss: the micro-batch's losses, one per sample.
            logits: the pass's outputs.
            targets: the labels.
        """
        return per_sample_loss.mean()

    def after_second_pass(self, loss: torch.Tensor, perturbed_loss: torch.Tensor) -> None:
        """After the second pass, once the step's fp16 overflow is known: adaptive variants
        update their state here (through ``keep_if_overflow``).

        Args:
            loss: L(θ), the first pass's loss.
            perturbed_loss: L(θ+ε), the second's.
        """

    def global_norm(self, tensors: Tensors) -> torch.Tensor:
        """One L2 norm over a whole list of tensors, kept on the device (sharded: over every
        process's shards, one all-reduce of the squared norm)."""
        if self._shard_group is None:
            return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(tensors)))
        sq = torch.stack(torch._foreach_norm(tensors)).square().sum()
        return self._reduce_sum_(sq).sqrt()

    def dot(self, a: Tensors, b: Tensors) -> torch.Tensor:
        """⟨a, b⟩ over two tensor lists, on the device: one dot per tensor, no temporaries (3×
        faster
        than the polarization identity over foreach sums, and without its float32 cancellation)."""
        out = torch.stack([torch.dot(x.reshape(-1), y.reshape(-1)) for x, y in zip(a, b)]).sum()
        return out if self._shard_group is None else self._reduce_sum_(out)

    def tensor_norms(self, tensors: Tensors) -> Tensors:
        """‖·‖ of each tensor of a list (sharded: of the whole tensor, one all-reduce)."""
        if self._shard_group is None:
            return list(torch._foreach_norm(tensors))
        sq = self._reduce_sum_(torch.stack(torch._foreach_norm(tensors)).square())
        return list(sq.sqrt().unbind())

    def tensor_dots(self, a: Tensors, b: Tensors) -> Tensors:
        """⟨a_i, b_i⟩ of each pair of tensors of two lists (sharded: whole tensors)."""
        dots = [torch.dot(x.reshape(-1), y.reshape(-1)) for x, y in zip(a, b)]
        if self._shard_group is None:
            return dots
        return list(self._reduce_sum_(torch.stack(dots)).unbind())

    # ------------------------------------------------------------------ state
    def variant_state(self) -> dict:
        """The variant's own scalars and tensors beyond per-parameter state (override and
        extend)."""
        return {"step_count": self.step_count}

    def load_variant_state(self, state: dict) -> None:
        """Restore ``variant_state()``'s output (tensors already on the parameters' device)."""
        self.step_count = int(state["step_count"])

    def log_values(self) -> dict:
        """Scalars for metrics.jsonl (ρ and anything adaptive); one host sync, at log time."""
        return {"rho": self.current_rho, **self.pop_grad_norm_max()}

    def cost_values(self) -> dict:
        """``grad_evals``: the gradient evaluations counted so far (for metrics.jsonl)."""
        return {"grad_evals": self.grad_evals}

    def summary_values(self) -> dict:
        """The run's cost for summary.json: counted passes per step, share of perturbed steps."""
        steps = max(self.step_count, 1)
        return {
            "grad_evals_per_step": self.grad_evals / steps,
            "perturbed_fraction": self.schedule.perturbed / steps,
        }

    def pop_grad_norm_max(self) -> dict:
        """``grad_norm_max``: the largest first-pass ‖g‖ since the last call (Γ in TLC-SAM's bound);
        resets it."""
        folded = self._folded_grad_norm_max()
        if folded is None:
            return {}
        value, self._grad_norm_max = float(folded), None
        return {"grad_norm_max": value}

    @contextlib.contextmanager
    def _state_by_parameter(self):
        """Per-parameter state under the parameters' own keys while torch packs it (sharded, the
        variant keys it by the local shard it sees)."""
        c = self._cache
        if "sharded" not in c:
            yield
            return
        pairs = [(lp, p) for lp, p in zip(c["params"], c["sharded"]) if lp in self.state]
        for lp, p in pairs:
            self.state[p] = self.state.pop(lp)
        try:
            yield
        finally:
            for lp, p in pairs:
                self.state[lp] = self.state.pop(p)

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state with the base optimizer's, the variant's and the schedule's."""
        with self._state_by_parameter():
            sd = super().state_dict()
        sd["base"] = self.base_optimizer.state_dict()
        sd["variant"] = self.variant_state()
        sd["schedule"] = {**self.schedule.state(), "grad_evals": self.grad_evals}
        if self._folded_grad_norm_max() is not None:  # a checkpoint within an epoch: the max so far
            sd["grad_norm_max"] = self._grad_norm_max.detach().cpu()
        return sd

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved (older checkpoints without a schedule too)."""
        sd = dict(state_dict)
        base, variant = sd.pop("base"), sd.pop("variant")
        schedule = sd.pop("schedule", None)  # absent in checkpoints older than the schedules
        grad_norm_max = sd.pop("grad_norm_max", None)
        if schedule is not None:
            schedule = dict(schedule)
            self.grad_evals = float(schedule.pop("grad_evals"))
            self.schedule.load(schedule)
        super().load_state_dict(sd)
        self.base_optimizer.load_state_dict(base)
        _reshard_state(self.base_optimizer)
        self.param_groups = self.base_optimizer.param_groups
        # a checkpoint is read onto the CPU: the variant's tensors (GEAR-SAM's block energies,
        # TLC-SAM's controller) go where the parameters are, as torch does for per-parameter state
        device = next(p.device for g in self.param_groups for p in g["params"])
        self.load_variant_state(
            {k: v.to(device) if torch.is_tensor(v) else v for k, v in variant.items()}
        )
        self._cache = {}
        self._grad_norm_max = None if grad_norm_max is None else grad_norm_max.to(device)
        self._step_norms, self._step_norm_parts = [], []


def _reshard_state(optimizer) -> None:
    """A sharded run's optimizer state read back from one process's checkpoint (local shards):
    each tensor shaped like its parameter's local shard becomes a DTensor sharded as it is."""
    from torch.distributed.tensor import DTensor

    for group in optimizer.param_groups:
        for p in group["params"]:
            if not isinstance(p, DTensor) or p not in optimizer.state:
                continue
            local = p.to_local()
            state = optimizer.state[p]
            for k, v in state.items():
                if torch.is_tensor(v) and not isinstance(v, DTensor) and v.ndim == p.ndim > 0 \
                        and v.shape == local.shape:  # fmt: skip
                    state[k] = DTensor.from_local(
                        v.to(local.device), p.device_mesh, p.placements, run_check=False,
                        shape=p.shape, stride=p.stride(),
                    )  # fmt: skip
