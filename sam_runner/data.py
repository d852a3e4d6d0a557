"""Datasets and loaders.

Small datasets (MNIST-1D, digits, CIFAR) live as tensors on the training device; a
``TensorLoader`` shuffles with its own seeded generator (one per epoch, so a resumed
epoch sees the same batches) and augments whole batches on tensors. Image folders go
through a torchvision DataLoader with workers.
"""
from __future__ import annotations

import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .errors import UserError, number, require

CIFAR_STATS = {
    "cifar10": ((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": ((0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)),
}
IMAGENET_STATS = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
DATASETS = ("mnist1d", "digits", "cifar10", "cifar100", "cifar100_lt", "image_folder")


@dataclass
class Data:
    train: object            # iterable of (x, y, idx) batches, with set_epoch(epoch) and len()
    test: object             # iterable of (x, y, idx) batches
    num_classes: int
    input_shape: tuple
    train_size: int
    train_tensors: tuple | None = None   # (x, y) as stored (uint8 images stay uint8)
    prepare: object = None               # x -> model input, without augmentation

    def train_subset(self, n: int, seed: int):
        """A fixed, seeded subset of the training set as model-ready tensors (for curvature)."""
        x, y = self.train_tensors
        g = torch.Generator().manual_seed(seed + 104729)
        idx = torch.randperm(len(y), generator=g)[:min(n, len(y))].to(y.device)
        xs = x[idx]
        return (self.prepare(xs, None) if self.prepare is not None else xs), y[idx]
    class_counts: list = field(default_factory=list)


# ---------------------------------------------------------------------------- loaders
class TensorLoader:
    """Batches of an in-memory (x, y) pair; ``x`` may be uint8 images, normalised per batch.

    Shuffling and augmentation draw from ``torch.Generator(seed * 100003 + epoch)``: the
    batches of an epoch depend on (seed, epoch) alone. Under data parallelism each of
    ``world`` processes takes its ``rank``-th slice of every global batch, and the
    augmentation is drawn for the whole global batch and sliced alike: the processes of
    an epoch together see exactly the augmented batches of one process.
    """

    def __init__(self, x, y, batch_size, *, shuffle, seed=0, drop_last=False, transform=None,
                 rank=0, world=1):
        self.x, self.y = x, y
        self.batch_size, self.shuffle, self.seed, self.drop_last = batch_size, shuffle, seed, drop_last
        self.transform = transform
        self.rank, self.world = rank, world
        self.epoch = 0
        self.weights = None  # per-example sampling weights (a sampler such as sgs sets them)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self):
        n = len(self.y)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def generator(self):
        g = torch.Generator(device="cpu")
        g.manual_seed(self.seed * 100003 + self.epoch)
        return g

    def __iter__(self):
        n, g = len(self.y), self.generator()
        if self.weights is not None:
            # on the CPU with the CPU generator: CUDA multinomial refuses it, and CPU and GPU runs draw alike
            order = torch.multinomial(self.weights.cpu(), n, replacement=True, generator=g)
        elif self.shuffle:
            order = torch.randperm(n, generator=g)
        else:
            order = torch.arange(n)
        order = order.to(self.y.device)
        for i in range(len(self)):
            idx = order[i * self.batch_size:(i + 1) * self.batch_size]
            batch = None
            if self.world > 1:
                # strided: equal shares of a full batch, and a short last batch (test set) loses nothing
                batch = (len(idx), slice(self.rank, None, self.world))
                idx = idx[batch[1]]
            x = self.x[idx]
            if self.transform is not None:
                x = self.transform(x, g, batch)
            yield x, self.y[idx], idx


class Normalize:
    """uint8 (or float) images → float, optional crop-and-flip, per-channel normalisation."""

    def __init__(self, mean, std, augment=False, pad=4, scale=255.0):
        self.mean = torch.tensor(mean).view(1, -1, 1, 1)
        self.std = torch.tensor(std).view(1, -1, 1, 1)
        self.augment, self.pad, self.scale = augment, pad, scale

    def __call__(self, x, g, batch=None):
        """``batch`` = (size, share): ``x`` is the ``share`` (a slice) of a global batch of ``size``."""
        x = x.float().div_(self.scale)
        if self.augment:
            x = random_crop_flip(x, self.pad, g, batch)
        mean, std = self.mean.to(x.device), self.std.to(x.device)
        return (x - mean) / std


def random_crop_flip(x, pad, g, batch=None):
    """Per-sample random crop with zero padding and horizontal flip, on a whole batch.

    With ``batch`` = (size, share), ``x`` is one process's share of a global batch: the crops
    and flips are drawn for all ``size`` samples and this share's are kept."""
    n, c, h, w = x.shape
    size, share = batch if batch is not None else (n, slice(None))
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))
    oy = torch.randint(0, 2 * pad + 1, (size,), generator=g)[share].to(x.device)
    ox = torch.randint(0, 2 * pad + 1, (size,), generator=g)[share].to(x.device)
    flip = (torch.rand(size, generator=g)[share] < 0.5).to(x.device)
    rows = (oy[:, None] + torch.arange(h, device=x.device))[:, :, None]
    cols = (ox[:, None] + torch.arange(w, device=x.device))[:, None, :]
    cols = torch.where(flip[:, None, None], cols.flip(2), cols)
    return padded.permute(0, 2, 3, 1)[torch.arange(n, device=x.device)[:, None, None], rows, cols].permute(0, 3, 1, 2)


