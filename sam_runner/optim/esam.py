"""ESAM (Du et al., ICLR 2022): SAM with a random part of the weights perturbed and the descent
pass on the part of the batch whose loss the perturbation raises most.

- Stochastic weight perturbation: ε = (ρ/β) m ⊙ g/‖g‖, m a Bernoulli(β) mask, one draw per
  coordinate (the paper's text). ``faithful=true``: one draw per parameter tensor, as the
  official code (dydjw9/Efficient_SAM ``utils/Esam.py``) does by freezing tensors, so the norm is
  that of the kept tensors' gradients: ε_K = (ρ/β) g_K/‖g_K‖ on the kept tensors K, 0 elsewhere.
  Nothing needs the other tensors' gradients at θ, so the mask is drawn before the first pass
  and that pass skips them (the engine's ``first_pass_skips``), which is where the official
  code saves its compute; the run is bit for bit the one computing every gradient.
- Sharpness-sensitive data selection: one forward without gradients at θ+ε gives each sample's
  loss rise ℓ_i(θ+ε) − ℓ_i(θ); the descent pass runs on the ⌊γB⌋ samples with the largest rise
  (at least one). ``faithful=true``: the official rule, the samples whose rise is strictly above
  the ⌊γB⌋-th largest (so ⌊γB⌋ − 1 of them without ties; at least one), the whole batch when
  γ ≥ 0.99. γ = 1 skips the extra forward, and β = 1, γ = 1 is SAM.

Cost (``grad_evals``): the first pass 1, the forward without gradients ⅓, the descent pass the
share of the batch it ran on. A training loop of its own must pass every micro-batch through
``optimizer.select_rows(...)`` and weight each micro-batch's mean loss by its share of the rows
kept (the runner's loop does), and compute its loss with ``optimizer.reduce_loss``; one that
does not gets a warning, and its descent pass runs on the whole batch (counted as a full pass)::

    def closure():
        opt.zero_grad()
        x_kept, y_kept = opt.select_rows(x, y)
        logits = model(x_kept)
        loss = opt.reduce_loss(F.cross_entropy(logits, y_kept, reduction="none"), logits, y_kept)
        loss.backward()
        return loss

Ours: the selection is per process under data parallelism (as the official code), the mask is
drawn at the step itself (the official code draws it at the end of the previous step, so its
first step perturbs every tensor), from the variant's own generator seeded by
``perturb_seed`` and saved with the optimizer's state, and the forward without gradients leaves
BatchNorm's running statistics alone (the official one updates them). Defaults β = 0.6, γ = 0.5
(the official CIFAR scripts).
"""

from __future__ import annotations

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

NO_GRAD_FORWARD = 1 / 3  # a forward without backward, in passes (contract)


