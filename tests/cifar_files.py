"""Small CIFAR-10/100 folders in torchvision's real on-disk format (python pickles)."""

from __future__ import annotations

import hashlib
import pickle
from pathlib import Path

import numpy as np


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def _dump(path: Path, obj) -> str:
    with open(path, "wb") as f:
        pickle.dump(obj, f)
    return _md5(path)


def write_cifar(
    root: Path, name: str, n_train: int, n_test: int, num_classes: int | None = None, seed: int = 0
):
    """Write ``name`` ('cifar10' or 'cifar100') under ``root``; returns the class attributes
    (train_list, test_list, meta) torchvision checks, with the md5 sums of the files written."""
    rng = np.random.default_rng(seed)
    classes = num_classes or (10 if name == "cifar10" else 100)
    folder = Path(root) / ("cifar-10-batches-py" if name == "cifar10" else "cifar-100-python")
    folder.mkdir(parents=True, exist_ok=True)
    label_key = "labels" if name == "cifar10" else "fine_labels"

    def batch(n):
        labels = (np.arange(n) % classes).tolist()  # every class present, in order
        return {"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8), label_key: labels}

    if name == "cifar10":
        train_list = [
            [f"data_batch_{i}", _dump(folder / f"data_batch_{i}", batch(n_train // 5))]
            for i in range(1, 6)
        ]
        test_list = [["test_batch", _dump(folder / "test_batch", batch(n_test))]]
        meta = {
            "filename": "batches.meta",
            "key": "label_names",
            "md5": _dump(folder / "batches.meta", {"label_names": [f"c{i}" for i in range(10)]}),
        }
    else:
        train_list = [["train", _dump(folder / "train", batch(n_train))]]
        test_list = [["test", _dump(folder / "test", batch(n_test))]]
        meta = {
            "filename": "meta",
            "key": "fine_label_names",
            "md5": _dump(folder / "meta", {"fine_label_names": [f"c{i}" for i in range(100)]}),
        }
    return {"train_list": train_list, "test_list": test_list, "meta": meta}


def install(monkeypatch, root: Path, name: str, n_train: int = 500, n_test: int = 200):
    """Write the files and point torchvision's integrity table at their checksums."""
    from torchvision import datasets

    cls = datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100
    for attr, value in write_cifar(root, name, n_train, n_test).items():
        monkeypatch.setattr(cls, attr, value)