# ---------------------------------------------------------------------------- sources
def _mnist1d(cfg):
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
        _atomic_pickle(d, path)
    to = lambda a, dt: torch.as_tensor(a, dtype=dt)
    x, xt = to(d["x"], torch.float32)[:, None, :], to(d["x_test"], torch.float32)[:, None, :]
    mean, std = x.mean(), x.std()
    return (x - mean) / std, to(d["y"], torch.long), (xt - mean) / std, to(d["y_test"], torch.long), 10, None


def _atomic_pickle(obj, path: Path):
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{os.getpid()}")
        with open(tmp, "wb") as f:
            pickle.dump(obj, f)
        os.replace(tmp, path)
    except OSError:
        pass  # caching is an optimisation; an unwritable cache folder only costs regeneration


def _digits(cfg):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    d = load_digits()
    x = torch.as_tensor(d.images, dtype=torch.float32)[:, None] / 16.0
    y = torch.as_tensor(d.target, dtype=torch.long)
    # a fixed split (not the run's seed): every seed is evaluated on the same test set
    tr, te = train_test_split(torch.arange(len(y)).numpy(), test_size=0.2, random_state=0, stratify=y.numpy())
    mean, std = x[tr].mean(), x[tr].std()
    x = (x - mean) / std
    return x[tr], y[tr], x[te], y[te], 10, None


def _cifar(cfg, name):
    from torchvision import datasets
    cls = datasets.CIFAR10 if name == "cifar10" else datasets.CIFAR100
    base = "cifar10" if name == "cifar10" else "cifar100"
    archive = {"cifar10": "cifar-10-python.tar.gz (or its cifar-10-batches-py/ folder)",
               "cifar100": "cifar-100-python.tar.gz (or its cifar-100-python/ folder)"}[base]
    root = str(cfg.data_dir)
    if not cfg.download:
        _extract_local_archive(cls, Path(root))
    try:
        train = cls(root, train=True, download=bool(cfg.download))
        test = cls(root, train=False, download=bool(cfg.download))
    except Exception as e:  # torchvision raises RuntimeError when missing, URLError etc. offline
        why = f" and could not be downloaded ({type(e).__name__})" if cfg.download else ""
        hint = "" if cfg.download else ", or set dataset.download=true"
        raise UserError(f"dataset {name}: files not found under dataset.data_dir={root}{why}; "
                        f"put {archive} there{hint}") from None
    to_x = lambda d: torch.as_tensor(d.data).permute(0, 3, 1, 2).contiguous()  # uint8 NCHW
    return (to_x(train), torch.as_tensor(train.targets), to_x(test), torch.as_tensor(test.targets),
            len(train.classes), CIFAR_STATS[base])


def _extract_local_archive(cls, root: Path) -> None:
    """Unpack torchvision's own archive when only it is present: what download=true does with a
    file already there, without the network. Only a file with the official checksum is opened."""
    from torchvision.datasets.utils import check_integrity, extract_archive
    tarball = root / cls.filename
    if not (root / cls.base_folder).is_dir() and check_integrity(str(tarball), cls.tgz_md5):
        extract_archive(str(tarball), str(root))


