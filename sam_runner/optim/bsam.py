"""bSAM, Bayesian SAM (Möllenhoff & Khan, ICLR 2023, "SAM as an Optimal Relaxation of Bayes";
official code team-approx-bayes/bayesian-sam ``optim.py``, JAX).

A Gaussian posterior N(θ, 1/(N s)) with a per-coordinate precision s (initialised to
``s_init``). Per step:

1. pass 0 at a sample θ + n/√(N s), n ~ N(0, I): g;
2. ε = ρ g / s (elementwise; no normalisation), pass 1 at θ + ε: g_ε;
3. m ← β₁ m + (1 − β₁)(g_ε + δ θ); θ ← θ − η m / s (s before its update);
   s ← β₂ s + (1 − β₂)(√s |g| + γ + δ).

δ is the parameter group's ``weight_decay`` (the official code's prior precision / N), η its
learning rate, γ = ``damping``. bSAM is an optimizer of its own: the base optimizer's step is not
taken (its ``lr`` and ``weight_decay`` are read; a momentum of the base does nothing, with a
notice). Defaults ρ = 0.01, β₁ = 0.9, β₂ = 0.999, γ = 0.1, s_init = 1 (the official CIFAR
command; its learning rate 0.5 belongs to ``base_optimizer.lr``).

``num_data`` is N; ``sam-run`` sets it to the training set's size when null (the official code
multiplies it by ``--dafactor`` 4 under augmentation: set it to 4 × the size for that). From
Python, null means no weight noise (N = ∞), with a notice.

pytorch_optimizer's ``BSAM`` differs from the official code in four places (its noise has
variance 1/(N s)² where the official has 1/(N s); the parameters are not restored between the
passes; its momentum averages wd·g_ε instead of g_ε + δ θ; its s averages (√s |g_ε| + δ + γ)²):
the official code is the reference here (tests/optim/test_bsam.py transcribes it).

Ours: the noise is drawn from a generator seeded by ``perturb_seed``, the count of steps taken
and the process's rank (so every process draws its own, as the official code's sub-batches do,
and a resume draws the same noise without a saved generator), in one call for all the
parameters; under data parallelism with per-process ε the √s |g| term is averaged over processes
(the official code averages it over its sub-batches), so s stays the same everywhere. A plain
step (a schedule's) takes the update with the gradient at θ in place of g_ε and g. BatchNorm
running statistics come from the noisy pass.
"""

from __future__ import annotations

import math
import warnings
from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from ..registry import VARIANTS
from .engine import _check
from .sam import SAM

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from torch.optim.optimizer import ParamsT


def _rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


