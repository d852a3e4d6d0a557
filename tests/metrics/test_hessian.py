"""Lanczos eigenvalues and Hutchinson trace against the dense Hessian of small models."""

import pytest
import torch
import torch.nn.functional as F
from metrics_helpers import dense_hessian
from torch import nn

from sam_runner.metrics import (
    HessianOperator,
    hessian_eigenpairs,
    hessian_trace,
    spectral_density,
    top_hessian_eigenvalues,
)
from sam_runner.metrics.hvp import _method_choice
from sam_runner.metrics.solvers import lanczos


def bn_cnn(seed=0):
    torch.manual_seed(seed)
    m = nn.Sequential(
        nn.Conv1d(1, 4, 3),
        nn.BatchNorm1d(4),
        nn.ReLU(),
        nn.Conv1d(4, 4, 3),
        nn.BatchNorm1d(4),
        nn.ReLU(inplace=True),
        nn.Flatten(),
        nn.Linear(4 * 6, 3),
    )
    x, y = torch.randn(61, 1, 10), torch.randint(0, 3, (61,))
    m.train()
    for _ in range(3):
        m(x)  # non-trivial running statistics
    return m.eval(), x, y


def uneven(x, y):
    cuts = [0, 7, 40, 61]
    return [(x[a:b], y[a:b]) for a, b in zip(cuts, cuts[1:])]


@pytest.mark.parametrize("method", ["double_backward", "forward_over_reverse"])
def test_top_k_matches_dense_hessian_cnn_with_batchnorm_eval_uneven_batches(method):
    m, x, y = bn_cnn()
    eig = torch.linalg.eigvalsh(dense_hessian(m, F.cross_entropy, x, y)).flip(0)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    vals = top_hessian_eigenvalues(
        m, F.cross_entropy, uneven(x, y), k=3, method=method, max_iter=200
    )
    assert len(vals) == 3
    for got, want in zip(vals, eig[:3].tolist()):
        assert abs(got - want) <= 1e-3 * abs(want)
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())  # nothing moved


def test_batchnorm_train_mode_uses_batch_statistics_and_keeps_running_stats():
    m, x, y = bn_cnn(1)
    m.train()
    eig = torch.linalg.eigvalsh(dense_hessian(m, F.cross_entropy, x, y)).flip(0)
    running = m[1].running_mean.clone()
    vals = top_hessian_eigenvalues(m, F.cross_entropy, [(x, y)], k=2)
    assert abs(vals[0] - eig[0]) <= 1e-3 * abs(eig[0]) and abs(vals[1] - eig[1]) <= 1e-3 * abs(
        eig[1]
    )
    assert torch.equal(m[1].running_mean, running) and m.training


def test_hvp_equals_dense_hessian_times_v_with_worker_threads_and_restores_the_model():
    """The HVP (BatchNorm as its affine map, batches over worker threads, the heap kept) is H v
    of the real model; afterwards the BatchNorm layers run their own forward, the thread count
    and the heap's settings are back."""
    from sam_runner.metrics import hvp

    kept = 1 if hvp._glibc() else 0
    m, x, y = bn_cnn()
    H = dense_hessian(m, F.cross_entropy, x, y)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with HessianOperator(m, F.cross_entropy, uneven(x, y), "double_backward") as op:
            assert op._pool.workers == 2
            # the affine map is in place
            assert all("forward" in bn.__dict__ for bn in (m[1], m[4]))
            assert hvp._heap_kept_depth == [kept]  # freed pages stay in the process
            v = torch.randn(op.numel, generator=torch.Generator().manual_seed(0))
            hv = op(v)
        assert torch.allclose(hv.double(), H @ v.double(), rtol=1e-4, atol=1e-5)
        assert torch.get_num_threads() == 2
        assert all("forward" not in bn.__dict__ for bn in (m[1], m[4]))
        assert hvp._heap_kept_depth == [0]
    finally:
        torch.set_num_threads(threads)


def test_batchnorm_subclass_with_its_own_forward_is_left_alone():
    class BatchNormReLU(nn.BatchNorm1d):  # like timm's BatchNormAct: forward does more than BN
        def forward(self, x):
            return torch.relu(super().forward(x))

    torch.manual_seed(0)
    m = nn.Sequential(nn.Conv1d(1, 3, 3), BatchNormReLU(3), nn.Flatten(), nn.Linear(3 * 6, 2))
    x, y = torch.randn(20, 1, 8), torch.randint(0, 2, (20,))
    m.train()
    m(x)
    m.eval()
    eig = torch.linalg.eigvalsh(dense_hessian(m, F.cross_entropy, x, y)).flip(0)
    with HessianOperator(m, F.cross_entropy, [(x, y)]):
        assert "forward" not in m[1].__dict__
    assert top_hessian_eigenvalues(m, F.cross_entropy, [(x[:9], y[:9]), (x[9:], y[9:])])[
        0
    ] == pytest.approx(float(eig[0]), rel=1e-3)


