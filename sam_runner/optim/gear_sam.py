"""GEAR-SAM (Gradient-Energy Adaptive Radius SAM; known from its abstract).

Blocks b partition the parameters. State: one scalar per block, the EMA of the squared
block gradient norm a_b ← β a_b + (1 − β) ‖g_b‖², bias-corrected â_b = a_b / (1 − β^t)
(t counts perturbing steps; the new a_b and t are committed after the second pass, so a
step skipped by the fp16 scaler, whichever pass overflowed, leaves them unchanged).
Sensitivity s_b = sqrt(â_b); the closed-form allocation of max Σ r_b s_b s.t. Σ r_b² = ρ²
is r_b = ρ s_b / sqrt(Σ_j s_j²); ε_b = r_b g_b / ‖g_b‖.
So ‖ε‖ = ρ exactly, and β = 0 is SAM (r_b = ρ ‖g_b‖ / ‖g‖) on one process, or under data
parallelism with ``sync_perturbation=True``. Under data parallelism without it, β = 0 is not
per-process SAM: the shares r_b come from the block energies averaged over processes (below),
while each ε_b points along the process's own g_b, so ε ≠ ρ g/‖g‖ for the process's g.
Default β = 0.9.

From the abstract: the EMA of squared block gradients, the closed-form allocation of the
fixed global radius, scalar-only extra state. Ours (docs/variants.md): the exact EMA and
bias correction, and the block choices ``blocks``:
- ``'group'`` (default): one block per functional block. The group key
  ``block`` when the groups carry it (the runner's groups: a model's top-level child, its
  weights and biases together); otherwise, with a bound model (``model=`` or
  ``bind(model=...)``), the model's top-level child owning each parameter (parameters of the
  root module: one more block); with neither, one block per parameter group and a warning
  (a plain parameter list is then one block: exactly SAM).
- ``'tensor'``: one block per tensor.
- ``'layer'``: one block per module that owns parameters; needs the model
  (``model=`` or ``bind(model=...)``).
A block whose gradient is exactly zero gets ε_b = 0 (its share of ρ is lost that step).
Also ours: under data parallelism with per-process perturbations (``sync_perturbation=False``)
the EMA takes the mean over processes of ‖g_b‖² (one all-reduce of a vector of block count
per perturbing step), so every process keeps the same a_b (and a checkpoint of one
process resumes them all); ε_b = r_b g_b / ‖g_b‖ still uses the process's own g_b. With
``sync_perturbation=True`` the gradients are already averaged and nothing more is sent.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from ..registry import VARIANTS
from .blocks import top_level_blocks
from .engine import SharpnessAware, _check

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from torch.optim.optimizer import ParamsT

BLOCKS = ("group", "tensor", "layer")


@VARIANTS.register(
    "gear_sam",
    "SAM's radius split over functional blocks by an EMA of their gradient energy (GEAR-SAM)",
)
class GEARSAM(SharpnessAware):
    # why each process's own ε (sync_perturbation=false) cannot run sharded
    fsdp_own_perturbation_refused = (
        "its block energies, read by ε, are indexed by the sharded parameter lists"
    )
    variant_options = {"beta": 0.9, "blocks": "group"}

    def __init__(
        self,
        params: ParamsT,
        base_optimizer: Callable[..., torch.optim.Optimizer],
        rho: float = 0.05,
        **kwargs: Any,
    ) -> None:
        super().__init__(params, base_optimizer, rho=rho, **kwargs)
        _check(0 <= self.beta < 1, f"beta must be in [0, 1), got {self.beta}")
        _check(self.blocks in BLOCKS, f"blocks must be one of {BLOCKS}, got {self.blocks!r}")
        # a_b, one scalar per block (created at the first step, on the device)
        self.block_energy = None
        self.energy_steps = None  # t of the bias correction (device tensor)
        self._warned = False

    def _block_ids(self) -> list:
        """Block key of every parameter, in param_groups order."""
        all_params = [p for g in self.param_groups for p in g["params"]]
        if self.blocks == "tensor":
            return list(range(len(all_params)))
        if self.blocks == "group" and any("block" in g or "blocks" in g for g in self.param_groups):
            return self.per_parameter("block", lambda _, gi: gi, with_grads=False)
        if self.model is None:
            _check(
                self.blocks != "layer",
                "GEARSAM(blocks='layer') needs the model: pass model=... or call bind(model=...) "
                "before step()",
            )
            n = len(self.param_groups)
            if not self._warned:  # once per optimizer (block ids are rebuilt with the cache)
                self._warned = True
                sam = " (one block: exactly SAM)" if n == 1 else ""
                warnings.warn(
                    "GEARSAM: no model bound and no 'block' keys in the parameter groups, so each "
                    f"of the {n} group(s) is one block{sam}; pass model=... or call "
                    "bind(model=...) for one block per top-level child, or give the groups a "
                    "'block' key"
                )
            return [gi for gi, g in enumerate(self.param_groups) for _ in g["params"]]
        if self.blocks == "layer":
            owners = [
                m
                for m in self.model.modules()
                if next(m.parameters(recurse=False), None) is not None
            ]
            owner = {id(p): i for i, m in enumerate(owners) for p in m.parameters(recurse=False)}
        else:
            owner = top_level_blocks(self.model)
        missing = [tuple(p.shape) for p in all_params if id(p) not in owner]
        _check(
            not missing,
            f"GEARSAM(blocks={self.blocks!r}): parameters of shapes {missing} are not in the "
            "bound model",
        )
        return [owner[id(p)] for p in all_params]

    def _index(self, params, device):
        """Block index (a device tensor) of each parameter with a gradient, and the block count."""
        c = self._cache
        if "block_index" not in c:
            ids = self._block_ids()
            # renumber densely so that blocks with layer numbering start at 0
            dense = {b: i for i, b in enumerate(dict.fromkeys(ids))}
            pos = {
                id(p): dense[b]
                for p, b in zip(
                    self.shards([p for g in self.param_groups for p in g["params"]]), ids
                )
            }
            c["block_index"] = torch.tensor([pos[id(p)] for p in params], device=device)
            c["num_blocks"] = len(dense)
        return c["block_index"], c["num_blocks"]

    def compute_perturbation(
        self, params: list[torch.Tensor], grads: list[torch.Tensor], eps: list[torch.Tensor]
    ) -> None:
        """ε with each block's radius set from its bias-corrected gradient energy; the new EMA
        staged."""
        index, num_blocks = self._index(params, grads[0].device)
        sq = torch.stack(self.tensor_norms(grads)).square()
        # ‖g_b‖²
        block_sq = torch.zeros(num_blocks, device=sq.device, dtype=sq.dtype).index_add_(
            0, index, sq
        )
        # the state is global: the mean ‖g_b‖² over processes (their own under sync_perturbation
        # already)
        global_sq = block_sq if self.sync_perturbation else self.all_reduce_mean_(block_sq.clone())
        if self.block_energy is None:
            self.block_energy = torch.zeros_like(block_sq)
            self.energy_steps = torch.zeros((), device=block_sq.device)
        energy = self.beta * self.block_energy + (1 - self.beta) * global_sq
        t = self.energy_steps + 1
        s = (energy / (1 - self.beta**t)).sqrt()
        self._staged = (energy, t)  # committed after the second pass, once its overflow is known
        r = self.current_rho * s / (s.square().sum().sqrt() + 1e-12)  # closed-form allocation
        scale = (r / (block_sq.sqrt() + 1e-12))[index]  # r_b / ‖g_b‖, per tensor
        torch._foreach_copy_(eps, grads)
        torch._foreach_mul_(eps, scale.unbind())

    @override
    def after_second_pass(self, loss: torch.Tensor, perturbed_loss: torch.Tensor) -> None:
        """Commit the staged block energies and step count, unless the fp16 step was skipped."""
        # a skipped fp16 step (inf/NaN in either pass) leaves the EMA and its step count as they
        # were
        energy, t = self._staged
        self.block_energy = self.keep_if_overflow(energy, self.block_energy)
        self.energy_steps = self.keep_if_overflow(t, self.energy_steps)

    def variant_state(self) -> dict:
        """The engine's state, the block energies and their step count."""
        return {
            **super().variant_state(),
            "block_energy": self.block_energy,
            "energy_steps": self.energy_steps,
        }

    def load_variant_state(self, state: dict) -> None:
        """Restore ``variant_state()``'s output."""
        super().load_variant_state(state)
        for key in ("block_energy", "energy_steps"):
            setattr(self, key, state[key].clone() if state[key] is not None else None)
