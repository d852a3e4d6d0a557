"""The curvature of an FSDP2-sharded model measured on its shards (metrics/sharded.py): two gloo
processes against one process on the whole model."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

from sam_runner import distributed
from sam_runner.data import Data
from sam_runner.training import strategy

CPU = torch.device("cpu")


def _model():
    """Conv1d + BatchNorm (running statistics: buffers the forward needs) + a Linear of 3 rows,
    which 2 processes shard unevenly (2 rows and 1: a padded chunk)."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv1d(1, 4, 3), nn.BatchNorm1d(4), nn.Tanh(), nn.Flatten(), nn.Linear(32, 3)
    )
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 2.0)
    return model.eval()


def _batches():
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(90, 1, 10, generator=g), torch.randint(0, 3, (90,), generator=g)
    return [(x[i : i + 32], y[i : i + 32]) for i in range(0, 90, 32)]


def _sharded():
    """(the model sharded over the processes, its unsharded structure on the meta device), after
    a forward without backward, as an evaluation leaves it: the root's parameters gathered. Its
    first layer recomputes its activations (``trainer.activation_checkpointing``, set before the
    structure is copied, as ``strategy.wrap`` does)."""
    model = _model()
    strategy.checkpoint_activations(model[0])
    structure = copy.deepcopy(model).to_empty(device="meta")
    strategy.shard(model, [], distributed.current())
    with torch.no_grad():
        model(_batches()[0][0])
    return model, structure


def _estimates(op, eig) -> dict:
    """The trace (plain and deflated by the Ritz vectors) and the SLQ nodes and weights."""
    from sam_runner.metrics.solvers import hessian_trace, spectral_density

    density = spectral_density(op, 2, 8, seed=0)
    return {
        "trace": hessian_trace(op, 6, seed=0),
        "deflated": hessian_trace(op, 6, seed=0, basis=eig.ritz_vectors),
        "nodes": density["nodes"],
        "weights": density["weights"],
    }


def _operator_probe():
    """λ_1, λ_2, the loss, ‖g‖, the traces and the density from the sharded operator and from
    one process's operator on the whole model; the lengths of the vectors each process holds."""
    from sam_runner.metrics.hvp import HessianOperator
    from sam_runner.metrics.sharded import ShardedHessianOperator
    from sam_runner.metrics.solvers import hessian_eigenpairs

    topo = distributed.current()
    whole = _model()
    model, structure = _sharded()
    out = {}
    with HessianOperator(whole, F.cross_entropy, _batches(), "double_backward") as op:
        eig = hessian_eigenpairs(whole, None, op.batches, k=2, tol=1e-6, operator=op)
        out["whole"] = (eig.values, float(op.loss()), float(op.gradient().norm()), op.numel)
        out["whole_estimates"] = _estimates(op, eig)
    with ShardedHessianOperator(model, structure, F.cross_entropy, _batches(), topo) as op:
        eig = hessian_eigenpairs(None, None, op.batches, k=2, tol=1e-6, operator=op)
        g_norm = float(topo.sum(op.gradient().square().sum()).sqrt())
        out["sharded"] = (eig.values, float(op.loss()), g_norm, op.numel)
        out["sharded_estimates"] = _estimates(op, eig)
        lengths = topo.gather(torch.tensor([[eig.ritz_vectors.shape[1], op.numel]]))
        out["vector_lengths"] = lengths.tolist()
        out["structure_devices"] = {p.device.type for p in structure.parameters()}
    return out


def test_the_sharded_operator_equals_one_process_on_the_whole_model():
    out = distributed.launch(_operator_probe, (), 2, CPU)  # rank 0's; rank 1 checked below
    values, loss, g_norm, numel = out["whole"]
    s_values, s_loss, s_g_norm, _ = out["sharded"]
    assert s_values == pytest.approx(values, rel=1e-5)
    assert s_loss == pytest.approx(loss, rel=1e-6) and s_g_norm == pytest.approx(g_norm, rel=1e-5)
    # each process holds its chunk of every vector: ⌈rows/2⌉ rows of each parameter on rank 0,
    # the rest on rank 1 (the Linear's 3 rows: 2 and 1)
    assert numel == 123 and out["vector_lengths"] == [[78, 78], [45, 45]]
    # the same probes (each process draws its chunk of them), so the same estimates
    whole, sharded = out["whole_estimates"], out["sharded_estimates"]
    for key in ("trace", "deflated"):
        assert sharded[key] == pytest.approx(whole[key], rel=1e-5), key
    for key in ("nodes", "weights"):
        for a, b in zip(sharded[key], whole[key]):
            assert a == pytest.approx(b, rel=1e-4, abs=1e-6), key
    assert out["structure_devices"] == {"meta"}  # the structure never held weights


