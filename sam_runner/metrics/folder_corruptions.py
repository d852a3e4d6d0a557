"""Corruptions of an image folder's test set (``metrics.corruptions`` with
``dataset=image_folder``).

- ``metrics.corruptions.folder`` set: a Hendrycks-style ImageNet-C tree
  ``<folder>/<corruption>/<severity>/<class>/*`` is read (source ``files``), each image resized
  to ``dataset.image_size`` (shorter side) and centre-cropped (ImageNet-C's images are already
  224² crops: at 224 they pass unchanged), normalised as the test set. Its class folders must be
  the test set's. ``names: all`` is every corruption folder of the tree.
- otherwise the registry's corruptions are generated batch by batch on the device (source
  ``generated``) from the test images decoded in 8 bits (the evaluation transform), with the
  parameters of ``corruptions.folder_parameter``: ImageNet-C's, scaled to the image size, for
  the blurs; the registry's own for the per-pixel ones.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ..data import corruptions as C
from ..errors import require


class CorruptedFolder:
    """Batches ``(x, y, idx)`` of the 8-bit test images corrupted on the device, then
    normalised (``prepare``)."""

    def __init__(self, images, name, severity, g, prepare, image_size):
        self.images, self.name, self.severity, self.g = images, name, severity, g
        self.prepare, self.value = prepare, C.folder_parameter(name, severity, image_size)

    def __len__(self):
        return len(self.images)

    def __iter__(self):
        for x, y, idx in self.images:
            x = C.corrupt_images(self.name, x, self.severity, self.g, self.value)
            yield self.prepare(x, None), y, idx


def folder_names(section: dict, names: list) -> list:
    """The corruptions to evaluate: with an ImageNet-C tree and ``names: all``, its folders."""
    folder = section.get("folder")
    if folder is None or section.get("names", "all") not in ("all", None):
        return names
    root = Path(str(folder))
    require(root.is_dir(), f"metrics.corruptions.folder={folder} is not a folder")
    return sorted(p.name for p in root.iterdir() if p.is_dir())


def folder_loader(data, section: dict, dataset_cfg, seed: int, name: str, severity: int):
    size = int(dataset_cfg.get("image_size", 224))
    if section.get("folder") is not None:
        return tree_loader(data, Path(str(section["folder"])), name, severity, size), "files"
    test = data.test
    g = C.generator(data.device or torch.device("cpu"), seed, name, severity, test.rank)
    images = data.test_images
    return CorruptedFolder(images, name, severity, g, data.prepare, size), "generated"


def tree_loader(data, root: Path, name: str, severity: int, size: int):
    """One corruption and severity of an ImageNet-C tree, through the test set's loader."""
    from torchvision import datasets
    from torchvision import transforms as T

    from ..data.folder import read_image
    from ..data.loaders import FolderLoader, Indexed
    from ..data.sources import IMAGENET_STATS

    path = root / name / str(severity)
    require(
        path.is_dir(),
        f"metrics.corruptions.folder={root}: no {path} (expected "
        "<folder>/<corruption>/<severity>/<class>/*)",
    )
    tf = T.Compose([T.Resize(size), T.CenterCrop(size), T.ToTensor(), T.Normalize(*IMAGENET_STATS)])
    ds = datasets.ImageFolder(path, tf, loader=read_image)
    classes = data.test.ds.ds.classes
    require(
        ds.classes == classes,
        f"metrics.corruptions.folder: {path} holds classes {ds.classes[:3]}..., not the test "
        f"set's {classes[:3]}...",
    )
    test = data.test
    loader = FolderLoader(
        Indexed(ds),
        test.kw["batch_size"] * test.world,
        False,
        0,
        test.kw["num_workers"],
        False,
        test.rank,
        test.world,
    )
    loader.device = data.device
    return loader
