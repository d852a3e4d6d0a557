"""Several vectors through one backward (``HessianOperator.hvp_batch``) and the solvers that use
it: SLQ's runs in lock-step, Hutchinson's and Hutch++'s probes in blocks, the exact diagonal.
Each against the one-vector-at-a-time path and against dense Hessians."""

import math

import pytest
import torch
import torch.nn.functional as F
from metrics_helpers import dense_hessian
from test_hessian import WithUnused, bn_cnn, uneven

from sam_runner.metrics import (
    HessianOperator,
    hessian_trace,
    smoothed_density,
    spectral_density,
)
from sam_runner.metrics import sharpness as S
from sam_runner.metrics.solvers import SeededProbes, deflated_trace, hessian_diagonal, lanczos


def operator(m, batches, batching, cache_mb=1024):
    return HessianOperator(m, F.cross_entropy, batches, "double_backward", cache_mb, batching)


def test_batched_hvp_equals_single_hvps_and_the_dense_hessian():
    m, x, y = bn_cnn()
    H = dense_hessian(m, F.cross_entropy, x, y)
    V = torch.randn(5, len(H), generator=torch.Generator().manual_seed(0))
    with operator(m, uneven(x, y), "batched") as op:
        assert op.batching_pays(5)
        batched = op.hvp_batch(V)
        assert op.hvps == 5  # one per vector, not one per call
        singles = torch.stack([op(v) for v in V])
    assert torch.allclose(batched, singles, rtol=1e-5, atol=1e-6)
    assert torch.allclose(batched.double(), V.double() @ H, rtol=1e-4, atol=1e-6)


def test_batched_hvp_gives_zero_rows_for_parameters_the_loss_does_not_reach():
    torch.manual_seed(0)
    m, x, y = WithUnused(), torch.randn(30, 5), torch.randint(0, 3, (30,))
    H = dense_hessian(m, F.cross_entropy, x, y)
    V = torch.randn(3, len(H), generator=torch.Generator().manual_seed(1))
    with operator(m, [(x[:12], y[:12]), (x[12:], y[12:])], "batched") as op:
        HV = op.hvp_batch(V)
    assert torch.allclose(HV.double(), V.double() @ H, rtol=1e-4, atol=1e-6)
    assert torch.count_nonzero(HV[:, 24:30]) == 0  # the unused layer's weight and bias


def test_without_cached_graphs_a_batch_is_a_loop_of_single_hvps():
    m, x, y = bn_cnn()
    with operator(m, uneven(x, y), "batched", cache_mb=0) as op:
        V = torch.randn(4, op.numel, generator=torch.Generator().manual_seed(0))
        assert not op.batching_pays(4)
        HV = op.hvp_batch(V)
        assert op.hvps == 4
        assert torch.equal(HV, torch.stack([op(v) for v in V]))


def test_hvp_batch_rejects_an_unknown_batching():
    m, x, y = bn_cnn()
    with pytest.raises(ValueError, match="batching='sometimes'"):
        operator(m, [(x, y)], "sometimes")


@pytest.mark.parametrize("batching", ["batched", "loop"])
def test_hutchinson_probes_in_blocks_are_the_single_probe_estimate(batching):
    """The probes are drawn as one HVP per probe drew them: the same estimate to float rounding,
    20 probes = two full blocks and a partial one."""
    m, x, y = bn_cnn()
    with operator(m, uneven(x, y), batching) as op:
        mean, se = hessian_trace(op, num_probes=20, seed=3)
        assert op.hvps == 20
        g = torch.Generator().manual_seed(3)
        samples = []
        for _ in range(20):
            v = (torch.randint(0, 2, (op.numel,), generator=g) * 2 - 1).to(op.dtype)
            samples.append(torch.dot(v, op(v)))
    s = torch.stack(samples).double()
    assert mean == pytest.approx(float(s.mean()), rel=1e-6)
    assert se == pytest.approx(float(s.std() / 20**0.5), rel=1e-5)


def test_exact_diagonal_in_blocks_is_the_dense_diagonal():
    m, x, y = bn_cnn()
    H = dense_hessian(m, F.cross_entropy, x, y)
    with operator(m, uneven(x, y), "batched") as op:
        diag = hessian_diagonal(op)
        assert op.hvps == op.numel
    assert torch.allclose(diag, torch.diagonal(H), rtol=1e-4, atol=1e-6)


def test_hutch_plus_plus_batched_equals_the_loop():
    m, x, y = bn_cnn()
    values = {}
    for batching in ("batched", "loop"):
        with operator(m, uneven(x, y), batching) as op:
            values[batching] = S.fisher_trace_ratio(op, num_probes=24, exact_max_params=0, seed=2)
            assert op.hvps == 24
    assert values["batched"] == pytest.approx(values["loop"], rel=1e-4)


def test_slq_runs_in_lock_step_equal_the_runs_one_by_one():
    """Three runs advanced by one batched HVP per step: the nodes and weights of three separate
    Lanczos runs from the same seeded start vectors."""
    m, x, y = bn_cnn()
    with operator(m, uneven(x, y), "batched") as op:
        together = spectral_density(op, num_runs=3, num_steps=15, seed=4)
        assert op.hvps == 45
    with operator(m, uneven(x, y), "loop") as op:
        apart = spectral_density(op, num_runs=3, num_steps=15, seed=4)
        g = torch.Generator().manual_seed(4)
        v = (torch.randint(0, 2, (op.numel,), generator=g) * 2 - 1).double()
        first = lanczos(op, op.numel, 1, 1e-3, 15, v, g, op.device, torch.float32, stop=False)
    assert apart["nodes"][0] == first.nodes and apart["weights"][0] == first.weights
    for key in ("nodes", "weights"):
        for a, b in zip(together[key], apart[key]):
            assert a == pytest.approx(b, rel=1e-4, abs=1e-6)


