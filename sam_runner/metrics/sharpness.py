"""Sharpness measures beyond the Hessian spectrum, on an ``Objective`` (mean loss over fixed
batches, see objective.py). Every measure restores the parameters it moves.

- ``worst_case_sharpness``: max_{‖ε‖≤ρ} L(θ+ε) − L(θ), approximated by ``steps``
  normalized ascent steps ε ← ρ·g(θ+ε)/‖g(θ+ε)‖ (the first is SAM's ε; from a seeded
  random direction when g = 0), reporting the largest rise seen. ``adaptive=True`` uses
  ASAM's ball ‖T⁻¹ε‖ ≤ ρ with T = |θ| + η (Kwon et al. 2021): ε ← ρ T²g/‖Tg‖, with T =
  |θ| + η on weights and T = 1 on biases, the ball the ``asam`` optimizer perturbs in (a bias:
  a vector named ``*bias``, optim/blocks.py). The iteration and the "largest rise seen" readout are
  our choice (Foret et
  al. and Kwon et al. define the maximum, not how to approximate it). On a quadratic at its
  minimum the iteration is power iteration, and the value tends to ½ρ²λ_max (adaptive:
  ½ρ²λ_max(THT)).
- ``average_sharpness``: E_δ L(θ+δ) − L(θ), δ ~ N(0, σ²I), Monte Carlo over
  ``num_samples`` seeded draws (mean and standard error). ½σ² tr(H) on a quadratic.
- ``directional_sharpness``: dᵀHd along seeded unit directions d (or given ones), one HVP
  each on a Hessian operator, the dot product in float64 (a second difference of float32
  losses would be quantised to ~2⁻²⁴·L/h²); mean and max.
- ``armijo_probe``: backtracking line search along −g from α₀, α ← βα until
  L(θ − αg) ≤ L(θ) − cα‖g‖². On a quadratic with q = gᵀHg/‖g‖² > 0 a trial α is accepted
  iff α ≤ 2(1−c)/q, so the implied curvature 2(1−c)/α is always ≥ q (an upper bound on q).
  A lower bound exists only when α₀ itself was rejected: then the trial before the accepted
  one, α/β, failed, so β·2(1−c)/q < α ≤ 2(1−c)/q and the implied curvature lies in
  [q, q/β). When α₀ is accepted, 2(1−c)/α₀ ≥ q is all that is known. (The probe of the
  Armijo-probe abstract; log α is meant to track log λ_max.) When no α passes within
  ``max_steps`` trials, α and the curvature are NaN (nothing was accepted, and the next α
  would be untested).
- ``fisher_trace_ratio``: Σ_i H_ii/(F_ii + δ) = tr((F + δ)⁻¹H), F the diagonal empirical
  Fisher (mean of squared per-sample gradients of the run's loss with the observed labels, as
  the Armijo-probe abstract's experiments use), δ = damping · mean(F) (relative to the Fisher's
  scale). Exact (H's diagonal by HVPs) on small models, else Hutch++ with a standard error. A
  Fisher-preconditioned Hessian trace, not the Fisher–Rao norm.
- ``fisher_rao_norm``: ⟨θ, Fθ⟩ with the full empirical Fisher, the mean over samples of
  ⟨θ, ∇ℓ_n⟩² (Liang et al. 2019's Fisher–Rao norm, squared), and its standard error.
Per-sample gradients by ``torch.func.vmap``; with BatchNorm in train mode a sample's gradient
would need its batch, so they are taken with the model in eval mode there (our choice), while H
keeps the measurement's mode (every module's flag is restored).
"""

from __future__ import annotations

import math
import warnings

import torch

from ..module_state import modes_restored
from ..optim.blocks import is_bias
from .fast_forwards import own_conv1d
from .hvp import HessianOperator
from .objective import Objective
from .solvers import deflated_trace, hessian_diagonal, hutch_plus_plus


def _positive(name, value):
    if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
        raise ValueError(f"{name}={value!r} must be a finite number > 0")


def worst_case_sharpness(
    obj: Objective,
    rho: float = 0.05,
    steps: int = 5,
    adaptive: bool = False,
    eta: float = 0.01,
    seed: int = 0,
) -> float:
    """max over ‖ε‖ ≤ ρ of L(θ+ε) − L(θ) by ``steps`` normalized ascent steps (``adaptive``:
    ASAM's ball); the weights restored."""
    with obj.restoring():
        return _worst_case_sharpness_impl(obj, rho, steps, adaptive, eta, seed)


