"""SpectralSAM (matrix-aware SAM; known from its abstract).

For each hidden weight matrix W (conv kernels reshaped to d_out × (d_in·k·k)), with
gradient G = U Σ Vᵀ: E_W = ρ_s · msign(G) · sqrt(max(1, d_out / d_in)), msign(G) ≈ U Vᵀ
by the Newton–Schulz iteration torch.optim.Muon uses (its quintic coefficients and step
count). Every other parameter gets Euclidean SAM with radius ρ: ε = ρ g / ‖g‖ over those
parameters. Defaults ρ_s = ``rho_spectral`` = 0.05, ρ = 0.05. Any base optimizer, Muon included.
``rho_schedule`` scales ρ_s and ρ by the same factor (ours).

Hidden matrices: parameters of groups with ``hidden`` true (set by the runner) and more
than one dimension; for a plain parameter list with a bound model (``model=`` or
``bind(model=...)``), the weights of Linear/Conv layers except the first and the last such
layer in module order (blocks.py; tokens, embeddings and norms are never hidden); with no
model, every tensor with more than one dimension except the first and the last such tensor.

From the abstract: a layerwise spectral inner perturbation for hidden matrices, paired
with any outer step. Ours (docs/variants.md): the radius scaling, the Euclidean SAM for
the rest, and the iteration running in float32 (Muon runs it in bfloat16); the singular
values of msign(G) are close to 1 but not exactly 1 (the quintic's band, roughly
[0.7, 1.2]), as in Muon. Ours too, for speed: matrices of one shape run as one batched
iteration, and wide ones run it in Gram form (same iterates; see ``msign``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.optim import _muon

from ..registry import VARIANTS
from .blocks import hidden_weights
from .engine import _check
from .sam import SAM

if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from torch.optim.optimizer import ParamsT

NS_COEFFICIENTS = (_muon.DEFAULT_A, _muon.DEFAULT_B, _muon.DEFAULT_C)
NS_STEPS = _muon.DEFAULT_NS_STEPS


def msign(g: torch.Tensor, steps: int = NS_STEPS, eps: float = 1e-7) -> torch.Tensor:
    """Muon's quintic Newton–Schulz iteration on matrices ``g`` [..., m, n], in float32."""
    x = g.float().reshape(-1, *g.shape[-2:])
    out = torch.empty_like(x)
    msign_into(list(x.unbind()), list(out.unbind()), 1.0, steps, eps)
    return out.reshape(g.shape)


def msign_into(
    mats: list, outs: list, scale: float = 1.0, steps: int = NS_STEPS, eps: float = 1e-7
) -> None:
    """outs[i] ← scale · msign(mats[i]) for matrices of one shape (``outs[i]``: any tensor of
    the same number of elements, e.g. a conv kernel's ε, filled row-major), by Muon's quintic
    Newton–Schulz iteration, batched, in float32.

    Every iterate is X_k = P_k X_0 with P_k a polynomial in S = X_0 X_0ᵀ (m × m, m the short
    side), because X_{k+1} = Q_k X_k with Q_k = a I + b A_k + c A_k², A_k = X_k X_kᵀ, and all of
    these commute. For a wide matrix (long side > 1.5 m) we therefore compute P_steps on the
    m × m side (``_gram_iteration``) and write scale · P_steps X_0 straight into ``outs``: two
    m × m × n products plus m³ work instead of two m × m × n products per step, and no stacked
    copies of the matrices (ResNet-18's 512 × 4608 kernels: about 4× faster on a CPU; the
    normalization X_0 = G/‖G‖ and the scale are folded into P). The result is the same in
    exact arithmetic; in float32, forming S squares the spread of singular values, so on badly
    conditioned G it is less exact than the direct float32 form (spectral-norm error against
    the float64 iteration up to ~3e-3 instead of ~3e-4), and still 10× more exact than Muon's
    own bfloat16 iteration (~3e-2 to 4e-1 on the same matrices).
    """
    a, b, c = NS_COEFFICIENTS
    rows, cols = mats[0].shape
    wide = rows <= cols
    m, n = min(rows, cols), max(rows, cols)
    if n <= 1.5 * m or steps == 0:  # near-square: the direct form is as cheap
        x = torch.stack([t.float() if wide else t.float().mT for t in mats])
        x = x / x.flatten(-2).norm(dim=-1).clamp_min(eps)[..., None, None]  # spectral norm <= 1
        for _ in range(steps):
            gram = x @ x.mT
            x = a * x + (b * gram + c * gram @ gram) @ x
        x = (x if wide else x.mT).contiguous() * scale
        torch._foreach_copy_(outs, [t.view(o.shape) for t, o in zip(x.unbind(), outs)])
        return
    g = [t.float() for t in mats]
    s = torch.stack([symmetric_mm(t, t.mT) if wide else symmetric_mm(t.mT, t) for t in g])
    norm2 = s.diagonal(dim1=-2, dim2=-1).sum(-1).clamp_min(eps * eps)  # ‖G‖²
    poly = _gram_iteration(s / norm2[:, None, None], steps) * (scale / norm2.sqrt())[:, None, None]
    for t, p, o in zip(g, poly, outs):
        direct = o.dtype == torch.float32 and o.is_contiguous()
        target = (
            o.view(rows, cols)
            if direct
            else torch.empty(rows, cols, dtype=torch.float32, device=o.device)
        )
        torch.mm(p, t, out=target) if wide else torch.mm(t, p, out=target)  # (P Gᵀ)ᵀ = G P
        if not direct:  # another dtype or memory format (channels_last)
            o.copy_(target.view(o.shape))


