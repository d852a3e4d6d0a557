"""trainer.compile on any device: SAM's second pass reuses the first pass's graph (no recompile:
BatchNorm's running statistics are put back rather than its flag flipped), the training pass's
loss is in the compiled graph with its forward, a compiled run equals an eager one to float
error, a bad compile_mode is one line, and a CPU without a C++ compiler runs eagerly with a
notice."""

from __future__ import annotations

import pytest
import torch
from conftest import compose, run_cli
from torch import nn

from sam_runner.losses import per_example
from sam_runner.module_state import running_stats_restored
from sam_runner.optim import SAM
from sam_runner.train import train
from sam_runner.training.compile import (
    ForwardLoss,
    compiled,
    compiled_forward_loss,
    compiler_missing,
)


def _bn_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv1d(1, 4, 3), nn.BatchNorm1d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 14, 3)
    )


def test_running_stats_restored_puts_them_back_and_changes_no_output():
    net, x = _bn_net().train(), torch.randn(8, 1, 16)
    bn = net[1]
    before = [bn.running_mean.clone(), bn.running_var.clone(), bn.num_batches_tracked.clone()]
    with running_stats_restored(net.modules()):
        inside = net(x)
        assert bn.track_running_stats  # the flag a compiled model guards on stays as it was
    after = [bn.running_mean, bn.running_var, bn.num_batches_tracked]
    assert all(torch.equal(a, b) for a, b in zip(before, after))
    assert torch.equal(inside, net(x))  # batch statistics either way
    assert not torch.equal(bn.running_mean, before[0])  # outside, they move


def test_sams_second_pass_reuses_the_first_pass_graph():
    """Three SAM steps of a compiled BatchNorm model: one graph, compiled once (dynamo's counters;
    the aot_eager backend: the same guards as inductor without generating code)."""
    import torch._dynamo.utils as dynamo_utils

    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    net = _bn_net().train()
    model = torch.compile(net, backend="aot_eager")
    opt = SAM(net.parameters(), torch.optim.SGD, rho=0.05, lr=0.1)
    opt.bind(model=model)  # the compiled model: its BatchNorm statistics are put back
    x, y = torch.randn(8, 1, 16), torch.randint(0, 3, (8,))

    def closure():
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    for _ in range(3):
        opt.step(closure)
    frames = dict(dynamo_utils.counters["frames"])
    assert frames.get("total") == 1 and dynamo_utils.counters["stats"]["unique_graphs"] == 1, dict(
        dynamo_utils.counters
    )


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_loss_is_in_the_compiled_graph_and_sams_passes_reuse_it(precision):
    """Three SAM steps (six passes) through the run's compiled ForwardLoss of a BatchNorm model:
    one frame compiled once, one graph, and that graph ends in the cross-entropy (a backend that
    records the FX graphs dynamo hands it, and runs them as they are)."""
    import torch._dynamo.utils as dynamo_utils

    torch._dynamo.reset()
    dynamo_utils.counters.clear()
    graphs = []

    def recording(graph_module, example_inputs):  # noqa: ARG001 (a backend's signature)
        graphs.append(graph_module)
        return graph_module.forward

    net = _bn_net().train()
    cpu = torch.device("cpu")
    forward_loss = ForwardLoss(net, per_example("cross_entropy"), cpu, precision)
    train_pass = compiled_forward_loss(forward_loss, "default", backend=recording)
    opt = SAM(net.parameters(), torch.optim.SGD, rho=0.05, lr=0.1)
    opt.bind(model=torch.compile(net, backend=recording))  # as Run binds its compiled model
    x, y = torch.randn(8, 1, 16), torch.randint(0, 3, (8,))
    eager = forward_loss(x, y)[1]

    def closure():
        opt.zero_grad(set_to_none=True)
        out, per_sample = train_pass(x, y)
        assert out.dtype == (torch.bfloat16 if precision == "bf16" else torch.float32)
        loss = per_sample.mean()
        loss.backward()
        return loss

    first = closure()
    torch.testing.assert_close(first, eager.mean())  # compiled = eager before any step
    for _ in range(3):
        opt.step(closure)
    assert dynamo_utils.counters["frames"]["total"] == 1, dict(dynamo_utils.counters)
    assert dynamo_utils.counters["stats"]["unique_graphs"] == 1 and len(graphs) == 1
    called = [n.target for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert torch.nn.functional.cross_entropy in called  # the loss, inside the graph
    assert called[-1] is torch.nn.functional.cross_entropy


@pytest.mark.slow  # inductor writes and compiles C++: a minute on a 2-core machine
def test_a_compiled_run_equals_an_eager_run(tmp_path):
    common = ["model=cnn1d", "dataset.num_samples=256", "dataset.batch_size=64",
              "trainer.epochs=1", "metrics.hessian.enabled=false", "optimizer=sam"]  # fmt: skip
    eager = train(compose(*common), tmp_path / "eager")
    fast = train(compose(*common, "trainer.compile=true"), tmp_path / "compiled")
    a, b = (
        torch.load(tmp_path / r / "checkpoints" / "last.pt")["model"] for r in ("eager", "compiled")
    )
    assert a.keys() == b.keys()
    for k in a:  # float error: inductor fuses and reorders the arithmetic
        torch.testing.assert_close(a[k], b[k], rtol=1e-4, atol=1e-5)
    assert eager["test_loss"] == pytest.approx(fast["test_loss"], rel=1e-4)


def test_a_bad_compile_mode_is_one_line(tmp_path, capsys):
    code, _, err = run_cli(
        ["trainer.compile_mode=fastest", f"hydra.run.dir={tmp_path / 'r'}"], capsys
    )
    assert code == 2 and err.count("\n") == 1, err
    assert "trainer.compile_mode='fastest'" in err and "reduce-overhead" in err
    assert not (tmp_path / "r").exists()


def test_a_cpu_without_a_cxx_compiler_runs_eagerly_with_a_notice(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no g++, c++ or clang++ on it
    monkeypatch.delenv("CXX", raising=False)
    cpu = torch.device("cpu")
    assert "C++ compiler" in compiler_missing(cpu)
    net = _bn_net()
    assert compiled(net, "default", cpu) is net
    assert "runs eagerly" in capsys.readouterr().err
