"""Image folders (``dataset=image_folder``): the tree's checks, and the measurement subset.

The measurement subset (curvature, the sharpness measures, the landscape's training points)
is drawn by the same rule as for tensor datasets (``subset_indices``), decoded once with the
evaluation transform (resize to 8/7 of ``image_size``, centre crop; no augmentation) into a
uint8 tensor, and normalised when a measurement asks for it. It is kept in
``<run>/cache/measure_subset_n<N>_seed<S>.pt`` (written atomically) so that sam-eval and
sam-landscape read it back instead of decoding again. Memory: ``N × 3 × image_size²`` bytes
(4,096 images at 224² are 0.62 GB); a subset over half the memory available is refused.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

from ..errors import UserError, require
from ..runfiles import atomic_write

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def subset_indices(size: int, n: int, seed: int) -> torch.Tensor:
    """The measurement subset's indices into a training set of ``size``: the first ``n`` of a
    permutation seeded by ``seed`` (every dataset, tensors and folders alike)."""
    g = torch.Generator().manual_seed(seed + 104729)
    return torch.randperm(size, generator=g)[: min(n, size)]


def check_tree(root: Path) -> None:
    """One-line errors for a tree the ImageFolder would refuse or misread: a missing split, a
    split without class folders, a class folder without images."""
    for split in ("train", "val"):
        require(
            (root / split).is_dir(),
            f"dataset.root={root}: missing folder {root / split} (expected "
            "<root>/train/<class>/*.jpg and <root>/val/<class>/*.jpg)",
        )
    for split in ("train", "val"):
        classes = sorted(p for p in (root / split).iterdir() if p.is_dir())
        require(classes, f"dataset.root={root}: {root / split} has no class folders")
        for c in classes:
            has_image = any(f.suffix.lower() in IMAGE_SUFFIXES for f in c.iterdir())
            require(
                has_image,
                f"dataset.root={root}: class folder {c} holds no images "
                f"({', '.join(IMAGE_SUFFIXES)}); remove it or add images",
            )


def read_image(path: str):
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
    """Physical memory available to this process now (Linux; elsewhere unbounded)."""
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


class FolderSubset:
    """Decodes (or reads from the cache) the measurement subset of an image folder's training
    set. ``dataset``: an ImageFolder of the training samples with the uint8 evaluation
    transform; ``labels``: the training labels (after label noise, as training sees them)."""

    def __init__(self, dataset, labels: torch.Tensor, image_size: int, workers: int):
        self.dataset, self.labels, self.size, self.workers = dataset, labels, image_size, workers
        files = "\n".join(f"{p}\t{t}" for p, t in dataset.samples).encode()
        self.fingerprint = hashlib.sha256(files + str(image_size).encode()).hexdigest()

    def __call__(self, n: int, seed: int, cache_dir=None, write: bool = True):
        idx = subset_indices(len(self.labels), n, seed)
        need = len(idx) * 3 * self.size * self.size
        require(
            need <= available_bytes() // 2,
            f"metrics.hessian.num_samples={n}: the measurement subset ({len(idx)} images at "
            f"{self.size}²) needs {need / 2**30:.1f} GiB as uint8, over half the "
            f"{available_bytes() / 2**30:.1f} GiB available; lower metrics.hessian.num_samples",
        )
        path = Path(cache_dir) / f"measure_subset_n{n}_seed{seed}.pt" if cache_dir else None
        cached = self._read(path, idx)
        if cached is not None:
            return cached, self.labels[idx]
        x = self._decode(idx)
        if path is not None and write:
            state = {"fingerprint": self.fingerprint, "idx": idx, "x": x}
            atomic_write(path, lambda f: torch.save(state, f))
        return x, self.labels[idx]

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
        """The images at ``idx``, through a DataLoader with the run's workers, as one uint8
        tensor [n, 3, size, size]."""
        part = torch.utils.data.Subset(self.dataset, idx.tolist())
        loader = torch.utils.data.DataLoader(
            part, batch_size=256, shuffle=False, num_workers=self.workers
        )
        batches = [x for x, _ in loader]
        empty = torch.empty(0, 3, self.size, self.size, dtype=torch.uint8)
        return torch.cat(batches) if batches else empty