def _fraction(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1


@VARIANTS.register("esam", "SAM on a random β of the weights, descent on the top-γ of the batch")
class ESAM(SAM):
    passes = 3  # first pass, forward without gradients, descent pass (2 when γ = 1)
    variant_options = {"beta": 0.6, "gamma": 0.5, "faithful": False}
    fsdp_refused = (
        "its first pass skips the gradients of unperturbed tensors, and FSDP2 reduce-scatters "
        "every sharded gradient"
    )

    def __init__(
        self, params: ParamsT, base_optimizer: Callable[..., torch.optim.Optimizer], **kwargs: Any
    ) -> None:
        self.seed = int(kwargs.get("perturb_seed", 0))
        super().__init__(params, base_optimizer, **kwargs)
        _check(_fraction(self.beta), f"beta must be a number in (0, 1], got {self.beta!r}")
        _check(_fraction(self.gamma), f"gamma must be a number in (0, 1], got {self.gamma!r}")
        self.faithful = bool(self.faithful)
        self.selects = self.gamma < (0.99 if self.faithful else 1.0)
        self.passes = 3 if self.selects else 2
        self.generator = None  # made on the parameters' device at the first perturbed step
        self._generator_state = None
        self._before, self._after, self._kept, self._probing = [], [], [], False
        self._rows = []  # each kept micro-batch's rows in the first pass
        self._warned = False
        self._drawn_from = None
        self._keep = None  # faithful: (the trained tensors, the mask drawn over them this step)

    # ------------------------------------------------------------------ weights
    def _draw(self, n, device):
        if device.type == "meta":  # shapes only (the config check builds on the meta device)
            return torch.rand(n, device=device)
        if self.generator is None:
            self.generator = torch.Generator(device=device)
            self.generator.manual_seed(self.seed)
            if self._generator_state is not None:
                self.generator.set_state(torch.tensor(self._generator_state, dtype=torch.uint8))
        if self.grad_scaler is not None:  # rewound if the scaler skips this step
            self._drawn_from = self.generator.get_state()
        return torch.rand(n, generator=self.generator, device=device)

    @override
    def _finish(self):
        super()._finish()
        drawn_from, self._drawn_from = self._drawn_from, None
        if drawn_from is not None and self.overflowed():  # a skipped step draws nothing
            self.generator.set_state(drawn_from)

    @override
    def first_pass_skips(self) -> list[torch.nn.Parameter]:
        """``faithful``: the tensors drawn out need no gradient at θ (ε is 0 on them and ‖g‖ is
        over the kept ones), so the first pass skips them, as the official code's frozen tensors
        (one host sync: which ones is a host decision)."""
        self._keep = None
        if not self.faithful or self.beta == 1:
            return []
        trained = [p for g in self.param_groups for p in g["params"] if p.requires_grad]
        if not trained:
            return []
        keep = self._draw(len(trained), trained[0].device) < self.beta
        self._keep = (trained, keep)
        if keep.device.type == "meta":  # shapes only: nothing to decide on
            return []
        skipped = [p for p, k in zip(trained, keep.tolist()) if not k]
        # every tensor drawn out: ε is 0, and a pass that skips every parameter has nothing to
        # backpropagate, so the first pass runs in full (the step is then a plain one at θ)
        return [] if len(skipped) == len(trained) else skipped

    def _kept_tensors(self, params, dtype):
        """The mask drawn before the first pass, over ``params`` (the tensors with a gradient)."""
        trained, keep = self._keep
        if len(trained) != len(params) or any(a is not b for a, b in zip(trained, params)):
            at = {id(p): i for i, p in enumerate(trained)}  # a tensor without a gradient
            keep = keep[torch.tensor([at[id(p)] for p in params], device=keep.device)]
        return keep.to(dtype)

    @override
    def compute_perturbation(
        self, params: list[torch.Tensor], grads: list[torch.Tensor], eps: list[torch.Tensor]
    ) -> None:
        """ε = (ρ/β) m ⊙ g/‖g‖ with a Bernoulli(β) mask m (SAM's ε when β = 1)."""
        if self.beta == 1:
            return super().compute_perturbation(params, grads, eps)
        device = grads[0].device
        if self.faithful:  # one draw per tensor (before the first pass); ‖·‖ over the kept ones
            keep = self._kept_tensors(params, grads[0].dtype)
            norms = torch.stack(torch._foreach_norm(grads))
            scale = keep * (self.current_rho / self.beta) / (torch.linalg.vector_norm(
                keep * norms) + 1e-12)  # fmt: skip
            torch._foreach_copy_(eps, grads)
            torch._foreach_mul_(eps, list(scale.unbind()))
            return None
        super().compute_perturbation(params, grads, eps)  # ρ g/‖g‖
        sizes = [e.numel() for e in eps]
        # in place on the draws (no bool or cast copies): the same bits as (u < β).float() / β
        mask = self._draw(sum(sizes), device).lt_(self.beta).to(eps[0].dtype).div_(self.beta)
        torch._foreach_mul_(eps, [m.view_as(e) for m, e in zip(mask.split(sizes), eps)])
        return None

    # ------------------------------------------------------------------ data
    @override
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        """One ESAM step (``closure`` as the engine's)."""
        self._before = []  # the first pass's per-sample losses, gathered by reduce_loss
        return super().step(closure)

    @override
    def reduce_loss(
        self, per_sample_loss: torch.Tensor, logits: torch.Tensor, targets: torch.Tensor
    ) -> torch.Tensor:
        """The mean loss; the first pass's per-sample losses kept to choose the descent pass's
        rows."""
        if self.pass_index == 0 and self.selects:
            self._before.append(per_sample_loss.detach())
        elif self._probing:
            self._after.append(per_sample_loss.detach())
            # nothing needs a gradient in this pass: a leaf keeps the closure's backward valid
            return per_sample_loss.detach().mean().requires_grad_()
        return per_sample_loss.mean()

    @override
    def select_rows(self, *tensors: torch.Tensor | None) -> tuple:
        """The descent pass's rows of a micro-batch (those whose loss the perturbation raised
        most); all in the other passes."""
        if not self._kept:
            return tensors
        keep, rows = self._kept.pop(0), self._rows.pop(0)
        if keep is None:
            return tensors
        n = len(tensors[0])
        _check(
            rows == n,
            f"ESAM's descent pass got a micro-batch of {n} rows where the first pass had "
            f"{rows}: pass the same micro-batches, in the same order, to every pass",
        )
        if keep.dtype != torch.bool:  # row indices, in order: no host sync
            return tuple(t if t is None else t.index_select(0, keep) for t in tensors)
        return tuple(t if t is None else t[keep.to(t.device)] for t in tensors)

    def _probe(self, closure):
        """The forward without gradients at θ+ε; the masks of the rows the descent keeps, one
        per micro-batch (``select_rows`` hands them out in order)."""
        params = [p for g in self.param_groups for p in g["params"]]
        self._after, self._probing, self.pass_share = [], True, NO_GRAD_FORWARD
        try:
            self.run_pass(closure, 1, sync=False, skip=params)
        finally:
            self._probing, self.pass_share = False, 1.0
        sizes = [len(b) for b in self._before]
        rise = torch.cat(self._after).float() - torch.cat(self._before).float()
        batch = len(rise)
        n = int(batch * self.gamma)
        self._rows = list(sizes)
        if rise.device.type == "meta":  # no values to rank: the whole batch (shapes only)
            self._kept, self.pass_share = [None] * len(sizes), max(n, 1) / batch
            return
        keep = torch.zeros(batch, dtype=torch.bool, device=rise.device)
        top = torch.topk(rise, max(n, 1))
        if not self.faithful and len(sizes) == 1:
            # one micro-batch keeps exactly max(n, 1) rows, known here: their indices in batch
            # order select them without reading the device (the same rows as the mask)
            self._kept, self.pass_share = [top.indices.sort().values], max(n, 1) / batch
            return
        if self.faithful:
            keep = rise > top.values[-1]
            if not bool(keep.any()):  # the strict rule kept nothing: keep the largest rise
                keep[top.indices[0]] = True
        else:
            keep[top.indices] = True
        self._kept = list(keep.split(sizes))
        # one host sync (so does the indexing): the faithful rule's count, or how the kept rows
        # fall into several micro-batches, depends on the values
        self.pass_share = int(keep.sum()) / batch

    @override
    def sharpness_step(self, closure: Callable[[], torch.Tensor]) -> torch.Tensor:
        """The first pass, a forward at θ + ε to rank the samples, then the descent pass on the
        selected rows."""
        if not self.selects:
            return super().sharpness_step(closure)
        loss, params, pgrads = self.first_pass(closure)
        c = self._cache
        self.perturbation_into(params, pgrads, c["eps"])
        torch._foreach_copy_(c["theta"], params)
        torch._foreach_add_(params, c["eps"])
        if not self._before:  # the closure does not call reduce_loss: nothing to rank by
            self._unselected("compute its loss with optimizer.reduce_loss(per_sample, ...)")
            self.descend(closure, 1, loss)
            return loss
        self._probe(closure)
        share = self.pass_share
        try:
            self.descend(closure, 2, loss)
        finally:
            self.pass_share = 1.0
        if self._kept:  # select_rows was not called: the descent pass ran on the whole batch
            self._kept, self._rows = [], []
            self.count_pass(1.0 - share)
            self._unselected("pass each micro-batch through optimizer.select_rows(...)")
        return loss

    def _unselected(self, what: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(
                f"ESAM: the closure does not {what}, so the descent pass runs on the whole "
                "batch (no data selection); see sam_runner/optim/esam.py",
                stacklevel=4,
            )

    # ------------------------------------------------------------------ state
    @override
    def variant_state(self) -> dict:
        """The engine's state and the mask generator's state."""
        # a list of bytes, not a tensor: it stays on the host whatever device the state goes to
        state = self.generator.get_state().tolist() if self.generator is not None else None
        return {**super().variant_state(), "generator": state}

    @override
    def load_variant_state(self, state: dict) -> None:
        """Restore ``variant_state()``'s output (the generator rebuilt at its next use)."""
        super().load_variant_state(state)
        self.generator, self._generator_state = None, state.get("generator")
