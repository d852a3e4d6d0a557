"""Datasets (``dataset=<name>``, registered in sources.py) and what a run gets from them.

Small datasets (MNIST-1D, digits, CIFAR) live as tensors on the training device and go
through a ``TensorLoader``; image folders go through a torchvision DataLoader with workers
(loaders.py). Long-tail cuts and label noise are applied to the training labels (labels.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import torch

from ..errors import integer, number, require
from ..registry import DATASETS
from .augment import tensor_policy
from .augment import validate as validate_augment
from .folder import subset_indices
from .labels import batch_size, training_labels, validation_split
from .loaders import Normalize, TensorLoader

if TYPE_CHECKING:
    from omegaconf import DictConfig


@dataclass
class Data:
    train: object  # iterable of (x, y, idx) batches, with set_epoch(epoch) and len()
    test: object  # iterable of (x, y, idx) batches
    num_classes: int
    input_shape: tuple
    train_size: int
    train_tensors: tuple | None = None  # (x, y) as stored (uint8 images stay uint8)
    prepare: object = None  # x -> model input, without augmentation
    class_counts: list = field(default_factory=list)
    full_batch: bool = False  # one training batch holds the whole training set
    clean_train_labels: torch.Tensor | None = None  # before label noise (train_tensors' are after)
    train_plain: object = None  # the training set in order, un-augmented (BatchNorm statistics)
    val: object = None  # batches of the validation split (dataset.val_split), None without one
    folder_subset: object = None  # image folders: decodes the measurement subset (folder.py)
    test_images: object = None  # image folders: test batches as uint8 (corruptions apply to them)
    device: object = None  # where the measurement subset goes (folders; tensors already are)
    cache_dir: object = None  # where a decoded measurement subset is kept (<run>/cache)
    cache_write: bool = True  # False: read a cached subset, never write one (sam-eval)
    corpus: dict | None = None  # token corpora: corpus_bytes, corpus_sha256 (for summary.json)

    @property
    def measurable(self) -> bool:
        """Whether a measurement subset can be drawn (every dataset source of this package)."""
        return self.train_tensors is not None or self.folder_subset is not None

    def train_subset(self, n: int, seed: int, write: bool | None = None):
        """The measurement subset: a fixed, seeded subset of the training set
        (``folder.subset_indices``), without augmentation, as model-ready tensors (for
        curvature, the sharpness measures, the landscape); with a full batch, the whole
        training set, in order (the loss that the steps descend). Image folders decode it once
        into uint8 (kept in ``cache_dir``; ``write`` overrides ``cache_write``) and normalise it
        here, on the device."""
        if self.train_tensors is None:
            write = self.cache_write if write is None else write
            x, y = self.folder_subset(n, seed, self.cache_dir, write, self.device)
            x, y = x.to(self.device), y.to(self.device)
            return self.prepare(x, None), y
        x, y = self.train_tensors
        idx = subset_indices(len(y), n, seed).to(y.device)
        if self.full_batch:
            idx = torch.arange(len(y), device=y.device)
        xs = x[idx]
        return (self.prepare(xs, None) if self.prepare is not None else xs), y[idx]


@dataclass
class Arrays:
    """A dataset in memory, as a source returns it: inputs and labels of both splits, the class
    count, and the per-channel (mean, std) of uint8 images (None: the inputs are already floats)."""

    x: torch.Tensor
    y: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    stats: tuple | None = None


def validate(cfg: DictConfig) -> None:
    """The ``dataset`` keys every source shares, then the source's own check (one-line errors)."""
    entry = DATASETS.entry(cfg.name)
    if cfg.batch_size != "full":  # full: one batch is the whole training set (full-batch GD)
        integer("dataset.batch_size", cfg.batch_size, "a positive integer or full", lambda b: b > 0)
    subset = cfg.get("train_subset")
    if subset is not None:
        integer(
            "dataset.train_subset",
            subset,
            "an integer >= the number of classes (or null)",
            lambda n: n >= (entry.num_classes or 1),
        )
    validate_val_split(cfg.get("val_split", 0))
    ratio = cfg.get("imbalance_ratio")
    if ratio is not None:  # its upper bound (the size of class 0) needs the data: labels.py
        number("dataset.imbalance_ratio", ratio, "a number >= 1 (or null)", lambda r: r >= 1)
    number(
        "dataset.label_noise",
        cfg.get("label_noise", 0.0),
        "a fraction in [0, 1)",
        lambda f: 0 <= f < 1,
    )
    validate_augment(cfg)
    if entry.meta.get("check"):
        entry.check(cfg)


