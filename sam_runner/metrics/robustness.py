"""Robustness to corruptions (``metrics.corruptions``, off by default): the test set evaluated
under every selected corruption of ``data/corruptions.py`` at every selected severity.

Images (CIFAR-10, CIFAR-100, CIFAR-100-LT): the published CIFAR-10-C / CIFAR-100-C arrays
(``<dataset.data_dir>/CIFAR-10-C/<corruption>.npy`` with ``labels.npy``: 10,000 images per
severity, severity 1 first) when they are there (``source: auto`` or ``files``); otherwise the
corruptions are generated on the fly, batch by batch on the training device, from the clean
8-bit test images (``generated``). MNIST-1D: its own perturbations, always generated. Every
corrupted copy is evaluated like the clean test set (eval mode, the run's autocast), and:

- ``test_acc_c``, ``test_ece_c``: accuracy and ECE averaged over corruptions and severities;
- ``test_acc_c_<corruption>``: the corruption's accuracy averaged over its severities.

Generated noise is drawn from a generator seeded by the run's seed, the corruption and the
severity (``corruptions.generator``): every job of a sweep with the same seed sees the same
corrupted images.
"""

from __future__ import annotations

import contextlib
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from .. import distributed
from ..data import corruptions as C
from ..data.loaders import TensorLoader
from ..errors import UserError, require
from ..part import Part
from ..registry import CORRUPTIONS, DATASETS
from .calibration import expected_calibration_error
from .evaluate import predict
from .folder_corruptions import check_corruption_tree, folder_loader, folder_names

if TYPE_CHECKING:
    from collections.abc import Iterable
    from contextlib import AbstractContextManager

    from omegaconf import DictConfig
    from torch import nn

    from ..clock import Clock
    from ..data import Data
    from ..distributed import Topology
    from ..part import Run

SOURCES = ("auto", "files", "generated")
# the published arrays of each dataset's test set, under dataset.data_dir
FOLDERS = {"cifar10": "CIFAR-10-C", "cifar100": "CIFAR-100-C", "cifar100_lt": "CIFAR-100-C"}


def _section(metrics_cfg) -> dict:
    from omegaconf import OmegaConf

    node = metrics_cfg.get("corruptions") if metrics_cfg is not None else None
    if OmegaConf.is_config(node):
        node = OmegaConf.to_container(node, resolve=True)
    return dict(node or {})


def enabled(metrics_cfg: DictConfig) -> bool:
    """Whether ``metrics.corruptions.enabled`` asks for the measurement."""
    return bool(_section(metrics_cfg).get("enabled", False))


def kind_of(dataset_name: str) -> str | None:
    """``1d`` (MNIST-1D), ``image`` (three-channel 8-bit images held as tensors), or None."""
    entry = DATASETS.entry(dataset_name)
    shape = entry.input_shape
    if shape is not None and len(shape) == 2:
        return "1d"
    if entry.tensors and shape is not None and len(shape) == 3 and shape[0] == 3:
        return "image"
    if not entry.tensors:  # image folders: RGB images, decoded in 8 bits
        return "image"
    return None


def selected(metrics_cfg: DictConfig, kind: str) -> list[str]:
    """The corruption names ``metrics.corruptions.names`` selects for inputs of ``kind``."""
    names = _section(metrics_cfg).get("names", "all")
    return C.names_for(kind) if names in ("all", None) else [str(n) for n in names]


def severities(metrics_cfg: DictConfig) -> list[int]:
    """The severities ``metrics.corruptions.severities`` selects."""
    return [int(s) for s in _section(metrics_cfg).get("severities", C.SEVERITIES)]


