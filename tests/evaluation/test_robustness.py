"""Robustness to corruptions on real data and real trained models: the accuracy of a fixed model
does not rise with severity; the published arrays are read in the test set's order (and used
instead of generating); a run logs the corruption keys at its final evaluation."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
from cifar_files import install
from conftest import compose
from omegaconf import OmegaConf

from sam_runner import distributed
from sam_runner.data import Arrays, build_data, tensor_data
from sam_runner.data import corruptions as C
from sam_runner.errors import UserError
from sam_runner.metrics.evaluate import predict
from sam_runner.metrics.robustness import corrupted_loader, corruption_values
from sam_runner.models import build_model

CORRUPTIONS_WITH_NOISE = re.compile("noise")


def fit(model, data, epochs, lr=3e-3):
    """A few epochs of Adam: a fixed model that has learnt the task."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for epoch in range(epochs):
        model.train()
        data.train.set_epoch(epoch)
        for x, y, _ in data.train:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    return model.eval()


def accuracy(model, loader) -> float:
    logits, labels = predict(model, loader, torch.no_grad(), distributed.current())
    return float((logits.argmax(1) == labels).float().mean())


def severity_accuracies(model, data, dataset_cfg, name, seeds=(0, 1, 2)):
    """Accuracy at each severity, averaged over noise draws (seeds)."""
    metrics = OmegaConf.create({"corruptions": {"enabled": True, "source": "generated"}})
    return [
        float(
            np.mean(
                [
                    accuracy(model, corrupted_loader(data, metrics, dataset_cfg, s, name, sev)[0])
                    for s in seeds
                ]
            )
        )
        for sev in C.SEVERITIES
    ]


def assert_monotone(name, accs, n):
    """Along each run of growing severities, no rise beyond 2.5 standard errors of an accuracy
    measured on ``n`` images, and the last below the first."""
    for run in C.monotone_runs(name):
        a = [accs[s - 1] for s in run]
        slack = 2.5 * math.sqrt(max(a[0] * (1 - a[0]), 0.05) / n)
        assert all(b <= prev + slack for prev, b in zip(a, a[1:])), (name, run, a)
        assert a[-1] <= a[0], (name, run, a)


@pytest.fixture(scope="module")
def mnist1d_model():
    cfg = compose("dataset.num_samples=2000", "dataset.batch_size=64")
    torch.manual_seed(0)
    data = build_data(cfg.dataset, torch.device("cpu"), seed=0)
    model = build_model(compose("model=cnn1d").model, data.input_shape, data.num_classes)
    return fit(model, data, epochs=8), data, cfg.dataset


@pytest.mark.parametrize("name", C.names_for("1d"))
def test_mnist1d_accuracy_does_not_rise_with_severity(mnist1d_model, name):
    model, data, dataset_cfg = mnist1d_model
    clean = accuracy(model, data.test)
    assert clean > 0.5  # the model has learnt something to lose
    accs = severity_accuracies(model, data, dataset_cfg, name)
    assert_monotone(name, [clean] + accs, len(data.test.y))
    assert accs[-1] < clean - 0.03  # the top severity hurts


def coloured_digits():
    """scikit-learn's digits as 32x32 8-bit colour images: strokes slightly brighter than a
    background colour drawn at random per image (low contrast, so that noise matters too)."""
    from sklearn.datasets import load_digits

    d = load_digits()
    g = torch.Generator().manual_seed(0)
    ink = torch.as_tensor(d.images, dtype=torch.float32)[:, None] / 16.0
    ink = torch.nn.functional.interpolate(ink, scale_factor=4, mode="nearest")
    bg = 0.2 + 0.4 * torch.rand(len(ink), 3, 1, 1, generator=g)
    fg = bg + 0.08 + 0.1 * torch.rand(len(ink), 1, 1, 1, generator=g)
    x = ((ink * fg + (1 - ink) * bg) * 255).round().to(torch.uint8)
    y = torch.as_tensor(d.target)
    train = x[:1400].float() / 255
    stats = (train.mean((0, 2, 3)).tolist(), train.std((0, 2, 3)).tolist())
    return Arrays(x[:1400], y[:1400], x[1400:], y[1400:], 10, stats)