@VARIANTS.register("bsam", "SAM as a Bayes relaxation: noisy g, ε = ρg/s, Adam-like s (bSAM)")
class BSAM(SAM):
    # why each process's own ε (sync_perturbation=false) cannot run sharded
    fsdp_own_perturbation_refused = (
        "its posterior scale s is per-parameter state on the shards, updated from the first "
        "pass's gradient"
    )
    replaces_lr = True  # the step is η m / s
    variant_options = {
        "beta1": 0.9,
        "beta2": 0.999,
        "damping": 0.1,
        "s_init": 1.0,
        "num_data": None,
    }

    def __init__(
        self,
        params: ParamsT,
        base_optimizer: Callable[..., torch.optim.Optimizer],
        rho: float = 0.01,
        **kwargs: Any,
    ) -> None:
        self.seed = int(kwargs.get("perturb_seed", 0))
        super().__init__(params, base_optimizer, rho=rho, **kwargs)
        _check(0 <= self.beta1 < 1, f"beta1 must be in [0, 1), got {self.beta1}")
        _check(0 <= self.beta2 < 1, f"beta2 must be in [0, 1), got {self.beta2}")
        _check(self.damping >= 0, f"damping must be >= 0, got {self.damping}")
        _check(self.s_init > 0, f"s_init must be > 0, got {self.s_init}")
        if self.num_data is not None:
            self.set_num_data(self.num_data)
        moving = [g for g in self.param_groups if g.get("momentum") or g.get("nesterov")]
        if moving:
            warnings.warn(
                "bsam: the base optimizer's momentum does nothing (bSAM's own is beta1)",
                stacklevel=2,
            )
        self.noise_count = 0
        self._gs, self._told = None, False
        self._saved, self._noise = {}, None  # persistent scratch: per-parameter, flat noise

    def set_num_data(self, n: float) -> None:
        """N, the number of training examples the posterior's precision counts."""
        _check(
            isinstance(n, (int, float)) and not isinstance(n, bool) and 0 < n < math.inf,
            f"num_data must be a number > 0, got {n!r}",
        )
        self.num_data = float(n)

    def _state(self, p, key):
        state = self.state[p]
        if key not in state:
            init = self.s_init if key == "bsam_s" else 0.0
            state[key] = torch.full_like(p, init)
        return state[key]

    def _buffers(self, slot: str, params) -> list[torch.Tensor]:
        """Persistent scratch tensors shaped like ``params`` (made again when they change)."""
        key = (slot, tuple(id(p) for p in params))
        if key not in self._saved:
            self._saved = {k: v for k, v in self._saved.items() if k[0] != slot}
            self._saved[key] = [torch.empty_like(p) for p in params]
        return self._saved[key]

    def _copy(self, params):
        buf = self._buffers("mean", params)
        torch._foreach_copy_(buf, params)
        return buf

    def _add_noise_(self, trained) -> None:
        """θ ← θ + n/√(N s), n ~ N(0, I) drawn for (seed, steps taken, rank) in one call into a
        persistent flat buffer. Sharded parameters share one θ: one draw of the whole tensors
        (rank 0's), each process adding its shard."""
        params = self.shards(trained)
        device = params[0].device
        if device.type == "meta":
            noise = [torch.randn_like(p) for p in params]
        else:
            sharded = self._shard_group is not None
            gen = torch.Generator(device=device)
            gen.manual_seed(hash((self.seed, self.noise_count, 0 if sharded else _rank())) % 2**63)
            sizes = [p.numel() for p in trained]  # whole tensors
            if self._noise is None or self._noise.numel() != sum(sizes):
                self._noise = torch.empty(sum(sizes), device=device, dtype=params[0].dtype)
            self._noise.normal_(generator=gen)
            noise = [
                _shard_of(v.view(p.shape).to(p.dtype), p)
                for v, p in zip(self._noise.split(sizes), trained)
            ]
        std = self._buffers("std", params)  # 1/√(N s)
        torch._foreach_copy_(std, [self._state(p, "bsam_s") for p in params])
        torch._foreach_mul_(std, self.num_data)
        torch._foreach_rsqrt_(std)
        torch._foreach_addcmul_(params, noise, std)

    def _scaled_abs_grads(self, params, grads) -> list[torch.Tensor]:
        """√s |g| into persistent buffers (this step's: read by ``base_step``)."""
        gs = self._buffers("gs", params)
        torch._foreach_copy_(gs, [self._state(p, "bsam_s") for p in params])
        torch._foreach_sqrt_(gs)
        torch._foreach_mul_(gs, grads)
        torch._foreach_abs_(gs)
        return gs

    @override
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        """One bSAM step (``closure`` as the engine's)."""
        self._gs = None
        return super().step(closure)

    @override
    def sharpness_step(self, closure: Callable[[], torch.Tensor]) -> torch.Tensor:
        """Pass 0 at a noisy sample of the posterior, ε = ρ g / s, the descent pass at θ + ε."""
        trained = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        if self.num_data is None and not self._told:
            self._told = True
            warnings.warn("bsam: num_data is not set: no weight noise (N = ∞)", stacklevel=3)
        noisy = self.num_data is not None and bool(trained)
        if noisy:
            mean = self._copy(self.shards(trained))
            self._add_noise_(trained)
        loss = self.run_pass(closure, 0, sync=self.sync_perturbation)
        if noisy:
            torch._foreach_copy_(self.shards(trained), mean)
        params, grads, _ = self._lists()
        self._unscale(grads)
        pgrads = self.prepare_perturbation(params, grads)
        s = [self._state(p, "bsam_s") for p in params]
        gs = self._scaled_abs_grads(params, grads)
        if not self.sync_perturbation:
            self.all_reduce_mean_list_(gs)
        self._gs = gs
        torch._foreach_copy_(self._cache["theta"], params)
        torch._foreach_addcdiv_(params, pgrads, s, value=self.current_rho)  # θ + ρ g / s
        self.descend(closure, 1, loss)
        return loss

    @override
    def base_step(self) -> None:
        """bSAM's own update of θ, its momentum and its precision s (the base optimizer's step is
        not taken)."""
        params, grads, slices = self._lists()
        gs = self._gs
        if gs is None:  # a plain step: the gradient at θ stands for g
            gs = self._scaled_abs_grads(params, grads)
        # whole lists where groups share lr and weight decay (the usual case: one bucket)
        buckets: dict[tuple, list[int]] = {}
        for (a, b), group in zip(slices, self.param_groups):
            key = (group["lr"], group.get("weight_decay", 0.0))
            buckets.setdefault(key, []).extend(range(a, b))
        for (lr, wd), at in buckets.items():
            p, g, gs_ = [params[i] for i in at], [grads[i] for i in at], [gs[i] for i in at]
            s = [self._state(q, "bsam_s") for q in p]
            m = [self._state(q, "bsam_momentum") for q in p]
            torch._foreach_lerp_(m, g, 1 - self.beta1)  # m ← β₁ m + (1 − β₁)(g_ε + δ θ)
            if wd:
                torch._foreach_add_(m, p, alpha=(1 - self.beta1) * wd)
            torch._foreach_addcdiv_(p, m, s, value=-lr)  # θ − η m / s
            torch._foreach_add_(gs_, self.damping + wd)  # gs is this step's scratch
            torch._foreach_lerp_(s, gs_, 1 - self.beta2)
        self.noise_count += 1
        self._gs = None

    @override
    def variant_state(self) -> dict:
        """The engine's state and the count of noise draws."""
        return {**super().variant_state(), "noise_count": self.noise_count}

    @override
    def load_variant_state(self, state: dict) -> None:
        """Restore ``variant_state()``'s output."""
        super().load_variant_state(state)
        self.noise_count = int(state.get("noise_count", 0))


def _shard_of(full, p):
    """This process's shard of ``full``, a whole tensor shaped like parameter ``p`` (``full``
    itself when ``p`` is not sharded)."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    if not isinstance(p, DTensor):
        return full
    return distribute_tensor(full, p.device_mesh, p.placements, src_data_rank=None).to_local()
