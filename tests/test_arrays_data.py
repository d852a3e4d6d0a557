"""dataset=arrays: the user's own .npz, .npy and .csv files, written here, trained in-process."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import compose, run_cli

from sam_runner.data import build_data
from sam_runner.data.arrays import synthetic_spectra
from sam_runner.train import train

FAST = [
    "dataset=arrays",
    "model=cnn1d",
    "model.channels=4",
    "dataset.batch_size=16",
    "trainer.epochs=2",
    "metrics.hessian.num_samples=64",
    "metrics.hessian.max_iter=10",
    "trainer.progress=none",
]


def test_spectra_npz_trains_with_sam_and_the_preset_composes(tmp_path):
    path = synthetic_spectra(tmp_path / "spectra.npz", n=80, length=48)
    summary = train(compose(*FAST, f"dataset.path={path}", "optimizer=sam"), tmp_path / "run")
    assert summary["status"] == "completed" and 0 <= summary["test_acc"] <= 1
    cfg = compose("experiment=spectra_sam_mini", f"dataset.path={path}")
    assert cfg.dataset.name == "arrays" and cfg.model.arch == "mlp"


def test_npy_pair_is_standardised_on_the_training_split(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(5.0, 3.0, (50, 2, 10)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", np.array(["a", "b"] * 25))
    data = build_data(compose(*FAST, f"dataset.path={tmp_path}").dataset, torch.device("cpu"), 0)
    xs, ys = data.train_tensors
    assert data.input_shape == (2, 10) and data.num_classes == 2
    assert len(ys) + len(data.test.y) == 50
    assert torch.allclose(xs.mean(0), torch.zeros(2, 10), atol=1e-5)
    assert set(ys.tolist()) == {0, 1}


def test_csv_with_a_label_column(tmp_path):
    rows = ["f1,f2,f3,kind"] + [f"{i},{i % 3},{2 * i},{'xy'[i % 2]}" for i in range(40)]
    (tmp_path / "d.csv").write_text("\n".join(rows))
    cfg = compose(*FAST, f"dataset.path={tmp_path / 'd.csv'}", "dataset.label_column=kind")
    data = build_data(cfg.dataset, torch.device("cpu"), 0)
    assert data.input_shape == (1, 3) and data.num_classes == 2


def _fails(tmp_path, capsys, path, *extra, word):
    run = tmp_path / "bad_run"
    code, _, err = run_cli([*FAST, f"dataset.path={path}", *extra, f"hydra.run.dir={run}"], capsys)
    assert code == 2 and err.count("\n") == 1 and word in err, err
    assert not run.exists()


@pytest.mark.parametrize(
    ("arrays", "word"),
    [
        ({"x": np.array([[1.0, np.nan]] * 4), "y": np.array([0, 1, 0, 1])}, "NaN"),
        ({"x": np.ones((4, 3)), "y": np.array([0, 1, 0])}, "4 samples"),
        ({"x": np.ones((4, 3)), "y": np.zeros(4)}, "single class"),
    ],
)
def test_bad_arrays_are_one_line_exit_2(tmp_path, capsys, arrays, word):
    np.savez(tmp_path / "bad.npz", **arrays)
    _fails(tmp_path, capsys, tmp_path / "bad.npz", word=word)


def test_a_missing_label_column_is_named(tmp_path, capsys):
    (tmp_path / "d.csv").write_text("a,b\n1,2\n3,4\n")
    _fails(tmp_path, capsys, tmp_path / "d.csv", "dataset.label_column=cls", word="'cls'")


def test_binary_arrays_come_back_exactly_when_binarized_and_a_circuit_trains_on_them(tmp_path):
    rng = np.random.default_rng(1)
    x = (rng.random((60, 12)) < np.linspace(0.2, 0.8, 12)).astype(np.float32)
    x_test = (rng.random((20, 12)) < 0.5).astype(np.float32)
    y, y_test = np.arange(60) % 2, np.arange(20) % 2
    np.savez(tmp_path / "bits.npz", x=x, y=y, x_test=x_test, y_test=y_test)
    pc = [f"dataset.path={tmp_path / 'bits.npz'}", "dataset.binarize=true", "model=pc",
          "model.depth=2", "model.sum_units=2", "model.repetitions=1", "trainer.loss=nll",
          "dataset.batch_size=20", "trainer.epochs=1", "trainer.progress=none"]  # fmt: skip
    data = build_data(compose("dataset=arrays", *pc).dataset, torch.device("cpu"), 0)
    train_x, test_x = data.train_tensors[0], torch.cat([b for b, *_ in data.test])
    assert torch.equal(train_x.reshape(60, 12), torch.as_tensor(x))  # 0/1 back exactly
    assert torch.equal(test_x.reshape(20, 12), torch.as_tensor(x_test))
    summary = train(compose("dataset=arrays", *pc), tmp_path / "run")
    assert summary["status"] == "completed" and 0 < summary["test_bpd"] < 2
