"""SAMPa, SAM parallelized (Xie et al., NeurIPS 2024; official code LIONS-EPFL/SAMPa).

SAM's two gradients depend on each other (ε needs the first); SAMPa makes them independent by
building ε from the gradient at an auxiliary point y_t computed in the previous step:

    x̃_t = x_t + ρ ∇f(y_t)/‖∇f(y_t)‖,   y_{t+1} = x_t − η ∇f(y_t),
    x_{t+1} = x_t − η ((1 − λ) ∇f(x̃_t) + λ ∇f(y_{t+1}))

(the base optimizer applies the mixed gradient at x_t). ∇f(x̃_t) and ∇f(y_{t+1}) need only
∇f(y_t): the official code computes them on two GPUs at once. Defaults ρ = 0.1, λ = ``lam`` = 0.2
(the official script's ``--rho``, ``--og``).

The two-process form: with an even number N of data-parallel processes, ranks [0, N/2) compute
∇f(x̃_t) (role 0, pass 0) and ranks [N/2, N) ∇f(y_{t+1}) (role 1, pass 1), each role over the
whole global batch (``process_roles``: the run gives each role's processes their share of every
global batch); one all-reduce then gives every process both gradients, each averaged over its
role, and the step's loss f(x̃_t). On one process, an odd number or sharded parameters, both
passes run one after the other on every process (synchronised), with a notice, where
``sequential_fallback`` (default true) accepts it; false refuses such a run. Both forms take the
same step on the same global batch.

Ours: both passes on the step's batch (the official code evaluates ∇f(x̃_t) on the previous
step's batch, the one ∇f(y_t) came from); y_{t+1} = x_t − η ∇f(y_t) with the group's learning
rate, as the paper writes it (the official code adds the SGD momentum buffer and weight decay to
the look-ahead); ∇f(y) is kept in the optimizer's per-parameter state (``sampa_gy``, the same on
every process; a resume is exact, a step the fp16 scaler skips leaves it); on the first step
∇f(y_0) = 0, so both passes run at x_0, as in the official code; the loss a step returns is
f(x̃_t). BatchNorm running statistics come from the pass at x̃_t (in the two-process form, rank
0's, given to every process after the step as DDP gives its buffers); the job's cost is counted
as 2 passes a step in both forms.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from typing_extensions import override

from ..registry import VARIANTS
from .engine import _check
from .sam import SAM

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from torch.optim.optimizer import ParamsT


def _job() -> tuple[int, int]:
    """(rank, world) of this process's data-parallel job; (0, 1) outside one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


