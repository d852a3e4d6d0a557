"""Bench section: image-folder loading (python scripts/bench.py --only folder).

folder_loader_over_torchvision  one epoch of our training loader (dataset=image_folder's
                                FolderLoader: its transform, batch, workers, pinned memory on
                                CUDA, persistent workers, prefetch) over one epoch of a plain
                                ``torch.utils.data.DataLoader(ImageFolder(...))`` with the same
                                transform, batch size and workers; side by side, alternating,
                                median of the repeats (target ≤ 1.05)
folder_measure_subset_s         building the measurement subset (4,096 images; --quick: 512) of
                                a JPEG tree at 224² the first time (decoded), seconds
folder_measure_subset_cached_s  the same subset read back from the run folder's cache, seconds
folder_epoch_images             images per epoch of the loader comparison
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from benchutil import interleaved_ratio
from omegaconf import OmegaConf

from sam_runner.data import build_data


def write_jpegs(root: Path, classes: int, per_class: int, size: int) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in range(classes):
            folder = root / split / f"c{c}"
            folder.mkdir(parents=True)
            for i in range(per_class if split == "train" else 2):
                pixels = rng.integers(0, 255, (size, size * 5 // 4, 3)).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.jpg", quality=90)


def folder_cfg(root: Path, workers: int, size: int):
    return OmegaConf.create(
        dict(
            name="image_folder",
            root=str(root),
            data_dir="",
            download=False,
            batch_size=64,
            label_noise=0.0,
            augment=True,
            sampler="uniform",
            image_size=size,
            num_workers=workers,
        )
    )


def loader_ratio(root: Path, repeats: int, workers: int) -> tuple[float, int]:
    from torchvision import datasets

    data = build_data(folder_cfg(root, workers, 128), torch.device("cpu"), 0)
    ours = data.train
    plain = torch.utils.data.DataLoader(
        datasets.ImageFolder(root / "train", ours.ds.ds.transform),
        batch_size=64,
        shuffle=True,
        num_workers=workers,
        drop_last=True,
        persistent_workers=workers > 0,
    )
    epoch = lambda loader: sum(len(b[0]) for b in loader)
    return interleaved_ratio(lambda: epoch(ours), lambda: epoch(plain), repeats), epoch(plain)


def subset_seconds(root: Path, n: int) -> tuple[float, float]:
    data = build_data(folder_cfg(root, 4, 224), torch.device("cpu"), 0)
    cache = root / "cache"
    t0 = time.perf_counter()
    data.folder_subset(n, 0, cache, True)
    first = time.perf_counter() - t0
    t0 = time.perf_counter()
    data.folder_subset(n, 0, cache, True)
    return first, time.perf_counter() - t0


def run(args) -> dict:
    repeats = 3 if args.quick else args.repeats
    n = 512 if args.quick else 4096
    tmp = Path(tempfile.mkdtemp(prefix="bench-folder-"))
    try:
        write_jpegs(tmp / "small", 4, 64, 160)
        ratio, images = loader_ratio(tmp / "small", repeats, 2)
        write_jpegs(tmp / "big", 8, n // 8, 256)
        first, cached = subset_seconds(tmp / "big", n)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {
        "folder_loader_over_torchvision": ratio,
        "folder_epoch_images": images,
        "folder_measure_subset_s": first,
        "folder_measure_subset_cached_s": cached,
    }
