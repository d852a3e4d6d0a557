"""The datasets a config can name (``dataset=<name>``), each registered here with its description.

A source of in-memory data returns ``Arrays`` (the runner builds the loaders); a source with
``tensors=False`` builds its own loaders and returns ``Data``.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..distributed import allowed_cpus
from ..errors import UserError, integer, require
from ..registry import DATASETS
from ..runfiles import atomic_write
from . import Arrays, Data
from .augment import folder_transform
from .folder import FolderSubset, check_tree, read_image
from .labels import training_labels, validation_split
from .loaders import FolderLoader, Indexed, Normalize

if TYPE_CHECKING:
    from collections.abc import Callable

    from omegaconf import DictConfig

CIFAR_STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def _mnist1d_keys(cfg) -> None:
    # the generator makes num_samples // 10 per class, then splits 80/20
    integer(
        "dataset.num_samples",
        cfg.get("num_samples", 5000),
        "an integer >= 10 (MNIST-1D makes num_samples // 10 examples per class and keeps 80% for "
        "training)",
        lambda n: n >= 10,
    )


@DATASETS.register(
    "mnist1d",
    "MNIST-1D (Greydanus 2020), generated locally by the mnist1d package",
    check=_mnist1d_keys,
    input_shape=(1, 40),
    num_classes=10,
)
def mnist1d(cfg: DictConfig) -> Arrays:
    """MNIST-1D's arrays, generated once into ``data_dir`` and read from there after."""
    root = Path(cfg.data_dir)
    path = root / f"mnist1d_{int(cfg.get('num_samples', 5000))}.pkl"
    if path.exists():
        with open(path, "rb") as f:
            d = pickle.load(f)
    else:
        from mnist1d.data import get_dataset_args, make_dataset

        args = get_dataset_args()
        args.num_samples = int(cfg.get("num_samples", 5000))
        d = make_dataset(args)
        d = {k: d[k] for k in ("x", "y", "x_test", "y_test")}
        try:
            atomic_write(path, lambda f: pickle.dump(d, f))
        except OSError:
            pass  # caching is an optimisation; an unwritable cache folder only costs regeneration
    to = lambda a, dt: torch.as_tensor(a, dtype=dt)
    x, xt = to(d["x"], torch.float32)[:, None, :], to(d["x_test"], torch.float32)[:, None, :]
    mean, std = x.mean(), x.std()
    return Arrays(
        (x - mean) / std, to(d["y"], torch.long), (xt - mean) / std, to(d["y_test"], torch.long), 10
    )


