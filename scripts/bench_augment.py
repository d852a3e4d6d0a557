"""Bench section: the cost of the augmentation policies per training batch (python
scripts/bench.py --only augment).

augment_<policy>_over_basic  the time to make one augmented CIFAR batch (128 uint8 32×32
                             images, on the CPU: crop and flip, the policy's per-sample
                             operation, normalisation; what TensorLoader does per batch) under
                             dataset.augment=<policy> over the time under basic; measured side
                             by side, alternating, median of the repeats
augment_basic_batch_ms       the basic batch's own time, milliseconds (the ratios' unit)
mixup_over_basic, cutmix_over_basic  a basic batch then MixUp (CutMix) over a basic batch
cifar_loader_over_bare_index  one epoch of the CIFAR training loader (TensorLoader over 8,192
                             uint8 32×32 images, batch 128: shuffle, crop and flip, normalise)
                             over a bare loop over the same tensor (a seeded permutation, each
                             batch taken with index_select and normalised: the least any loop
                             over images held in memory does); one thread, side by side, median
"""

from __future__ import annotations

import torch
from benchutil import interleaved_ratio, median_time, single_threaded
from omegaconf import OmegaConf

from sam_runner.data.augment import Mixing, tensor_policy
from sam_runner.data.loaders import Normalize, TensorLoader
from sam_runner.data.sources import CIFAR_STATS

POLICIES = ("cutout", "autoaugment", "randaugment", "trivialaugment")


def batch_maker(policy: str, x):
    crop_flip, op = tensor_policy(policy, 32)
    tf = Normalize(*CIFAR_STATS["cifar10"], augment=crop_flip, policy=op)
    g = torch.Generator().manual_seed(0)
    return lambda: tf(x, g)


@single_threaded
def loader_over_bare_index(repeats: int, n: int = 8192) -> float:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    mean, std = CIFAR_STATS["cifar10"]
    tf = Normalize(mean, std, augment=True)
    loader = TensorLoader(x, y, 128, shuffle=True, seed=0, drop_last=True, transform=tf)
    m, s = torch.tensor(mean).view(1, -1, 1, 1), torch.tensor(std).view(1, -1, 1, 1)

    def through_loader():
        for _ in loader:
            pass

    def bare():
        order = torch.randperm(n, generator=torch.Generator().manual_seed(0))
        for i in range(n // 128):
            idx = order[i * 128 : (i + 1) * 128]
            x.index_select(0, idx).float().div_(255).sub_(m).div_(s), y[idx]

    return interleaved_ratio(through_loader, bare, repeats)


def run(args) -> dict:
    repeats = 3 if args.quick else args.repeats
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (128, 3, 32, 32), dtype=torch.uint8, generator=g)
    y = torch.arange(128) % 10
    basic = batch_maker("basic", x)
    out = {
        "augment_basic_batch_ms": 1000 * median_time(basic, repeats),
        "cifar_loader_over_bare_index": loader_over_bare_index(max(repeats, 7)),
    }
    for policy in POLICIES:
        out[f"augment_{policy}_over_basic"] = interleaved_ratio(
            batch_maker(policy, x), basic, repeats
        )
    for kind in ("mixup", "cutmix"):
        mixing = Mixing(OmegaConf.create({f"{kind}_alpha": 1.0}), 10, 0)
        out[f"{kind}_over_basic"] = interleaved_ratio(
            lambda m=mixing: m(basic(), y, 0), basic, repeats
        )
    return out