def long_tail_indices(labels: torch.Tensor, num_classes: int, ratio: float) -> torch.Tensor:
    """Exponential profile: class c keeps its first n_max * ratio^(-c/(C-1)) examples."""
    n_max = int((labels == 0).sum())
    require(ratio <= n_max, f"dataset.imbalance_ratio={ratio} leaves the last class without training examples; "
                            f"use at most {n_max} (the size of class 0)")
    keep = []
    for c in range(num_classes):
        # + 1e-9: n_max * n_max^-1 is 0.99999... in floating point for some n_max
        n_c = int(n_max * ratio ** (-c / max(1, num_classes - 1)) + 1e-9)
        keep.append(torch.nonzero(labels == c).flatten()[:n_c])
    return torch.cat(keep).sort().values


def apply_label_noise(y: torch.Tensor, num_classes: int, fraction: float, seed: int) -> torch.Tensor:
    """Replace ``fraction`` of the labels by a uniformly random *other* class (fixed by the seed)."""
    if fraction <= 0:
        return y
    g = torch.Generator().manual_seed(seed + 7919)
    n = len(y)
    idx = torch.randperm(n, generator=g)[: int(round(fraction * n))]
    shift = torch.randint(1, num_classes, (len(idx),), generator=g)
    y = y.clone()
    y[idx] = (y[idx] + shift) % num_classes
    return y


# ---------------------------------------------------------------------------- entry
def validate(cfg) -> None:
    require(cfg.name in DATASETS, f"dataset={cfg.name!r} is unknown; choose one of {', '.join(DATASETS)}")
    bs = cfg.batch_size
    require(isinstance(bs, int) and not isinstance(bs, bool) and bs > 0,
            f"dataset.batch_size={bs!r} must be a positive integer")
    number("dataset.label_noise", cfg.get("label_noise", 0.0), "a fraction in [0, 1)", lambda f: 0 <= f < 1)
    if cfg.name == "mnist1d":  # the generator makes num_samples // 10 per class, then splits 80/20
        n = cfg.get("num_samples", 5000)
        require(isinstance(n, int) and not isinstance(n, bool) and n >= 10,
                f"dataset.num_samples={n!r} must be an integer >= 10 (MNIST-1D makes num_samples // 10 "
                "examples per class and keeps 80% for training)")


def _training_labels(cfg, y, num_classes: int, seed: int, world: int):
    """(kept indices, training labels, clean class counts): the long-tail cut, then label noise; the
    counts (which define the many/medium/few split) are of the clean labels. Checks the batch size."""
    ratio = cfg.get("imbalance_ratio", 100 if cfg.name == "cifar100_lt" else None)
    keep = torch.arange(len(y))
    if ratio is not None:  # a long-tailed training set; the test set stays whole
        ratio = number("dataset.imbalance_ratio", ratio, "a number >= 1 (or null)", lambda r: r >= 1)
        keep = long_tail_indices(y, num_classes, ratio)
    y = y[keep]
    counts = torch.bincount(y, minlength=num_classes).tolist()
    n, bs = len(y), cfg.batch_size
    require(bs <= n, f"dataset.batch_size={bs} is larger than the training set ({n} examples); use at most {n}")
    require(bs % world == 0, f"dataset.batch_size={bs} (the global batch) must be divisible by the number "
                             f"of processes ({world})")
    return keep, apply_label_noise(y, num_classes, float(cfg.get("label_noise", 0.0)), seed), counts