def test_conv1d_layers_run_as_matrix_products_with_the_same_hessian():
    """On a CPU the operator evaluates plain Conv1d layers as unfold + one matrix product: strided,
    padded, with and without bias, the model's outputs and H v are those of the real layers.
    Grouped or dilated convolutions keep their own forward; everything is restored afterwards."""
    torch.manual_seed(0)
    m = nn.Sequential(
        nn.Conv1d(2, 4, 3, stride=2, padding=1),
        nn.Tanh(),
        nn.Conv1d(4, 4, 3, padding=2, bias=False),
        nn.Tanh(),
        nn.Conv1d(4, 4, 3, groups=2, dilation=2),
        nn.Flatten(),
        nn.Linear(12, 3),
    )
    x, y = torch.randn(13, 2, 9), torch.randint(0, 3, (13,))
    want_out = m(x)
    H = dense_hessian(m, F.cross_entropy, x, y)
    with HessianOperator(
        m, F.cross_entropy, [(x[:6], y[:6]), (x[6:], y[6:])], "double_backward"
    ) as op:
        assert ["forward" in c.__dict__ for c in (m[0], m[2], m[4])] == [True, True, False]
        torch.testing.assert_close(m(x), want_out, rtol=1e-5, atol=1e-6)
        assert m[0](x[0]).shape == (4, 5)  # unbatched input still works
        v = torch.randn(op.numel, generator=torch.Generator().manual_seed(1))
        hv = op(v)
    assert torch.allclose(hv.double(), H @ v.double(), rtol=1e-4, atol=1e-5)
    assert all("forward" not in c.__dict__ for c in (m[0], m[2], m[4]))


def test_mlp_with_negative_curvature_returns_largest_first():
    torch.manual_seed(2)
    m = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 4))
    x, y = torch.randn(40, 5), torch.randint(0, 4, (40,))
    eig = torch.linalg.eigvalsh(dense_hessian(m, F.cross_entropy, x, y)).flip(0)
    r = hessian_eigenpairs(m, F.cross_entropy, [(x[:25], y[:25]), (x[25:], y[25:])], k=2, seed=3)
    assert r.values == sorted(r.values, reverse=True)
    assert abs(r.values[0] - eig[0]) <= 1e-3 * abs(eig[0]) and abs(
        r.values[1] - eig[1]
    ) <= 1e-3 * abs(eig[1])
    assert r.converged and 2 <= r.hvps <= 100
    # the returned vector is the top eigenvector: its Rayleigh quotient is λ_max
    H = dense_hessian(m, F.cross_entropy, x, y)
    v = torch.cat([t.reshape(-1) for t in r.vectors]).double()
    assert float(v @ H @ v / (v @ v)) == pytest.approx(float(eig[0]), rel=1e-3)


def test_warm_start_from_top_eigenvector_needs_few_hvps():
    m, x, y = bn_cnn()
    cold = hessian_eigenpairs(m, F.cross_entropy, [(x, y)], seed=0)
    warm = hessian_eigenpairs(m, F.cross_entropy, [(x, y)], init=cold.vectors, seed=1)
    assert warm.hvps < cold.hvps and warm.values[0] == pytest.approx(cold.values[0], rel=1e-3)


@pytest.mark.parametrize("k", [1, 3])
def test_presolve_on_leading_batch_keeps_top_k_exact(k):
    """A coarse start from batch 0's Hessian; the full run still meets the dense top-k."""
    m, x, y = bn_cnn()
    eig = torch.linalg.eigvalsh(dense_hessian(m, F.cross_entropy, x, y)).flip(0)
    r = hessian_eigenpairs(
        m,
        F.cross_entropy,
        uneven(x[[*range(20, 61), *range(20)]], y[[*range(20, 61), *range(20)]]),
        k=k,
        max_iter=200,
        presolve_batches=1,
        presolve_tol=3e-2,
    )
    assert r.presolve_hvps > 0 and r.converged
    for got, want in zip(r.values, eig[:k].tolist()):
        assert abs(got - want) <= 1e-3 * abs(want)
    # all batches in the "presolve" means no presolve at all
    whole = hessian_eigenpairs(m, F.cross_entropy, [(x, y)], k=k, max_iter=200, presolve_batches=1)
    assert whole.presolve_hvps == 0


