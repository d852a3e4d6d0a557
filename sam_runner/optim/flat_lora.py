"""Flat-LoRA (Li et al., ICML 2025, "Flat-LoRA: Low-Rank Adaptation over a Flat Loss Landscape";
code nblt/Flat-LoRA): flatness of the merged weight W' = W + s·BA in the full weight space, not
in the adapters' space, by random weight perturbation.

Each step is one forward-backward at W' + ε for every adapted layer, ε drawn fresh: filter-wise
Gaussian noise, row i (an output unit) ε_i ~ N(0, σ_t² ‖W'_i‖² / n · I), n the layer's fan-in, so
that the noise scales with each filter's own norm and not with the width. The adapters' gradients
at that point are the update's (LoRA's A and B, and whatever else is trainable, through the
same pass), and W is restored bit for bit afterwards (a saved copy, not a subtraction). σ_t rises
as σ·(1 − cos(π t/T))/2 over the run's T steps (``sigma_schedule=increasing``, the paper's; or
``constant``), σ = ``rho``. The noise of step t comes from a generator seeded by
(``noise_seed``, t): a resumed run draws the same noise, and the paper's memory trick (store the
seed, not ε) is what the restore-from-copy would replace on a large model.

Ours (docs/fine_tuning.md#flat-lora): σ is the config's ``rho`` (one name for every variant's
radius; default 0.05, the paper's LLM setting), the noise is added to the frozen weight of each
adapted layer only (the paper's: the adapted linear layers), every step perturbs (the engine's
``perturb_schedule`` may thin it, as for any variant). Without an adapted layer in the bound
model (full fine-tuning, or no model bound), the noise goes to the trainable matrices (every
parameter of two or more dimensions) themselves: random weight perturbation (RWP, the method
Flat-LoRA carries over to the merged weight), so the variant applies to any model. Adapted layers
are the runner's own (``model.peft=lora`` on its models) and ``peft``'s LoRA layers
(``model=hf``); DoRA's magnitude rescaling is not modelled (``model.peft=lora`` there).
"""

from __future__ import annotations

import math

import torch
from typing_extensions import override

from ..registry import VARIANTS
from .engine import SharpnessAware, _check

SCHEDULES = ("increasing", "constant")


def lora_layers(model) -> list[tuple[torch.Tensor, torch.Tensor, int]]:
    """(frozen weight W, the adapters' merged delta s·BA in W's layout, the output dimension of
    W) of every LoRA-adapted layer of ``model`` (the runner's own layers and ``peft``'s)."""
    from ..adapters.lora import LoRA

    model = getattr(model, "module", model)  # DDP
    model = getattr(model, "_orig_mod", model)  # torch.compile
    out = []
    for m in model.modules():
        if isinstance(m, LoRA):
            a, b = m.lora_A, m.lora_B
            if a.dim() == 2:
                delta = (b @ a) * m.lora_scaling
            else:  # a convolution: B is 1x1 from r channels
                delta = torch.einsum("or,r...->o...", b.flatten(1), a) * m.lora_scaling
            out.append((m.weight, delta, 0))
        elif hasattr(m, "get_delta_weight") and hasattr(m, "lora_A"):  # peft's LoraLayer
            base = m.get_base_layer()
            delta = sum(m.get_delta_weight(n) for n in m.active_adapters if n in m.lora_A)
            if not torch.is_tensor(delta):
                continue
            dim = 1 if getattr(m, "fan_in_fan_out", False) else 0
            out.append((base.weight, delta, dim))
    return out


@VARIANTS.register(
    "flat_lora",
    "one pass at W + sBA + ε, filter-wise noise on the merged LoRA weight (Flat-LoRA)",
)
class FlatLoRA(SharpnessAware):
    passes = 1
    single_pass_perturbation = True
    variant_options = {"sigma_schedule": "increasing", "noise_seed": 0}
    fsdp_refused = (
        "its noise is drawn for whole weight matrices and scaled by the rows of the merged "
        "W + s·BA (the whole adapter matrices), which no process holds"
    )

    def __init__(self, params, base_optimizer, rho: float = 0.05, **kwargs):
        super().__init__(params, base_optimizer, rho=rho, **kwargs)
        _check(
            self.sigma_schedule in SCHEDULES,
            f"sigma_schedule={self.sigma_schedule!r} is unknown; choose {' or '.join(SCHEDULES)}",
        )
        _check(
            self.perturb_schedule != "adaptive",
            "perturb_schedule='adaptive' does not apply to flat_lora (it decides on a pass at "
            "θ, which Flat-LoRA does not take); use every, random or late",
        )
        self.noise_seed = int(self.noise_seed)
        self._saved: dict = {}

    @property
    def sigma(self) -> float:
        """σ_t of the current step."""
        sigma = self.current_rho
        if self.sigma_schedule == "increasing" and self.total_steps:
            t = min(self.step_count, self.total_steps) / self.total_steps
            sigma *= 0.5 * (1 - math.cos(math.pi * t))
        return sigma

    def noise_(self, layers) -> None:
        """W ← W + ε for each adapted layer (W saved first); ε from this step's generator."""
        sigma = self.sigma
        for i, (w, delta, dim) in enumerate(layers):
            saved = self._saved.get(i)
            if saved is None or saved.shape != w.shape:
                saved = self._saved[i] = torch.empty_like(w)
            saved.copy_(w)
            if sigma == 0 or w.device.type == "meta":  # meta: shapes only, no numbers to draw
                continue
            g = torch.Generator(device=w.device)
            g.manual_seed(self.noise_seed * 1_000_003 + self.step_count * 1009 + i)
            merged = (w + delta).float()
            rows = merged.movedim(dim, 0).flatten(1)
            fan_in = rows.shape[1]
            std = sigma * rows.norm(dim=1) / math.sqrt(fan_in)  # one per filter
            noise = torch.randn(rows.shape, generator=g, device=w.device) * std[:, None]
            w.add_(noise.view_as(merged.movedim(dim, 0)).movedim(0, dim).to(w.dtype))

    def perturbed_layers(self) -> list:
        """(weight, its merged delta, output dimension) of what the noise goes to: the bound
        model's LoRA layers, or without any, the trainable matrices themselves (RWP)."""
        layers = lora_layers(self.model) if self.model is not None else []
        if layers:
            return layers
        params = [p for g in self.param_groups for p in g["params"] if p.dim() >= 2]
        return [(p, torch.zeros((), dtype=p.dtype, device=p.device), 0) for p in params]

    @override
    def sharpness_step(self, closure):
        layers = self.perturbed_layers()
        with torch.no_grad():
            self.noise_(layers)
        try:
            loss = self.run_pass(closure, 0, sync=True)
        finally:
            with torch.no_grad():
                for i, (w, _, _) in enumerate(layers):
                    w.copy_(self._saved[i])  # W bit for bit
        grads = self._lists()[1]
        self._unscale(grads)
        self._track_grad_norm(grads)
        self.descent_loss = loss
        return loss

    @override
    def compute_perturbation(self, params, grads, eps):  # noqa: ARG002 (not a gradient rule)
        raise NotImplementedError("flat_lora perturbs the frozen weights in sharpness_step")

    @override
    def log_values(self) -> dict:
        return {**super().log_values(), "flat_lora_sigma": self.sigma}