def validate(metrics_cfg: DictConfig, dataset_cfg: DictConfig | None = None) -> None:
    """One-line errors for ``metrics.corruptions`` (and, given the dataset, whether it applies)."""
    c = _section(metrics_cfg)
    keys = ("enabled", "names", "severities", "source", "folder")
    unknown = sorted(set(c) - set(keys))
    require(
        not unknown,
        f"metrics.corruptions.{unknown[0] if unknown else ''} is not a key; accepted: "
        f"{', '.join(keys)}",
    )
    require(
        isinstance(c.get("enabled", False), bool),
        f"metrics.corruptions.enabled={c.get('enabled')!r} must be true or false",
    )
    require(
        c.get("source", "auto") in SOURCES,
        f"metrics.corruptions.source={c.get('source')!r} is unknown; choose one of "
        f"{', '.join(SOURCES)}",
    )
    sev = c.get("severities", list(C.SEVERITIES))
    require(
        isinstance(sev, (list, tuple))
        and sev
        and all(isinstance(s, int) and not isinstance(s, bool) and 1 <= s <= 5 for s in sev),
        f"metrics.corruptions.severities={sev!r} must be a non-empty list of integers in 1..5",
    )
    names = c.get("names", "all")
    require(
        names in ("all", None) or (isinstance(names, (list, tuple)) and names),
        f"metrics.corruptions.names={names!r} must be 'all' or a non-empty list of corruptions",
    )
    for n in [] if names in ("all", None) else names:
        CORRUPTIONS.entry(n)  # unknown: "choose one of ..."
    if dataset_cfg is not None and c.get("enabled", False):
        _check_dataset(metrics_cfg, dataset_cfg)


def _check_dataset(metrics_cfg, dataset_cfg) -> None:
    kind = kind_of(dataset_cfg.name)
    require(
        kind is not None,
        f"metrics.corruptions applies to MNIST-1D, CIFAR-10/100 and image folders, not "
        f"dataset={dataset_cfg.name}; set metrics.corruptions.enabled=false",
    )
    for name in selected(metrics_cfg, kind):
        require(
            CORRUPTIONS.entry(name).inputs == kind,
            f"metrics.corruptions.names: {name} is not a corruption of dataset="
            f"{dataset_cfg.name}'s inputs; choose among {', '.join(C.names_for(kind))}",
        )
    if not DATASETS.entry(dataset_cfg.name).tensors:
        _check_tree(_section(metrics_cfg))
        if _section(metrics_cfg).get("folder") is not None:
            names = selected(metrics_cfg, kind)
            check_corruption_tree(_section(metrics_cfg), names, dataset_cfg.get("root", "."))
    elif _section(metrics_cfg).get("source", "auto") == "files":
        folder = _folder(dataset_cfg)
        require(
            folder is not None and (folder / "labels.npy").exists(),
            f"metrics.corruptions.source=files: no {FOLDERS.get(dataset_cfg.name, 'arrays')}/"
            f"labels.npy under dataset.data_dir={dataset_cfg.get('data_dir')}; put the published "
            "arrays there, or use source=auto",
        )


def _check_tree(section: dict) -> None:
    """An image folder's corruptions: ``folder`` (an ImageNet-C tree) for source=files."""
    folder = section.get("folder")
    require(
        folder is not None or section.get("source", "auto") != "files",
        "metrics.corruptions.source=files on dataset=image_folder needs "
        "metrics.corruptions.folder=<ImageNet-C tree: <corruption>/<severity>/<class>/*>",
    )
    require(
        folder is None or Path(str(folder)).is_dir(),
        f"metrics.corruptions.folder={folder} is not a folder (expected an ImageNet-C tree "
        "<corruption>/<severity>/<class>/*)",
    )


def _folder(dataset_cfg) -> Path | None:
    name = FOLDERS.get(str(dataset_cfg.name))
    return Path(str(dataset_cfg.get("data_dir", "."))) / name if name else None


# ---------------------------------------------------------------------------- corrupted sets
def _arrays(folder: Path, name: str, severity: int, labels, device):
    """The published images of one corruption and severity, as uint8 NCHW on ``device``."""
    import numpy as np

    n = len(labels)
    try:
        images = np.load(folder / f"{name}.npy", mmap_mode="r")[(severity - 1) * n : severity * n]
        stored = np.load(folder / "labels.npy", mmap_mode="r")[(severity - 1) * n : severity * n]
    except (OSError, ValueError) as e:
        raise UserError(f"{folder / (name + '.npy')} is unreadable ({type(e).__name__})") from None
    require(
        images.shape == (n, 32, 32, 3) and np.array_equal(stored, labels.cpu().numpy()),
        f"{folder / (name + '.npy')} does not hold severity {severity} of this test set "
        f"({n} images in the test set's order)",
    )
    return torch.from_numpy(np.array(images)).permute(0, 3, 1, 2).contiguous().to(device)