def test_lanczos_residual_rule_holds_on_a_close_gap():
    # λ₂/λ₁ = 0.9 with a dense bulk below: the returned value must be within tol of λ₁
    torch.manual_seed(0)
    n = 400
    q, _ = torch.linalg.qr(torch.randn(n, n, dtype=torch.float64))
    spectrum = torch.cat([torch.tensor([10.0, 9.0]), torch.rand(n - 2, dtype=torch.float64) * 8])
    A = (q * spectrum) @ q.T
    r = lanczos(
        lambda v: (A @ v.double()).to(v.dtype),
        n,
        k=2,
        tol=1e-3,
        max_iter=200,
        generator=torch.Generator().manual_seed(0),
    )
    assert r.converged
    assert abs(r.values[0] - 10) <= 1e-2 and abs(r.values[1] - 9) <= 9e-3


def close_spectrum(seed, top, n=100):
    """A symmetric matrix with the given top eigenvalues over a bulk in [−0.05, 0.45], and all its
    eigenvalues, largest first."""
    g = torch.Generator().manual_seed(seed)
    bulk = torch.rand(n - len(top), generator=g, dtype=torch.float64) * 0.5 - 0.05
    values = torch.cat([torch.tensor(top, dtype=torch.float64), bulk])
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=g, dtype=torch.float64))
    return (q * values) @ q.T, values.sort(descending=True).values


@pytest.mark.parametrize("top", [(1.0, 0.8, 0.66, 0.655), (1.0, 0.99, 0.98, 0.97)])
def test_lanczos_k3_skips_no_eigenvalue_on_close_spectra(top):
    """k = 3 at the default tol over 60 seeds: each value within tol of the dense λ₁, λ₂, λ₃
    (without the guard pair, Lanczos returned λ₄ as the third value on 5–7 of these seeds)."""
    for seed in range(60):
        A, exact = close_spectrum(seed, top)
        r = lanczos(
            lambda v: (A @ v.double()).to(v.dtype),
            len(A),
            k=3,
            generator=torch.Generator().manual_seed(seed),
        )
        assert r.converged, seed
        for i in range(3):
            assert abs(r.values[i] - float(exact[i])) <= 1e-3 * float(exact[i]), (seed, i)


def test_lanczos_accepts_a_multiple_eigenvalue_at_the_kth_place():
    """λ₃ = λ₄: the pair cannot be separated, and either is λ₃; no run to max_iter."""
    for seed in range(10):
        A, exact = close_spectrum(seed, (1.0, 0.8, 0.66, 0.66))
        r = lanczos(lambda v: (A @ v.double()).to(v.dtype), len(A), k=3, generator=None)
        assert r.converged and r.hvps < 60
        assert abs(r.values[2] - 0.66) <= 1e-3 * 0.66


def test_hutchinson_trace_within_its_standard_error():
    m, x, y = bn_cnn()
    exact = float(dense_hessian(m, F.cross_entropy, x, y).trace())
    with HessianOperator(m, F.cross_entropy, uneven(x, y)) as op:
        mean, se = hessian_trace(op, num_probes=400, seed=0)
    assert se > 0 and abs(mean - exact) <= 4 * se


def test_deflated_trace_equals_the_dense_trace_and_has_a_smaller_error():
    """tr(QᵀHQ) exactly + Hutchinson on the projected rest: with every eigenvector the exact
    trace (nothing left to sample); with the top 3 the dense float64 trace within 4 standard
    errors, a smaller error than the same probes undeflated; with any basis (random rows, not
    orthonormal) still unbiased."""
    m, x, y = bn_cnn()
    dense = dense_hessian(m, F.cross_entropy, x, y)
    exact = float(dense.trace())
    evals, evecs = torch.linalg.eigh(dense)
    top = evecs[:, evals.abs().argsort(descending=True)[:3]].T
    with HessianOperator(m, F.cross_entropy, uneven(x, y)) as op:
        whole, se_whole = hessian_trace(op, num_probes=4, basis=evecs.T)
        mean, se = hessian_trace(op, num_probes=200, seed=1, basis=top)
        _, se_plain = hessian_trace(op, num_probes=200, seed=1)
        hvps = op.hvps
        g = torch.Generator().manual_seed(2)
        other, se_other = hessian_trace(
            op, num_probes=200, seed=3, basis=torch.randn(5, op.numel, generator=g)
        )
    assert whole == pytest.approx(exact, rel=1e-4) and se_whole < 1e-4 * abs(exact)
    assert abs(mean - exact) <= 4 * se and se < 0.8 * se_plain
    assert abs(other - exact) <= 4 * se_other
    assert hvps == len(evecs) + 4 + 3 + 200 + 200  # k exact HVPs, then one per probe


