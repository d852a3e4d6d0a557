"""Corruptions of an image folder's test set (``metrics.corruptions`` with
``dataset=image_folder``).

- ``metrics.corruptions.folder`` set: a Hendrycks-style ImageNet-C tree
  ``<folder>/<corruption>/<severity>/<class>/*`` is read (source ``files``), each image resized
  to ``dataset.image_size`` (shorter side) and centre-cropped (ImageNet-C's images are already
  224² crops: at 224 they pass unchanged), normalised as the test set. Its class folders must be
  the test set's. ``names: all`` is every corruption folder of the tree.
- otherwise the registry's corruptions are generated batch by batch on the device (source
  ``generated``) from the test images decoded in 8 bits (the evaluation transform), with the
  parameters of ``corruptions.folder_parameter``: ImageNet-C's table (the per-pixel ones as
  published, the blurs' lengths scaled to the image size), not the registry's CIFAR-10-C one.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from ..data import corruptions as C
from ..data.folder import class_names, read_image, require_same_classes
from ..data.loaders import FolderLoader, Indexed
from ..data.sources import IMAGENET_STATS
from ..errors import UserError, first_line, require

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from omegaconf import DictConfig

    from ..data import Data


class CorruptedFolder:
    """Batches ``(x, y, idx)`` of the 8-bit test images corrupted on the device, then
    normalised (``prepare``)."""

    def __init__(
        self,
        images: Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
        name: str,
        severity: int,
        g: torch.Generator,
        prepare: Callable[..., torch.Tensor],
        image_size: int,
    ) -> None:
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


def folder_loader(
    data: Data, section: dict, dataset_cfg: DictConfig, seed: int, name: str, severity: int
) -> tuple[Iterable, str]:
    """The test set under one corruption and severity: from an ImageNet-C tree (``folder``) or
    generated on the device; and which."""
    size = int(dataset_cfg.get("image_size", 224))
    if section.get("folder") is not None:
        return tree_loader(data, Path(str(section["folder"])), name, severity, size), "files"
    test = data.test
    g = C.generator(data.device or torch.device("cpu"), seed, name, severity, test.rank)
    images = data.test_images
    return CorruptedFolder(images, name, severity, g, data.prepare, size), "generated"


def check_corruption_tree(section: dict, names: list, dataset_root: Path | str) -> None:
    """Before anything runs: every corruption and severity asked of an ImageNet-C tree is a
    folder holding exactly the test set's class folders (``<dataset.root>/val``)."""
    root, val = Path(str(section["folder"])), Path(str(dataset_root)) / "val"
    classes = class_names(val) if val.is_dir() else None
    for name in folder_names(section, names):
        for severity in [int(s) for s in section.get("severities", C.SEVERITIES)]:
            path = severity_folder(root, name, severity)
            if classes is not None:
                tree_classes(path, classes)


def severity_folder(root: Path, name: str, severity: int) -> Path:
    """``<root>/<name>/<severity>``, refused in one line when it is not a folder."""
    path = root / name / str(severity)
    require(
        path.is_dir(),
        f"metrics.corruptions.folder={root}: no {path} (expected "
        "<folder>/<corruption>/<severity>/<class>/*)",
    )
    return path


def tree_classes(path: Path, classes: list) -> None:
    """``path``'s class folders must be the test set's: labels are sorted positions."""
    where = f"metrics.corruptions.folder: {path}"
    require_same_classes(classes, class_names(path), where, "the test set (dataset.root's val/)")


def tree_loader(data: Data, root: Path, name: str, severity: int, size: int) -> FolderLoader:
    """One corruption and severity of an ImageNet-C tree, batched as the test set is, read
    once: its workers (the test set's number) end with the pass, so one corrupted copy's
    workers run at a time."""
    from torchvision import datasets
    from torchvision import transforms as T

    path = severity_folder(root, name, severity)
    tree_classes(path, data.test.ds.ds.classes)
    tf = T.Compose([T.Resize(size), T.CenterCrop(size), T.ToTensor(), T.Normalize(*IMAGENET_STATS)])
    try:
        ds = datasets.ImageFolder(path, tf, loader=read_image)
    except FileNotFoundError as e:  # a class folder without images
        raise UserError(f"metrics.corruptions.folder: {path}: {first_line(e)}") from None
    test = data.test
    kw = dict(rank=test.rank, world=test.world, persistent=False)
    batch = test.kw["batch_size"] * test.world
    loader = FolderLoader(Indexed(ds), batch, False, 0, test.kw["num_workers"], False, **kw)
    loader.device = data.device
    return loader
