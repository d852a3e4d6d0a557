"""Clients as disjoint shards of the training set: IID, or label-skewed by Dirichlet(α).

Both are drawn from the run's seed alone (numpy's generator, never torch's global one: a split
changes no other draw of the run), and each shard's indices are sorted, so one IID client holds
the training set in its own order (a one-client federation sees a centralized run's batches).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch

from ..errors import UserError, require

if TYPE_CHECKING:
    from omegaconf import DictConfig

REDRAWS = 100  # Dirichlet draws tried before a client left with no sample is an error


def split_clients(
    labels: torch.Tensor, clients: int, alpha: float | None, seed: int
) -> list[torch.Tensor]:
    """The clients' sorted training-set indices: ``alpha`` None = IID (a seeded permutation cut
    into near-equal shards); else each class's examples are dealt by proportions drawn from
    Dirichlet(α·1) over the clients (Hsu et al. 2019), redrawn while a client has none."""
    n = len(labels)
    require(
        clients <= n,
        f"federated.clients={clients} is more than the {n} training samples; use at most {n}",
    )
    rng = np.random.default_rng([int(seed), 0xFED])
    if alpha is None:
        order = rng.permutation(n)
        return [torch.from_numpy(np.sort(s)) for s in np.array_split(order, clients)]
    y = labels.cpu().numpy()
    for _ in range(REDRAWS):
        shards = _dirichlet(y, clients, float(alpha), rng)
        if min(len(s) for s in shards) > 0:
            return [torch.from_numpy(np.sort(s)) for s in shards]
    raise UserError(
        f"federated.dirichlet_alpha={alpha} left a client with no sample in {REDRAWS} seeded "
        f"draws of federated.clients={clients} over {n} training samples; raise dirichlet_alpha "
        "or lower federated.clients"
    )


def check_split(cfg: DictConfig) -> None:
    """The split a federated run will make, made before anything is written, on the training
    labels it will train on (``data.planned``): more clients than training samples, or a
    Dirichlet split that leaves a client empty, is one line here rather than a failed run. A
    dataset not yet in ``dataset.data_dir`` is checked when the run has read it."""
    f = cfg.get("federated")
    if f is None or f.get("name", "none") == "none":
        return
    from ..data.planned import has_labels, planned_labels

    require(
        has_labels(str(cfg.dataset.name)),
        f"federated={f.name} deals a labelled training set out to its clients; "
        f"dataset={cfg.dataset.name} has no labels per example (next-token windows): use a "
        "classification dataset",
    )
    labels = planned_labels(cfg.dataset, int(cfg.seed))
    if labels is not None:
        split_clients(labels, int(f.clients), f.dirichlet_alpha, int(cfg.seed))


def _dirichlet(y: np.ndarray, clients: int, alpha: float, rng) -> list[np.ndarray]:
    parts: list[list[np.ndarray]] = [[] for _ in range(clients)]
    for c in np.unique(y):
        members = rng.permutation(np.flatnonzero(y == c))
        share = rng.dirichlet(np.full(clients, alpha))
        cuts = (np.cumsum(share)[:-1] * len(members)).astype(int)
        for k, piece in enumerate(np.split(members, cuts)):
            parts[k].append(piece)
    return [np.concatenate(p) for p in parts]


def histograms(labels: torch.Tensor, shards: list[torch.Tensor], num_classes: int) -> list:
    """Each client's class counts, one list per client."""
    y = labels.cpu()
    return [torch.bincount(y[s], minlength=num_classes).tolist() for s in shards]


def skew(hist: list) -> float:
    """Label skew of a split: the mean total-variation distance between each client's class
    distribution and the pooled one (0 for identical histograms; →1 as clients hold one class
    each)."""
    h = np.asarray(hist, dtype=float)
    pooled = h.sum(0) / h.sum()
    own = h / h.sum(1, keepdims=True)
    return float(0.5 * np.abs(own - pooled).sum(1).mean())
