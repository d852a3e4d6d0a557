"""``metrics.trace.num_samples`` and ``metrics.density.num_samples``: the trace and the density on
the first samples of the Hessian subset, and the keys checked before a run."""

import pytest
import torch
import torch.nn.functional as F
from conftest import compose, run_cli
from omegaconf import OmegaConf
from test_tracker import measured, setup

from sam_runner.errors import UserError
from sam_runner.metrics import HessianOperator, hessian_trace, spectral_density
from sam_runner.metrics.measures import leading_batches
from sam_runner.metrics.tracker import validate


def measure_with(tracker, **sections):
    tracker.cfg = OmegaConf.merge(tracker.cfg, sections)
    return measured(tracker, 1, 1, final=True)


def reference(model, data, n, fn):
    """``fn(op)`` on a Hessian operator over the first n samples of the tracker's subset (64
    samples in batches of 40), the model in eval mode as the tracker measures it."""
    x, y = data.train_subset(64, 0)
    batches = leading_batches([(x[:40], y[:40]), (x[40:], y[40:])], n)
    model.eval()
    with HessianOperator(model, F.cross_entropy, batches) as op:
        return fn(op)


@pytest.mark.parametrize("n", [30, 48, 64, 1000])
def test_trace_is_measured_on_the_first_num_samples(n):
    tracker, model, data = setup()
    row = measure_with(tracker, trace={"enabled": True, "num_probes": 6, "num_samples": n})
    # deflated by the measurement's own top Ritz vector (trace.deflate, on by default)
    basis = torch.cat([v.reshape(-1) for v in tracker.vector])[None]
    mean, se = reference(model, data, n, lambda op: hessian_trace(op, 6, seed=0, basis=basis))
    assert row["hessian_trace"] == pytest.approx(mean, rel=1e-5)
    assert row["hessian_trace_se"] == pytest.approx(se, rel=1e-5)
    tracker, model, data = setup()
    trace = {"enabled": True, "num_probes": 6, "num_samples": n, "deflate": False}
    plain = measure_with(tracker, trace=trace)
    mean, se = reference(model, data, n, lambda op: hessian_trace(op, 6, seed=0))
    assert plain["hessian_trace"] == pytest.approx(mean, rel=1e-5)
    assert plain["hessian_trace_se"] == pytest.approx(se, rel=1e-5)


def test_density_is_measured_on_the_first_num_samples_and_differs_from_the_whole_subset():
    tracker, model, data = setup()
    measure_with(
        tracker, density={"enabled": True, "num_runs": 2, "num_steps": 6, "num_samples": 30}
    )
    got = tracker.summary_extras()["hessian_density"]
    want = reference(model, data, 30, lambda op: spectral_density(op, 2, 6, seed=0))
    whole = reference(model, data, 64, lambda op: spectral_density(op, 2, 6, seed=0))
    for key in ("nodes", "weights"):
        for a, b in zip(got[key], want[key]):
            assert a == pytest.approx(b, rel=1e-4, abs=1e-7)
    assert got["nodes"][0][0] != pytest.approx(whole["nodes"][0][0], rel=1e-3)


def test_leading_batches_cut_the_last_batch():
    batches = [(torch.arange(40), torch.arange(40)), (torch.arange(40, 64), torch.arange(40, 64))]
    assert [len(y) for _, y in leading_batches(batches, 48)] == [40, 8]
    assert [len(y) for _, y in leading_batches(batches, 40)] == [40]
    assert [len(y) for _, y in leading_batches(batches, 500)] == [40, 24]


@pytest.mark.parametrize("section", ["trace", "density"])
@pytest.mark.parametrize("value", [0, 2.5, "all"])
def test_bad_num_samples_is_refused_before_a_run(section, value):
    cfg = compose("metrics=full").metrics
    OmegaConf.set_struct(cfg, False)
    cfg = OmegaConf.merge(cfg, {section: {"num_samples": value}})
    message = f"metrics.{section}.num_samples={value!r} must be an integer >= 1"
    with pytest.raises(UserError, match=message.replace(".", r"\.")):
        validate(cfg)


def test_bad_num_samples_on_the_command_line_is_one_line_exit_2(tmp_path, capsys):
    argv = ["metrics=full", "metrics.density.num_samples=0", f"hydra.run.dir={tmp_path / 'run'}"]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("sam-run: error: metrics.density.num_samples=0 must be an integer >= 1")
    assert not (tmp_path / "run").exists()