def _gram_iteration(s: torch.Tensor, steps: int) -> torch.Tensor:
    """P_steps from S = X_0 X_0ᵀ: A_0 = S, A_{k+1} = Q_k A_k Q_k, P_{k+1} = Q_k P_k. Every
    product here is of two polynomials in S, hence symmetric (``symmetric_mm``)."""
    a, b, c = NS_COEFFICIENTS
    eye = torch.eye(s.size(-1), dtype=s.dtype, device=s.device)
    gram, poly = s, None
    for k in range(steps):
        q = a * eye + b * gram + c * symmetric_mm(gram, gram)
        poly = q if poly is None else symmetric_mm(q, poly)
        if k + 1 < steps:
            gram = symmetric_mm(q, symmetric_mm(gram, q))
    return poly


def symmetric_mm(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """x @ y ([..., m, k] @ [..., k, m]) for a product known to be symmetric: only the upper block
    triangle, in up to 4 row blocks of at least 128 rows, mirrored below (with 4 blocks 5/8 of
    the multiply-adds: on a CPU thread ResNet-18's 512 × 512 products run ~1.2× and its
    512 × 4608 Gram products ~1.4× faster; the rounding stays that of x @ y)."""
    m = x.size(-2)
    parts = min(4, m // 128)
    if parts < 2:  # small products: the pieces cost more than they save
        return x @ y
    b = -(-m // parts)
    out = x.new_empty(*x.shape[:-1], m)
    for i in range(0, m, b):
        row = x[..., i : i + b, :] @ y[..., :, i:]  # block row i, columns i..m
        out[..., i : i + b, i:] = row
        out[..., i + b :, i : i + b] = row[..., :, b:].mT
    return out


@VARIANTS.register(
    "spectral_sam", "ρ_s·msign(G) on hidden matrices, SAM on the rest (matrix-aware SAM)"
)
class SpectralSAM(SAM):
    variant_options = {"rho_spectral": 0.05}
    fsdp_refused = "msign(G) orthogonalises each whole hidden matrix, which no process holds"

    def __init__(
        self, params: ParamsT, base_optimizer: Callable[..., torch.optim.Optimizer], **kwargs: Any
    ) -> None:
        super().__init__(params, base_optimizer, **kwargs)
        _check(self.rho_spectral >= 0, f"rho_spectral must be >= 0, got {self.rho_spectral}")

    def _layout(self, params):
        """Hidden matrices grouped by shape (for batched iterations) and the other tensors
        (cached)."""
        c = self._cache
        if "matrices" not in c:
            flags = []
            if any("hidden" in g or "hidden_flags" in g for g in self.param_groups):
                hidden = self.per_parameter("hidden", lambda *_: False)
                flags = [bool(h) and p.ndim > 1 for h, p in zip(hidden, params)]
            elif self.model is not None:
                hidden = hidden_weights(self.model)
                flags = [id(p) in hidden for p in params]
            # no structure known: the first and the last matrix stand for the first layer and the
            # head
            else:
                mats = [i for i, p in enumerate(params) if p.ndim > 1]
                flags = [i in mats[1:-1] for i in range(len(params))]
            by_shape = {}
            for i, p in enumerate(params):
                if flags[i]:
                    by_shape.setdefault(tuple(p.shape), []).append(i)
            c["matrices"] = list(by_shape.values())
            c["others"] = [i for i, f in enumerate(flags) if not f]
        return c["matrices"], c["others"]

    def compute_perturbation(
        self, params: list[torch.Tensor], grads: list[torch.Tensor], eps: list[torch.Tensor]
    ) -> None:
        """ε_W = ρ_s msign(G) √max(1, d_out/d_in) on hidden matrices, Euclidean SAM on the rest."""
        matrices, others = self._layout(params)
        if others:
            g, e = [grads[i] for i in others], [eps[i] for i in others]
            torch._foreach_copy_(e, g)
            torch._foreach_mul_(e, self.current_rho / (self.global_norm(g) + 1e-12))
        for idx in matrices:
            d_out, d_in = grads[idx[0]].shape[0], grads[idx[0]][0].numel()
            # rho_schedule scales ρ_s as it scales ρ
            scale = self.rho_spectral * self.rho_factor * max(1.0, d_out / d_in) ** 0.5
            msign_into([grads[i].reshape(d_out, d_in) for i in idx], [eps[i] for i in idx], scale)
