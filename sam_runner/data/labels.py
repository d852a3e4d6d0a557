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


def balanced_subset(y: torch.Tensor, num_classes: int, n: int, seed: int) -> torch.Tensor:
    """Indices of ``n`` training examples, as equal a share of every class as ``n`` allows (the
    first ``n % C`` classes one more), drawn by a generator seeded with ``seed``; sorted."""
    g = torch.Generator().manual_seed(seed + 5381)
    keep = []
    for c in range(num_classes):
        members = torch.nonzero(y == c).flatten()
        need = n // num_classes + (c < n % num_classes)
        require(
            len(members) >= need,
            f"dataset.train_subset={n} needs {need} examples of class {c}, "
            f"which has {len(members)}; use at most "
            f"{num_classes * int(torch.bincount(y, minlength=num_classes).min())}",
        )
        keep.append(members[torch.randperm(len(members), generator=g)[:need]])
    return torch.cat(keep).sort().values


def batch_size(cfg, n: int) -> int:
    """``dataset.batch_size``, with ``full`` the whole training set of ``n`` examples."""
    return n if cfg.batch_size == "full" else int(cfg.batch_size)


def training_labels(cfg, y, num_classes: int, seed: int, world: int):
    """(kept indices, training labels, clean class counts): a class-balanced subset, the long-tail
    cut, then label noise; the counts (which define the many/medium/few split) are of the clean
    labels. Checks the batch size against the training set."""
    keep = torch.arange(len(y))
    if cfg.get("train_subset") is not None:  # fixed by the seed: every job of a seed trains on it
        keep = balanced_subset(y, num_classes, int(cfg.train_subset), seed)
    ratio = cfg.get("imbalance_ratio")
    if ratio is not None:  # a long-tailed training set; the test set stays whole
        ratio = number(
            "dataset.imbalance_ratio", ratio, "a number >= 1 (or null)", lambda r: r >= 1
        )
        keep = keep[long_tail_indices(y[keep], num_classes, ratio)]
    y = y[keep]
    counts = torch.bincount(y, minlength=num_classes).tolist()
    n, bs = len(y), batch_size(cfg, len(y))
    require(
        bs <= n,
        f"dataset.batch_size={bs} is larger than the training set ({n} examples); use at most {n}",
    )
    require(
        bs % world == 0,
        f"dataset.batch_size={cfg.batch_size} ({bs} examples: the global "
        f"batch) must be divisible by the number of processes ({world})",
    )
    return keep, apply_label_noise(y, num_classes, float(cfg.get("label_noise", 0.0)), seed), counts