def _tracker(model, hessian: dict, measures: dict):
    from sam_runner.metrics.tracker import CurvatureTracker

    x, y = torch.cat([b[0] for b in _batches()]), torch.cat([b[1] for b in _batches()])
    data = Data(None, None, num_classes=3, input_shape=(1, 10), train_size=90, train_tensors=(x, y))
    hessian = {"num_samples": 90, "batch_size": 32, **hessian}
    cfg = OmegaConf.create({"hessian": hessian, **measures})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    return CurvatureTracker(cfg, model, data, opt, seed=0)


HESSIAN = {"k": 2, "tol": 1e-6, "grad_topk_overlap": True, "presolve_batches": 1}
# the trace and the density on the leading 60 of the 90 samples: not what either process holds
ON_SHARDS = {
    "trace": {"enabled": True, "num_probes": 4, "num_samples": 60},
    "density": {"enabled": True, "num_runs": 2, "num_steps": 6, "num_samples": 60},
}
# the sharpness measures on the leading 60 samples too: more than a process's share (45)
SHARPNESS = {
    "num_samples": 60,
    "directional": {"enabled": True, "num_directions": 2},
    "average": {"enabled": True, "num_samples": 3},
}
GATHERED = {**ON_SHARDS, "sharpness": SHARPNESS}


def _tracker_probe():
    """The final measurement's keys and density, sharded: with the trace and the density, on the
    shards; with the directional sharpness too, on the gathered weights; how many whole-model
    state dicts each assembled (``full_state`` calls) and the length of the warm start it kept
    on each process."""
    from sam_runner.metrics import tracker as tracker_module

    assembled, gather = [], tracker_module.full_state
    tracker_module.full_state = lambda m: assembled.append(1) or gather(m)
    out = {}
    for name, measures in (("shards", ON_SHARDS), ("gathered", GATHERED)):
        model, structure = _sharded()
        tracker = _tracker(model, HESSIAN, measures)
        tracker.unsharded = structure
        before = len(assembled)
        out[name] = (tracker.measure(final=True), tracker.density)
        out[f"{name}_assembled"] = len(assembled) - before
        kept = torch.tensor([sum(t.numel() for t in tracker.vector)])
        out[f"{name}_vector"] = distributed.current().gather(kept).tolist()
    return out


def test_the_final_measurement_of_a_sharded_model_gathers_it_only_for_other_measures():
    out = distributed.launch(_tracker_probe, (), 2, CPU)
    one = _tracker(_model(), HESSIAN, GATHERED)  # one process, the whole model
    whole, whole_density = one.measure(final=True), one.density
    # the warm start kept: each process's chunk (rank 1's padded to rank 0's rows), or the whole
    assert out["shards_assembled"] == 0 and out["shards_vector"] == [78, 78]
    assert out["gathered_assembled"] == 1 and out["gathered_vector"] == [123, 123]
    keys = ("lambda_max", "lambda_2", "eos_ratio", "grad_topk_overlap", "hessian_trace")
    for name in ("shards", "gathered"):
        row, density = out[name]
        for key in keys:
            assert row[key] == pytest.approx(whole[key], rel=1e-5), (name, key)
        for a, b in zip(density["nodes"], whole_density["nodes"]):
            assert a == pytest.approx(b, rel=1e-4, abs=1e-6), name
    assert out["shards"][0]["hessian_method"] == "double_backward"
    assert "sharpness_dir" in out["gathered"][0] and "sharpness_dir" not in out["shards"][0]
    for key in ("sharpness_dir", "sharpness_dir_max", "sharpness_avg"):  # the same 60 samples
        assert out["gathered"][0][key] == pytest.approx(whole[key], rel=1e-5), key