def test_slq_quadrature_reproduces_the_dense_spectrum_moments():
    """Gauss quadrature with m Lanczos steps is exact for polynomials of degree < 2m: for each run,
    Σ_i w_i θ_i^p = vᵀHᵖv/vᵀv (v its start vector) for p < 2m against the dense Hessian; and a run
    of as many steps as parameters has the dense eigenvalues as its nodes."""
    m, x, y = bn_cnn()
    H = dense_hessian(m, F.cross_entropy, x, y)
    steps = 6
    with operator(m, uneven(x, y), "auto") as op:
        d = spectral_density(op, num_runs=2, num_steps=steps, seed=5)
    g = torch.Generator().manual_seed(5)
    scale = torch.linalg.eigvalsh(H).abs().max()
    for nodes, weights in zip(d["nodes"], d["weights"]):
        v = (torch.randint(0, 2, (len(H),), generator=g) * 2 - 1).double()
        nodes, weights = torch.tensor(nodes) / scale, torch.tensor(weights)
        Hv = v / v.norm()
        for p in range(2 * steps):
            moment = float(v @ Hv / v.norm())
            assert float(weights @ nodes**p) == pytest.approx(moment, rel=2e-3, abs=1e-5), p
            Hv = H @ Hv / scale


def test_slq_on_the_whole_space_has_the_dense_eigenvalues_as_nodes():
    torch.manual_seed(0)
    m, x, y = WithUnused(), torch.randn(30, 5), torch.randint(0, 3, (30,))
    m.unused.requires_grad_(False)  # 39 parameters, all reached by the loss
    kept = (torch.arange(45) < 24) | (torch.arange(45) >= 30)  # all but the unused layer's
    H = dense_hessian(m, F.cross_entropy, x, y)[kept][:, kept]
    with operator(m, [(x, y)], "batched") as op:
        d = spectral_density(op, num_runs=2, num_steps=100, seed=0)
    eig = torch.linalg.eigvalsh(H)
    for nodes, weights in zip(d["nodes"], d["weights"]):
        assert len(nodes) == len(eig) == 39 and sum(weights) == pytest.approx(1.0, abs=1e-6)
        nodes = torch.tensor(nodes, dtype=eig.dtype).sort().values  # largest first: sorted
        assert torch.allclose(nodes, eig, atol=1e-4 * float(eig.abs().max()))


def test_smoothed_density_is_the_mean_of_the_runs_gaussians():
    """Each run's weights sum to 1, so the curve integrates to 1; with one node per run it is the
    mean of Gaussians at the nodes."""
    density = {"nodes": [[0.0, 2.0], [1.0]], "weights": [[0.25, 0.75], [1.0]]}
    grid = torch.linspace(-5, 7, 4001, dtype=torch.float64)
    curve = smoothed_density(density, grid, 0.5)
    assert float(curve.sum() * (grid[1] - grid[0])) == pytest.approx(1.0, abs=1e-6)

    def gauss(at):
        return torch.exp(-0.5 * ((grid - at) / 0.5) ** 2) / (0.5 * (2 * math.pi) ** 0.5)

    want = (0.25 * gauss(0.0) + 0.75 * gauss(2.0) + gauss(1.0)) / 2
    assert torch.allclose(curve, want, atol=1e-12)


@pytest.mark.parametrize("kwargs", [{"num_steps": 0}, {"num_runs": 0}, {"num_steps": 2.5}])
def test_spectral_density_rejects_bad_sizes(kwargs):
    m, x, y = bn_cnn()
    name, value = next(iter(kwargs.items()))
    with operator(m, [(x, y)], "auto") as op:
        with pytest.raises(ValueError, match=f"{name}={value!r} must be an integer >= 1"):
            spectral_density(op, **kwargs)


def test_shared_probes_give_each_estimate_its_own_value_for_fewer_hvps():
    """The trace (plain and deflated), the diagonal's probes and the density's start vectors on
    one ``SeededProbes``: the values each computes alone, bit for bit, the deflated
    trace equal to projecting every probe before its HVP, and each probe applied once."""
    m, x, y = bn_cnn()
    g = torch.Generator().manual_seed(7)
    with operator(m, uneven(x, y), "loop") as op:
        basis = torch.randn(2, op.numel, generator=g, dtype=torch.float64)
        alone = [
            hessian_trace(op, 6, seed=3),
            hessian_trace(op, 6, seed=3, basis=basis),
            spectral_density(op, num_runs=2, num_steps=5, seed=3),
        ]
        projected = deflated_trace(op.hvp_batch, op.numel, basis, 6, 3, op.device, op.dtype)
        start, probes = op.hvps, SeededProbes(op, 3)
        probes.first(8)  # the quantization's diagonal, say, first
        shared = [
            hessian_trace(op, 6, seed=3, probes=probes),
            hessian_trace(op, 6, seed=3, basis=basis, probes=probes),
            spectral_density(op, num_runs=2, num_steps=5, seed=3, probes=probes),
        ]
        # 8 probes, the basis' 2 for the deflated trace, the density's 4 further steps × 2 runs
        assert op.hvps - start == 8 + 2 + 2 * 4
    assert shared == alone
    assert shared[1][0] == pytest.approx(projected[0], rel=1e-6)
    assert shared[1][1] == pytest.approx(projected[1], rel=1e-5)
