"""Solvers on a Hessian operator: top eigenpairs (Lanczos), the trace (Hutchinson) and the
spectral density (stochastic Lanczos quadrature).

Lanczos (``lanczos``): full reorthogonalization (classical Gram–Schmidt applied twice) against
every previous vector; stops when each of the top-k Ritz pairs (θ_i, y_i) has residual
‖H y_i − θ_i y_i‖ = |β_m s_{m,i}| ≤ tol·|θ_i|, which bounds the distance from θ_i to an
eigenvalue of H by tol·|θ_i| (a rigorous bound, unlike the change between two estimates).
Vectors are stored in float32 when tol ≥ 1e-5 (the reorthogonalization keeps them orthogonal
to ~1e-6, far below the tolerance) and float64 otherwise; the tridiagonal problem is solved in
float64. On an invariant subspace (β ≈ 0) it restarts from a fresh random vector orthogonal
to the basis. For k > 1 the stop also waits for a guard pair (``_certified``).

Storage is bounded: at most ``max_vectors`` (default ``LANCZOS_VECTORS`` = 20) Lanczos vectors
are kept. A run that fills them restarts thickly (Wu & Simon 2000): the basis becomes the top
Ritz vectors (about half of it, at least the k wanted and the guard) and the current residual
direction, the projected matrix diag(θ) bordered by the couplings β·s_{m,i}, and the iteration
goes on from there, reorthogonalised against every kept vector. The relation H Q = Q T + β q eᵀ
holds across restarts, so the residual rule above certifies the pairs as before; a run that
converges before the basis is full (most λ_max runs) is the unrestarted run, bit for bit.
``max_vectors=None`` keeps every vector (the whole tridiagonal; quadrature runs always do).

Also the weighted traces of the Fisher measures: ``hutch_plus_plus`` (Hutch++, Meyer et al.
2021) and the exact ``hessian_diagonal``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from .hvp import HessianOperator

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from typing import Any

    from torch import nn


@dataclass
class LanczosResult:
    values: list  # top-k Ritz values, largest first
    vectors: torch.Tensor  # [k, n] their Ritz vectors (unit norm)
    hvps: int  # operator applications used
    residuals: list  # ‖H y − θ y‖ of each returned pair
    converged: bool
    nodes: list = field(default_factory=list)  # all Ritz values (for quadrature)
    weights: list = field(default_factory=list)  # squared first components of their vectors
    alphas: list = field(default_factory=list)  # the tridiagonal: its diagonal ...
    # ... and off-diagonal (its leading j×j block is step j's)
    betas: list = field(default_factory=list)
    restarts: int = 0  # thick restarts taken
    stored: int = 0  # the most vectors the basis held (its memory, in vectors)


def _summed(reduce, t: torch.Tensor) -> torch.Tensor:
    """``t`` summed over the processes that each hold a part of the vectors (``reduce``; None:
    the vectors are whole, ``t`` as it is)."""
    return t if reduce is None else reduce(t)


def whole_norm(v: torch.Tensor, reduce=None) -> torch.Tensor:
    """‖v‖ of the whole vector, ``v`` one process's part of it under ``reduce``."""
    return v.norm() if reduce is None else reduce(v.square().sum()).sqrt()


def _whole_length(n: int, reduce=None, device="cpu") -> int:
    """The length of the whole vectors whose parts have length ``n`` (``reduce``: their sum)."""
    if reduce is None:
        return n
    return int(reduce(torch.tensor(float(n), dtype=torch.float64, device=device)))


def _random_unit(n, generator, device, dtype, reduce=None):
    v = torch.randn(n, generator=generator, dtype=torch.float64).to(device=device, dtype=dtype)
    return v / whole_norm(v, reduce)


