"""CurvatureTracker: schedule, keys, warm start, BatchNorm modes, EoS threshold, checkpoint
state."""

import copy
import io
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import compose
from metrics_helpers import dense_hessian
from omegaconf import OmegaConf
from torch import nn

from sam_runner.data import Data
from sam_runner.errors import UserError
from sam_runner.metrics import top_hessian_eigenvalues
from sam_runner.metrics.stability import stability_threshold
from sam_runner.metrics.tracker import CurvatureTracker, validate
from sam_runner.optim import SAM, SAMSPS


def measured(tracker, epoch, step, final=False, within_epoch=False):
    """What the tracker logs at that point of training: within an epoch (every_n_steps) or at the
    end of one (every_n_epochs, and the last epoch: ``final``)."""
    clock = tracker.clock
    clock.epoch, clock.step, clock.within_epoch = epoch, step, within_epoch
    clock.epochs = epoch if final else epoch + 1
    return tracker.log_values()


def setup(**hessian):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv1d(1, 4, 3), nn.BatchNorm1d(4), nn.ReLU(), nn.Flatten(), nn.Linear(32, 3)
    )
    x, y = torch.randn(100, 1, 10), torch.randint(0, 3, (100,))
    model.train()
    model(x)
    data = Data(
        train=None,
        test=None,
        num_classes=3,
        input_shape=(1, 10),
        train_size=100,
        train_tensors=(x, y),
    )
    cfg = OmegaConf.create({"hessian": {"num_samples": 64, "batch_size": 40, **hessian}})
    opt = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.1, momentum=0.9)
    return CurvatureTracker(cfg, model, data, opt, seed=0), model, data


def test_end_measurement_equals_lambda_max_on_the_seeded_subset_in_eval_mode():
    tracker, model, data = setup()
    assert (
        measured(tracker, 1, 1, within_epoch=True) == {}
        and measured(tracker, 1, 10, final=False) == {}
    )
    row = measured(tracker, 2, 20, final=True)
    assert model.training  # mode restored
    x, y = data.train_subset(64, 0)
    model.eval()
    expected = top_hessian_eigenvalues(model, F.cross_entropy, [(x, y)], tol=1e-6)[0]
    assert row["lambda_max"] == pytest.approx(expected, rel=1e-3)
    assert row["eos_ratio"] == pytest.approx(row["lambda_max"] / ((2 + 2 * 0.9) / 0.1))
    assert row["hessian_hvps"] >= 1 and row["hessian_time_s"] > 0
    assert tracker.summary_extras()["hessian_bn_mode"] == "eval"


def test_presolve_on_the_first_batch_gives_the_same_lambda_max():
    tracker, model, data = setup(presolve_batches=1)
    row = measured(tracker, 2, 20, final=True)
    x, y = data.train_subset(64, 0)
    model.eval()
    expected = top_hessian_eigenvalues(model, F.cross_entropy, [(x, y)], tol=1e-6)[0]
    assert row["lambda_max"] == pytest.approx(expected, rel=1e-3)
    assert row["hessian_presolve_hvps"] >= 1 and row["hessian_hvps"] >= 1
    with pytest.raises(UserError, match="presolve_tol=0"):
        setup(presolve_batches=1, presolve_tol=0)


def test_every_n_steps_warm_starts_and_bn_train_mode_differs():
    tracker, model, _ = setup(every_n_steps=5, bn_mode="train")
    first = measured(tracker, 1, 5, within_epoch=True)
    second = measured(tracker, 1, 10, within_epoch=True)
    assert measured(tracker, 1, 7, within_epoch=True) == {}
    assert second["hessian_hvps"] < first["hessian_hvps"]  # warm start from the previous vector
    eval_tracker, m2, _ = setup()
    assert (
        abs(measured(eval_tracker, 1, 1, final=True)["lambda_max"] - second["lambda_max"])
        > 1e-3 * second["lambda_max"]
    )