def _worst_case_sharpness_impl(
    obj, rho: float = 0.05, steps: int = 5, adaptive: bool = False, eta: float = 0.01, seed: int = 0
):
    _positive("rho", rho)
    if not (isinstance(steps, int) and steps >= 1):
        raise ValueError(f"steps={steps!r} must be an integer >= 1")
    base = obj.loss()
    theta = obj.flat([p.detach() for p in obj.params])
    t = torch.ones_like(theta)
    if adaptive:  # ASAM's T: |θ| + η on weights, 1 on biases (as optimizer=asam perturbs)
        weights = [
            torch.full_like(p, float(not is_bias(n, p))) for n, p in zip(obj.names, obj.params)
        ]
        on = obj.flat(weights).bool()
        t[on] = theta[on].abs() + eta
    eps = torch.zeros_like(theta)
    best = torch.zeros((), dtype=torch.float64, device=theta.device)
    g_gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        obj.shift(eps)
        g = obj.gradient()
        obj.shift(eps, -1.0)
        tg = t * g
        norm = tg.norm()
        if float(norm) == 0.0:  # at a stationary point: any direction
            tg = torch.randn(len(g), generator=g_gen).to(g)
            norm = tg.norm()
        eps = rho * t * tg / norm
        obj.shift(eps)
        best = torch.maximum(best, (obj.loss() - base).double())
        obj.shift(eps, -1.0)
    return float(best)


def average_sharpness(
    obj: Objective, sigma: float = 0.01, num_samples: int = 10, seed: int = 0
) -> tuple[float, float]:
    """E L(θ+δ) − L(θ) over ``num_samples`` draws δ ~ N(0, σ²I): (mean, standard error); the
    weights restored."""
    with obj.restoring():
        return _average_sharpness_impl(obj, sigma, num_samples, seed)


def _average_sharpness_impl(obj, sigma: float = 0.01, num_samples: int = 10, seed: int = 0):
    _positive("sigma", sigma)
    if not (isinstance(num_samples, int) and num_samples >= 2):
        raise ValueError(f"num_samples={num_samples!r} must be an integer >= 2")
    base = obj.loss()
    g = torch.Generator().manual_seed(seed)
    rises = []
    for _ in range(num_samples):
        delta = torch.randn(obj.numel, generator=g).to(obj.device, obj.dtype) * sigma
        obj.shift(delta)
        rises.append(obj.loss() - base)
        obj.shift(delta, -1.0)
    r = torch.stack(rises).double().cpu()
    return float(r.mean()), float(r.std() / math.sqrt(num_samples))


def directional_sharpness(
    op: HessianOperator,
    num_directions: int = 4,
    seed: int = 0,
    directions: list[torch.Tensor] | None = None,
) -> tuple[float, float]:
    """(mean, max) of dᵀHd along unit directions d: one HVP each, the dot product in float64."""
    if directions is None:
        if not (isinstance(num_directions, int) and num_directions >= 1):
            raise ValueError(f"num_directions={num_directions!r} must be an integer >= 1")
        g = torch.Generator().manual_seed(seed)
        directions = [torch.randn(op.numel, generator=g) for _ in range(num_directions)]
    values = []
    for d in directions:
        d = d.to(op.device, torch.float64)
        d = (d / d.norm()).to(op.dtype)  # the direction the HVP sees, its norm taken in float64
        d64 = d.double()
        values.append(torch.dot(d64, op(d).double()) / torch.dot(d64, d64))
    v = torch.stack(values).cpu()
    return float(v.mean()), float(v.max())


def armijo_probe(
    obj: Objective, alpha0: float = 1.0, c: float = 1e-4, beta: float = 0.5, max_steps: int = 40
) -> tuple[float, float, int]:
    """(accepted α, implied curvature 2(1−c)/α, loss evaluations used); α and curvature are NaN
    when no trial within ``max_steps`` is accepted."""
    with obj.restoring():
        return _armijo_probe_impl(obj, alpha0, c, beta, max_steps)


def _armijo_probe_impl(
    obj, alpha0: float = 1.0, c: float = 1e-4, beta: float = 0.5, max_steps: int = 40
):
    _positive("alpha0", alpha0)
    if not (0 < c < 1 and 0 < beta < 1):
        raise ValueError(f"armijo c={c} and beta={beta} must both lie in (0, 1)")
    base = obj.loss()
    g = obj.gradient()
    gg = torch.dot(g, g)
    alpha, evals = alpha0, 0
    for _ in range(max_steps):
        obj.shift(g, -alpha)
        trial = obj.loss()
        obj.shift(g, alpha)
        evals += 1
        if float(trial) <= float(base - c * alpha * gg):
            return alpha, 2 * (1 - c) / alpha, evals
        alpha *= beta
    return math.nan, math.nan, evals