class _Basis:
    """Lanczos vectors as rows, in blocks of ``BLOCK`` allocated as needed up to ``capacity``
    rows: memory follows the iterations taken, not ``max_iter`` (100 vectors of a 36M-parameter
    WRN are 14 GB), and never exceeds ``capacity`` vectors."""

    BLOCK = 16

    def __init__(self, n, device, dtype, capacity=None, reduce=None):
        self.n, self.device, self.dtype, self.blocks = n, device, dtype, []
        self.capacity, self.reduce = capacity, reduce

    def __getitem__(self, i):
        return self.blocks[i // self.BLOCK][i % self.BLOCK]

    def __setitem__(self, i, v):
        while i >= len(self.blocks) * self.BLOCK:
            rows = self.BLOCK
            if self.capacity is not None:
                rows = min(rows, self.capacity - len(self.blocks) * self.BLOCK)
            self.blocks.append(torch.zeros(rows, self.n, device=self.device, dtype=self.dtype))
        self.blocks[i // self.BLOCK][i % self.BLOCK] = v

    def _rows(self, count):
        for b, block in enumerate(self.blocks):
            rows = min(self.BLOCK, count - b * self.BLOCK)
            if rows <= 0:
                break
            yield block[:rows]

    def orthogonalize(self, w, count, in_place=False):
        """w minus its projection on the first ``count`` vectors, Gram–Schmidt applied twice
        ("twice is enough", Kahan–Parlett), block by block; ``in_place``: in w's own storage
        (the same values, one vector of memory fewer)."""
        for _ in range(2):
            for rows in self._rows(count):
                coefficients = _summed(self.reduce, rows @ w)
                w = w.sub_(rows.T @ coefficients) if in_place else w - rows.T @ coefficients
        return w

    def holds(self, t) -> bool:
        """Whether ``t`` lives in the basis' own storage."""
        ptr = t.untyped_storage().data_ptr()
        return any(block.untyped_storage().data_ptr() == ptr for block in self.blocks)

    def combine(self, coeffs, count):
        """Rows Σ_i coeffs[i, c] q_i, one per column of ``coeffs`` [count, m]."""
        out = None  # the first block's product itself: one vector fewer than zeros + product
        for b, rows in enumerate(self._rows(count)):
            part = coeffs[b * self.BLOCK : b * self.BLOCK + len(rows)].T @ rows
            out = part if out is None else out.add_(part)
        return out

    COLUMNS = 1 << 14  # columns recombined at a time (the restart's only extra memory)

    def recombine(self, coeffs, count):
        """The first ``coeffs.shape[1]`` rows replaced, in place, by ``combine(coeffs, count)``:
        column slice by column slice, so that no second basis is held."""
        kept = coeffs.shape[1]
        for start in range(0, self.n, self.COLUMNS):
            cols = slice(start, start + self.COLUMNS)
            old = torch.cat([rows[:, cols] for rows in self._rows(count)])
            new = coeffs.T @ old
            for i in range(kept):
                self[i][cols] = new[i]


def tridiagonal(alphas: Sequence[float], betas: Sequence[float]) -> torch.Tensor:
    """Lanczos' T (float64) from its diagonal and its first len(alphas) − 1 off-diagonal entries."""
    T = torch.diag(torch.tensor(alphas, dtype=torch.float64))
    if len(alphas) > 1:
        off = torch.tensor(betas[: len(alphas) - 1], dtype=torch.float64)
        T += torch.diag(off, 1) + torch.diag(off, -1)
    return T


def _check_lanczos(k, tol, max_iter) -> None:
    if not (isinstance(k, int) and k >= 1):
        raise ValueError(f"k={k!r} must be an integer >= 1")
    if not tol > 0:
        raise ValueError(f"tol={tol!r} must be > 0")
    if not (isinstance(max_iter, int) and max_iter >= k):
        raise ValueError(f"max_iter={max_iter!r} must be an integer >= k={k}")


def _ritz(alphas, betas):
    """Eigenvalues (largest first) and eigenvectors of the tridiagonal so far."""
    evals, evecs = torch.linalg.eigh(tridiagonal(alphas, betas))
    return evals.flip(0), evecs.flip(1)


GUARD = 1  # Ritz pairs certified beyond the k wanted when k > 1


def _certified(evals, res, k, tol) -> bool:
    """Whether the top-k Ritz values are certified: each within tol·|θ_i| of an eigenvalue. For
    k > 1 also the next ``GUARD`` Ritz values, to tol·|θ_k|, and θ_k separated from θ_{k+1} by
    more than their residuals (or closer than tol·|θ_k|: a cluster). A wanted value that
    converged to the eigenvalue below a missing one (Lanczos can pick up the top eigenvalues out
    of order) is then rarely returned as the k-th: the missing one appears while the guard
    converges. k = 1 has no guard (λ_max keeps its HVP count)."""
    want = k if k == 1 else k + GUARD
    if len(evals) < want:
        return False
    if not bool((res[:k] <= tol * evals[:k].abs()).all()):
        return False
    if k == 1:
        return True
    if not bool((res[k:want] <= tol * abs(float(evals[k - 1]))).all()):
        return False
    gap = float(evals[k - 1] - evals[k])
    # a gap within the tolerance is a cluster (or a multiple eigenvalue): either value is λ_k's
    return gap > float(res[k - 1] + res[k]) or gap <= tol * abs(float(evals[k - 1]))


LANCZOS_VECTORS = 20  # the vectors a certified run keeps (thick restart beyond)


class _Run:
    """One Lanczos run, advanced a step at a time by the caller's w = H q_j (so that several runs
    can share one batched HVP, ``spectral_density``). ``capacity``: the most vectors kept (None:
    all); ``keep``: the Ritz vectors a thick restart keeps; ``reduce``: a sum over processes
    when each holds a part of every vector (a sharded operator's ``reduce_sum``)."""

    def __init__(self, n, init, generator, device, dtype, capacity=None, keep=0, reduce=None):
        self.n, self.generator, self.reduce = n, generator, reduce
        self.whole_n = _whole_length(n, reduce, device)
        self.capacity, self.keep = capacity, keep
        self.Q = _Basis(n, device, dtype, capacity, reduce)
        if init is not None and float(whole_norm(init, reduce)) > 0:
            q = init.to(device=device, dtype=dtype).reshape(-1)
            self.Q[0] = q / whole_norm(q, reduce)
        else:
            self.Q[0] = _random_unit(n, generator, device, dtype, reduce)
        self.alphas, self.betas, self.beta, self._w = [], [], 0.0, None
        # after a thick restart: the kept Ritz values and their couplings to the next vector
        self.head, self.coupling, self.steps, self.restarts = [], [], 0, 0

    @property
    def size(self) -> int:
        """Vectors in the basis whose products are in T."""
        return len(self.head) + len(self.alphas)

    @property
    def q(self) -> torch.Tensor:
        """The vector whose H q the next step needs."""
        return self.Q[self.size]

    def projected(self) -> torch.Tensor:
        """T = QᵀHQ (float64): the tridiagonal, after a restart bordered by diag(θ) and the
        couplings of the kept Ritz vectors to the first vector after them."""
        T = tridiagonal(self.alphas, self.betas)
        if not self.head:
            return T
        h = len(self.head)
        out = torch.zeros(self.size, self.size, dtype=torch.float64)
        out[:h, :h] = torch.diag(torch.tensor(self.head, dtype=torch.float64))
        out[h:, h:] = T
        out[:h, h] = out[h, :h] = torch.tensor(self.coupling, dtype=torch.float64)
        return out

    def ritz(self):
        """Eigenvalues (largest first) and eigenvectors of T."""
        if not self.head:
            return _ritz(self.alphas, self.betas)
        evals, evecs = torch.linalg.eigh(self.projected())
        return evals.flip(0), evecs.flip(1)

    def step(self, w):
        """α_j, w orthogonalised against every vector so far, β_j = ‖w‖; T_j's Ritz pairs."""
        j = self.size
        self.steps += 1
        self.alphas.append(float(_summed(self.reduce, torch.dot(w, self.Q[j]))))
        # w is the step's own (H q_j, used nowhere else) unless it is a basis vector itself
        self._w = self.Q.orthogonalize(w, j + 1, in_place=not self.Q.holds(w))
        self.beta = float(whole_norm(self._w, self.reduce))
        return self.ritz()

    def advance(self, evals) -> None:
        """The next Lanczos vector; on an invariant subspace a fresh orthogonal direction; with
        the basis full, a thick restart first."""
        Q = self.Q
        scale = max(abs(float(evals[0])), abs(float(evals[-1])), 1e-30)
        invariant = self.beta <= 1e-7 * scale
        if invariant:
            fresh = _random_unit(self.n, self.generator, Q.device, Q.dtype, self.reduce)
            w = Q.orthogonalize(fresh, self.size)
            beta, norm = 0.0, whole_norm(w, self.reduce)
        else:
            beta, w, norm = self.beta, self._w, self.beta
        self._w = None
        if self.capacity is not None and self.size >= self.capacity:
            self._restart(beta)
        else:
            self.betas.append(beta)
        Q[self.size] = w
        Q[self.size].div_(norm)  # w / ‖w‖ in the basis' row: no second copy of w

    def _restart(self, beta) -> None:
        """The basis replaced by T's top ``keep`` Ritz vectors (in place), T by diag(θ) with
        their couplings β·s_{m,i} to the next vector."""
        evals, evecs = self.ritz()
        kept = evecs[:, : self.keep]
        self.Q.recombine(kept.to(device=self.Q.device, dtype=self.Q.dtype), self.size)
        self.head = [float(v) for v in evals[: self.keep]]
        self.coupling = [beta * float(s) for s in kept[-1]]
        self.alphas, self.betas = [], []
        self.restarts += 1

    def result(self, k, converged) -> LanczosResult:
        self._w = None  # not needed for the Ritz vectors: its memory back first
        exact = self.size == self.whole_n
        evals, evecs = self.ritz()
        out = _result(self.Q, evals, evecs, self.steps, self.alphas, self.betas, self.beta, k,
                      converged or exact, exact, self.reduce)  # fmt: skip
        out.restarts, out.stored = self.restarts, sum(len(b) for b in self.Q.blocks)
        return out


def _keep(k: int, capacity: int) -> int:
    """Ritz vectors a thick restart keeps: the wanted and the guard and half the rest."""
    want = k if k == 1 else k + GUARD
    return min(capacity - 2, want + (capacity - want) // 2)


def lanczos(
    matvec: Callable[[torch.Tensor], torch.Tensor],
    n: int,
    k: int = 1,
    tol: float = 1e-3,
    max_iter: int = 100,
    init: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    stop: bool = True,
    max_vectors: int | None = LANCZOS_VECTORS,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> LanczosResult:
    """Top-k eigenpairs of the symmetric operator ``matvec`` (flat vectors of length ``n``).

    ``stop=False`` runs exactly ``max_iter`` steps (stochastic Lanczos quadrature), keeping
    every vector. ``max_vectors``: the most vectors kept (thick restart beyond; None: all), at
    least 2(k + 1) + 2 for k > 1. ``reduce``: each process holds ``n`` entries of every vector
    (a part), ``reduce`` sums a tensor over the processes (one all-reduce per inner product,
    norm and projection); every process runs the same iteration and gets the same values.
    """
    _check_lanczos(k, tol, max_iter)
    dtype = dtype or (torch.float32 if tol >= 1e-5 else torch.float64)
    whole_n = _whole_length(n, reduce, device)
    capacity = None
    if stop and max_vectors is not None:
        if not (isinstance(max_vectors, int) and max_vectors >= 4):
            raise ValueError(f"max_vectors={max_vectors!r} must be an integer >= 4 (or None)")
        # room for the wanted pairs and the guard twice over, whatever k (k = 10 keeps 24)
        want = k if k == 1 else k + GUARD
        capacity = max(max_vectors, 2 * want + 2)
        capacity = capacity if capacity < min(max_iter, whole_n) else None
    keep = _keep(k, capacity) if capacity is not None else 0
    steps = min(max_iter, whole_n) if capacity is None else max_iter
    run = _Run(n, init, generator, device, dtype, capacity, keep, reduce)
    converged = False
    for j in range(steps):
        evals, evecs = run.step(matvec(run.q))
        if stop and _certified(evals, (run.beta * evecs[-1]).abs(), k, tol):
            converged = True
            break
        if j + 1 == steps:
            break
        run.advance(evals)
    return run.result(k, converged)


def _result(Q, evals, evecs, steps, alphas, betas, beta, k, converged, exact, reduce=None):
    """The top-k Ritz pairs of a finished run (``exact``: the Krylov space is the whole space).
    After a thick restart ``alphas``, ``betas``, the nodes and weights are those of the last
    cycle's T."""
    m = min(k, len(evals))
    vectors = Q.combine(evecs[:, :m].to(device=Q.device, dtype=Q.dtype), len(evals))
    vectors = vectors.div_(_row_norms(vectors, reduce))
    res = torch.zeros(m, dtype=torch.float64) if exact else (beta * evecs[-1, :m]).abs()
    return LanczosResult(
        [float(v) for v in evals[:m]],
        vectors,
        steps,
        [float(r) for r in res],
        converged,
        [float(v) for v in evals],
        [float(w) for w in evecs[0] ** 2],
        alphas,
        betas + [beta],
    )


@dataclass
class EigenResult:
    values: list  # largest first
    vectors: list  # top eigenvector per parameter (list of tensors shaped like the parameters)
    hvps: int  # HVPs on all of ``batches``
    method: str
    converged: bool
    residuals: list
    presolve_hvps: int = 0  # HVPs on the leading ``presolve_batches`` batches only
    ritz_vectors: torch.Tensor | None = None  # [k, n]: every returned pair's vector, flat, unit


def hessian_eigenpairs(
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    k: int = 1,
    *,
    tol: float = 1e-3,
    max_iter: int = 100,
    method: str = "auto",
    init: torch.Tensor | Sequence[torch.Tensor] | None = None,
    seed: int = 0,
    graph_cache_mb: float = 1024,
    presolve_batches: int = 0,
    presolve_tol: float = 3e-2,
    operator: HessianOperator | None = None,
) -> EigenResult:
    """Top-k eigenvalues with the top eigenvector, the HVP count and the HVP method used.

    ``init``: a start vector (flat, or a list shaped like the parameters), e.g. the previous
    top eigenvector for a warm start.
    ``presolve_batches``: when > 0 and fewer than all batches, first run Lanczos to the loose
    ``presolve_tol`` on the Hessian of just the leading ``presolve_batches`` batches (HVPs that
    cost that fraction of a full one), and start the full run from the sum of its top-k Ritz
    vectors (every one of the k directions present). The full run still stops on its own
    residual rule, so the answer is as certified as without it; it only starts closer. Our
    choice (a coarse-to-fine start), not from a paper: about 25% fewer full-HVP equivalents
    on the default model.
    """
    op = operator or HessianOperator(model, loss_fn, batches, method, graph_cache_mb)
    try:
        if isinstance(init, (list, tuple)):
            init = op.flat([t.to(op.device) for t in init])
        g = torch.Generator().manual_seed(seed)
        presolve_hvps = 0
        if 0 < presolve_batches < len(op.batches):
            init, presolve_hvps = _presolve(
                op, presolve_batches, k, presolve_tol, max_iter, init, g
            )
        start = op.hvps
        r = lanczos(op, op.numel, k, tol, max_iter, init, g, op.device, reduce=op.reduce_sum)
        return EigenResult(
            r.values,
            op.unflat(r.vectors[0].to(op.dtype)),
            op.hvps - start,
            op.method,
            r.converged,
            r.residuals,
            presolve_hvps,
            r.vectors,
        )
    finally:
        if operator is None:
            op.close()


def _presolve(op, n_batches, k, tol, max_iter, init, generator):
    """(the sum of the top-k Ritz vectors of the leading batches' Hessian, the HVPs spent on it)."""

    def partial(v):
        # summed over the processes: each must run the same iteration (it took each process's
        # own share alone, and the split runs' collectives then came apart)
        return op.leading_hvp(v, n_batches)

    # capped: a presolve that does not settle quickly is not worth its HVPs
    pre = lanczos(
        partial,
        op.numel,
        k,
        tol,
        min(max_iter, max(30, 2 * k)),
        init,
        generator,
        op.device,
        reduce=op.reduce_sum,
    )
    return pre.vectors.sum(0), pre.hvps


def top_hessian_eigenvalues(
    model: nn.Module,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    k: int = 1,
    **kwargs: Any,
) -> list[float]:
    """The k largest eigenvalues, largest first, of the Hessian of the mean loss over all
    samples in ``batches`` (iterable of ``(inputs, targets)``), in the model's current mode.
    Keyword arguments as ``hessian_eigenpairs`` (tol=1e-3 relative, max_iter=100, method)."""
    return hessian_eigenpairs(model, loss_fn, batches, k, **kwargs).values


PROBE_BLOCK = 8  # probes per batched HVP (Hutchinson, Hutch++, the exact diagonal)


def _blocks(matmat, V: torch.Tensor) -> torch.Tensor:
    """matmat over the rows of V, ``PROBE_BLOCK`` rows at a time."""
    return torch.cat([matmat(V[i : i + PROBE_BLOCK]) for i in range(0, len(V), PROBE_BLOCK)])


def _row_norms(V: torch.Tensor, reduce=None) -> torch.Tensor:
    """[rows, 1]: the norm of each whole row of V (``reduce``: V holds a part of each)."""
    if reduce is None:
        return V.norm(dim=1, keepdim=True)
    return reduce(V.square().sum(1, keepdim=True)).sqrt()


def _rademacher(n, generator, device, dtype):
    return (torch.randint(0, 2, (n,), generator=generator) * 2 - 1).to(device, dtype)


def _rademachers(count, n, generator, device, dtype) -> torch.Tensor:
    """[count, n]: the same vectors, in the same order, as ``count`` calls of ``_rademacher``."""
    return torch.stack([_rademacher(n, generator, device, dtype) for _ in range(count)])


def hutchinson(
    op: HessianOperator,
    num_probes: int = 100,
    seed: int = 0,
    weight: torch.Tensor | None = None,
    probes: SeededProbes | None = None,
) -> tuple[float, float]:
    """Hutchinson's estimate of tr(diag(w) H) (tr(H) without ``weight``) with Rademacher probes v:
    the mean of (w ⊙ v)ᵀ H v and its standard error. Probes go through ``op.hvp_batch`` in blocks;
    the probes, and so the estimate, are those of one HVP per probe (``probes``: shared ones,
    ``SeededProbes``)."""
    if not (isinstance(num_probes, int) and num_probes >= 2):
        raise ValueError(f"num_probes={num_probes!r} must be an integer >= 2")
    V, HV = probe_products(op, num_probes, seed, probes)
    W = V if weight is None else weight * V
    s = _summed(op.reduce_sum, torch.stack([torch.dot(w, hv) for w, hv in zip(W, HV)]))
    s = s.double().cpu()
    return float(s.mean()), float(s.std() / math.sqrt(num_probes))


def probe_products(
    op: HessianOperator, num_probes: int, seed: int = 0, probes: SeededProbes | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(V, HV): ``num_probes`` seeded Rademacher rows and H applied to each (in blocks).
    ``probes``: a ``SeededProbes`` of ``op`` and ``seed`` whose products are shared."""
    return (probes or SeededProbes(op, seed)).first(num_probes)


class SeededProbes:
    """The seeded Rademacher probes of ``probe_products`` on one operator, and H applied to each,
    kept and extended as more are asked for: the first c probes are the same whatever the count
    (one generator, drawn in turn), so every estimate of a measurement that draws probes from the
    same seed on the same operator (the trace, the quantization's diagonal, the density's start
    vectors) shares their HVPs. H is applied to each probe scaled to unit norm, as a Lanczos run
    from it takes its first step (``spectral_density`` reuses those products bit for bit), and
    Hv = ‖v‖·H(v/‖v‖) for the estimates (equal to H applied to v up to float rounding). The
    probes are kept as int8 signs (a quarter of float32's memory). On a sharded operator
    (``reduce_sum``) each process keeps its chunk of every probe, drawn as one process draws the
    whole probe (``rademacher_chunks``)."""

    def __init__(self, op: HessianOperator, seed: int = 0) -> None:
        self.op, self.seed = op, seed
        self._signs = torch.empty(0, op.numel, dtype=torch.int8, device=op.device)
        self._products = torch.empty(0, op.numel, dtype=op.dtype, device=op.device)

    def _extend(self, count: int) -> None:
        op, have = self.op, len(self._signs)
        if count <= have:
            return
        g = torch.Generator().manual_seed(self.seed)
        if op.reduce_sum is None:
            V = _rademachers(count, op.numel, g, op.device, op.dtype)
        else:
            V = op.rademacher_chunks(count, g)
        # as _Run normalises its start
        units = [v / whole_norm(v, op.reduce_sum) for v in V[have:]]
        if op.batching_pays(min(len(units), PROBE_BLOCK)):
            products = _blocks(op.hvp_batch, torch.stack(units))
        else:  # each from its own allocation, as a run's: a CPU GEMM's last bits can depend on
            # where a row starts in memory
            products = torch.stack([op(u) for u in units])
        self._products = torch.cat([self._products, products])
        self._signs = V.to(torch.int8)

    def unit_products(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(U, HU): the first ``count`` probes scaled to unit norm, and H applied to each."""
        self._extend(count)
        V = self._signs[:count].to(self.op.dtype)
        reduce = self.op.reduce_sum
        return torch.stack([v / whole_norm(v, reduce) for v in V]), self._products[:count]

    def first(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(V, HV) of the first ``count`` probes (HVPs only for those not yet applied)."""
        self._extend(count)
        V = self._signs[:count].to(self.op.dtype)
        return V, self._products[:count] * _row_norms(V, self.op.reduce_sum)


def hutch_plus_plus(
    matmat: Callable[[torch.Tensor], torch.Tensor],
    n: int,
    num_matvecs: int = 60,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> tuple[float, float]:
    """Hutch++ (Meyer et al. 2021) estimate of tr(A) for the symmetric A, ``matmat`` applying it to
    the rows of a [B, n] matrix: the exact trace of A on Q = orth(A S), S n×s Rademacher
    (s = ``num_matvecs`` // 3), plus Hutchinson on the rest (I − QQᵀ)A(I − QQᵀ) with the remaining
    probes: (estimate, standard error of the Hutchinson part). The sketch takes the dominant
    directions out of Hutchinson's variance. Each third goes through ``matmat`` in blocks."""
    if not (isinstance(num_matvecs, int) and num_matvecs >= 6):
        raise ValueError(f"num_probes={num_matvecs!r} must be an integer >= 6 (Hutch++)")
    g = torch.Generator().manual_seed(seed)
    dtype = dtype or torch.float32
    sketch = num_matvecs // 3
    Y = _blocks(matmat, _rademachers(sketch, n, g, device, dtype))
    Q = torch.linalg.qr(Y.T)[0]
    AQ = _blocks(matmat, Q.T.contiguous())
    exact = sum(float(torch.dot(q.double(), aq.double())) for q, aq in zip(Q.T, AQ))
    Z = _rademachers(num_matvecs - 2 * sketch, n, g, device, dtype)
    Z = Z - (Z @ Q) @ Q.T
    s = torch.stack([torch.dot(z.double(), az.double()) for z, az in zip(Z, _blocks(matmat, Z))])
    s = s.cpu()
    return exact + float(s.mean()), float(s.std() / math.sqrt(len(s)))


def hessian_diagonal(op: HessianOperator) -> torch.Tensor:
    """H's diagonal (float64), exactly: H_ii = ⟨e_i, H e_i⟩, one HVP per coordinate (in blocks)."""
    out = torch.empty(op.numel, dtype=torch.float64, device=op.device)
    for i in range(0, op.numel, PROBE_BLOCK):
        rows = torch.arange(min(PROBE_BLOCK, op.numel - i), device=op.device)
        E = torch.zeros(len(rows), op.numel, device=op.device, dtype=op.dtype)
        E[rows, i + rows] = 1.0
        out[i : i + len(rows)] = op.hvp_batch(E)[rows, i + rows]
    return out


def hessian_trace(
    op: HessianOperator,
    num_probes: int = 100,
    seed: int = 0,
    basis: torch.Tensor | None = None,
    probes: SeededProbes | None = None,
) -> tuple[float, float]:
    """Hutchinson's estimate of tr(H): (mean of vᵀHv over Rademacher probes, its standard error).
    ``basis`` ([k, n], e.g. the top-k Ritz vectors already computed): deflated, tr(QᵀHQ) exactly
    (k more HVPs) plus Hutchinson on (I − QQᵀ)H(I − QQᵀ), Q an orthonormal basis of its rows
    (``deflated_hutchinson``). ``probes``: a ``SeededProbes`` of ``op`` and ``seed`` (shared
    HVPs)."""
    if basis is None or len(basis) == 0:
        return hutchinson(op, num_probes, seed, probes=probes)
    return deflated_hutchinson(op, basis, num_probes, seed, probes)


def deflated_hutchinson(
    op: HessianOperator,
    basis: torch.Tensor,
    num_probes: int = 100,
    seed: int = 0,
    probes: SeededProbes | None = None,
) -> tuple[float, float]:
    """tr(H) = tr(QᵀHQ) + tr(P HP), P = I − QQᵀ, for any Q with orthonormal columns (the cross
    terms vanish: tr(QQᵀHP) = tr(HPQQᵀ) = 0); Q = orth(basisᵀ) in float64. The first term exactly,
    the second by Hutchinson with the probes of ``hutchinson`` (the same seeded Rademacher
    vectors), each projected, Pv. Unbiased for any basis; with H's top eigenvectors it takes
    their share out of the variance (2 Σ_{i≠j} H_ij² for Rademacher probes): (estimate,
    standard error of the Hutchinson part). H(Pv) = Hv − (HQ)(Qᵀv) by linearity, from the HQ of
    the first term and the plain probes' Hv (``probes``, which other measures share): k HVPs
    beyond those."""
    V, HV = probe_products(op, num_probes, seed, probes)
    return deflated_trace(op.hvp_batch, op.numel, basis, num_probes, seed, op.device, op.dtype,
                          products=(V, HV), reduce=op.reduce_sum)  # fmt: skip


def deflated_trace(
    matmat: Callable[[torch.Tensor], torch.Tensor],
    n: int,
    basis: torch.Tensor,
    num_probes: int,
    seed: int = 0,
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
    products: tuple[torch.Tensor, torch.Tensor] | None = None,
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[float, float]:
    """``deflated_hutchinson`` for any symmetric A given by ``matmat`` (rows of a [B, n] matrix):
    tr(QᵀAQ) exactly (k applications) + Hutchinson on (I − QQᵀ)A(I − QQᵀ) with ``num_probes``.
    ``products``: (V, AV) of the seeded probes unprojected (``probe_products``), so that
    A(PV) = AV − (VQ)(AQ) costs no application of A. ``reduce``: the vectors are each
    process's chunks (a sharded operator's ``reduce_sum``); then ``products`` are needed."""
    if not (isinstance(num_probes, int) and num_probes >= 2):
        raise ValueError(f"num_probes={num_probes!r} must be an integer >= 2")
    if reduce is not None and products is None:
        raise ValueError("a deflated trace over chunked vectors needs the probes' products")
    dtype = dtype or torch.float32
    B = torch.as_tensor(basis).reshape(len(basis), -1)
    if B.shape[1] != n:
        raise ValueError(f"basis has {B.shape[1]} columns; the Hessian has {n} parameters")
    Q = _orthonormal_columns(B.to(device, torch.float64), reduce)  # [n, k]
    AQ = _blocks(matmat, Q.T.to(dtype).contiguous()).double()
    exact = float(_summed(reduce, torch.einsum("ni,in->", Q, AQ)))
    if products is not None:
        V, AV = (t.double() for t in products)
        coords = _summed(reduce, V @ Q)  # [probes, k]
        s = _summed(reduce, ((V - coords @ Q.T) * (AV - coords @ AQ)).sum(1)).cpu()
        return exact + float(s.mean()), float(s.std() / math.sqrt(num_probes))
    g = torch.Generator().manual_seed(seed)
    V = _rademachers(num_probes, n, g, device, torch.float64)
    V = (V - (V @ Q) @ Q.T).to(dtype)
    s = (V.double() * _blocks(matmat, V).double()).sum(1).cpu()
    return exact + float(s.mean()), float(s.std() / math.sqrt(num_probes))


def _orthonormal_columns(B: torch.Tensor, reduce=None) -> torch.Tensor:
    """[n, k]: an orthonormal basis of the rows of B [k, n] (float64): Householder QR; over
    chunked rows (``reduce``) Cholesky QR, Q = Bᵀ L⁻ᵀ with L Lᵀ = B Bᵀ summed over the
    processes (the same span; fine for the nearly orthonormal Ritz vectors it is given)."""
    if reduce is None:
        return torch.linalg.qr(B.T)[0]
    L = torch.linalg.cholesky(reduce(B @ B.T))
    return torch.linalg.solve_triangular(L, B, upper=False).T


def spectral_density(
    op: HessianOperator,
    num_runs: int = 3,
    num_steps: int = 25,
    seed: int = 0,
    probes: SeededProbes | None = None,
) -> dict:
    """Stochastic Lanczos quadrature (Ghorbani et al. 2019): for each of ``num_runs`` Rademacher
    start vectors, the nodes (Ritz values) and weights (squared first eigenvector components)
    of a ``num_steps``-step Lanczos run. The spectral density is the average over runs of
    Σ_i w_i δ(λ − node_i); smooth it with a Gaussian to plot (``smoothed_density``). The runs
    advance in lock-step, one ``op.hvp_batch`` per step, when one batched backward pays for
    them; else one after the other (one basis in memory at a time). Each run draws the vectors
    of its restarts (invariant subspaces) from a generator of its own, so the runs do not depend
    on which way they go. The start vectors are the seeded probes of ``probe_products``: their
    first products come from ``probes`` (a ``SeededProbes`` of ``op`` and ``seed``, shared with
    the trace and the quantization's diagonal), bit for bit the products a run computes."""
    for name, value in (("num_runs", num_runs), ("num_steps", num_steps)):
        if not (isinstance(value, int) and value >= 1):
            raise ValueError(f"{name}={value!r} must be an integer >= 1")
    probes = probes or SeededProbes(op, seed)
    starts = probes.first(num_runs)[0].double()
    # the first step's products when the probes are in the basis' float32 (the runs' own q)
    firsts = probes.unit_products(num_runs)[1] if op.dtype == torch.float32 else None
    together = num_runs if op.batching_pays(num_runs) else 1
    steps = min(num_steps, _whole_length(op.numel, op.reduce_sum, op.device))
    results = []
    for i in range(0, num_runs, together):
        chosen = slice(i, i + together)
        first = None if firsts is None else firsts[chosen]
        results += _lockstep(op, starts[chosen], steps, seed + 1 + i, first)
    return {"nodes": [r.nodes for r in results], "weights": [r.weights for r in results]}


def smoothed_density(density: dict, grid: torch.Tensor, sigma: float) -> torch.Tensor:
    """The SLQ density (``spectral_density``'s nodes and weights, the mean over runs) convolved
    with a Gaussian of width ``sigma``, on ``grid`` (float64): the curve a plot at that resolution
    shows, (1/runs) Σ_runs Σ_i w_i φ_σ(x − node_i)."""
    grid = grid.double()
    out = torch.zeros_like(grid)
    for nodes, weights in zip(density["nodes"], density["weights"]):
        z = (grid[None] - torch.tensor(nodes, dtype=torch.float64)[:, None]) / sigma
        out += (torch.tensor(weights, dtype=torch.float64)[:, None] * torch.exp(-0.5 * z**2)).sum(0)
    return out / (len(density["nodes"]) * sigma * math.sqrt(2 * math.pi))


def _lockstep(op: HessianOperator, starts, steps: int, seed: int, firsts=None) -> list:
    """``steps``-step Lanczos runs (float32 basis, no stopping rule) from ``starts``, advanced
    together: one ``op.hvp_batch`` of their current vectors per step (the first step's products
    ``firsts`` when given: H of the unit start vectors)."""
    gens = [torch.Generator().manual_seed(seed + r) for r in range(len(starts))]
    runs = [
        _Run(op.numel, v, gen, op.device, torch.float32, reduce=op.reduce_sum)
        for v, gen in zip(starts, gens)
    ]
    for j in range(steps):
        if j == 0 and firsts is not None:
            W = firsts.clone()  # laid out as hvp_batch's own result (row 0 where a block starts)
        else:
            W = op.hvp_batch(torch.stack([r.q for r in runs]))
        for r, w in zip(runs, W):
            evals, _ = r.step(w)
            if j + 1 < steps:
                r.advance(evals)
    return [r.result(1, False) for r in runs]
