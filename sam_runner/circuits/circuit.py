"""A smooth, decomposable probabilistic circuit over discrete variables (``model=pc``).

Structure: a RAT-SPN (Peharz et al. 2020) random binary region graph. Each of ``repetitions``
repetitions permutes the D variables at random and cuts the permutation into 2**depth contiguous,
near-equal parts (the leaf regions); the regions above form the balanced binary tree over them
(region g at level t has the children 2g and 2g+1 at level t + 1), so every internal region splits
its scope in two halves of a random order. A leaf region holds ``sum_units`` fully factorised
categorical distributions over its variables; an internal region at level t >= 1 holds
``sum_units`` sum nodes over the cross products of its two children's units; the root (level 0)
is one sum node over the cross products of every repetition's two top regions. Products join
disjoint scopes (decomposable) and every sum's children share its scope (smooth), so the circuit
is normalised and any marginal is one pass with the marginalised leaves set to 1.

Why this structure: it is built from D alone (no structure learning from the data, so a run's
circuit depends on its seed only), its layers are dense tensors (one einsum per level), and its
depth is a key, which the trace-by-depth study needs.

Everything is evaluated in log space: a sum layer is ``log(exp(c - m) @ w) + m``, m the children's
maximum. The parameters are logits (sum weights ``softmax(sum_logits[t])``, leaf probabilities
``softmax(leaf_logits)``); EM (em.py) sets them to the log of its new weights.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from ..errors import integer
from .flows import downward, leaf_statistics

MAX_UNITS = 256  # sum_units: a level holds R·2^t·S·U² weights
MAX_REPETITIONS = 256


@dataclass
class Pass:
    """One evaluation's log-values. Per sum level t (0 is the root): ``left[t]``, ``right[t]``
    the two child regions' unit log-values ``[B, R, 2^t, U]`` and ``sums[t]`` the sum nodes'
    ``[B, R, 2^t, S]`` (the root's: ``[B]``, equal to ``ll``); ``local[t]`` the sum nodes'
    local terms s_i(x) = Σ_j c_j(x)²/p_i(x)² when asked for (curvature.py), shaped as
    ``sums[t]``."""

    ll: torch.Tensor
    left: list
    right: list
    sums: list
    local: list
    parts: list


def region_assignment(num_vars: int, depth: int, repetitions: int) -> torch.Tensor:
    """``[R, D]``: each variable's leaf region in each repetition (a random permutation cut into
    2**depth contiguous near-equal parts; torch's global generator draws the permutations)."""
    parts = 2**depth
    out = torch.empty(repetitions, num_vars, dtype=torch.long)
    place = torch.arange(num_vars) * parts // num_vars  # position in the order -> its part
    for r in range(repetitions):
        out[r, torch.randperm(num_vars)] = place
    return out


def check_structure(
    num_vars: int, categories: int, depth: int, sum_units: int, repetitions: int
) -> None:
    """One-line errors for structure keys out of range (2**depth leaf regions need that many
    variables at least)."""
    integer("model.categories", categories, "an integer >= 2", lambda k: k >= 2)
    top = max(1, num_vars.bit_length() - 1)
    integer(
        "model.depth",
        depth,
        f"an integer in [1, {top}] (2**depth leaf regions of the data's {num_vars} variables)",
        lambda d: 1 <= d <= top and 2**d <= num_vars,
    )
    integer("model.sum_units", sum_units, f"an integer in [1, {MAX_UNITS}]",
            lambda s: 1 <= s <= MAX_UNITS)  # fmt: skip
    integer("model.repetitions", repetitions, f"an integer in [1, {MAX_REPETITIONS}]",
            lambda r: 1 <= r <= MAX_REPETITIONS)  # fmt: skip


def _record(param: nn.Parameter, grad: torch.Tensor) -> None:
    """EM's statistic: the gradient of the objective with respect to the normalised log-weights
    (minus the mean expected flows, for the mean negative log-likelihood), summed over passes;
    and the logits' own gradient from it (through log-softmax: g − softmax(θ)·Σ g), so that
    ``param.grad`` is what autograd would give (gradient norms, clipping)."""
    grad = grad.detach()
    held = getattr(param, "em_grad", None)
    param.em_grad = grad if held is None else held + grad
    logits = grad - torch.softmax(param.detach(), -1) * grad.sum(-1, keepdim=True)
    param.grad = logits if param.grad is None else param.grad + logits


def _log_normalised(param: nn.Parameter) -> torch.Tensor:
    """log softmax of a logits parameter. Under EM (``param.em_driven``) the log-weights are a
    leaf of the graph with the hook that records EM's statistic: the backward pass stops there
    (EM reads no gradient of the logits)."""
    if getattr(param, "em_driven", False) and torch.is_grad_enabled() and param.requires_grad:
        logw = torch.log_softmax(param.detach(), dim=-1).requires_grad_()
        logw.register_hook(functools.partial(_record, param))
        return logw
    return torch.log_softmax(param, dim=-1)


def _scaled(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(exp(v − m), m) with m the maximum over the units (detached: the shift cancels)."""
    m = v.amax(dim=-1, keepdim=True).detach()
    return torch.exp(v - m), m


def _log_mix(left, right, weights, local: bool = False):
    """log Σ_{a,b} w[r, g, s, (a, b)]·exp(left[..., a] + right[..., b]) -> ``[B, R, G, S]``:
    each sum node over the products of its region's two children, stably (the products are
    the outer product of the children's shifted values: U² multiplications, no U² exps).
    Returns (log-values, the local terms Σ_j c_j²/p_i² with ``local`` else None, the
    intermediates (products, their mixture) the top-down pass reads: flows.py)."""
    (a, ma), (b, mb) = _scaled(left), _scaled(right)
    products = (a.unsqueeze(-1) * b.unsqueeze(-2)).flatten(-2)  # [B, R, G, U²]
    mixed = torch.einsum("brgk,rgsk->brgs", products, weights)
    out = torch.log(mixed) + (ma + mb)
    if not local:
        return out, None, (products, mixed)
    squares = a.square().sum(-1, keepdim=True) * b.square().sum(-1, keepdim=True)
    # the shifts cancel: (Σ c²/e^{2m}) / (p/e^m)²
    return out, squares / mixed.square(), (products, mixed)


def _log_root(left, right, weights, local: bool = False):
    """The root over every repetition's products -> ``[B]`` (``weights``: ``[R·U²]``), as
    ``_log_mix`` (intermediates: the products and each repetition's shift)."""
    (a, ma), (b, mb) = _scaled(left[:, :, 0]), _scaled(right[:, :, 0])  # [B, R, U]
    products = (a.unsqueeze(-1) * b.unsqueeze(-2)).flatten(-2)  # [B, R, U²]
    inner = torch.einsum("brk,rk->br", products, weights.view(products.shape[1], -1))
    shift = (ma + mb).squeeze(-1)
    out = torch.logsumexp(torch.log(inner) + shift, dim=-1)
    if not local:
        return out, None, (products, shift)
    squares = torch.log(a.square().sum(-1) * b.square().sum(-1)) + 2 * shift
    return out, torch.exp(torch.logsumexp(squares, dim=-1) - 2 * out), (products, shift)


class ProbabilisticCircuit(nn.Module):
    """``forward(x)`` -> log p(x), ``[B]``, for x ``[B, ...]`` of integer-valued categories in
    ``[0, categories)`` (any shape per example: flattened to its D variables).

    Args:
        num_vars: D, the number of variables.
        categories: the values a variable takes (2: Bernoulli leaves).
        depth: levels of sum nodes (the root is depth 0); 2**depth leaf regions.
        sum_units: sum nodes per internal region, and distributions per leaf region.
        repetitions: random region trees under the root.
    """

    def __init__(
        self,
        num_vars: int,
        categories: int = 2,
        depth: int = 2,
        sum_units: int = 4,
        repetitions: int = 2,
    ) -> None:
        super().__init__()
        check_structure(num_vars, categories, depth, sum_units, repetitions)
        self.num_vars, self.categories, self.depth = num_vars, categories, depth
        self.sum_units, self.repetitions = sum_units, repetitions
        regions = region_assignment(num_vars, depth, repetitions)
        offsets = torch.arange(repetitions)[:, None] * 2**depth
        self.register_buffer("leaf_index", (regions + offsets).flatten())
        self.leaf_logits = nn.Parameter(torch.randn(repetitions, num_vars, sum_units, categories))
        self.sum_logits = nn.ParameterList(
            nn.Parameter(0.5 * torch.randn(self.weight_shape(t))) for t in range(depth)
        )

    def weight_shape(self, level: int) -> tuple:
        """The weights of the sum nodes at ``level``: ``[R·U²]`` at the root, else
        ``[R, 2^t, S, U²]`` (U: the child regions' units)."""
        k = self.sum_units**2
        if level == 0:
            return (self.repetitions * k,)
        return (self.repetitions, 2**level, self.sum_units, k)

    def weights(self) -> list[torch.Tensor]:
        """The sum weights of each level (0 = the root), normalised over each node's children."""
        return [torch.exp(_log_normalised(p)) for p in self.sum_logits]

    def leaf_log_probs(self) -> torch.Tensor:
        """``[R, D, U, K]``: each leaf distribution's log-probabilities."""
        return _log_normalised(self.leaf_logits)

    def curvature_view(self) -> nn.Module:
        """What the runner's curvature measurements differentiate: the sum weights themselves
        (``curvature.WeightView``), the coordinates of the exact trace."""
        return WeightView(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """log p(x) of each example (``[B]``); under EM the statistics by the circuit's own
        top-down pass."""
        em = getattr(self.sum_logits[0], "em_driven", False)
        if em and torch.is_grad_enabled() and self.sum_logits[0].requires_grad:
            # EM's statistics by the circuit's own top-down pass (flows.py), not autograd's
            log_leaf, logws = self.leaf_log_probs(), [_log_normalised(p) for p in self.sum_logits]
            return _EMLogLikelihood.apply(self, x, log_leaf, *logws)
        return self.evaluate(x).ll

    def marginal(self, x: torch.Tensor, observed: torch.Tensor) -> torch.Tensor:
        """log p(x_O): the variables where ``observed`` ([B, D] bool) is false are summed out
        (their values in x are ignored)."""
        return self.evaluate(x, observed=observed).ll

    def leaves(
        self,
        x: torch.Tensor,
        observed: torch.Tensor | None = None,
        grad: bool = True,
        log_leaf: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """``[B, R, 2^depth, U]``: each leaf region's units' log-values (sums of its variables'
        log-probabilities). ``grad=False``: without a graph to the leaf parameters.

        One matrix product: the one-hot inputs ``[B, D·K]`` times the table ``[D·K, R·L·U]``
        whose entry ((d, k), (r, l, u)) is log θ_{r,d,u}(k) where variable d lies in leaf region
        l of repetition r, else 0 (a summed-out variable's one-hot row is 0: its leaf is 1)."""
        n, k = len(x), self.categories
        with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
            log_leaf = self.leaf_log_probs() if log_leaf is None else log_leaf  # [R, D, U, K]
            parts = 2**self.depth  # each variable's leaf region, from the saved structure
            regions = self.leaf_index.view(self.repetitions, self.num_vars) % parts
            where = torch.nn.functional.one_hot(regions, parts).to(log_leaf.dtype)  # [R, D, L]
            table = torch.einsum("rdl,rduk->dkrlu", where, log_leaf)
            onehot = torch.nn.functional.one_hot(x.reshape(n, -1).long(), k).to(log_leaf.dtype)
            if observed is not None:
                onehot = onehot * observed.reshape(n, -1, 1).to(onehot.dtype)
            out = onehot.reshape(n, -1) @ table.reshape(self.num_vars * k, -1)
        return out.view(n, self.repetitions, 2**self.depth, self.sum_units)

    def evaluate(
        self,
        x: torch.Tensor,
        weights: list[torch.Tensor] | None = None,
        observed: torch.Tensor | None = None,
        leaf_grad: bool = True,
        track: bool = False,
        local: bool = False,
        log_leaf: torch.Tensor | None = None,
    ) -> Pass:
        """Every level's log-values (``Pass``). ``weights``: the sum weights to use, as given
        (the circuit's own, normalised, by default); ``track``: the leaf values as a leaf of the
        graph, so that gradients reach every sum node's value without the leaf parameters;
        ``local``: the sum nodes' local terms too."""
        weights = self.weights() if weights is None else weights
        v = self.leaves(x, observed, grad=leaf_grad and not track, log_leaf=log_leaf)
        if track:
            v = v.detach().requires_grad_()
        lefts, rights, sums, locals_, parts = ([None] * self.depth for _ in range(5))
        for t in reversed(range(self.depth)):
            left, right = v[:, :, 0::2], v[:, :, 1::2]
            lefts[t], rights[t] = left, right
            mix = _log_mix if t > 0 else _log_root
            v, locals_[t], parts[t] = mix(left, right, weights[t], local)
            sums[t] = v
        return Pass(sums[0], lefts, rights, sums, locals_, parts)


class WeightView(nn.Module):
    """The circuit as a function of its sum weights: this module's parameters are the weights
    themselves (the coordinates ``hessian_trace`` differentiates in; the leaves held fixed), so
    that the generic estimators (Lanczos λ_max, Hutchinson's trace) measure the same Hessian.
    ``train()``/``eval()`` copy the circuit's current weights in (a measurement switches the
    mode first), so one view follows a training run."""

    def __init__(self, circuit: "ProbabilisticCircuit") -> None:
        super().__init__()
        object.__setattr__(self, "circuit", circuit)  # not a submodule: not this view's parameters
        self.weights = nn.ParameterList(nn.Parameter(w.detach().clone()) for w in circuit.weights())

    def sync(self) -> None:
        """Copy the circuit's current normalised sum weights into this view."""
        with torch.no_grad():
            for mine, w in zip(self.weights, self.circuit.weights()):
                mine.copy_(w)

    def train(self, mode: bool = True) -> WeightView:
        """``nn.Module.train``, the weights synced first."""
        self.sync()
        return super().train(mode)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """log p(x) of each example at the view's sum weights (no graph to the leaf parameters)."""
        return self.circuit.evaluate(x, list(self.weights), leaf_grad=False).ll


class _EMLogLikelihood(torch.autograd.Function):
    """log p(x) whose backward is the top-down pass: the gradient of Σ_b g_b log p(x_b) at the
    normalised log-weights and leaf log-probabilities is Σ_b g_b n(x_b), the expected flows."""

    @staticmethod
    def forward(ctx, circuit, x, log_leaf, *logws):
        weights = [lw.exp() for lw in logws]
        ctx.circuit, ctx.x, ctx.weights = circuit, x, weights
        ctx.p = circuit.evaluate(x, weights, leaf_grad=False, log_leaf=log_leaf)
        return ctx.p.ll

    @staticmethod
    def backward(ctx, grad):
        _, stats, leaf_flows = downward(ctx.circuit, ctx.p, ctx.weights, grad)
        leaf = leaf_statistics(ctx.circuit, ctx.x, leaf_flows)
        ctx.p = ctx.weights = None
        return None, None, leaf, *stats


def circuit_of(model: nn.Module) -> ProbabilisticCircuit | None:
    """The circuit behind ``model`` (itself, or DDP's/compile's wrapped module), or None."""
    for m in (model, getattr(model, "module", None), getattr(model, "_orig_mod", None)):
        if isinstance(m, ProbabilisticCircuit):
            return m
    return None