@VARIANTS.register("sampa", "ε from the gradient at y_t = x − η∇f(y): two independent passes")
class SAMPa(SAM):
    variant_options = {"lam": 0.2, "sequential_fallback": True}

    def __init__(
        self,
        params: ParamsT,
        base_optimizer: Callable[..., torch.optim.Optimizer],
        rho: float = 0.1,
        **kwargs: Any,
    ) -> None:
        super().__init__(params, base_optimizer, rho=rho, **kwargs)
        _check(0 <= self.lam <= 1, f"lam must be in [0, 1], got {self.lam}")
        _check(
            self.perturb_schedule != "adaptive",
            "perturb_schedule='adaptive' does not apply to sampa (it decides on a pass at θ, and "
            "neither of SAMPa's passes is at θ); use every, random or late",
        )
        self._staged, self._buffers, self._flat = None, {}, None
        self.role, self.role_size = None, 1
        params = [p for g in self.param_groups for p in g["params"]]
        if any(p.device.type == "meta" for p in params):
            return  # a check's build, before any process starts: training_share checks the config
        rank, world = _job()
        sharded = any(isinstance(p, DTensor) for p in params)
        roles = self.process_roles(
            world, sharded, {"sequential_fallback": self.sequential_fallback}
        )
        # the processes of each role; this process's role (0: pass at x̃, 1: pass at y)
        self.role_size = world // roles
        self.role = rank // self.role_size if roles == 2 else None
        if self.role is None:
            why = "sharded parameters" if sharded else f"{world} process" + "es" * (world > 1)
            warnings.warn(
                f"sampa: the two gradients run one after the other on every process ({why}; the "
                "two-process form needs an even number of data-parallel processes)",
                stacklevel=2,
            )

    @classmethod
    @override
    def process_roles(cls, world: int, sharded: bool, options: dict) -> int:
        """2 (the two-process form) on an even number of unsharded processes, else 1 where
        ``sequential_fallback`` accepts both passes on every process; else a ValueError."""
        fallback = options.get("sequential_fallback", cls.variant_options["sequential_fallback"])
        _check(
            isinstance(fallback, bool),
            f"sequential_fallback must be true or false, got {fallback!r}",
        )
        if world >= 2 and world % 2 == 0 and not sharded:
            return 2
        has = "sharded parameters" if sharded else f"{world} process" + "es" * (world > 1)
        _check(
            fallback,
            "sequential_fallback=false runs only the two-process form, which needs an even "
            f"number of data-parallel processes (trainer.devices=2, 4, ...) without sharding, and "
            f"this run has {has}; set sequential_fallback=true to run both passes one after the "
            "other on every process",
        )
        return 1

    def _buffer(self, params, slot: str):
        key = (slot, tuple(id(p) for p in params))
        if key not in self._buffers:
            self._buffers = {k: v for k, v in self._buffers.items() if k[0] != slot}
            self._buffers[key] = [torch.empty_like(p) for p in params]
        return self._buffers[key]

    @override
    def sharpness_step(self, closure: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The gradient at the auxiliary point y_t (for the next step's ε) and the descent pass
        at x_t + ε: on this process one after the other, or one of them on each role."""
        if self.role is not None:
            return self._two_process_step(closure)
        trained = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        trained = self.shards(trained)  # sharded: the local shards
        gy = [self.state[p].get("sampa_gy") for p in trained]
        known = all(g is not None for g in gy) and bool(trained)
        x = self._buffer(trained, "x")
        torch._foreach_copy_(x, trained)
        if known:
            self._move_to_x_tilde(trained, gy)
        loss = self.run_pass(closure, 0, sync=True)
        torch._foreach_copy_(trained, x)
        params, grads, slices = self._lists()
        self._unscale(grads)
        self._track_grad_norm(grads)
        g_pert = self._buffer(params, "g_pert")
        torch._foreach_copy_(g_pert, grads)
        if known:  # y = x − η g_y, each group's learning rate
            at = {id(p): i for i, p in enumerate(trained)}
            for (a, b), group in zip(slices, self.param_groups):
                ps = params[a:b]
                if ps and group["lr"]:
                    torch._foreach_add_(ps, [gy[at[id(p)]] for p in ps], alpha=-group["lr"])
        self.run_pass(closure, 1, sync=True)
        torch._foreach_copy_(trained, x)
        grads = self._lists()[1]
        self._unscale(grads)
        self._mix(params, grads, g_pert)
        self.descent_loss = loss
        return loss

    def _move_to_x_tilde(self, trained: list[torch.Tensor], gy: list[torch.Tensor]) -> None:
        """x̃ = x + ρ g_y/‖g_y‖, in place."""
        step = self._buffer(trained, "step")
        torch._foreach_copy_(step, gy)
        torch._foreach_mul_(step, self.current_rho / (self.global_norm(gy) + 1e-12))
        torch._foreach_add_(trained, step)

    def _mix(self, params: list[torch.Tensor], grads: list[torch.Tensor], g_pert) -> None:
        """``grads`` (∇f(y_{t+1}), kept unless the step is skipped) ← (1 − λ) g_x̃ + λ g_y."""
        self._staged = (params, [g.clone() for g in grads])
        torch._foreach_mul_(grads, self.lam)
        torch._foreach_add_(grads, g_pert, alpha=1 - self.lam)

    def _two_process_step(self, closure: Callable[[], torch.Tensor]) -> torch.Tensor:
        """This role's pass, unsynchronised (role 0 at x̃, role 1 at y), then one all-reduce of
        both roles' gradients and of f(x̃); rank 0's BatchNorm statistics to every process."""
        trained = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        gy = [self.state[p].get("sampa_gy") for p in trained]
        known = all(g is not None for g in gy) and bool(trained)
        x = self._buffer(trained, "x")
        torch._foreach_copy_(x, trained)
        if known and self.role == 0:
            self._move_to_x_tilde(trained, gy)
        elif known:  # y = x − η g_y, each group's learning rate
            at = {id(p): g for p, g in zip(trained, gy)}
            for group in self.param_groups:
                ps = [p for p in group["params"] if id(p) in at]
                if ps and group["lr"]:
                    torch._foreach_add_(ps, [at[id(p)] for p in ps], alpha=-group["lr"])
        loss = self.run_pass(closure, self.role, sync=False)
        self.count_pass(1.0)  # the other role's pass: the job's work is two passes a step
        torch._foreach_copy_(trained, x)
        params, grads, _ = self._lists()
        g_pert, g_y, loss = self._exchange(grads, loss)
        self._unscale(g_pert)
        self._track_grad_norm(g_pert)
        torch._foreach_copy_(grads, g_y)
        self._unscale(grads)
        self._mix(params, grads, g_pert)
        self._share_batchnorm_statistics()
        self.descent_loss = loss
        return loss

    def _exchange(self, grads: list[torch.Tensor], loss: torch.Tensor) -> tuple:
        """(∇f(x̃), ∇f(y), f(x̃)), each the mean over its role's processes: one all-reduce of a
        flat buffer [role 0's | role 1's | loss] in which each process fills its role's part."""
        n = sum(g.numel() for g in grads)
        if self._flat is None or self._flat.numel() != 2 * n + 1:
            self._flat = torch.empty(2 * n + 1, dtype=grads[0].dtype, device=grads[0].device)
        flat = self._flat
        flat[(1 - self.role) * n : (2 - self.role) * n].zero_()  # the other role's part
        torch.cat([g.reshape(-1) for g in grads], out=flat[self.role * n : (self.role + 1) * n])
        flat[2 * n] = loss.detach() if self.role == 0 else 0
        if self.role_size > 1:  # a mean over the role's processes (DDP divides before, too)
            flat.div_(self.role_size)
        dist.all_reduce(flat)
        sizes = [g.numel() for g in grads]
        g_pert = [v.view_as(g) for v, g in zip(flat[:n].split(sizes), grads)]
        g_y = [v.view_as(g) for v, g in zip(flat[n : 2 * n].split(sizes), grads)]
        return g_pert, g_y, flat[2 * n].clone().to(loss.dtype)

    def _share_batchnorm_statistics(self) -> None:
        """Rank 0's BatchNorm buffers to every process (DDP's own broadcast skips unsynchronised
        passes, and role 1's pass leaves them alone): one broadcast per dtype."""
        buffers = [b for m in self._bn for b in m.buffers()]
        for dtype in dict.fromkeys(b.dtype for b in buffers):
            same = [b for b in buffers if b.dtype == dtype]
            flat = torch.cat([b.reshape(-1) for b in same])
            dist.broadcast(flat, src=0)
            parts = flat.split([b.numel() for b in same])
            torch._foreach_copy_(same, [v.view_as(b) for v, b in zip(parts, same)])

    @override
    def _finish(self):
        super()._finish()
        staged, self._staged = self._staged, None
        if staged is None or self.overflowed():
            return
        for p, g in zip(*staged):
            self.state[p]["sampa_gy"] = g