@DATASETS.register(
    "digits",
    "scikit-learn's 8×8 handwritten digits, a fixed 80/20 split",
    input_shape=(1, 8, 8),
    num_classes=10,
)
def digits(_cfg: DictConfig) -> Arrays:
    """scikit-learn's 8×8 digits, a fixed 80/20 split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = torch.as_tensor(d.images, dtype=torch.float32)[:, None] / 16.0
    y = torch.as_tensor(d.target, dtype=torch.long)
    # a fixed split (not the run's seed): every seed is evaluated on the same test set
    tr, te = train_test_split(
        torch.arange(len(y)).numpy(), test_size=0.2, random_state=0, stratify=y.numpy()
    )
    mean, std = x[tr].mean(), x[tr].std()
    x = (x - mean) / std
    return Arrays(x[tr], y[tr], x[te], y[te], 10)


def _cifar(cfg, name) -> Arrays:
    from torchvision import datasets

    cls = datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100
    base = "cifar10" if name == "cifar10" else "cifar100"
    archive = {
        "cifar10": "cifar-10-python.tar.gz (or its cifar-10-batches-py/ folder)",
        "cifar100": "cifar-100-python.tar.gz (or its cifar-100-python/ folder)",
    }[base]
    root = str(cfg.data_dir)
    if not cfg.download:
        _extract_local_archive(cls, Path(root))
    try:
        train = cls(root, train=True, download=bool(cfg.download))
        test = cls(root, train=False, download=bool(cfg.download))
    except Exception as e:  # torchvision raises RuntimeError when missing, URLError etc. offline
        why = f" and could not be downloaded ({type(e).__name__})" if cfg.download else ""
        hint = "" if cfg.download else ", or set dataset.download=true"
        raise UserError(
            f"dataset {name}: files not found under dataset.data_dir={root}{why}; put {archive} "
            f"there{hint}"
        ) from None
    to_x = lambda d: torch.as_tensor(d.data).permute(0, 3, 1, 2).contiguous()  # uint8 NCHW
    return Arrays(
        to_x(train),
        torch.as_tensor(train.targets),
        to_x(test),
        torch.as_tensor(test.targets),
        len(train.classes),
        CIFAR_STATS[base],
    )


@DATASETS.register(
    "cifar10",
    "CIFAR-10 (torchvision; crop and flip on tensors)",
    input_shape=(3, 32, 32),
    num_classes=10,
    augmented=True,
)
def cifar10(cfg: DictConfig) -> Arrays:
    """CIFAR-10's arrays (torchvision's download)."""
    return _cifar(cfg, "cifar10")


@DATASETS.register(
    "cifar100",
    "CIFAR-100 (torchvision; crop and flip on tensors)",
    input_shape=(3, 32, 32),
    num_classes=100,
    augmented=True,
)
def cifar100(cfg: DictConfig) -> Arrays:
    """CIFAR-100's arrays (torchvision's download)."""
    return _cifar(cfg, "cifar100")


@DATASETS.register(
    "cifar100_lt",
    "CIFAR-100 with a long-tailed training set (imbalance_ratio 100)",
    input_shape=(3, 32, 32),
    num_classes=100,
    augmented=True,
)
def cifar100_lt(cfg: DictConfig) -> Arrays:
    """CIFAR-100's arrays (the long tail is cut from the training set later)."""
    return _cifar(cfg, "cifar100")


def _extract_local_archive(cls, root: Path) -> None:
    """Unpack torchvision's own archive when only it is present: what download=true does with a
    file already there, without the network. Only a file with the official checksum is opened."""
    from torchvision.datasets.utils import check_integrity, extract_archive

    tarball = root / cls.filename
    if not (root / cls.base_folder).is_dir() and check_integrity(str(tarball), cls.tgz_md5):
        extract_archive(str(tarball), str(root))


def image_size(cfg: DictConfig) -> int:
    """``dataset.image_size`` of an image folder, checked (one line when it is not a size)."""
    return integer(
        "dataset.image_size",
        cfg.get("image_size", 224),
        "a positive integer (the side in pixels of the square images the model sees)",
        lambda s: s >= 1,
    )


def data_shape(dataset_cfg: DictConfig) -> tuple[tuple, int]:
    """(input shape, class count) of a dataset, from its registration (image folders: their
    configured image size, and a placeholder class count)."""
    entry = DATASETS.entry(dataset_cfg.name)
    if entry.meta.get("shape_of"):  # token data: the window length and the vocabulary size
        return entry.shape_of(dataset_cfg)
    shape = entry.input_shape
    if shape is None:  # checked here too: the trainer's checks build the model first
        size = image_size(dataset_cfg)
        shape = (3, size, size)
    return tuple(shape), entry.num_classes or 2


def _folder_keys(cfg) -> None:
    """The keys and the tree, checked before anything runs: the image size and worker count,
    the splits, the same class folders in both, class folders with images."""
    image_size(cfg)
    integer(
        "dataset.num_workers",
        cfg.get("num_workers", 4),
        "an integer >= 0 (DataLoader worker processes; 0: images load in the main process)",
        lambda w: w >= 0,
    )
    root = cfg.get("root")
    require(
        root not in (None, "???"),
        "dataset=image_folder needs dataset.root=<folder with train/ and val/>",
    )
    check_tree(Path(str(root)))
    require(
        cfg.batch_size != "full",
        "dataset.batch_size=full needs an in-memory dataset, not dataset=image_folder; give a "
        "number (curvature is still measured on the metrics.hessian.num_samples subset; for the "
        "edge of stability on folders, measure every metrics.hessian.every_n_steps steps)",
    )


