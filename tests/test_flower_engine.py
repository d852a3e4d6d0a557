"""Flower's simulation engine (``flwr[simulation]``, not a dependency of the runner) running our
client update gives the global model the in-process rounds give (scripts/bench_flower.py;
docs/federated.md#the-engine). Skipped where flwr is not installed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))


@pytest.mark.slow  # Ray starts its cluster: tens of seconds on a shared CPU
@pytest.mark.parametrize("ordered", [True, False])
def test_flower_over_our_client_update_is_our_fedavg(ordered):
    # skipped in the test, not the module: a module-level skip would be reported by every
    # marker selection (`pytest -m cuda` in the GPU check) as one more skipped test
    pytest.importorskip("flwr.simulation")
    pytest.importorskip("ray")
    import bench_flower

    got = bench_flower.compare(clients=3, rounds=1, local_steps=3, ordered=ordered)
    if ordered:  # the same clients, batches and mean, summed in the same order
        assert got["max_abs_weight_diff"] == 0
    else:  # Flower's FedAvg sums in the order replies arrive: float rounding apart
        assert 0 < got["max_abs_weight"] and got["max_abs_weight_diff"] <= 1e-5
