"""CurvatureTracker: schedule, keys, warm start, BatchNorm modes, EoS threshold, checkpoint state."""
import io

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch import nn

from sam_runner.data import Data
from sam_runner.errors import UserError
from sam_runner.metrics import top_hessian_eigenvalues
from sam_runner.metrics.tracker import CurvatureTracker, stability_threshold
from sam_runner.optim import SAM


def setup(**hessian):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(1, 4, 3), nn.BatchNorm1d(4), nn.ReLU(), nn.Flatten(), nn.Linear(32, 3))
    x, y = torch.randn(100, 1, 10), torch.randint(0, 3, (100,))
    model.train()
    model(x)
    data = Data(train=None, test=None, num_classes=3, input_shape=(1, 10), train_size=100, train_tensors=(x, y))
    cfg = OmegaConf.create({"hessian": {"num_samples": 64, "batch_size": 40, **hessian}})
    opt = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.1, momentum=0.9)
    return CurvatureTracker(cfg, model, data, opt, seed=0), model, data


def test_end_measurement_equals_lambda_max_on_the_seeded_subset_in_eval_mode():
    tracker, model, data = setup()
    assert tracker.on_step(1, 1, model) is None and tracker.on_epoch_end(1, 10, model, final=False) == {}
    row = tracker.on_epoch_end(2, 20, model, final=True)
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
    row = tracker.on_epoch_end(2, 20, model, final=True)
    x, y = data.train_subset(64, 0)
    model.eval()
    expected = top_hessian_eigenvalues(model, F.cross_entropy, [(x, y)], tol=1e-6)[0]
    assert row["lambda_max"] == pytest.approx(expected, rel=1e-3)
    assert row["hessian_presolve_hvps"] >= 1 and row["hessian_hvps"] >= 1
    with pytest.raises(UserError, match="presolve_tol=0"):
        setup(presolve_batches=1, presolve_tol=0)


def test_every_n_steps_warm_starts_and_bn_train_mode_differs():
    tracker, model, _ = setup(every_n_steps=5, bn_mode="train")
    first = tracker.on_step(1, 5, model)
    second = tracker.on_step(1, 10, model)
    assert tracker.on_step(1, 7, model) is None
    assert second["hessian_hvps"] < first["hessian_hvps"]  # warm start from the previous vector
    eval_tracker, m2, _ = setup()
    assert abs(eval_tracker.on_epoch_end(1, 1, m2, True)["lambda_max"] - second["lambda_max"]) > 1e-3 * second["lambda_max"]


def test_bn_train_mode_switches_only_batchnorm_and_restores_every_module():
    """bn_mode=train: batch statistics in BatchNorm, but dropout off (a random loss has no
    Hessian to certify); afterwards each module is back in its own mode."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv1d(1, 4, 3), nn.BatchNorm1d(4), nn.ReLU(), nn.Dropout(0.5), nn.Flatten(),
                          nn.Linear(32, 3))
    x, y = torch.randn(100, 1, 10), torch.randint(0, 3, (100,))
    data = Data(train=None, test=None, num_classes=3, input_shape=(1, 10), train_size=100, train_tensors=(x, y))
    cfg = OmegaConf.create({"hessian": {"num_samples": 64, "batch_size": 64, "bn_mode": "train", "tol": 1e-6}})
    opt = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.1)
    tracker = CurvatureTracker(cfg, model, data, opt, seed=0)
    model.train()
    model[0].eval()  # a module in its own mode must stay so
    row = tracker.on_epoch_end(1, 1, model, final=True)
    assert [m.training for m in model] == [False, True, True, True, True, True]
    xs, ys = data.train_subset(64, 0)
    model[3].eval()  # the expected value: dropout off, BatchNorm on batch statistics
    expected = top_hessian_eigenvalues(model, F.cross_entropy, [(xs, ys)], tol=1e-6)[0]
    assert row["lambda_max"] == pytest.approx(expected, rel=1e-4)


def test_state_round_trips_through_weights_only_checkpoint():
    tracker, model, _ = setup(k=2)
    row = tracker.on_epoch_end(1, 1, model, True)
    assert "lambda_2" in row and row["lambda_2"] <= row["lambda_max"]
    buf = io.BytesIO()
    torch.save(tracker.state_dict(), buf)
    buf.seek(0)
    fresh, _, _ = setup(k=2)
    fresh.load_state_dict(torch.load(buf, weights_only=True))
    assert all(torch.equal(a, b) for a, b in zip(fresh.vector, tracker.vector))


def test_sharpness_options_add_their_keys():
    tracker, model, _ = setup()
    tracker.cfg = OmegaConf.merge(tracker.cfg, {"trace": {"enabled": True, "num_probes": 4},
                                                "sharpness": {"num_samples": 32, "worst_case": {"enabled": True},
                                                              "average": {"enabled": True},
                                                              "directional": {"enabled": True},
                                                              "armijo": {"enabled": True},
                                                              "fisher_rao": {"enabled": True, "num_probes": 4}}})
    row = tracker.on_epoch_end(1, 1, model, True)
    for key in ("hessian_trace", "hessian_trace_se", "sharpness_worst", "sharpness_avg", "sharpness_dir",
                "armijo_alpha", "armijo_curvature", "fisher_rao"):
        assert key in row


def test_stability_threshold_and_bad_config():
    p = [nn.Parameter(torch.zeros(1))]
    assert stability_threshold(torch.optim.SGD(p, lr=0.5)) == pytest.approx(4.0)
    assert stability_threshold(torch.optim.SGD(p, lr=0.5, momentum=0.9, nesterov=True)) == pytest.approx(3.8 / (0.5 * 2.8))
    assert stability_threshold(torch.optim.AdamW(p)) is None
    with pytest.raises(UserError, match="bn_mode='batch'"):
        setup(bn_mode="batch")