def test_deflated_trace_rejects_a_basis_of_another_size():
    m, x, y = bn_cnn()
    with HessianOperator(m, F.cross_entropy, [(x, y)]) as op:
        with pytest.raises(ValueError, match="basis has 7 columns; the Hessian has"):
            hessian_trace(op, 4, basis=torch.ones(2, 7))


def test_spectral_density_weights_are_a_probability_per_run():
    m, x, y = bn_cnn()
    with HessianOperator(m, F.cross_entropy, [(x, y)]) as op:
        d = spectral_density(op, num_runs=2, num_steps=20)
    eig = torch.linalg.eigvalsh(dense_hessian(m, F.cross_entropy, x, y))
    for nodes, weights in zip(d["nodes"], d["weights"]):
        assert len(nodes) == 20 and sum(weights) == pytest.approx(1.0, abs=1e-6)
        assert max(nodes) <= float(eig[-1]) * (1 + 1e-4) and min(nodes) >= float(eig[0]) - 1e-4


def test_bad_arguments_are_rejected_clearly():
    m, x, y = bn_cnn()
    with pytest.raises(ValueError, match="method='newton'"):
        top_hessian_eigenvalues(m, F.cross_entropy, [(x, y)], method="newton")
    with pytest.raises(ValueError, match="k=0"):
        top_hessian_eigenvalues(m, F.cross_entropy, [(x, y)], k=0)
    with pytest.raises(ValueError, match="batches is empty"):
        top_hessian_eigenvalues(m, F.cross_entropy, [])
    with pytest.raises(ValueError, match="batch 1 of batches is empty"):  # not a NaN weight
        top_hessian_eigenvalues(m, F.cross_entropy, [(x, y), (x[:0], y[:0])])


class WithUnused(nn.Module):
    """A trainable parameter the forward never uses (e.g. a head switched off)."""

    def __init__(self):
        super().__init__()
        self.body, self.unused, self.head = nn.Linear(5, 4), nn.Linear(2, 2), nn.Linear(4, 3)

    def forward(self, x):
        return self.head(torch.tanh(self.body(x)))


@pytest.mark.parametrize("method", ["double_backward", "forward_over_reverse"])
@pytest.mark.parametrize("cache_mb", [1024, 0])
def test_unused_trainable_parameters_have_zero_hessian_rows(method, cache_mb):
    torch.manual_seed(0)
    m, x, y = WithUnused(), torch.randn(30, 5), torch.randint(0, 3, (30,))
    H = dense_hessian(m, F.cross_entropy, x, y)
    batches = [(x[:12], y[:12]), (x[12:], y[12:])]
    with HessianOperator(m, F.cross_entropy, batches, method, cache_mb) as op:
        v = torch.randn(op.numel, generator=torch.Generator().manual_seed(0))
        assert torch.allclose(op(v).double(), H @ v.double(), rtol=1e-4, atol=1e-6)
        g = op.gradient()
    # after body's weight and bias, in parameter order
    unused = slice(4 * 5 + 4, 4 * 5 + 4 + 2 * 2 + 2)
    assert torch.count_nonzero(H[unused]) == 0 and torch.count_nonzero(g[unused]) == 0
    vals = top_hessian_eigenvalues(
        m, F.cross_entropy, batches, k=2, method=method, graph_cache_mb=cache_mb, tol=1e-6
    )
    assert vals == pytest.approx(torch.linalg.eigvalsh(H).flip(0)[:2].tolist(), rel=1e-4)


def test_choosing_the_hvp_method_leaves_the_global_rng_alone():
    """method=auto without the graph cache times both methods on probe vectors; they must not come
    from the global RNG, or a resumed run's dropout and shuffling would depart from an unbroken
    one."""
    _method_choice.clear()  # so this call does time the methods
    m, x, y = bn_cnn()
    state = torch.get_rng_state()
    with HessianOperator(m, F.cross_entropy, uneven(x, y), "auto", graph_cache_mb=0) as op:
        assert op.method in ("double_backward", "forward_over_reverse") and not op._cache_ok
    top_hessian_eigenvalues(m, F.cross_entropy, uneven(x, y), graph_cache_mb=0)
    assert torch.equal(state, torch.get_rng_state())


