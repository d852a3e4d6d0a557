"""Between two runs: the straight line, its barrier, BatchNorm reset, the Bézier curve."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch
from conftest import compose
from landscape_helpers import CNN, MLP, copy_run, trained

from sam_runner.landscape.bezier import BezierCurve, curve_optimizer, curve_step, weights
from sam_runner.landscape.cli import main
from sam_runner.landscape.evaluate import COLUMNS, Evaluator
from sam_runner.landscape.files import pair_folder
from sam_runner.rebuild import load_run
from sam_runner.runfiles import read_rows

QUIET = ["trainer.progress=none"]


def table(path):
    with open(path) as f:
        return [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]


def last_test(run):
    return [r for r in read_rows(run / "metrics.jsonl") if "test_loss" in r][-1]


def test_a_run_with_a_copy_of_itself_is_flat_and_its_barrier_is_zero(tmp_path):
    run = copy_run(trained(*CNN), tmp_path / "run")
    twin = copy_run(run, tmp_path / "twin")  # the run itself is refused (#42): its copy
    assert main([str(run), "--to", str(twin), "landscape.alphas=7", *QUIET]) == 0
    out = run / "landscape" / twin.name
    rows = table(out / "connectivity.csv")
    assert [r["alpha"] for r in rows] == pytest.approx([-0.25, 0, 0.25, 0.5, 0.75, 1, 1.25])
    for k in COLUMNS:  # every point is the run itself, bit for bit
        assert len({r[k] for r in rows}) == 1
    s = json.loads((out / "landscape.json").read_text())
    for key in ("train_loss", "test_loss", "train_error", "test_error"):
        assert s[f"barrier_{key}"] == 0.0
    assert s["ends"]["a"]["test_loss"] == last_test(run)["test_loss"]


def test_the_ends_are_the_two_runs_own_losses_and_the_barrier_is_their_rise(tmp_path):
    a = copy_run(trained(*CNN), tmp_path / "a")
    b = trained(*CNN, "seed=1")
    assert main([str(a), "--to", str(b), *QUIET]) == 0
    out = a / "landscape" / b.name
    rows = table(out / "connectivity.csv")
    alphas = np.array([r["alpha"] for r in rows])
    assert len(rows) == 31 and {0.0, 0.5, 1.0} <= set(alphas)
    at = {r["alpha"]: r for r in rows}
    for run, alpha in ((a, 0.0), (b, 1.0)):  # the test set: what each run logged itself
        assert at[alpha]["test_loss"] == last_test(run)["test_loss"]
        assert at[alpha]["test_acc"] == last_test(run)["test_acc"]
    s = json.loads((out / "landscape.json").read_text())
    inside = [r for r in rows if 0 <= r["alpha"] <= 1]
    lo, hi = at[0.0]["train_loss"], at[1.0]["train_loss"]
    rise = max(r["train_loss"] - (lo + r["alpha"] * (hi - lo)) for r in inside)
    assert s["barrier_train_loss"] == pytest.approx(rise, abs=1e-12)
    assert s["run_b"]["run"] == str(b.resolve()) and s["settings"]["bn"] == "eval"
    assert (out / "connectivity.png").read_bytes()[:4] == b"\x89PNG"


def test_batchnorm_recomputed_at_each_alpha(tmp_path):
    a = copy_run(trained(*CNN), tmp_path / "a")
    b = trained(*CNN, "seed=1")
    argv = [
        str(a),
        "--to",
        str(b),
        "landscape.alphas=5",
        "landscape.bn=recompute",
        "landscape.bn_samples=128",
    ]
    assert main([*argv, *QUIET]) == 0
    s = json.loads((a / "landscape" / b.name / "landscape.json").read_text())
    assert s["settings"]["bn"] == "recompute" and s["settings"]["bn_samples"] == 128
    rows = table(a / "landscape" / b.name / "connectivity.csv")
    # statistics recomputed at α = 0 are not the run's running averages
    assert rows[1]["alpha"] == 0 and rows[1]["test_loss"] != last_test(a)["test_loss"]


def test_a_trained_bezier_curve_has_a_lower_mean_loss_than_the_straight_line(tmp_path):
    a = copy_run(trained(*MLP, "trainer.epochs=8"), tmp_path / "a")
    b = trained(*MLP, "trainer.epochs=8", "seed=1")
    argv = [
        str(a),
        "--to",
        str(b),
        "landscape.curve=bezier",
        "landscape.curve_epochs=4",
        "landscape.alphas=11",
    ]
    assert main([*argv, *QUIET]) == 0
    out = pair_folder(a, b)
    s = json.loads((out / "landscape.json").read_text())
    curve = s["curve"]
    assert s["barrier_train_loss"] > 0  # two seeds: the straight line rises
    assert curve["mean_train_loss"] < curve["line_mean_train_loss"]
    assert curve["epochs"] == 4 and len(curve["epoch_train_loss"]) == 4
    line, bez = table(out / "connectivity.csv"), table(out / "bezier.csv")
    assert [r["t"] for r in bez] == [r["alpha"] for r in line if 0 <= r["alpha"] <= 1]
    ends = {r["alpha"]: r for r in line}
    assert bez[0]["train_loss"] == ends[0.0]["train_loss"]  # the curve starts at A ...
    assert bez[-1]["train_loss"] == ends[1.0]["train_loss"]  # ... and ends at B, exactly


def test_one_curve_step_is_sgd_without_weight_decay_plus_the_penalty_on_the_curve_point():
    """Garipov et al.: SGD with weight decay 0 on θ_C, and ½·w·‖φ(t)‖² added to the loss, so the
    step is θ_C − η(∇_C L(φ(t)) + w·2t(1 − t)·φ(t)), not a decay of θ_C itself."""
    cpu = torch.device("cpu")
    run_a, run_b = load_run(trained(*MLP), cpu), load_run(trained(*MLP, "seed=1"), cpu)
    ev = Evaluator(run_a, 64, 64)
    curve = BezierCurve(ev, run_a.state, run_b.state)
    lr, wd, t = 0.1, 0.05, 0.3
    cfg = compose(
        "optimizer=base",
        f"base_optimizer.lr={lr}",
        "base_optimizer.momentum=0",
        f"base_optimizer.weight_decay={wd}",
    )
    optimizer, penalty = curve_optimizer(cfg, curve.control, 10)
    assert penalty == wd
    assert all(g["weight_decay"] == 0 for g in optimizer.base_optimizer.param_groups)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    optimizer.bind(model=curve.control, grad_scaler=scaler, clip_grad_norm=None)
    (x, *_), y = ev.train
    y = y[: len(x)]

    # the expected step, by autograd on the penalised loss at φ(t) with θ_C as leaves
    wa, wc, wb = weights(t)
    c = [v.detach().clone().requires_grad_(True) for v in curve.c]
    phi = {n: wa * a + wc * ci + wb * b for n, a, ci, b in zip(curve.names, curve.a, c, curve.b)}
    out = torch.func.functional_call(curve.control, phi, (x,))
    loss = run_a.criterion()(out.float(), y).mean() + 0.5 * wd * sum(
        v.square().sum() for v in phi.values()
    )
    grads = torch.autograd.grad(loss, c)
    expected = [ci.detach() - lr * g for ci, g in zip(c, grads)]
    decayed_control = [
        ci.detach() - lr * (g - wd * wc * p + wd * ci.detach())
        for ci, g, p in zip(c, grads, phi.values())
    ]

    got = curve_step(optimizer, curve, run_a.criterion(), run_a.autocast(), scaler, wd, x, y, t)
    assert float(got) == pytest.approx(float(loss.detach()), rel=1e-6)
    for new, want, old in zip(curve.c, expected, decayed_control):
        assert torch.allclose(new, want, rtol=1e-5, atol=1e-7)
    assert not all(
        torch.allclose(n, o, rtol=1e-5, atol=1e-7) for n, o in zip(curve.c, decayed_control)
    )


# ------------------------------------------------------------ one computation per folder (#28)
def test_a_pair_recomputed_without_a_curve_keeps_nothing_of_the_earlier_curve(tmp_path):
    """A pair that had a Bézier curve, recomputed with the line only: landscape.json holds no
    ``curve`` (its options say linear) and bezier.csv is gone; the model recorded is the one
    built (model=auto resolved), not ``auto``."""
    a = copy_run(trained("model.channels=8"), tmp_path / "a")  # model=auto: cnn1d on MNIST-1D
    b = trained("model.channels=8", "seed=1")
    argv = [str(a), f"landscape.to={b}", "landscape.alphas=5", "trainer.progress=none"]
    assert main([*argv, "landscape.curve=bezier", "landscape.curve_epochs=1"]) == 0
    out = pair_folder(a, b)
    assert "curve" in json.loads((out / "landscape.json").read_text())
    assert (out / "bezier.csv").is_file()
    assert main(argv) == 0
    s = json.loads((out / "landscape.json").read_text())
    assert s["options"]["curve"] == "linear" and "curve" not in s
    assert not (out / "bezier.csv").exists()
    assert s["run_a"]["model"] == s["run_b"]["model"] == "cnn1d"


def test_non_finite_logits_have_no_accuracy_and_both_panels_leave_them_out():
    """Where the weights give non-finite logits the accuracy is NaN, as the loss is (not the
    share of class 0 that argmax of NaNs picks: error 0.9 on ten classes), and the error panel
    leaves those points out and says so, as the loss panel does."""
    from sam_runner.landscape.plots import plot_connectivity

    run = load_run(trained(*MLP), torch.device("cpu"))
    ev = Evaluator(run, 256, 4096)
    finite = ev.measure()
    assert torch.isfinite(finite).all()
    with torch.no_grad():
        next(run.model.parameters()).fill_(float("nan"))
    broken = ev.measure()
    ev.restore()
    assert torch.isnan(broken).all()  # train and test loss, train and test accuracy
    alphas = np.array([-0.25, 0.0, 0.5, 1.0, 1.25])
    values = np.tile(finite.double().numpy(), (5, 1))
    values[0] = broken.double().numpy()
    fig = plot_connectivity(alphas, values, "t")
    loss_ax, err_ax = fig.axes
    for ax in (loss_ax, err_ax):
        drawn = [line for line in ax.get_lines() if line.get_label().startswith("line, ")]
        assert all(np.isnan(line.get_ydata()[0]) for line in drawn)
        assert any("not finite at α = -0.25" in t.get_text() for t in ax.texts)


@pytest.mark.parametrize("with_wd", [False, True])
def test_a_sam_curve_step_builds_eps_with_weight_decay_only_as_training_would(with_wd):
    """Under SAM the penalty ½·w·‖φ(t)‖² enters the ascent gradient only with
    ``optimizer.perturb_with_weight_decay=true`` (training's default keeps it out of ε); the
    descent gradient at θ_C + ε always has it."""
    cpu = torch.device("cpu")
    run_a, run_b = load_run(trained(*MLP), cpu), load_run(trained(*MLP, "seed=1"), cpu)
    ev = Evaluator(run_a, 64, 64)
    curve = BezierCurve(ev, run_a.state, run_b.state)
    lr, wd, rho, t = 0.1, 0.5, 0.2, 0.4
    cfg = compose(
        "optimizer=sam",
        f"optimizer.rho={rho}",
        f"optimizer.perturb_with_weight_decay={str(with_wd).lower()}",
        f"base_optimizer.lr={lr}",
        "base_optimizer.momentum=0",
        f"base_optimizer.weight_decay={wd}",
    )
    optimizer, _ = curve_optimizer(cfg, curve.control, 10)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    optimizer.bind(model=curve.control, grad_scaler=scaler, clip_grad_norm=None)
    (x, *_), y = ev.train
    y = y[: len(x)]
    wa, wc, wb = weights(t)
    criterion = run_a.criterion()

    def grads_at(c, penalised):
        leaves = [v.detach().clone().requires_grad_(True) for v in c]
        phi = [wa * a + wc * ci + wb * b for a, ci, b in zip(curve.a, leaves, curve.b)]
        out = torch.func.functional_call(curve.control, dict(zip(curve.names, phi)), (x,))
        loss = criterion(out.float(), y).mean()
        if penalised:
            loss = loss + 0.5 * wd * sum(v.square().sum() for v in phi)
        return torch.autograd.grad(loss, leaves)

    c0 = [v.detach().clone() for v in curve.c]
    g0 = grads_at(c0, penalised=with_wd)
    norm = torch.sqrt(sum(g.square().sum() for g in g0))
    g1 = grads_at([c + rho * g / norm for c, g in zip(c0, g0)], penalised=True)
    expected = [c - lr * g for c, g in zip(c0, g1)]
    curve_step(optimizer, curve, criterion, run_a.autocast(), scaler, wd, x, y, t)
    for new, want in zip(curve.c, expected):
        assert torch.allclose(new, want, rtol=1e-4, atol=1e-6)
