"""The federated measures of a round, from each sampled client's ε at the global weights (its
first local step):

- ``eps_pairwise_cos``: the inter-client perturbation inconsistency, the mean cosine over client
  pairs of their ε (as applied), from the running sum of unit vectors:
  (‖Σ u_k‖² − m) / (m(m − 1)); one client: none;
- ``eps_low_freq_share``: the share of ε's energy (before any filter) in the lowest
  ``measure_cutoff`` of each tensor's rFFT bins, the clients' mean;
- ``eps_global_cos``: the flatness incompatibility, the clients' mean cosine between their ε
  and the global model's SAM direction on the union of their data (∇L on the measurement
  subset, plain SAM's ε up to its radius).
"""

from __future__ import annotations

import math

import torch


def low_frequency_energy(t: torch.Tensor, cutoff: float) -> tuple[float, float]:
    """(energy of the lowest ``cutoff`` share of the rFFT bins of ``t`` flattened, all of it)."""
    power = torch.fft.rfft(t.reshape(-1).float()).abs().pow(2)
    k = math.ceil(cutoff * power.numel())
    return float(power[:k].sum()), float(power.sum())


class Observer:
    def __init__(self, cutoff: float) -> None:
        self.cutoff = cutoff
        self.watching = False
        self.begin(None, False)

    def begin(self, global_direction: dict | None, measuring: bool) -> None:
        """Start a round: measure its clients' ε (against ``global_direction``) when
        ``measuring``."""
        self.measuring, self.direction = measuring, global_direction
        self.unit_sum: list | None = None
        self.count, self.low, self.cos = 0, [], []

    def raw(self, eps: list) -> None:
        """ε as the variant computed it (before an algorithm's filter)."""
        low = all_ = 0.0
        for e in eps:
            a, b = low_frequency_energy(e, self.cutoff)
            low, all_ = low + a, all_ + b
        if all_ > 0:
            self.low.append(low / all_)

    def applied(self, params: list, eps: list) -> None:
        """ε as the perturbed pass uses it."""
        norm = math.sqrt(sum(float(e.pow(2).sum()) for e in eps))
        if norm == 0:
            return
        unit = [e / norm for e in eps]
        if self.unit_sum is None:
            self.unit_sum = [u.clone() for u in unit]
        else:
            torch._foreach_add_(self.unit_sum, unit)
        self.count += 1
        if self.direction is not None:
            g = [self.direction.get(id(p)) for p in params]
            pairs = [(u, d) for u, d in zip(unit, g) if d is not None]
            dot = sum(float((u * d).sum()) for u, d in pairs)
            g_norm = math.sqrt(sum(float(d.pow(2).sum()) for _, d in pairs))
            if g_norm > 0:
                self.cos.append(dot / g_norm)

    def values(self) -> dict:
        """The round's measures of the clients' ε (pairwise cosine, low-frequency share, cosine
        with the global direction); {} when not measured."""
        if not self.measuring:
            return {}
        out = {}
        m = self.count
        if m > 1:
            s = sum(float(u.pow(2).sum()) for u in self.unit_sum)
            out["eps_pairwise_cos"] = (s - m) / (m * (m - 1))
        if self.low:
            out["eps_low_freq_share"] = sum(self.low) / len(self.low)
        if self.cos:
            out["eps_global_cos"] = sum(self.cos) / len(self.cos)
        return out
