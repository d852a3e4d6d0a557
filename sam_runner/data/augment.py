"""Augmentation policies (``dataset.augment=<name>``) and MixUp/CutMix (``dataset.mixup_alpha``,
``dataset.cutmix_alpha``), all from torchvision's ``transforms.v2``.

Every policy but ``none`` starts from the basic crop and flip; its extra operation (Cutout,
AutoAugment, RandAugment, TrivialAugment) is drawn **per sample**. On tensor datasets the
operation runs on the device, sample by sample, each sample under its own seed drawn from the
loader's (seed, epoch) generator: an epoch's augmented batches depend on (seed, epoch) alone,
so a resumed epoch repeats them, and no two samples of a batch share one sampled operation.
Folder datasets run the same operations in their DataLoader workers.

MixUp and CutMix mix a whole training batch (one λ per batch, the papers' convention) into
soft targets, seeded by (seed, step); the loss takes the soft targets, accuracy the hard labels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..errors import UserError, number
from ..part import Part
from ..registry import AUGMENTS, DATASETS

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from omegaconf import DictConfig

    from ..part import Run

CUTOUT_SIDE = 0.5  # the hole's side over the image's: 16×16 on 32×32, as the SAM paper's CIFAR
LEGACY = {True: "basic", False: "none"}  # dataset.augment=true/false, from before the policies


def _v2():
    from torchvision.transforms import v2

    return v2


@AUGMENTS.register("none", "no augmentation", basic=False)
def no_op(_size: int) -> None:
    """``none``: no crop, no flip, no extra operation."""
    return None


@AUGMENTS.register("basic", "random crop (4-pixel padding; folders: resized crop) and flip")
def basic(_size: int) -> None:
    """``basic``: crop and flip, no extra operation."""
    return None


@AUGMENTS.register("cutout", "basic, then one 16×16 hole (Cutout, DeVries & Taylor 2017)")
def cutout(size: int) -> Cutout:
    """Cutout of a square a fixed fraction of the image's side."""
    return Cutout(round(CUTOUT_SIDE * size))


class Cutout:
    """DeVries & Taylor's Cutout as their code does it: a square of side ``side`` centred on a
    uniformly drawn pixel, clipped at the border (so it may be cut to a rectangle: mean area 196
    px for 16×16 on 32×32), set to 0 in the normalised image, i.e. the dataset's mean colour.
    It runs after normalisation on tensor and folder data alike (``after_normalisation``)."""

    after_normalisation = True

    def __init__(self, side: int) -> None:
        self.side = int(side)

    def __call__(self, img: torch.Tensor) -> torch.Tensor:
        h, w = img.shape[-2:]
        cy, cx = (int(torch.randint(n, (1,))) for n in (h, w))  # the global RNG, as v2's
        half = self.side // 2
        out = img.clone()
        out[..., max(0, cy - half) : min(h, cy + half), max(0, cx - half) : min(w, cx + half)] = 0
        return out


@AUGMENTS.register("autoaugment", "basic, then AutoAugment (CIFAR10 policy on 32², else ImageNet)")
def autoaugment(size: int) -> Callable:
    """torchvision's AutoAugment: the CIFAR10 policy on 32² images, else ImageNet's."""
    v2 = _v2()
    policy = v2.AutoAugmentPolicy.CIFAR10 if size == 32 else v2.AutoAugmentPolicy.IMAGENET
    return v2.AutoAugment(policy)


@AUGMENTS.register("randaugment", "basic, then RandAugment (2 operations, magnitude 9)")
def randaugment(_size: int) -> Callable:
    """torchvision's RandAugment with its defaults."""
    return _v2().RandAugment()


@AUGMENTS.register("trivialaugment", "basic, then TrivialAugment (one operation, any strength)")
def trivialaugment(_size: int) -> Callable:
    """torchvision's TrivialAugmentWide."""
    return _v2().TrivialAugmentWide()


def policy_name(value: bool | str) -> str:
    """``dataset.augment`` as a policy name (true/false: basic/none), or a one-line error."""
    if isinstance(value, bool):
        return LEGACY[value]
    return AUGMENTS.entry(value).name


def validate(cfg: DictConfig) -> None:
    """``dataset.augment``, ``dataset.mixup_alpha`` and ``dataset.cutmix_alpha``; a policy with
    an operation on images (Cutout, AutoAugment, ...) on a dataset that is not augmented (its
    registration's ``augmented``: MNIST-1D's signals, tokens, arrays) is refused, as it would do
    nothing."""
    policy = policy_name(cfg.get("augment", True))
    name = cfg.get("name")
    if policy not in ("none", "basic") and name is not None and not augmented(name):
        raise UserError(
            f"dataset.augment={policy} acts on images, and dataset={name}{_inputs(name)} is "
            f"not augmented (only {', '.join(DATASETS.names_where(augmented=True))} are); use "
            "dataset.augment=none"
        )
    for key in ("mixup_alpha", "cutmix_alpha"):
        number(f"dataset.{key}", cfg.get(key, 0.0), "a number >= 0 (0 = off)", lambda a: a >= 0)


def augmented(dataset: str) -> bool:
    """Whether a dataset's training batches are augmented (CIFAR's tensors, image folders): its
    registration says so; the other sources' inputs are signals, tokens or arrays."""
    return bool(DATASETS.entry(dataset).meta.get("augmented"))