@pytest.mark.parametrize("k,top", [(1, (1.0, 0.99, 0.98)), (3, (1.0, 0.99, 0.98, 0.97))])
def test_lanczos_bounded_storage_restarts_and_keeps_its_certificate(k, top):
    """With fewer vectors than the run needs, thick restarts: the basis never holds more than
    ``max_vectors``, the values meet the dense ones within tol, and each returned residual is
    the true ‖A y − θ y‖ (the certificate holds across restarts)."""
    restarts = 0
    for seed in range(5):
        A, exact = close_spectrum(seed, top, n=300)
        r = lanczos(
            lambda v: (A @ v.double()).to(v.dtype),
            len(A),
            k=k,
            max_iter=400,
            generator=torch.Generator().manual_seed(seed),
            max_vectors=10,
        )
        assert r.converged and r.stored <= 10, seed
        restarts += r.restarts
        for i in range(k):
            assert abs(r.values[i] - float(exact[i])) <= 1e-3 * float(exact[i]), (seed, i)
            y = r.vectors[i].double()
            true = float((A @ y - r.values[i] * y).norm())
            assert true == pytest.approx(r.residuals[i], rel=1e-2, abs=1e-6), (seed, i)
    assert restarts >= 3  # most runs needed more than the 10 vectors


def test_lanczos_that_fits_its_vectors_is_the_unbounded_run_bit_for_bit():
    A, _ = close_spectrum(0, (1.0, 0.8, 0.66, 0.655), n=200)
    runs = [
        lanczos(
            lambda v: (A @ v.double()).to(v.dtype),
            len(A),
            k=3,
            generator=torch.Generator().manual_seed(0),
            max_vectors=m,
        )  # fmt: skip
        for m in (None, 40)
    ]
    assert runs[1].restarts == 0 and runs[0].hvps == runs[1].hvps
    assert runs[0].values == runs[1].values and torch.equal(runs[0].vectors, runs[1].vectors)


def test_lanczos_keeps_room_for_many_wanted_pairs_and_refuses_too_few_vectors():
    """k = 10 under the default bound keeps 24 vectors (the pairs and the guard twice over) and
    meets the dense values; a bound under 4 is refused."""
    A, exact = close_spectrum(0, tuple(1.0 - 0.02 * i for i in range(11)), n=300)
    r = lanczos(lambda v: (A @ v.double()).to(v.dtype), len(A), k=10, max_iter=600,
                generator=torch.Generator().manual_seed(0))  # fmt: skip
    assert r.converged and r.stored == 24
    for i in range(10):
        assert abs(r.values[i] - float(exact[i])) <= 1e-3 * float(exact[i]), i
    with pytest.raises(ValueError, match="max_vectors=3 must be an integer >= 4"):
        lanczos(lambda v: v, 50, k=1, max_vectors=3)


def test_graph_cache_budget_is_capped_by_free_memory():
    """The gradient graphs are cached only within half the memory free now (and the setting)."""
    from sam_runner.metrics.hvp import free_memory_bytes, graph_cache_budget

    free = free_memory_bytes("cpu")
    assert free is not None and free > 0
    assert graph_cache_budget(1, "cpu") == 2**20
    assert graph_cache_budget(10**9, "cpu") <= 0.5 * free * 1.1  # free memory moves a little


def test_the_operator_on_fewer_samples_keeps_the_precision():
    """``on`` (the trace and density on fewer samples than λ_max's) keeps bf16: its H v is a bf16
    operator's on those samples, not fp32's. (bf16 autocast runs on any CPU, emulated where the
    CPU has no bf16 arithmetic: the run's check refuses that case for speed, not for results.)"""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 3))
    g = torch.Generator().manual_seed(5)
    batches = [(torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g))]
    fewer = [(batches[0][0][:32], batches[0][1][:32])]
    v = torch.randn(sum(p.numel() for p in model.parameters()), generator=g)
    with HessianOperator(
        model, F.cross_entropy, batches, "double_backward", precision="bf16"
    ) as op:
        small = op.on(fewer)
        assert small.precision == "bf16"
        hv = small(v)
    hvs = {}
    for precision in ("fp32", "bf16"):
        with HessianOperator(
            model, F.cross_entropy, fewer, "double_backward", precision=precision
        ) as fresh:
            hvs[precision] = fresh(v)
    assert torch.equal(hv, hvs["bf16"]) and not torch.equal(hv, hvs["fp32"])
