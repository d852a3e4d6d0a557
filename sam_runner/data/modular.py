"""``dataset=modular_arithmetic``: the grokking task (Power et al. 2022).

Every pair (a, b) of Z_p is one sequence of four tokens ``a ∘ b =`` (ids: the numbers 0..p-1,
then ∘ = p and "=" = p + 1); the target is the id of a∘b mod p. With ``div``, b runs over 1..p-1
and a/b = a·b^(p-2) mod p (Fermat), so p must be prime. A seeded permutation of the pairs puts
the first ``train_fraction`` of them in training and the rest in the test split (disjoint).
The vocabulary (the model's classes) is p + 2; only the p numbers are ever targets.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..errors import UserError, integer, number, require
from ..registry import DATASETS
from . import Arrays

if TYPE_CHECKING:
    from omegaconf import DictConfig

OPERATIONS = ("add", "sub", "mul", "div")


def is_prime(n: int) -> bool:
    """Whether ``n`` is a prime."""
    return n >= 2 and all(n % d for d in range(2, int(n**0.5) + 1))


def _keys(cfg) -> tuple[int, str, float]:
    p = integer("dataset.p", cfg.get("p", 97), "an integer >= 2 (the modulus)", lambda v: v >= 2)
    op = cfg.get("operation", "add")
    require(
        op in OPERATIONS,
        f"dataset.operation={op!r} is unknown; choose one of {', '.join(OPERATIONS)}",
    )
    if op == "div" and not is_prime(p):
        raise UserError(
            f"dataset.p={p} is not prime: dataset.operation=div needs a prime p (every b ≠ 0 "
            "has an inverse mod p only then)"
        )
    f = number(
        "dataset.train_fraction",
        cfg.get("train_fraction", 0.5),
        "a fraction in (0, 1) (the share of the pairs used for training)",
        lambda v: 0 < v < 1,
    )
    return p, op, f


def _check(cfg) -> None:
    p, _, f = _keys(cfg)
    n = p * p
    require(
        1 <= int(n * f) < n,
        f"dataset.train_fraction={f} leaves no pair in one of the splits of the {n} pairs",
    )


def pairs(p: int, op: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Every (a, b) the operation is defined on, as token sequences [N, 4], and the answers."""
    a, b = torch.meshgrid(torch.arange(p), torch.arange(p), indexing="ij")
    a, b = a.reshape(-1), b.reshape(-1)
    if op == "div":
        keep = b != 0
        a, b = a[keep], b[keep]
        inverse = torch.tensor([pow(int(v), p - 2, p) for v in range(p)])
        c = (a * inverse[b]) % p
    else:
        c = {"add": a + b, "sub": a - b, "mul": a * b}[op] % p
    x = torch.stack([a, torch.full_like(a, p), b, torch.full_like(a, p + 1)], dim=1)
    return x, c


def split(n: int, fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Disjoint training and test indices of ``n`` pairs: a permutation seeded by ``seed``."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + 7919))
    cut = int(n * fraction)
    return order[:cut], order[cut:]


def modular_shape(cfg: DictConfig) -> tuple[tuple, int]:
    """(input shape, class count) of modular arithmetic mod p: four tokens, p + 2 symbols."""
    p, _, _ = _keys(cfg)
    return (4,), p + 2


@DATASETS.register(
    "modular_arithmetic",
    "a∘b mod p for every pair (dataset.p, .operation, .train_fraction): grokking",
    check=_check,
    input_shape=None,
    num_classes=None,
    shape_of=modular_shape,
)
def modular_arithmetic(cfg: DictConfig) -> Arrays:
    """Every pair a∘b mod p, split into training and test by ``train_fraction``."""
    _check(cfg)
    p, op, f = _keys(cfg)
    x, y = pairs(p, op)
    train, test = split(len(y), f, int(cfg.get("split_seed", 0)))
    return Arrays(x[train], y[train], x[test], y[test], p + 2)
