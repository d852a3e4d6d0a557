"""Loaders of training and test batches ``(x, y, idx)``.

``TensorLoader``: an in-memory dataset (on the training device), shuffled with its own seeded
generator (one per epoch, so a resumed epoch sees the same batches) and augmented per sample on
tensors (augment.py's policies). ``FolderLoader``: a torchvision DataLoader with workers over an
image folder.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import torch

from ..errors import UserError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

    from .augment import TensorPolicy


class TensorLoader:
    """Batches of an in-memory (x, y) pair; ``x`` may be uint8 images, normalised per batch.

    Shuffling and augmentation draw from ``torch.Generator(seed * 100003 + epoch)``: the
    batches of an epoch depend on (seed, epoch) alone. Under data parallelism each of
    ``world`` processes takes its ``rank``-th slice of every global batch, and the
    augmentation is drawn for the whole global batch and sliced alike: the processes of
    an epoch together see exactly the augmented batches of one process.
    """

    def __init__(
        self,
        x: torch.Tensor,
        y: torch.Tensor,
        batch_size: int,
        *,
        shuffle: bool,
        seed: int = 0,
        drop_last: bool = False,
        transform: Normalize | Callable[..., torch.Tensor] | None = None,
        rank: int = 0,
        world: int = 1,
    ) -> None:
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
        self._held = None  # the padded and mirrored images a cropping transform selects from

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch the next pass draws its order and augmentation for."""
        self.epoch = epoch

    def share(self, rank: int, world: int) -> None:
        """Take the ``rank``-th of ``world`` strided slices of every global batch from now on.

        Args:
            rank: this process's place among the processes that split each batch.
            world: how many processes split each batch.
        """
        self.rank, self.world = rank, world

    def __len__(self):
        n = len(self.y)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def generator(self) -> torch.Generator:
        """The epoch's generator, seeded by (seed, epoch)."""
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
        device = self.y.device
        order = to_device(order, device)
        # the epoch's augmentation drawn now, batch after batch in the order the batches would
        # draw it, and moved once: no host-to-device copy (a stream synchronisation on CUDA) per
        # batch, and the same draws as batch-by-batch drawing
        draw_epoch = getattr(self.transform, "draw_epoch", None)
        sizes = [min(self.batch_size, n - i * self.batch_size) for i in range(len(self))]
        draws = draw_epoch(g, sizes, device) if draw_epoch is not None else None
        starts = self.crop_starts(order, sizes, draws)
        for i in range(len(self)):
            lo, hi = i * self.batch_size, (i + 1) * self.batch_size
            idx, batch = order[lo:hi], None
            if self.world > 1:
                # strided: equal shares of a full batch, and a short last batch (test set) loses
                # nothing
                batch = (sizes[i], slice(self.rank, None, self.world))
                idx = idx[batch[1]]
            if starts is not None:  # cropped and flipped as selected: one gather
                share = batch[1] if batch is not None else slice(None)
                x = self.transform.finish(self._held.crop(starts[lo:hi][share]), draws[i], batch)
            elif draws is not None:
                # index_select: the same rows as x[idx], ~30x sooner on uint8 images on the CPU
                x = self.transform.apply(self.x.index_select(0, idx), draws[i], batch)
            elif self.transform is not None:
                x = self.transform(self.x.index_select(0, idx), g, batch)
            else:
                x = self.x.index_select(0, idx)
            yield x, self.y.index_select(0, idx), idx  # as x: sooner than y[idx]

    def crop_starts(self, order: torch.Tensor, sizes: list[int], draws: list | None):
        """Where each sample of the epoch's batches starts in the held padded images (``Held``),
        or None when the transform does not crop: the images are padded and mirrored once (again
        only when ``x`` is replaced or changed in place), not per batch."""
        if draws is None or not sizes or not getattr(self.transform, "augment", False):
            return None
        held = self._held
        if held is None or held.x is not self.x or held.version != version(self.x):
            self._held = held = Held(self.x, self.transform.pad)
        crops = torch.cat([c for c, _ in draws], 1)
        return held.starts(order[: crops.shape[1]], crops)


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` (on the CPU) on ``device``: on CUDA from pinned memory without blocking the host (the
    caching host allocator keeps the pinned copy until the transfer has run)."""
    if t.device == device:
        return t
    if device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


class Normalize:
    """uint8 (or float) images → float, optional crop-and-flip and a per-sample policy operation
    (augment.py), per-channel normalisation.

    Called as ``tf(x, g, batch)`` it draws a batch's crops, flips and policy seeds from ``g``;
    a loader draws a whole epoch's at once instead (``draw_epoch``, the same draws in the same
    order) and applies them batch by batch, so that no batch waits on a copy: it crops and flips
    each batch as it selects it from its images held padded (``Held``), then ``finish``es it."""

    def __init__(
        self,
        mean: Sequence[float],
        std: Sequence[float],
        augment: bool = False,
        pad: int = 4,
        scale: float = 255.0,
        policy: TensorPolicy | None = None,
    ) -> None:
        self.mean = torch.tensor(mean).view(1, -1, 1, 1)
        self.std = torch.tensor(std).view(1, -1, 1, 1)
        self.augment, self.pad, self.scale, self.policy = augment, pad, scale, policy
        self._constants = {}  # device -> (mean, std) there, copied once

    def draw(
        self, g: torch.Generator, size: int
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """One batch's draws from ``g``: (crop offsets and flips ``[3, size]`` or None, the
        policy's per-sample seeds or None)."""
        crops = crop_flip_draws(g, size, self.pad) if self.augment else None
        seeds = self.policy.draw(g, size) if self.policy is not None else None
        return crops, seeds

    def draw_epoch(self, g: torch.Generator, sizes: Iterable[int], device: torch.device) -> list:
        """The draws of batches of global sizes ``sizes``, in order, the crops moved to
        ``device`` in one non-blocking copy."""
        draws = [self.draw(g, size) for size in sizes]
        if not self.augment or not draws:
            return draws
        crops = to_device(torch.cat([c for c, _ in draws], 1), device).split(sizes, 1)
        return [(c, seeds) for c, (_, seeds) in zip(crops, draws)]

    def __call__(self, x, g, batch=None):
        """``batch`` = (size, share): ``x`` is the ``share`` (a slice) of a global batch of
        ``size``.
        """
        size = batch[0] if batch is not None else len(x)
        crops, seeds = self.draw(g, size)
        if crops is not None:
            crops = crops.to(x.device)
        return self.apply(x, (crops, seeds), batch)

    def apply(
        self,
        x: torch.Tensor,
        draws: tuple[torch.Tensor | None, torch.Tensor | None],
        batch: tuple[int, slice] | None = None,
    ) -> torch.Tensor:
        """``x`` augmented by ``draws`` (``draw``'s, on ``x``'s device) and normalised."""
        crops = draws[0]
        if crops is not None:
            share = batch[1] if batch is not None else slice(None)
            x = crop_flip(x, self.pad, crops[:, share])
        return self.finish(x, draws, batch)

    def finish(
        self,
        x: torch.Tensor,
        draws: tuple[torch.Tensor | None, torch.Tensor | None],
        batch: tuple[int, slice] | None = None,
    ) -> torch.Tensor:
        """``x``, already cropped and flipped, through the policy's operation (``draws``' seeds)
        and normalised."""
        seeds = draws[1]
        share = batch[1] if batch is not None else slice(None)
        late = self.policy is not None and self.policy.after_normalisation
        if self.policy is not None and not late:  # on the stored images (uint8: their range)
            x = self.policy.apply(x, seeds[share])
        gain, shift = self.constants(x.device)
        # one float32 copy, normalised in place (a whole measurement subset passes here, and
        # temporaries would hold it three more times) as (x/scale − mean)/std = x·gain + shift:
        # two passes over the floats instead of three (float error, ~1 ulp)
        x = x.to(torch.float32, copy=True).mul_(gain).add_(shift)
        return self.policy.apply(x, seeds[share]) if late else x

    def constants(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(gain, shift) = (1/(scale·std), −mean/std) on ``device``, copied there once."""
        if device not in self._constants:
            gain, shift = 1 / (self.scale * self.std), -self.mean / self.std
            self._constants[device] = (to_device(gain, device), to_device(shift, device))
        return self._constants[device]


def crop_flip_draws(g: torch.Generator, size: int, pad: int) -> torch.Tensor:
    """A batch's crop offsets (rows, columns, in [0, 2·pad]) and flips (0/1), ``[3, size]``, drawn
    from ``g`` in this order."""
    oy = torch.randint(0, 2 * pad + 1, (size,), generator=g)
    ox = torch.randint(0, 2 * pad + 1, (size,), generator=g)
    flip = torch.rand(size, generator=g) < 0.5
    return torch.stack([oy, ox, flip.long()])


def random_crop_flip(
    x: torch.Tensor, pad: int, g: torch.Generator, batch: tuple[int, slice] | None = None
) -> torch.Tensor:
    """Per-sample random crop with zero padding and horizontal flip, on a whole batch.

    With ``batch`` = (size, share), ``x`` is one process's share of a global batch: the crops
    and flips are drawn for all ``size`` samples and this share's are kept."""
    size, share = batch if batch is not None else (len(x), slice(None))
    return crop_flip(x, pad, crop_flip_draws(g, size, pad)[:, share].to(x.device))


def crop_flip(x: torch.Tensor, pad: int, draws: torch.Tensor) -> torch.Tensor:
    """``x`` ``[n, c, h, w]`` zero-padded by ``pad`` and cropped back to ``h × w`` at the offsets
    ``draws[0]`` (rows) and ``draws[1]`` (columns), flipped left-right where ``draws[2]`` is 1."""
    key = (x.shape, pad, x.dtype, x.device)
    held = _HELD_BATCHES.get(key)
    if held is None:
        if len(_HELD_BATCHES) > 16:
            _HELD_BATCHES.clear()
        held = _HELD_BATCHES[key] = Held(x, pad)
    else:
        held.fill(x)
    return held.crop(held.starts(torch.arange(len(x), device=x.device), draws))


_HELD_BATCHES = {}  # (shape, pad, dtype, device) -> crop_flip's Held, its zeros made once


def version(t: torch.Tensor) -> int:
    """``t``'s in-place version counter (an inference tensor has none, and may not change)."""
    return 0 if t.is_inference() else t._version


class Held:
    """Images ``x`` ``[n, c, h, w]`` held zero-padded by ``pad``, then their left-right mirrors
    (also padded), so that a batch's crop and flip are one selection of rows: each output row is
    a window of ``w`` consecutive values of the flat buffer, read from the mirror for a flipped
    sample. Each row is followed by ``pad`` zeros and each plane preceded by ``pad`` rows of
    zeros; a window reads the zeros after the previous row (plane) as its left (top) padding.

    It holds 2·(h + pad)(w + pad)/(h·w) times ``x`` (2.5 for CIFAR's 32² with padding 4: 389 MB
    of uint8 beside CIFAR-10's 154 MB), made once. Per batch, it saves the padding, the flip and
    a copy of the batch."""

    def __init__(self, x: torch.Tensor, pad: int) -> None:
        n, c, h, w = x.shape
        self.pad, self.shape = pad, (c, h, w)
        self.row, self.image = w + pad, c * (h + pad) * (w + pad)
        flat = x.new_zeros(pad + 2 * n * self.image + pad * self.row)
        self.planes = flat[pad : pad + 2 * n * self.image].view(2, n, c, h + pad, self.row)
        self.fill(x)
        # every run of w values of the flat buffer: a view, no copy
        self.windows = flat.unfold(0, w, 1)
        plane = torch.arange(c, device=x.device).view(c, 1) * (h + pad)
        self.rows = ((plane + torch.arange(h, device=x.device)) * self.row).view(1, c * h)
        # padded columns [ox, ox + w) mirrored are the mirror's [2·pad − ox, 2·pad − ox + w)
        self.mirror = n * self.image + 2 * pad

    def fill(self, x: torch.Tensor) -> None:
        """Hold ``x`` (the shape held) and its mirror in place of the images held; the padding's
        zeros stay."""
        w = x.shape[-1]
        self.planes[0, :, :, self.pad :, :w] = x
        self.planes[1, :, :, self.pad :, :w] = x.flip(3)
        self.x, self.version = x, version(x)

    def starts(self, idx: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
        """Where the crop of each image ``idx`` starts, at the offsets and flips ``draws``
        (``[3, len(idx)]``: rows, columns, flips)."""
        oy, ox, flip = draws
        column = torch.where(flip.bool(), self.mirror - ox, ox)
        return idx * self.image + oy * self.row + column

    def crop(self, starts: torch.Tensor) -> torch.Tensor:
        """The crops starting at ``starts`` (``starts``' order), ``[len(starts), c, h, w]``."""
        rows = (starts.view(-1, 1) + self.rows).view(-1)
        return self.windows.index_select(0, rows).view(len(starts), *self.shape)


class Indexed(torch.utils.data.Dataset):
    """Wraps an ImageFolder so batches carry example indices like TensorLoader's. An index may
    come with a seed, ``(i, seed)``: the worker's torch generator is seeded with it before the
    transform, so an example's augmentation depends on (seed, epoch, rank, position) alone, not
    on which worker loads it or on the epochs before (persistent workers, resumed runs)."""

    def __init__(self, ds: torch.utils.data.Dataset) -> None:
        self.ds = ds

    def __len__(self):
        return len(self.ds)

    def __getitem__(self, i):
        if isinstance(i, tuple):
            i, seed = i
            # the CPU generator the transforms draw from (torch.manual_seed would also queue a
            # CUDA seeding, with a stack trace, per example)
            torch.default_generator.manual_seed(seed)
        x, y = self.ds[i]
        return x, y, i


class Shard(torch.utils.data.Dataset):
    """The examples ``indices`` of an ``Indexed`` image folder, as a dataset of their own (a
    federated client's): an example's seed passes through, and its index is its position in the
    shard, as a client's TensorLoader numbers its examples."""

    def __init__(self, ds: Indexed, indices: torch.Tensor) -> None:
        self.ds, self.indices = ds, indices.tolist()

    def __len__(self):
        return len(self.indices)

    def __getitem__(self, i):
        position, seed = i if isinstance(i, tuple) else (i, None)
        j = self.indices[position]
        x, y, _ = self.ds[j if seed is None else (j, seed)]
        return x, y, position


class EpochOrder(torch.utils.data.Sampler):
    """The examples of a FolderLoader's current epoch, in order, each with its seed: shuffled by
    ``torch.Generator(seed * 100003 + epoch)`` (a sampler's weights: drawn with replacement, as
    TensorLoader draws them), or in order; under data parallelism the process's share."""

    def __init__(self, loader: FolderLoader) -> None:
        self.loader = loader

    def order(self) -> list:
        """The epoch's example indices with their seeds, this process's share."""
        f = self.loader
        g = torch.Generator().manual_seed(f.seed * 100003 + f.epoch)
        n = len(f.ds)
        if f.weights is not None:
            idx = torch.multinomial(f.weights.cpu(), n, replacement=True, generator=g)
            return idx[f.rank :: f.world].tolist()
        if f.sampler is not None:  # DistributedSampler (training) or the process's indices
            return list(f.sampler)
        return (torch.randperm(n, generator=g) if f.shuffle else torch.arange(n)).tolist()

    def __len__(self):
        return len(self.order())

    def __iter__(self):
        f = self.loader
        base = ((f.seed * 100003 + f.epoch) * 1_000_003 + f.rank + 1) * 1_000_033
        # modulo 2**63: any seed in [0, 2**32) stays a valid generator seed
        return iter([(i, (base + k) % 2**63) for k, i in enumerate(self.order())])


def worker_batches(loader: Iterable) -> Iterator:
    """The batches of a torch DataLoader; an error of the user's raised in a worker (an
    unreadable image) comes out as its own line: the DataLoader re-raises it as the same type
    with the worker's whole traceback as the message, whose last line is the original."""
    try:
        yield from loader
        return
    except UserError as e:
        lines = str(e).strip().splitlines()
        if len(lines) <= 1:  # raised in this process: already one line
            raise
        # the re-raised error and its frames (the DataLoader iterator's among them) form a
        # cycle: without its traceback the iterator is freed with the loader, not by a later
        # garbage collection, which cannot signal its workers and waits 5 s for each
        e.__traceback__ = None
        message = lines[-1].removeprefix(f"{UserError.__module__}.UserError: ")
    raise UserError(message)


class FolderLoader:
    """Batches ``(x, y, idx)`` of an image folder through one DataLoader with workers, kept
    across epochs (persistent workers, 4 batches prefetched per worker, pinned memory on CUDA),
    moved to ``device``. The epoch's order and augmentation seeds come from ``EpochOrder``.
    ``labels``: the examples' labels (a sampler's per-example weights index them, as
    TensorLoader's ``y``). ``persistent=False``: a loader read once (a corrupted copy of the
    test set), whose workers end with its pass."""

    def __init__(
        self,
        ds: Indexed | Shard,
        batch_size: int,
        shuffle: bool,
        seed: int,
        workers: int,
        drop_last: bool,
        rank: int = 0,
        world: int = 1,
        labels: torch.Tensor | None = None,
        persistent: bool = True,
    ) -> None:
        self.ds, self.shuffle, self.seed, self.epoch = ds, shuffle, seed, 0
        self.labels, self.global_batch, self.drop_last = labels, batch_size, drop_last
        self.kw = dict(
            num_workers=workers,
            drop_last=drop_last,
            persistent_workers=workers > 0 and persistent,
            pin_memory=torch.cuda.is_available(),
            prefetch_factor=4 if workers > 0 else None,
        )
        self.share(rank, world)
        self.weights = None  # per-example sampling weights (a sampler such as sgs sets them)
        self.device = None  # batches are moved there (build_data sets the training device)
        self._loader = None

    def share(self, rank: int, world: int) -> None:
        """Take this process's share of the examples, ``rank`` of ``world`` (before the first
        batch): its 1/world of every global batch in training.

        Args:
            rank: this process's place among the processes that split the examples.
            world: how many processes split them.
        """
        self.rank, self.world, self.sampler = rank, world, None
        ds, drop_last = self.ds, self.drop_last
        if world > 1 and drop_last:
            self.sampler = torch.utils.data.DistributedSampler(
                ds, world, rank, shuffle=self.shuffle, seed=self.seed, drop_last=drop_last
            )
        elif world > 1:  # evaluation: every example exactly once over the processes (no padding)
            self.sampler = list(range(rank, len(ds), world))
        self.batch_size = self.kw["batch_size"] = self.global_batch // world

    @property
    def y(self) -> torch.Tensor:
        """The examples' labels, on the loader's device."""
        dev = self.device if self.device is not None else "cpu"
        return self.labels.to(dev)

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch the next pass draws its order for."""
        self.epoch = epoch
        if hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def __len__(self):
        n = len(EpochOrder(self))
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self):
        if self._loader is None:  # one DataLoader: its persistent workers serve every epoch
            # a weak reference back: no cycle, so a loader let go ends its workers at once
            # (collected later, its workers would pile up and be forked into new ones)
            order = EpochOrder(weakref.proxy(self))
            self._loader = torch.utils.data.DataLoader(self.ds, sampler=order, **self.kw)
        dev = self.device
        move = dev is not None and dev.type != "cpu"
        for x, y, idx in worker_batches(self._loader):
            if move:
                x, y = x.to(dev, non_blocking=True), y.to(dev, non_blocking=True)
                idx = idx.to(dev, non_blocking=True)
            yield x, y, idx