@pytest.mark.slow
def test_image_accuracy_does_not_rise_with_severity():
    ds = OmegaConf.create({"name": "cifar10", "batch_size": 64, "augment": False, "data_dir": "."})
    data = tensor_data(coloured_digits(), ds, torch.device("cpu"), seed=0)
    torch.manual_seed(0)
    model = build_model(OmegaConf.create({"arch": "mlp", "hidden": [64]}), (3, 32, 32), 10)
    model = fit(model, data, epochs=10, lr=1e-3)
    clean = accuracy(model, data.test)
    assert clean > 0.8
    for name in C.names_for("image"):
        seeds = (0, 1, 2) if CORRUPTIONS_WITH_NOISE.search(name) else (0,)
        accs = severity_accuracies(model, data, ds, name, seeds)
        assert_monotone(name, accs, len(data.test.y))
        assert accs[-1] < clean, (name, clean, accs)  # the top severity hurts


# ---------------------------------------------------------------------------- published arrays
@pytest.fixture
def fake_cifar(tmp_path, monkeypatch):
    install(monkeypatch, tmp_path, "cifar10", n_train=200, n_test=50)
    cfg = compose(
        "dataset=cifar10",
        f"dataset.data_dir={tmp_path}",
        "dataset.batch_size=50",
        "model=cnn",
        "model.channels=4",
    )
    return cfg, build_data(cfg.dataset, torch.device("cpu"), seed=0)


def write_arrays(folder, data, names, labels=None):
    """CIFAR-10-C-style arrays: 5 severities of the test set, severity 1 first (here each copy is
    the clean test set itself, so that a corrupted accuracy must equal the clean one)."""
    folder.mkdir(parents=True, exist_ok=True)
    clean = data.test.x.permute(0, 2, 3, 1).numpy()
    for name in names:
        np.save(folder / f"{name}.npy", np.concatenate([clean] * 5))
    y = data.test.y.numpy() if labels is None else labels
    np.save(folder / "labels.npy", np.concatenate([y] * 5).astype(np.uint8))


def test_published_arrays_are_read_in_the_test_sets_order(fake_cifar, tmp_path):
    cfg, data = fake_cifar
    write_arrays(tmp_path / "CIFAR-10-C", data, ["contrast", "brightness"])
    torch.manual_seed(0)
    model = build_model(cfg.model, data.input_shape, data.num_classes).eval()
    metrics = OmegaConf.create({"ece_bins": 15, "corruptions": {"enabled": True}})
    values, sources = corruption_values(model, data, metrics, cfg.dataset, 0)
    clean = accuracy(model, data.test)
    assert values["test_acc_c_contrast"] == values["test_acc_c_brightness"] == clean
    assert values["test_acc_c_gaussian_noise"] != clean or True  # generated: any value
    assert sources == ["files", "generated"]  # two from the arrays, seven generated
    loader, source = corrupted_loader(data, metrics, cfg.dataset, 0, "contrast", 3)
    batch = next(iter(loader))[0]
    assert source == "files" and torch.equal(batch, data.test.transform(data.test.x[:50], None))


def test_arrays_of_another_test_set_are_refused(fake_cifar, tmp_path):
    cfg, data = fake_cifar
    write_arrays(tmp_path / "CIFAR-10-C", data, ["contrast"], labels=np.zeros(50))
    metrics = OmegaConf.create({"corruptions": {"enabled": True, "names": ["contrast"]}})
    with pytest.raises(UserError, match="does not hold severity 1 of this test set"):
        corrupted_loader(data, metrics, cfg.dataset, 0, "contrast", 1)


def test_a_run_logs_the_corruption_keys_at_its_final_evaluation(fake_cifar, tmp_path):
    from sam_runner.train import train

    cfg, data = fake_cifar
    write_arrays(tmp_path / "CIFAR-10-C", data, ["contrast"])
    cfg = compose(
        *[f"{k}={v}" for k, v in (("dataset", "cifar10"), ("model", "cnn"))],
        f"dataset.data_dir={tmp_path}",
        "dataset.batch_size=50",
        "model.channels=4",
        "trainer.epochs=2",
        "trainer.progress=none",
        "metrics.hessian.enabled=false",
        "metrics.corruptions.enabled=true",
        "metrics.corruptions.severities=[1,5]",
    )
    summary = train(cfg, tmp_path / "run")
    keys = {f"test_acc_c_{n}" for n in C.names_for("image")} | {"test_acc_c", "test_ece_c"}
    assert keys <= set(summary)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert "test_acc_c" not in rows[0] and rows[-1]["test_acc_c"] == summary["test_acc_c"]
    # the arrays hold the clean test set: its "corrupted" accuracy is the clean one
    assert summary["test_acc_c_contrast"] == summary["test_acc"]
    per = [summary[k] for k in keys if k.startswith("test_acc_c_")]
    assert summary["test_acc_c"] == pytest.approx(sum(per) / len(per))
