"""Small ImageNet-style class-folder trees, written as real PNG and JPEG files."""

from __future__ import annotations

from pathlib import Path

import numpy as np

CLASSES = ("ant", "bee", "cat")


def write_tree(root, per_class: int = 40, val_per_class: int = 10, size: int = 36) -> Path:
    """``root/train/<class>/*`` and ``root/val/<class>/*``: per class a tint plus seeded noise
    (so a small model learns something), every other image a JPEG, the rest PNG."""
    from PIL import Image

    root = Path(root)
    rng = np.random.default_rng(0)
    for split, count in (("train", per_class), ("val", val_per_class)):
        for c, name in enumerate(CLASSES):
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                pixels = rng.integers(0, 120, (size, size + 4, 3))
                pixels[..., c] += 120
                image = Image.fromarray(pixels.astype(np.uint8))
                image.save(folder / (f"{i}.jpg" if i % 2 else f"{i}.png"))
    return root