class _Corrupting:
    """A loader transform: corrupt the batch (from its own seeded generator, batch after batch),
    then turn it into model input as the clean test set is (``prepare``)."""

    def __init__(self, name, severity, g, prepare):
        self.name, self.severity, self.g, self.prepare = name, severity, g, prepare

    def __call__(self, x, loader_generator, batch=None):
        if x.dtype == torch.uint8:
            x = C.corrupt_images(self.name, x, self.severity, self.g)
        else:
            x = C.corrupt(self.name, x, self.severity, self.g)
        return self.prepare(x, loader_generator, batch) if self.prepare is not None else x


def corrupted_loader(
    data: Data,
    metrics_cfg: DictConfig,
    dataset_cfg: DictConfig,
    seed: int,
    name: str,
    severity: int,
) -> tuple[Iterable, str]:
    """The test set under one corruption at one severity: the published arrays when the source
    allows and they are there, else generated batch by batch."""
    if data.train_tensors is None:  # an image folder
        return folder_loader(data, _section(metrics_cfg), dataset_cfg, seed, name, severity)
    test = data.test
    source = _section(metrics_cfg).get("source", "auto")
    folder = _folder(dataset_cfg)
    kw = dict(shuffle=False, rank=test.rank, world=test.world)
    if source != "generated" and folder is not None and (folder / f"{name}.npy").exists():
        x = _arrays(folder, name, severity, test.y, test.y.device)
        return TensorLoader(x, test.y, test.batch_size, transform=test.transform, **kw), "files"
    g = C.generator(test.y.device, seed, name, severity, test.rank)
    transform = _Corrupting(name, severity, g, test.transform)
    return TensorLoader(test.x, test.y, test.batch_size, transform=transform, **kw), "generated"


def corruption_values(
    model: nn.Module,
    data: Data,
    metrics_cfg: DictConfig,
    dataset_cfg: DictConfig,
    seed: int,
    autocast: AbstractContextManager | None = None,
    dist: Topology | None = None,
) -> tuple[dict, list[str]]:
    """``test_acc_c``, ``test_ece_c``, ``test_acc_c_<corruption>`` (see the module docstring),
    and the set of sources used (``files``, ``generated``)."""
    autocast = autocast if autocast is not None else contextlib.nullcontext()
    dist = dist if dist is not None else distributed.current()
    n_bins = int(metrics_cfg.get("ece_bins", 15))
    kind = kind_of(dataset_cfg.name)
    out, accs, eces, sources = {}, [], [], set()
    names = selected(metrics_cfg, kind)
    if data.train_tensors is None:
        names = folder_names(_section(metrics_cfg), names)
    for name in names:
        per = []
        for severity in severities(metrics_cfg):
            loader, source = corrupted_loader(data, metrics_cfg, dataset_cfg, seed, name, severity)
            logits, labels = predict(model, loader, autocast, dist)
            per.append(float((logits.argmax(1) == labels).float().mean()))
            eces.append(expected_calibration_error(logits.softmax(1), labels, n_bins))
            sources.add(source)
        out[f"test_acc_c_{name}"] = statistics.fmean(per)
        accs += per
    out["test_acc_c"], out["test_ece_c"] = statistics.fmean(accs), statistics.fmean(eces)
    return out, sorted(sources)


def check(cfg: DictConfig, where: object = None) -> None:  # noqa: ARG001 (every check's signature)
    """Validate ``metrics.corruptions`` against the dataset (every check's signature)."""
    validate(cfg.metrics, cfg.dataset)


def build_part(run: Run) -> Robustness | None:
    """The corruption measurement of the run's last evaluation (None when not asked for)."""
    if not enabled(run.cfg.metrics):
        return None
    return Robustness(run.cfg, run.data, run.net, run.loop.autocast, run.dist, run.clock)


class Robustness(Part):
    """The corruption keys of a run's final evaluation line."""

    def __init__(
        self,
        cfg: DictConfig,
        data: Data,
        model: nn.Module,
        autocast: AbstractContextManager,
        dist: Topology,
        clock: Clock,
    ) -> None:
        self.cfg, self.data, self.model, self.clock = cfg, data, model, clock
        self.autocast, self.dist = autocast, dist
        validate(cfg.metrics, cfg.dataset)  # before training, not after it

    def log_values(self) -> dict:
        """The corruption metrics after the last epoch (nothing before it)."""
        if not self.clock.final:
            return {}
        cfg = self.cfg
        values, _ = corruption_values(
            self.model, self.data, cfg.metrics, cfg.dataset, cfg.seed, self.autocast, self.dist
        )
        return values