def build_data(cfg, device, seed: int, rank: int = 0, world: int = 1) -> Data:
    validate(cfg)
    if cfg.name == "image_folder":
        return _image_folder(cfg, seed, rank, world)
    name = cfg.name
    if name == "mnist1d":
        x, y, xt, yt, c, stats = _mnist1d(cfg)
    elif name == "digits":
        x, y, xt, yt, c, stats = _digits(cfg)
    else:
        x, y, xt, yt, c, stats = _cifar(cfg, "cifar100" if name == "cifar100_lt" else name)
    keep, y, counts = _training_labels(cfg, y, c, seed, world)
    x, n = x[keep], len(y)
    # small datasets live on the training device (a GPU): no host-to-device copy per batch
    x, y, xt, yt = (t.to(device) for t in (x, y, xt, yt))
    if stats is not None:
        train_tf = Normalize(*stats, augment=bool(cfg.get("augment", True)))
        test_tf = Normalize(*stats, augment=False)
    else:
        train_tf = test_tf = None
    train = TensorLoader(x, y, cfg.batch_size, shuffle=True, seed=seed, drop_last=True, transform=train_tf,
                         rank=rank, world=world)
    test = TensorLoader(xt, yt, max(cfg.batch_size, 512), shuffle=False, transform=test_tf, rank=rank, world=world)
    return Data(train, test, c, tuple(x.shape[1:]), n, train_tensors=(x, y), class_counts=counts, prepare=test_tf)


class _Indexed(torch.utils.data.Dataset):
    """Wraps an ImageFolder so batches carry example indices like TensorLoader's."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        x, y = self.ds[i]
        return x, y, i


class _FolderLoader:
    def __init__(self, ds, batch_size, shuffle, seed, workers, drop_last, rank=0, world=1):
        self.ds, self.shuffle, self.seed, self.epoch, self.rank = ds, shuffle, seed, 0, rank
        self.sampler = None
        if world > 1 and drop_last:
            self.sampler = torch.utils.data.DistributedSampler(ds, world, rank, shuffle=shuffle, seed=seed,
                                                               drop_last=drop_last)
        elif world > 1:  # evaluation: every example exactly once over the processes (no padding)
            self.sampler = list(range(rank, len(ds), world))
        self.kw = dict(batch_size=batch_size // world, num_workers=workers, drop_last=drop_last,
                       persistent_workers=workers > 0, pin_memory=torch.cuda.is_available())
        self.loader = None
        self.weights = None

    def set_epoch(self, epoch):
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def _make(self):
        g = torch.Generator().manual_seed(self.seed * 100003 + self.epoch)
        if self.sampler is not None:
            # the generator seeds the workers' augmentation: one per process, else every process
            # draws the same crops (and from the global RNG, which a resume does not restore per process)
            g.manual_seed((self.seed * 100003 + self.epoch) * 1_000_003 + self.rank + 1)
            return torch.utils.data.DataLoader(self.ds, sampler=self.sampler, generator=g, **self.kw)
        return torch.utils.data.DataLoader(self.ds, shuffle=self.shuffle, generator=g, **self.kw)

    def __len__(self):
        return len(self._make())

    def __iter__(self):
        return iter(self._make())


def _image_folder(cfg, seed, rank, world):
    from torchvision import datasets, transforms as T
    root = cfg.get("root")
    require(root not in (None, "???"), "dataset=image_folder needs dataset.root=<folder with train/ and val/>")
    root = Path(str(root))
    for split in ("train", "val"):
        require((root / split).is_dir(), f"dataset.root={root}: missing folder {root / split} "
                                         "(expected <root>/train/<class>/*.jpg and <root>/val/<class>/*.jpg)")
    size = int(cfg.get("image_size", 224))
    norm = T.Normalize(*IMAGENET_STATS)
    train_tf = T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToTensor(), norm]) \
        if cfg.get("augment", True) else T.Compose([T.Resize(size), T.CenterCrop(size), T.ToTensor(), norm])
    test_tf = T.Compose([T.Resize(int(size * 8 / 7)), T.CenterCrop(size), T.ToTensor(), norm])
    train, test = datasets.ImageFolder(root / "train", train_tf), datasets.ImageFolder(root / "val", test_tf)
    c = len(train.classes)
    keep, targets, counts = _training_labels(cfg, torch.as_tensor(train.targets), c, seed, world)
    train.samples = train.imgs = [(train.samples[i][0], int(t)) for i, t in zip(keep.tolist(), targets)]
    train.targets = targets.tolist()
    n = len(train)
    workers = int(cfg.get("num_workers", 4))
    tl = _FolderLoader(_Indexed(train), cfg.batch_size, True, seed, workers, True, rank, world)
    vl = _FolderLoader(_Indexed(test), cfg.batch_size, False, seed, workers, False, rank, world)
    return Data(tl, vl, c, (3, size, size), n, class_counts=counts)
