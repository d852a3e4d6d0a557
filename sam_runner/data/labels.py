"""Training labels as a study sets them: a validation split held out first, then a long-tailed
cut of the classes, then label noise."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..errors import number, require

if TYPE_CHECKING:
    from omegaconf import DictConfig


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


def batch_size(cfg: DictConfig, n: int) -> int:
    """``dataset.batch_size``, with ``full`` the whole training set of ``n`` examples."""
    return n if cfg.batch_size == "full" else int(cfg.batch_size)


def validation_size(val_split: float | int | None, n: int) -> int:
    """``dataset.val_split`` as a number of examples of a training set of ``n``: a fraction in
    (0, 1) of it, or a count (an integer >= 1); 0 (or null) is no validation split."""
    if not val_split:
        return 0
    size = int(round(float(val_split) * n)) if float(val_split) < 1 else int(val_split)
    require(
        0 < size < n,
        f"dataset.val_split={val_split} holds out {size} of the {n} training examples; "
        f"use a fraction in (0, 1) or a count between 1 and {n - 1}",
    )
    return size


def validation_split(
    y: torch.Tensor, num_classes: int, val_split: float | int | None, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(training pool, validation indices), both sorted: ``dataset.val_split`` of the training
    set held out, stratified (each class gives its share of the split, the largest remainders
    one more) and drawn by a generator seeded with ``seed``. It depends on the labels, the seed
    and ``val_split`` alone, so adding ``train_subset``, a long tail or label noise (applied to
    the pool afterwards) leaves it unchanged."""
    n = len(y)
    size = validation_size(val_split, n)
    if size == 0:
        return torch.arange(n), torch.arange(0)
    counts = torch.bincount(y, minlength=num_classes).double()
    share = counts * size / n
    take = share.floor().long()
    extra = size - int(take.sum())
    take[torch.argsort(share - share.floor(), descending=True, stable=True)[:extra]] += 1
    g = torch.Generator().manual_seed(seed + 15485863)
    val = []
    for c in range(num_classes):
        members = torch.nonzero(y == c).flatten()
        val.append(members[torch.randperm(len(members), generator=g)[: int(take[c])]])
    val = torch.cat(val).sort().values
    held = torch.zeros(n, dtype=torch.bool)
    held[val] = True
    require(
        bool(torch.all(torch.bincount(y[~held], minlength=num_classes) > 0)),
        f"dataset.val_split={val_split} leaves a class without training examples; hold out less",
    )
    return torch.nonzero(~held).flatten(), val


def training_labels(
    cfg: DictConfig,
    y: torch.Tensor,
    num_classes: int,
    seed: int,
    world: int,
    pool: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """(kept indices, training labels, clean class counts): from ``pool`` (the indices left by
    the validation split; default all), a class-balanced subset, the long-tail cut, then label
    noise; the counts (which define the many/medium/few split) are of the clean labels. Checks
    the batch size against the training set."""
    keep = torch.arange(len(y)) if pool is None else pool
    if cfg.get("train_subset") is not None:  # fixed by the seed: every job of a seed trains on it
        keep = keep[balanced_subset(y[keep], num_classes, int(cfg.train_subset), seed)]
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
