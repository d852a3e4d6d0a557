"""SAM's peak memory against davda54/sam's and a base step's against a bare loop (#57): the
bench's own measurement (scripts/bench_memory.py, torch's allocations on the CPU, the same
count as CUDA's allocator), run here in one process on the bench's ResNet-18 (batch 4)."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

SCALARS = (
    1024  # bytes: the step's returned loss and a norm are allowed, nothing the size of a tensor
)


@pytest.fixture(scope="module")
def peaks():
    import bench_memory

    return {
        kind: bench_memory._steps_child(kind, batch=4)["bytes"]
        for kind in ("sam", "davda54", "base", "bare")
    }


def test_sam_peaks_no_higher_than_davda54s_sam(peaks):
    assert peaks["sam"] <= peaks["davda54"] + SCALARS, peaks


def test_base_peaks_no_higher_than_a_bare_loop(peaks):
    assert peaks["base"] <= peaks["bare"] + SCALARS, peaks


def test_sam_adds_one_copy_of_the_parameters_over_base(peaks):
    import bench_memory

    model = bench_memory._resnet18()[0]
    param_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    assert param_bytes - SCALARS <= peaks["sam"] - peaks["base"] <= param_bytes + SCALARS, peaks