def validate_val_split(value: float | None) -> None:
    """``dataset.val_split``: 0 (off), a fraction in (0, 1), or a count (an integer >= 1)."""
    accepted = "0 (off), a fraction in (0, 1) or a count (an integer >= 1)"
    x = number("dataset.val_split", 0 if value is None else value, accepted, lambda v: v >= 0)
    if x >= 1:
        integer("dataset.val_split", value, accepted)


def build_data(
    cfg: DictConfig,
    device: torch.device | str,
    seed: int,
    rank: int = 0,
    world: int = 1,
    train_share: tuple[int, int] | None = None,
) -> Data:
    """The ``dataset`` settings' data, checked, on ``device``: this process's share of it.

    Args:
        cfg: the ``dataset`` group.
        device: the training device.
        seed: the run's seed.
        rank: this process's rank among ``world`` data-parallel processes (its share of the
            test and evaluation sets).
        world: the number of processes.
        train_share: (rank, world) of its share of every global training batch where that is
            not (rank, world): processes in roles (``training_share``), each role's processes
            covering every batch.
    """
    validate(cfg)
    entry = DATASETS.entry(cfg.name)
    if not entry.tensors:  # a source that makes its own loaders (image folders)
        data = entry.target(cfg, seed, rank, world)
        data.device = device
        for loader in (data.train, data.test, data.train_plain, data.val, data.test_images):
            if loader is not None:
                loader.device = device
        if data.train_tensors is not None:  # token windows: the measurement subset's pool
            data.train_tensors = tuple(t.to(device) for t in data.train_tensors)
    else:
        data = tensor_data(entry.target(cfg), cfg, device, seed, rank, world)
    if train_share is not None and tuple(train_share) != (rank, world):
        require(
            hasattr(data.train, "share"),
            f"dataset={cfg.name}: its training batches cannot be split among process roles "
            "(the optimizer's); run it on one process",
        )
        data.train.share(*train_share)
    return data


def binarized(a: Arrays) -> Arrays:
    """``dataset.binarize``: each feature 1 where it exceeds its mean over the training split,
    else 0 (floats 0/1, both splits by the training means; discrete data for ``model=pc``)."""
    require(
        a.stats is None,
        "dataset.binarize applies to sets of float features (digits, mnist1d, arrays)",
    )
    mean = a.x.float().mean(0, keepdim=True)
    return replace(a, x=(a.x > mean).float(), x_test=(a.x_test > mean).float())


def tensor_data(a: Arrays, cfg, device, seed: int, rank: int = 0, world: int = 1) -> Data:
    """In-memory loaders over a source's arrays: the training labels as the study sets them, the
    tensors on the training device (no host-to-device copy per batch on a GPU)."""
    if cfg.get("binarize", False):
        a = binarized(a)
    pool, held = validation_split(a.y, a.num_classes, cfg.get("val_split", 0), seed)
    keep, y, counts = training_labels(cfg, a.y, a.num_classes, seed, world, pool)
    x, n = a.x[keep], len(y)
    x, y, xt, yt, clean = (t.to(device) for t in (x, y, a.x_test, a.y_test, a.y[keep]))
    if a.stats is not None:
        crop_flip, policy = tensor_policy(cfg.get("augment", True), int(x.shape[-1]))
        train_tf = Normalize(*a.stats, augment=crop_flip, policy=policy)
        test_tf = Normalize(*a.stats, augment=False)
    else:
        train_tf = test_tf = None
    full = cfg.batch_size == "full"  # one batch of every example: nothing to shuffle
    train = TensorLoader(
        x,
        y,
        batch_size(cfg, n),
        shuffle=not full,
        seed=seed,
        drop_last=True,
        transform=train_tf,
        rank=rank,
        world=world,
    )
    test = TensorLoader(
        xt,
        yt,
        max(batch_size(cfg, n), 512),
        shuffle=False,
        transform=test_tf,
        rank=rank,
        world=world,
    )
    plain = TensorLoader(
        x, y, max(batch_size(cfg, n), 512), shuffle=False, transform=test_tf, rank=rank, world=world
    )
    val = None
    if len(held):  # held out of training: clean labels, no augmentation, the test set's loader
        xv, yv = a.x[held].to(device), a.y[held].to(device)
        val = TensorLoader(
            xv, yv, test.batch_size, shuffle=False, transform=test_tf, rank=rank, world=world
        )
    return Data(
        train,
        test,
        a.num_classes,
        tuple(x.shape[1:]),
        n,
        train_tensors=(x, y),
        class_counts=counts,
        prepare=test_tf,
        full_batch=full,
        clean_train_labels=clean,
        train_plain=plain,
        val=val,
    )
