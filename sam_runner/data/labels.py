"""Training labels as a study sets them: a long-tailed cut of the classes, then label noise."""

from __future__ import annotations

import torch

from ..errors import number, require


def long_tail_indices(labels: torch.Tensor, num_classes: int, ratio: float) -> torch.Tensor:
    """Exponential profile: class c keeps its first n_max * ratio^(-c/(C-1)) examples."""
    n_max = int((labels == 0).sum())
    require(
        ratio <= n_max,
        f"dataset.imbalance_ratio={ratio} leaves the last class without training examples; use at "
        f"most {n_max} (the size of class 0)",
    )
    keep = []
    for c in range(num_classes):
        # + 1e-9: n_max * n_max^-1 is 0.99999... in floating point for some n_max
        n_c = int(n_max * ratio ** (-c / max(1, num_classes - 1)) + 1e-9)
        keep.append(torch.nonzero(labels == c).flatten()[:n_c])
    return torch.cat(keep).sort().values


def apply_label_noise(
    y: torch.Tensor, num_classes: int, fraction: float, seed: int
) -> torch.Tensor:
    """Replace ``fraction`` of the labels by a uniformly random *other* class (fixed by the
    seed)."""
    if fraction <= 0:
        return y
    g = torch.Generator().manual_seed(seed + 7919)
    n = len(y)
    idx = torch.randperm(n, generator=g)[: int(round(fraction * n))]
    shift = torch.randint(1, num_classes, (len(idx),), generator=g)
    y = y.clone()
    y[idx] = (y[idx] + shift) % num_classes
    return y


def training_labels(cfg, y, num_classes: int, seed: int, world: int):
    """(kept indices, training labels, clean class counts): the long-tail cut, then label noise; the
    counts (which define the many/medium/few split) are of the clean labels. Checks the batch
    size."""
    ratio = cfg.get("imbalance_ratio")
    keep = torch.arange(len(y))
    if ratio is not None:  # a long-tailed training set; the test set stays whole
        ratio = number(
            "dataset.imbalance_ratio", ratio, "a number >= 1 (or null)", lambda r: r >= 1
        )
        keep = long_tail_indices(y, num_classes, ratio)
    y = y[keep]
    counts = torch.bincount(y, minlength=num_classes).tolist()
    n, bs = len(y), cfg.batch_size
    require(
        bs <= n,
        f"dataset.batch_size={bs} is larger than the training set ({n} examples); use at most {n}",
    )
    require(
        bs % world == 0,
        f"dataset.batch_size={bs} (the global batch) must be divisible by the number of processes "
        f"({world})",
    )
    return keep, apply_label_noise(y, num_classes, float(cfg.get("label_noise", 0.0)), seed), counts
