"""Image folders (``dataset=image_folder``): the tree's checks, and the measurement subset.

The measurement subset (curvature, the sharpness measures, the landscape's training points and
BatchNorm samples) is drawn by the same rule as for tensor datasets (``subset_indices``),
decoded once with the evaluation transform (resize to 8/7 of ``image_size``, centre crop; no
augmentation) into a uint8 tensor, and normalised when a measurement asks for it. It is kept
in ``<run>/cache/measure_subset_n<N>_seed<S>.pt`` (written atomically) so that sam-eval and
sam-landscape read it back instead of decoding again. Memory: a measurement holds the subset
as float32 (4 bytes a value) and, while normalising it, the uint8 copy too: ``5 × N × 3 ×
image_size²`` bytes at once (4,096 images at 224²: 3.1 GB, of which the float32 copy, 2.5 GB,
stays); a subset over half the memory available where it goes (the host; a CUDA device for
the float32 copy when the run measures there) is refused.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..errors import UserError, require
from ..runfiles import atomic_write
from .loaders import worker_batches

if TYPE_CHECKING:
    import PIL.Image
    from torchvision.datasets import ImageFolder

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def subset_indices(size: int, n: int, seed: int) -> torch.Tensor:
    """The measurement subset's indices into a training set of ``size``: the first ``n`` of a
    permutation seeded by ``seed`` (every dataset, tensors and folders alike)."""
    g = torch.Generator().manual_seed(seed + 104729)
    return torch.randperm(size, generator=g)[: min(n, size)]


def class_names(folder: Path) -> list[str]:
    """The class folders of a split as ImageFolder finds them: its sub-folders' names, sorted
    (a class's label is its position in this list)."""
    return sorted(p.name for p in folder.iterdir() if p.is_dir())


def check_tree(root: Path) -> None:
    """One-line errors for a tree the ImageFolder would refuse or misread: a missing split, a
    split without class folders, val/ with other classes than train/ (labels are sorted
    positions: another set would shift them), a class folder without images."""
    for split in ("train", "val"):
        require(
            (root / split).is_dir(),
            f"dataset.root={root}: missing folder {root / split} (expected "
            "<root>/train/<class>/*.jpg and <root>/val/<class>/*.jpg)",
        )
    names = {split: class_names(root / split) for split in ("train", "val")}
    for split in ("train", "val"):
        require(names[split], f"dataset.root={root}: {root / split} has no class folders")
    require_same_classes(names["train"], names["val"], f"dataset.root={root}: val/", "train/")
    for split in ("train", "val"):
        for c in names[split]:
            folder = root / split / c
            has_image = any(f.suffix.lower() in IMAGE_SUFFIXES for f in folder.iterdir())
            require(
                has_image,
                f"dataset.root={root}: class folder {folder} holds no images "
                f"({', '.join(IMAGE_SUFFIXES)}); remove it or add images",
            )


def require_same_classes(expected: list, found: list, what: str, of: str) -> None:
    """``found`` (class folder names) must be ``expected``: else one line naming the classes
    that differ (the first 5 of each kind)."""
    expected_set, found_set = set(expected), set(found)
    missing = [c for c in expected if c not in found_set]
    extra = [c for c in found if c not in expected_set]
    differ = [f"{kind} {_names(cs)}" for kind, cs in (("missing", missing), ("extra", extra)) if cs]
    require(
        not differ,
        f"{what} has other class folders than {of} ({'; '.join(differ)}); labels are the "
        "positions of the sorted class names, so both need exactly the same class folders",
    )


def _names(names: list, shown: int = 5) -> str:
    more = f" and {len(names) - shown} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def read_image(path: str) -> PIL.Image.Image:
    """The ImageFolder loader, with an unreadable file as a one-line error naming it."""
    from PIL import Image

    try:
        with open(path, "rb") as f:
            return Image.open(f).convert("RGB")
    except Exception as e:
        raise UserError(
            f"dataset.root: image {path} is unreadable ({type(e).__name__}); replace or remove it"
        ) from None


def available_bytes() -> int:
    """Memory available to this process now without swapping: Linux's MemAvailable (free memory
    and the page cache it can reclaim: reading a large tree fills the cache), else the free
    pages, elsewhere unbounded."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def subset_bytes(count: int, image_size: int, device: torch.device | str | None = None) -> dict:
    """The bytes a measurement subset of ``count`` images holds at once, by device (``cpu``:
    the host): the uint8 copy (decoded or read back, on the host) and the float32 copy
    normalised from it on the measurement's ``device`` (a CUDA device: with the uint8 copy
    moved there)."""
    values, host = count * 3 * image_size * image_size, torch.device("cpu")
    device = torch.device(device if device is not None else "cpu")
    if device.type == "cuda":
        return {host: values, device: 5 * values}
    return {host: 5 * values}  # uint8 + float32: 1 + 4 bytes a value


def free_bytes(device: torch.device) -> int:
    """Memory available on ``device`` (``cpu``: the host's)."""
    return torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else available_bytes()


class FolderSubset:
    """Decodes (or reads from the cache) the measurement subset of an image folder's training
    set. ``dataset``: an ImageFolder of the training samples with the uint8 evaluation
    transform; ``labels``: the training labels (after label noise, as training sees them)."""

    def __init__(
        self, dataset: ImageFolder, labels: torch.Tensor, image_size: int, workers: int
    ) -> None:
        self.dataset, self.labels, self.size, self.workers = dataset, labels, image_size, workers
        files = "\n".join(f"{p}\t{t}" for p, t in dataset.samples).encode()
        self.fingerprint = hashlib.sha256(files + str(image_size).encode()).hexdigest()

    def __call__(self, n: int, seed: int, cache_dir=None, write: bool = True, device=None):
        """(uint8 images, labels) of the subset of ``n`` drawn with ``seed``, first checked to
        fit where the measurement on ``device`` holds it."""
        idx = subset_indices(len(self.labels), n, seed)
        self.check_fits(n, len(idx), device)
        path = Path(cache_dir) / f"measure_subset_n{n}_seed{seed}.pt" if cache_dir else None
        cached = self._read(path, idx)
        if cached is not None:
            return cached, self.labels[idx]
        x = self._decode(idx)
        if path is not None and write:
            state = {"fingerprint": self.fingerprint, "idx": idx, "x": x}
            try:
                atomic_write(path, lambda f: torch.save(state, f))
            except OSError:  # an unwritable cache only costs decoding again next time
                pass
        return x, self.labels[idx]

    def check_fits(self, n: int, count: int, device: torch.device | str | None = None) -> None:
        """A one-line error naming ``metrics.hessian.num_samples`` when the subset's copies
        held at once (``subset_bytes``) exceed half the memory available where they go."""
        for where, need in subset_bytes(count, self.size, device).items():
            free = free_bytes(where)
            on = "the host" if where.type == "cpu" else f"device {where}"
            require(
                need <= free // 2,
                f"metrics.hessian.num_samples={n}: the measurement subset ({count} images at "
                f"{self.size}²) needs {need / 2**30:.1f} GiB at once on {on} (uint8 as "
                f"decoded, float32 as measured), over half the {free / 2**30:.1f} GiB "
                "available there; lower metrics.hessian.num_samples",
            )

    def _read(self, path, idx):
        if path is None or not path.is_file():
            return None
        try:
            state = torch.load(path, map_location="cpu", weights_only=True)
        except Exception:  # a damaged cache is only decoded again
            return None
        same = state.get("fingerprint") == self.fingerprint and torch.equal(state["idx"], idx)
        return state["x"] if same else None

    def _decode(self, idx: torch.Tensor) -> torch.Tensor:
        """The images at ``idx``, through a DataLoader with the run's workers, into one uint8
        tensor [n, 3, size, size] (filled batch by batch: no second copy to concatenate)."""
        part = torch.utils.data.Subset(self.dataset, idx.tolist())
        loader = torch.utils.data.DataLoader(
            part, batch_size=256, shuffle=False, num_workers=self.workers
        )
        out = torch.empty(len(idx), 3, self.size, self.size, dtype=torch.uint8)
        start = 0
        for x, _ in worker_batches(loader):
            out[start : start + len(x)] = x
            start += len(x)
        return out
