"""Loaders of training and test batches ``(x, y, idx)``.

``TensorLoader``: an in-memory dataset (on the training device), shuffled with its own seeded
generator (one per epoch, so a resumed epoch sees the same batches) and augmented per sample on
tensors (augment.py's policies). ``FolderLoader``: a torchvision DataLoader with workers over an
image folder.
"""

from __future__ import annotations

import torch


class TensorLoader:
    """Batches of an in-memory (x, y) pair; ``x`` may be uint8 images, normalised per batch.

    Shuffling and augmentation draw from ``torch.Generator(seed * 100003 + epoch)``: the
    batches of an epoch depend on (seed, epoch) alone. Under data parallelism each of
    ``world`` processes takes its ``rank``-th slice of every global batch, and the
    augmentation is drawn for the whole global batch and sliced alike: the processes of
    an epoch together see exactly the augmented batches of one process.
    """

    def __init__(
        self, x, y, batch_size, *, shuffle, seed=0, drop_last=False, transform=None, rank=0, world=1
    ):
        self.x, self.y = x, y
        self.batch_size, self.shuffle, self.seed, self.drop_last = (
            batch_size,
            shuffle,
            seed,
            drop_last,
        )
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
            # on the CPU with the CPU generator: CUDA multinomial refuses it, and CPU and GPU runs
            # draw alike
            order = torch.multinomial(self.weights.cpu(), n, replacement=True, generator=g)
        elif self.shuffle:
            order = torch.randperm(n, generator=g)
        else:
            order = torch.arange(n)
        order = order.to(self.y.device)
        for i in range(len(self)):
            idx = order[i * self.batch_size : (i + 1) * self.batch_size]
            batch = None
            if self.world > 1:
                # strided: equal shares of a full batch, and a short last batch (test set) loses
                # nothing
                batch = (len(idx), slice(self.rank, None, self.world))
                idx = idx[batch[1]]
            x = self.x[idx]
            if self.transform is not None:
                x = self.transform(x, g, batch)
            yield x, self.y[idx], idx


class Normalize:
    """uint8 (or float) images → float, optional crop-and-flip and a per-sample policy operation
    (augment.py), per-channel normalisation."""

    def __init__(self, mean, std, augment=False, pad=4, scale=255.0, policy=None):
        self.mean = torch.tensor(mean).view(1, -1, 1, 1)
        self.std = torch.tensor(std).view(1, -1, 1, 1)
        self.augment, self.pad, self.scale, self.policy = augment, pad, scale, policy

    def __call__(self, x, g, batch=None):
        """``batch`` = (size, share): ``x`` is the ``share`` (a slice) of a global batch of
        ``size``.
        """
        if self.augment:
            x = random_crop_flip(x, self.pad, g, batch)
        if self.policy is not None:  # on the stored images (uint8: the policies' own range)
            x = self.policy(x, g, batch)
        x = x.float().div_(self.scale)
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
    return padded.permute(0, 2, 3, 1)[
        torch.arange(n, device=x.device)[:, None, None], rows, cols
    ].permute(0, 3, 1, 2)


class Indexed(torch.utils.data.Dataset):
    """Wraps an ImageFolder so batches carry example indices like TensorLoader's."""

    def __init__(self, ds):
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        x, y = self.ds[i]
        return x, y, i


class FolderLoader:
    """Batches ``(x, y, idx)`` of an image folder through a DataLoader with workers (pinned
    memory on CUDA, persistent workers, 4 batches prefetched per worker), moved to ``device``.
    ``labels``: the examples' labels (a sampler's per-example weights index them, as
    TensorLoader's ``y``)."""

    def __init__(
        self, ds, batch_size, shuffle, seed, workers, drop_last, rank=0, world=1, labels=None
    ):
        self.ds, self.shuffle, self.seed, self.epoch, self.rank = ds, shuffle, seed, 0, rank
        self.world, self.labels = world, labels
        self.sampler = None
        if world > 1 and drop_last:
            self.sampler = torch.utils.data.DistributedSampler(
                ds, world, rank, shuffle=shuffle, seed=seed, drop_last=drop_last
            )
        elif world > 1:  # evaluation: every example exactly once over the processes (no padding)
            self.sampler = list(range(rank, len(ds), world))
        self.kw = dict(
            batch_size=batch_size // world,
            num_workers=workers,
            drop_last=drop_last,
            persistent_workers=workers > 0,
            pin_memory=torch.cuda.is_available(),
            prefetch_factor=4 if workers > 0 else None,
        )
        self.weights = None  # per-example sampling weights (a sampler such as sgs sets them)
        self.device = None  # batches are moved there (build_data sets the training device)

    @property
    def y(self):
        """The examples' labels, on the loader's device."""
        dev = self.device if self.device is not None else "cpu"
        return self.labels.to(dev)

    def set_epoch(self, epoch):
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def _make(self):
        """A DataLoader of this epoch, made afresh: its order and its workers' augmentation seeds
        depend on (seed, epoch) alone, so a resumed or repeated epoch draws the same batches."""
        g = torch.Generator().manual_seed(self.seed * 100003 + self.epoch)
        if self.weights is not None:
            # a sampler's weights (sgs): indices drawn with replacement as TensorLoader draws them
            n = len(self.ds)
            order = torch.multinomial(self.weights.cpu(), n, replacement=True, generator=g)
            order = order[self.rank :: max(1, self.world)].tolist()
            return torch.utils.data.DataLoader(self.ds, sampler=order, generator=g, **self.kw)
        if self.sampler is not None:
            # the generator seeds the workers' augmentation: one per process, else every process
            # draws the same crops (and from the global RNG, which a resume does not restore per
            # process)
            g.manual_seed((self.seed * 100003 + self.epoch) * 1_000_003 + self.rank + 1)
            return torch.utils.data.DataLoader(
                self.ds, sampler=self.sampler, generator=g, **self.kw
            )
        return torch.utils.data.DataLoader(self.ds, shuffle=self.shuffle, generator=g, **self.kw)

    def __len__(self):
        return len(self._make())  # a DataLoader starts its workers when iterated, not here

    def __iter__(self):
        dev = self.device
        move = dev is not None and dev.type != "cpu"
        for x, y, idx in self._make():
            if move:
                x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
                idx = idx.to(dev, non_blocking=True)
            yield x, y, idx