def folder_workers(cfg: DictConfig, world: int = 1) -> int:
    """``dataset.num_workers``, at most the CPUs each process is allowed (more workers than
    cores only contend; validate.warnings says so before the run)."""
    asked = int(cfg.get("num_workers", 4))
    return min(asked, max(1, allowed_cpus()[0] // world))


def folder_labels(cfg: DictConfig) -> tuple:
    """(the training images' labels, the class count) of an image folder, from its file names
    alone (no image is opened)."""
    from torchvision import datasets

    train = datasets.ImageFolder(Path(str(cfg.root)) / "train", loader=read_image)
    return torch.as_tensor(train.targets), len(train.classes)


@DATASETS.register(
    "image_folder",
    "any <root>/train, <root>/val class-folder tree, through a DataLoader",
    check=_folder_keys,
    labels_of=folder_labels,
    tensors=False,
    input_shape=None,
    num_classes=None,
    augmented=True,
)
def image_folder(cfg: DictConfig, seed: int, rank: int, world: int) -> Data:
    """An image folder's loaders (train, test, un-augmented train, optional validation), this
    process's share."""
    from torchvision import datasets

    _folder_keys(cfg)
    root = Path(str(cfg.root))
    size = image_size(cfg)
    train_tf = folder_transform(cfg.get("augment", True), size, *IMAGENET_STATS)
    test_tf, raw_tf = folder_eval_transforms(size)
    folder = lambda split, tf: datasets.ImageFolder(root / split, tf, loader=read_image)
    train, test = folder("train", train_tf), folder("val", test_tf)
    c, labels = len(train.classes), torch.as_tensor(train.targets)
    pool, held = validation_split(labels, c, cfg.get("val_split", 0), seed)
    keep, targets, counts = training_labels(cfg, labels, c, seed, world, pool)
    train.samples = train.imgs = [
        (train.samples[i][0], int(t)) for i, t in zip(keep.tolist(), targets)
    ]
    train.targets = targets.tolist()
    n, workers = len(train), folder_workers(cfg, world)
    loader = lambda ds, shuffle, drop, **kw: FolderLoader(
        Indexed(ds), cfg.batch_size, shuffle, seed, workers, drop, rank, world, **kw
    )
    y = torch.as_tensor(train.targets)
    tl, vl = loader(train, True, True, labels=y), loader(test, False, False)
    plain = _with_samples(folder("train", test_tf), train)  # un-augmented: BatchNorm, sam-eval
    pl = loader(plain, False, False, labels=y)
    val = None
    if len(held):  # training images held out, with the test transform (no augmentation)
        held = torch.utils.data.Subset(folder("train", test_tf), held.tolist())
        val = loader(held, False, False)
    images = loader(folder("val", raw_tf), False, False)  # 8-bit: what corruptions take
    subset = FolderSubset(_with_samples(folder("train", raw_tf), train), y, size, workers)
    return Data(
        tl,
        vl,
        c,
        (3, size, size),
        n,
        class_counts=counts,
        train_plain=pl,
        val=val,
        prepare=Normalize(*IMAGENET_STATS),
        clean_train_labels=labels[keep],
        folder_subset=subset,
        test_images=images,
    )


def folder_eval_transforms(size: int) -> tuple[Callable, Callable]:
    """The evaluation transforms of an image folder: normalised floats (the test set), and the
    same pixels as uint8 (the measurement subset, normalised per use: the same numbers)."""
    from torchvision import transforms as T

    head = [T.Resize(int(size * 8 / 7)), T.CenterCrop(size)]
    test_tf = T.Compose([*head, T.ToTensor(), T.Normalize(*IMAGENET_STATS)])
    return test_tf, T.Compose([*head, T.PILToTensor()])


def _with_samples(ds, like):
    """``ds`` over the samples (and labels) of ``like``: the training set the run kept."""
    ds.samples = ds.imgs = like.samples
    ds.targets = like.targets
    return ds


# sources defined in their own modules register themselves on import
from . import arrays, modular, text, tokenized  # noqa: E402, F401
