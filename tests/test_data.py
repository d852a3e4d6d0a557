"""Datasets and loaders, on real on-disk formats the tests write."""
from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from cifar_files import install
from sam_runner.data import (TensorLoader, apply_label_noise, build_data, long_tail_indices, random_crop_flip)
from sam_runner.errors import UserError


def cfg(**kw):
    base = dict(name="mnist1d", data_dir="", download=False, batch_size=64, label_noise=0.0, augment=True,
                sampler="uniform")
    base.update(kw)
    return OmegaConf.create(base)


def test_mnist1d_is_generated_cached_and_shaped(tmp_path):
    d = build_data(cfg(data_dir=str(tmp_path), num_samples=1000), torch.device("cpu"), seed=0)
    assert d.input_shape == (1, 40) and d.num_classes == 10 and d.train_size == 800
    assert list(tmp_path.glob("mnist1d_1000.pkl")), "the generated set is cached under data_dir"
    x, y, idx = next(iter(d.train))
    assert x.shape == (64, 1, 40) and y.shape == (64,) and torch.equal(d.train_tensors[1][idx], y)


def test_digits_fixed_split(tmp_path):
    a = build_data(cfg(name="digits", data_dir=str(tmp_path)), torch.device("cpu"), seed=0)
    b = build_data(cfg(name="digits", data_dir=str(tmp_path)), torch.device("cpu"), seed=5)
    assert a.input_shape == (1, 8, 8) and a.train_size + len(a.test.y) == 1797
    assert torch.equal(a.test.y, b.test.y), "the test split must not depend on the run's seed"


@pytest.mark.parametrize("name,classes", [("cifar10", 10), ("cifar100", 100)])
def test_cifar_from_torchvision_files(name, classes, tmp_path, monkeypatch):
    install(monkeypatch, tmp_path, name)
    d = build_data(cfg(name=name, data_dir=str(tmp_path)), torch.device("cpu"), seed=0)
    assert d.num_classes == classes and d.input_shape == (3, 32, 32) and d.train_size == 500
    assert d.train_tensors[0].dtype == torch.uint8, "images stay uint8 in memory"
    x, y, _ = next(iter(d.train))
    assert x.dtype == torch.float32 and x.shape == (64, 3, 32, 32)
    xt, _, _ = next(iter(d.test))
    # the test transform normalises per channel: mean ≈ 0 over uniform noise, not augmented
    assert abs(float(xt.mean())) < 0.3


def test_cifar100_lt_profile(tmp_path, monkeypatch):
    install(monkeypatch, tmp_path, "cifar100", n_train=5000, n_test=200)
    d = build_data(cfg(name="cifar100_lt", data_dir=str(tmp_path), imbalance_ratio=10), torch.device("cpu"), seed=0)
    counts = d.class_counts
    assert counts[0] == 50 and counts[-1] == 5  # n_max * ratio^(-c/99)
    assert all(a >= b for a, b in zip(counts, counts[1:]))
    assert len(d.test.y) == 200, "the test set is untouched"


def test_long_tail_indices_formula():
    y = torch.arange(10).repeat(100)
    keep = long_tail_indices(y, 10, 100.0)
    counts = torch.bincount(y[keep], minlength=10).tolist()
    assert counts == [int(100 * 100 ** (-c / 9)) for c in range(10)]


def test_missing_cifar_offline_names_the_files(tmp_path):
    with pytest.raises(UserError, match="cifar-10-python.tar.gz"):
        build_data(cfg(name="cifar10", data_dir=str(tmp_path / "none")), torch.device("cpu"), seed=0)


def test_label_noise_exact_fraction_other_class_fixed_by_seed():
    y = torch.arange(10).repeat(100)
    a = apply_label_noise(y, 10, 0.3, seed=1)
    changed = a != y
    assert int(changed.sum()) == 300  # replaced by a different class, every time
    assert torch.equal(a, apply_label_noise(y, 10, 0.3, seed=1))
    assert not torch.equal(a, apply_label_noise(y, 10, 0.3, seed=2))


def test_label_noise_applies_to_every_dataset(tmp_path):
    clean = build_data(cfg(name="digits"), torch.device("cpu"), seed=0)
    noisy = build_data(cfg(name="digits", label_noise=0.5), torch.device("cpu"), seed=0)
    frac = float((clean.train_tensors[1] != noisy.train_tensors[1]).float().mean())
    assert frac == pytest.approx(0.5, abs=0.002)


def test_crop_flip_is_a_shifted_window():
    x = torch.arange(2 * 3 * 6 * 6, dtype=torch.float32).view(2, 3, 6, 6)
    g = torch.Generator().manual_seed(0)
    out = random_crop_flip(x, 2, g)
    assert out.shape == x.shape
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for i in range(2):
        found = any(torch.equal(out[i], w) or torch.equal(out[i], w.flip(2))
                    for oy in range(5) for ox in range(5) for w in [padded[i, :, oy:oy + 6, ox:ox + 6]])
        assert found


def test_loader_batches_depend_on_seed_and_epoch_only():
    x, y = torch.arange(100).float()[:, None], torch.arange(100)
    a = TensorLoader(x, y, 10, shuffle=True, seed=3, drop_last=True)
    b = TensorLoader(x, y, 10, shuffle=True, seed=3, drop_last=True)
    a.set_epoch(2), b.set_epoch(2)
    assert [t[2].tolist() for t in a] == [t[2].tolist() for t in b]
    b.set_epoch(3)
    assert [t[2].tolist() for t in a] != [t[2].tolist() for t in b]


def test_loader_ranks_split_each_global_batch():
    x, y = torch.arange(40).float()[:, None], torch.arange(40)
    whole = [t[2] for t in TensorLoader(x, y, 8, shuffle=True, seed=0, drop_last=True)]
    parts = [[t[2] for t in TensorLoader(x, y, 8, shuffle=True, seed=0, drop_last=True, rank=r, world=2)]
             for r in (0, 1)]
    for i, batch in enumerate(whole):
        a, b = parts[0][i], parts[1][i]
        assert len(a) == len(b) == 4 and not set(a.tolist()) & set(b.tolist())
        assert sorted(torch.cat([a, b]).tolist()) == sorted(batch.tolist())


def test_image_folder(tmp_path):
    from PIL import Image
    for split in ("train", "val"):
        for c in ("cat", "dog"):
            (tmp_path / split / c).mkdir(parents=True)
            for i in range(4):
                Image.new("RGB", (20, 20), (i * 40, 100, 200)).save(tmp_path / split / c / f"{i}.png")
    d = build_data(cfg(name="image_folder", root=str(tmp_path), image_size=16, num_workers=0, batch_size=4),
                   torch.device("cpu"), seed=0)
    assert d.num_classes == 2 and d.input_shape == (3, 16, 16)
    x, y, idx = next(iter(d.train))
    assert x.shape == (4, 3, 16, 16) and set(y.tolist()) <= {0, 1}


def test_image_folder_missing_split_is_one_line(tmp_path):
    with pytest.raises(UserError, match="val"):
        (tmp_path / "train").mkdir()
        build_data(cfg(name="image_folder", root=str(tmp_path)), torch.device("cpu"), seed=0)


def test_batch_larger_than_training_set(tmp_path):
    with pytest.raises(UserError, match="dataset.batch_size=5000"):
        build_data(cfg(name="digits", batch_size=5000), torch.device("cpu"), seed=0)