def per_sample_gradient_moments(
    obj: Objective, chunk: int = 256
) -> tuple[torch.Tensor, torch.Tensor]:
    """(diagonal empirical Fisher: the mean over samples of the squared per-sample gradient, flat;
    the per-sample ⟨θ, ∇ℓ_n⟩ in float64), from per-sample gradients in eval mode (module
    docstring), with Conv1d's own forward (``own_conv1d``)."""
    from torch.func import functional_call, grad, vmap

    model = obj.model
    with modes_restored(model), own_conv1d(model):
        model.eval()  # per-sample gradients need per-sample forward passes (see module docstring)
        params = tuple(p.detach() for p in obj.params)

        def sample_loss(ps, x, y):
            out = functional_call(model, dict(zip(obj.names, ps)), (x[None],))
            l = obj.loss_fn(out, y[None])
            return l.mean() if l.dim() > 0 else l

        per_sample = vmap(grad(sample_loss), in_dims=(None, 0, 0))
        total = torch.zeros(obj.numel, device=obj.device, dtype=obj.dtype)
        dots = []
        with warnings.catch_warnings():
            # vmap's fallback for ops without a batching rule (pooling) is exact, only slower;
            # its warning would be printed once per run, to no use for the user
            warnings.filterwarnings("ignore", "There is a performance drop", UserWarning)
            for x, y in obj.batches:
                for i in range(0, len(y), chunk):
                    gs = per_sample(params, x[i : i + chunk], y[i : i + chunk])
                    total += torch.cat([t.pow(2).sum(0).reshape(-1) for t in gs])
                    dots.append(
                        sum((t.double() * p.double()).flatten(1).sum(1) for t, p in zip(gs, params))
                    )
        dots = torch.cat(dots)
        return total / len(dots), dots


def fisher_rao_norm(
    obj: Objective, moments: tuple[torch.Tensor, torch.Tensor] | None = None
) -> tuple[float, float]:
    """⟨θ, Fθ⟩ for the empirical Fisher F = mean_n ∇ℓ_n ∇ℓ_nᵀ (all trainable parameters), i.e. the
    mean of ⟨θ, ∇ℓ_n⟩² over the samples: (value, its standard error over the samples).
    ``moments``: ``per_sample_gradient_moments(obj)`` when already taken."""
    _, dots = moments or per_sample_gradient_moments(obj)
    squares = dots.square().cpu()
    return float(squares.mean()), float(squares.std() / math.sqrt(len(squares)))


def fisher_trace_ratio(
    op: HessianOperator,
    num_probes: int = 60,
    damping: float = 1e-3,
    exact_max_params: int = 1024,
    seed: int = 0,
    moments: tuple[torch.Tensor, torch.Tensor] | None = None,
    basis: torch.Tensor | None = None,
) -> tuple[float, float]:
    """Σ_i H_ii / (F_ii + δ), δ = damping · mean_i F_ii: (value, standard error). Exact (H's
    diagonal by one HVP per coordinate, standard error 0) up to ``exact_max_params`` parameters;
    beyond, a trace estimate of A = W^½ H W^½, W = diag(1/(F + δ)): Hutch++ with ``num_probes``
    HVPs (in blocks), or, given ``basis`` ([k, n], H's top Ritz vectors), exactly on the span of
    W^½·basis (where those directions put A's large part) plus Hutchinson with ``num_probes``
    probes on the rest (``deflated_trace``: k + num_probes HVPs).
    ``moments``: ``per_sample_gradient_moments(op)`` when already taken."""
    _positive("damping", damping)
    fisher, _ = moments or per_sample_gradient_moments(op)
    scale = float(fisher.double().mean())
    weight = 1.0 / (fisher + damping * (scale if scale > 0 else 1.0))
    if op.numel <= exact_max_params:
        return float(torch.dot(weight.double(), hessian_diagonal(op))), 0.0
    root = weight.sqrt()

    def matmat(V):
        return root * op.hvp_batch(root * V)

    if basis is not None and len(basis):
        mapped = root.double() * torch.as_tensor(basis).to(root.device, torch.float64)
        return deflated_trace(matmat, op.numel, mapped, num_probes, seed, op.device, op.dtype)
    return hutch_plus_plus(matmat, op.numel, num_probes, seed, op.device, op.dtype)