def test_bn_train_mode_switches_only_batchnorm_and_restores_every_module():
    """bn_mode=train: batch statistics in BatchNorm, but dropout off (a random loss has no
    Hessian to certify); afterwards each module is back in its own mode."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv1d(1, 4, 3),
        nn.BatchNorm1d(4),
        nn.ReLU(),
        nn.Dropout(0.5),
        nn.Flatten(),
        nn.Linear(32, 3),
    )
    x, y = torch.randn(100, 1, 10), torch.randint(0, 3, (100,))
    data = Data(
        train=None,
        test=None,
        num_classes=3,
        input_shape=(1, 10),
        train_size=100,
        train_tensors=(x, y),
    )
    cfg = OmegaConf.create(
        {"hessian": {"num_samples": 64, "batch_size": 64, "bn_mode": "train", "tol": 1e-6}}
    )
    opt = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.1)
    tracker = CurvatureTracker(cfg, model, data, opt, seed=0)
    model.train()
    model[0].eval()  # a module in its own mode must stay so
    row = measured(tracker, 1, 1, final=True)
    assert [m.training for m in model] == [False, True, True, True, True, True]
    xs, ys = data.train_subset(64, 0)
    model[3].eval()  # the expected value: dropout off, BatchNorm on batch statistics
    expected = top_hessian_eigenvalues(model, F.cross_entropy, [(xs, ys)], tol=1e-6)[0]
    assert row["lambda_max"] == pytest.approx(expected, rel=1e-4)


def test_state_round_trips_through_weights_only_checkpoint():
    tracker, model, _ = setup(k=2)
    row = measured(tracker, 1, 1, final=True)
    assert "lambda_2" in row and row["lambda_2"] <= row["lambda_max"]
    buf = io.BytesIO()
    torch.save(tracker.state_dict(), buf)
    buf.seek(0)
    fresh, _, _ = setup(k=2)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    assert all(torch.equal(a, b) for a, b in zip(fresh.vector, tracker.vector))


def full_metrics(**hessian):
    """metrics=full as `sam-run` composes it, with tiny sizes."""
    cfg = compose("metrics=full").metrics
    return OmegaConf.merge(
        cfg,
        {
            "hessian": {"num_samples": 64, "batch_size": 40, "max_iter": 40, **hessian},
            "trace": {"num_probes": 4},
            "density": {"num_runs": 1, "num_steps": 8},
            "sharpness": {
                "num_samples": 48,
                "worst_case": {"steps": 2},
                "average": {"num_samples": 3},
                "directional": {"num_directions": 2},
                "fisher_trace_ratio": {"num_probes": 6, "damping": 1e-3, "exact_max_params": 0},
            },
        },
    )


@pytest.mark.parametrize("bn_mode", ["eval", "train"])
def test_full_measurement_gives_finite_values_and_restores_the_model_exactly(bn_mode):
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv1d(1, 4, 3),
        nn.BatchNorm1d(4),
        nn.ReLU(),
        nn.Dropout(0.3),
        nn.Flatten(),
        nn.Linear(32, 3),
    )
    x, y = torch.randn(100, 1, 10), torch.randint(0, 3, (100,))
    model.train()
    model(x)  # non-trivial running statistics
    model[0].eval()  # a module in its own mode
    test = [(x[:60], y[:60], None), (x[60:], y[60:], None)]
    data = Data(
        train=None,
        test=test,
        num_classes=3,
        input_shape=(1, 10),
        train_size=100,
        train_tensors=(x, y),
    )
    opt = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.1, momentum=0.9)
    tracker = CurvatureTracker(full_metrics(bn_mode=bn_mode), model, data, opt, seed=0)
    tracker.step = {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.0}
    tracker.init_state = {k: v + 0.01 for k, v in model.state_dict().items()}
    # parameters and BatchNorm buffers
    state = {k: v.clone() for k, v in model.state_dict().items()}
    modes = [m.training for m in model.modules()]
    row = measured(tracker, 5, 50, final=True)
    for key in (
        "lambda_max",
        "lambda_2",
        "lambda_3",
        "eos_ratio",
        "hessian_trace",
        "hessian_trace_se",
        "sharpness_worst",
        "sharpness_avg",
        "sharpness_avg_se",
        "sharpness_dir",
        "sharpness_dir_max",
        "armijo_alpha",
        "armijo_curvature",
        "fisher_trace_ratio",
        "fisher_trace_ratio_se",
        "fisher_rao_norm",
        "fisher_rao_norm_se",
        "param_norm",
        "dist_from_init",
        "path_norm",
        "spectral_norm_product",
        "quant_drop_4bit",
        "quant_loss_rise_pred_8bit",
        "input_grad_norm",
        "flip_prob",
        "sharpness_dim",
    ):
        assert math.isfinite(row[key]), key
    assert row["armijo_accepted"] is True and row["sharpness_worst"] >= 0
    assert row["fisher_trace_ratio_se"] > 0 and row["fisher_rao_norm"] > 0
    assert tracker.summary_extras()["hessian_density"]["nodes"]
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    assert [m.training for m in model.modules()] == modes


def test_fisher_measures_with_bn_train_use_batch_statistics_in_h():
    """Under bn_mode=train: F from per-sample gradients in eval mode, H with BatchNorm on batch
    statistics (every batch); the trace ratio exactly (a small model) against dense Hessians, and
    the Fisher–Rao norm against per-sample gradients."""
    tracker, model, data = setup(bn_mode="train")
    tracker.cfg = OmegaConf.merge(
        tracker.cfg,
        {
            "sharpness": {
                "num_samples": 64,
                "fisher_trace_ratio": {"enabled": True, "damping": 1e-3},
                "fisher_rao_norm": {"enabled": True},
            }
        },
    )
    ref = copy.deepcopy(model)  # the references below must not touch the tracked model's buffers
    row = measured(tracker, 1, 1, final=True)
    xs, ys = data.train_subset(64, 0)
    ref.eval()
    params = [p for p in ref.parameters()]
    grads = torch.stack(
        [
            torch.cat(
                [
                    g.reshape(-1)
                    for g in torch.autograd.grad(
                        F.cross_entropy(ref(xs[i : i + 1]), ys[i : i + 1]), params
                    )
                ]
            ).double()
            for i in range(64)
        ]
    )
    fisher = grads.square().mean(0)
    theta = torch.cat([p.detach().reshape(-1) for p in params]).double()
    ref[1].train()  # BatchNorm on batch statistics; the dense Hessian of the 40 + 24 batches
    H = sum(
        dense_hessian(ref, F.cross_entropy, xs[a:b], ys[a:b]) * (b - a) / 64
        for a, b in ((0, 40), (40, 64))
    )
    expected = float(torch.diagonal(H) @ (1 / (fisher + 1e-3 * fisher.mean())))
    assert row["fisher_trace_ratio"] == pytest.approx(expected, rel=1e-4)
    assert row["fisher_trace_ratio_se"] == 0.0
    assert row["fisher_rao_norm"] == pytest.approx(float((grads @ theta).square().mean()), rel=1e-4)
    assert model.training and all(m.training for m in model.modules())


@pytest.mark.parametrize(
    "section,message",
    [
        (
            {"fisher_trace_ratio": {"num_probes": 3}},
            "metrics.sharpness.fisher_trace_ratio.num_probes=3 must be an integer >= 6",
        ),
        (
            {"fisher_trace_ratio": {"exact_max_params": -1}},
            "metrics.sharpness.fisher_trace_ratio.exact_max_params=-1 must be an integer >= 0",
        ),
        ({"directional": {"h": 0.01}}, "metrics.sharpness.directional.h is not a key"),
        ({"fisher_rao_norm": {"num_probes": 5}}, "fisher_rao_norm.num_probes is not a key"),
    ],
)
def test_fisher_and_directional_options_are_checked_before_a_run(section, message):
    cfg = compose("metrics=full").metrics
    OmegaConf.set_struct(cfg, False)  # as a config from Python, not from Hydra's command line
    cfg = OmegaConf.merge(cfg, {"sharpness": section})
    with pytest.raises(UserError, match=message.replace("(", r"\(").replace(".", r"\.")):
        validate(cfg)


def test_armijo_without_acceptance_is_nan_and_left_out_of_the_pearson():
    tracker, model, _ = setup()
    tracker.cfg = OmegaConf.merge(
        tracker.cfg, {"sharpness": {"armijo": {"enabled": True, "alpha0": 1e30, "max_steps": 3}}}
    )
    row = measured(tracker, 1, 1, final=True)
    assert (
        math.isnan(row["armijo_alpha"])
        and math.isnan(row["armijo_curvature"])
        and row["armijo_accepted"] is False
    )
    assert math.isnan(tracker.history["armijo_alpha"][-1])
    # a run's history (checkpointed) with one probe not accepted: the Pearson is over the other
    # three
    tracker.load_state_dict(
        {
            "history": {
                "lambda_max": [1.0, 2.0, 4.0, 8.0],
                "armijo_alpha": [1.0, 0.5, math.nan, 0.125],
            }
        }
    )
    assert tracker.summary_extras()["armijo_log_alpha_log_lambda_pearson"] == pytest.approx(-1.0)


def sgd(lr=0.1, momentum=0.0, dampening=0.0, nesterov=False, dtype=torch.float32, wd=0.0):
    q = nn.Parameter(torch.ones(1, dtype=dtype))
    opt = torch.optim.SGD([q], lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=wd)
    # the constructor refuses Nesterov with dampening; step() runs it
    opt.param_groups[0]["dampening"] = dampening
    return q, opt


@pytest.mark.parametrize(
    "momentum,dampening,nesterov",
    [
        (0.0, 0.0, False),
        (0.0, 0.5, False),
        (0.9, 0.0, False),
        (0.9, 0.5, False),
        (0.9, 0.0, True),
        (0.9, 0.5, True),
    ],
)
def test_stability_threshold_is_where_sgd_on_a_quadratic_starts_to_diverge(
    momentum, dampening, nesterov
):
    threshold = stability_threshold(sgd(0.1, momentum, dampening, nesterov)[1])

    def final_distance(lam):  # PyTorch's own SGD on λ/2 x², from x = 1
        q, opt = sgd(0.1, momentum, dampening, nesterov, torch.float64)
        for _ in range(500):
            opt.zero_grad()
            (0.5 * lam * q**2).sum().backward()
            opt.step()
        return abs(q.item())

    assert final_distance(0.95 * threshold) < 1e-3 and final_distance(1.05 * threshold) > 1e3


@pytest.mark.parametrize("nesterov", [False, True])
def test_stability_threshold_includes_weight_decay(nesterov):
    """SGD steps along g + wθ: the decay adds w to the curvature, so the loss's threshold is w
    lower (38 − 5e-4 for lr 0.1, momentum 0.9); PyTorch's SGD with w = 4 diverges just above it."""
    _, opt = sgd(0.1, 0.9, wd=5e-4)
    assert stability_threshold(opt) == pytest.approx(37.9995, rel=1e-12)
    threshold = stability_threshold(sgd(0.1, 0.9, nesterov=nesterov, wd=4.0)[1])
    assert threshold == pytest.approx(stability_threshold(sgd(0.1, 0.9, nesterov=nesterov)[1]) - 4)

    def final_distance(lam):
        q, opt = sgd(0.1, 0.9, nesterov=nesterov, dtype=torch.float64, wd=4.0)
        for _ in range(500):
            opt.zero_grad()
            (0.5 * lam * q**2).sum().backward()
            opt.step()
        return abs(q.item())

    assert final_distance(0.95 * threshold) < 1e-3 and final_distance(1.05 * threshold) > 1e3
    assert stability_threshold(sgd(0.1, 0.0, wd=30.0)[1]) == 0.0  # no stable curvature ≥ 0 left


def test_eos_ratio_is_zero_at_lr_zero_and_absent_where_the_lr_is_not_the_step():
    tracker, model, _ = setup()
    tracker.optimizer.param_groups[0]["lr"] = 0.0  # the end of a cosine-to-0 schedule
    assert measured(tracker, 1, 1, final=True)["eos_ratio"] == 0.0
    assert stability_threshold(tracker.optimizer) == math.inf
    sps = SAMSPS(model.parameters(), torch.optim.SGD, lr=0.1)  # its Polyak step replaces the lr
    assert stability_threshold(sps) is None
    tracker.optimizer = sps
    assert "eos_ratio" not in measured(tracker, 2, 2, final=True)


def test_stability_threshold_and_bad_config():
    p = [nn.Parameter(torch.zeros(1))]
    assert stability_threshold(torch.optim.SGD(p, lr=0.5)) == pytest.approx(4.0)
    assert stability_threshold(
        torch.optim.SGD(p, lr=0.5, momentum=0.9, nesterov=True)
    ) == pytest.approx(3.8 / (0.5 * 2.8))
    assert stability_threshold(torch.optim.AdamW(p)) is None
    with pytest.raises(UserError, match="bn_mode='batch'"):
        setup(bn_mode="batch")