def _inputs(dataset: str) -> str:
    """What a dataset's inputs are, as its registration's shape says (" (1-D signals ...)")."""
    shape = DATASETS.entry(dataset).input_shape or ()
    if len(shape) == 2:
        return f" (1-D signals of length {shape[-1]})"
    return f" ({shape[-2]}×{shape[-1]} images)" if len(shape) == 3 else ""


class TensorPolicy:
    """A policy's extra operation on a batch of uint8 images (N, C, H, W), each sample under its
    own seed; ``batch`` = (size, share) as in ``random_crop_flip``: the seeds are drawn for the
    whole global batch and this share's are kept."""

    def __init__(self, op: Callable[[torch.Tensor], torch.Tensor]) -> None:
        self.op = op
        # Cutout fills the mean colour: it runs on the normalised floats, the rest on uint8
        self.after_normalisation = getattr(op, "after_normalisation", False)

    def draw(self, g: torch.Generator, size: int) -> torch.Tensor:
        """The per-sample seeds of a global batch of ``size`` (on the CPU), drawn from ``g``."""
        return torch.randint(0, 2**62, (size,), generator=g)

    def __call__(self, x, g, batch=None):
        size, share = batch if batch is not None else (len(x), slice(None))
        return self.apply(x, self.draw(g, size)[share])

    def apply(self, x: torch.Tensor, seeds: torch.Tensor) -> torch.Tensor:
        """Each sample of ``x`` under its own seed of ``seeds`` (CPU, one per sample)."""
        out = torch.empty_like(x)
        # v2 draws from the global CPU RNG: forked, so training's own draws (dropout) are
        # untouched; its generator reseeded directly (torch.manual_seed costs ~500x more)
        with torch.random.fork_rng(devices=[]):
            for i, seed in enumerate(seeds.tolist()):
                torch.default_generator.manual_seed(seed)
                out[i] = self.op(x[i])
        return out


def tensor_policy(value: bool | str, size: int) -> tuple[bool, TensorPolicy | None]:
    """(whether to crop and flip, the per-sample extra operation or None) of a policy."""
    entry = AUGMENTS.entry(policy_name(value))
    op = entry.target(size)
    return entry.basic, (TensorPolicy(op) if op is not None else None)


def folder_transform(
    value: bool | str, size: int, mean: Sequence[float], std: Sequence[float]
) -> Callable:
    """The training transform of an image folder: PIL image in, normalised float tensor out."""
    v2 = _v2()
    entry = AUGMENTS.entry(policy_name(value))
    if not entry.basic:
        head = [v2.Resize(size), v2.CenterCrop(size)]
    else:
        head = [v2.RandomResizedCrop(size, antialias=True), v2.RandomHorizontalFlip()]
    op = entry.target(size)
    late = getattr(op, "after_normalisation", False)
    geometric = [] if op is None or late else [op]
    tail = [op] if late else []
    return v2.Compose(
        [
            *head,
            *geometric,
            v2.ToImage(),
            v2.ToDtype(torch.float32, scale=True),
            v2.Normalize(mean, std),
            *tail,
        ]
    )


def build_part(run: Run) -> Mixing | None:
    """MixUp/CutMix of the training batches (None when neither is on)."""
    mixing = Mixing(run.cfg.dataset, run.data.num_classes, run.cfg.seed, run.data.input_shape)
    return mixing if mixing.op is not None else None


class Mixing(Part):
    """MixUp and/or CutMix of a training batch into soft targets (both on: one of the two per
    batch, at random), seeded by (seed, step); off, the batch and its labels pass through."""

    def __init__(
        self,
        dataset_cfg: DictConfig,
        num_classes: int,
        seed: int,
        input_shape: Sequence[int] = (3, 32, 32),
    ) -> None:
        v2 = _v2()
        mixup = float(dataset_cfg.get("mixup_alpha", 0.0) or 0.0)
        cutmix = float(dataset_cfg.get("cutmix_alpha", 0.0) or 0.0)
        if cutmix > 0 and len(input_shape) != 3:
            raise UserError(
                f"dataset.cutmix_alpha={cutmix:g} needs images, not inputs of shape "
                f"{tuple(input_shape)}; use dataset.mixup_alpha"
            )
        ops = []
        if mixup > 0:
            ops.append(v2.MixUp(alpha=mixup, num_classes=num_classes))
        if cutmix > 0:
            ops.append(v2.CutMix(alpha=cutmix, num_classes=num_classes))
        self.op = None if not ops else ops[0] if len(ops) == 1 else v2.RandomChoice(ops)
        self.seed = seed

    def batch(
        self, x: torch.Tensor, y: torch.Tensor, step: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch mixed (its targets soft)."""
        return self(x, y, step)

    def __call__(self, x, y, step: int):
        """(inputs, targets): soft targets (N, classes) when mixing, else ``y`` itself."""
        if self.op is None:
            return x, y
        shape = x.shape
        images = x if x.dim() == 4 else x.reshape(len(x), shape[1], 1, -1)  # 1-D signals: 1 row
        with torch.random.fork_rng(devices=[]):
            torch.default_generator.manual_seed(self.seed * 1_000_003 + step)
            mixed, targets = self.op(images, y)
        return mixed.reshape(shape), targets
