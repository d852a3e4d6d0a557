"""A checkpoint written on the GPU resumes on the CPU, and the reverse: every part of the run
(model, optimizer and the variant's own state, scaler, sampler, curvature warm start, RNG) is
read onto the CPU and moved where the resumed run computes, and the resumed run ends where the
unbroken run on the first device ends (to float32 rounding across devices)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import compose, stopped_early_of

from sam_runner.train import train

pytestmark = pytest.mark.cuda

COMMON = (
    "dataset=digits",
    "model=mlp",
    "trainer.progress=none",
    "scheduler=constant",
    "metrics.hessian.num_samples=256",
    "metrics.hessian.max_iter=20",
    "metrics.hessian.every_n_epochs=1",
)


def _rows(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    return [{k: v for k, v in r.items() if not k.endswith("time_s")} for r in rows]


@pytest.mark.parametrize("optimizer", ["sam", "gear_sam", "tlc_sam"])
@pytest.mark.parametrize("first, then", [("cuda", "cpu"), ("cpu", "cuda")])
def test_a_checkpoint_resumes_on_the_other_device(optimizer, first, then, tmp_path):
    cfg = lambda device, epochs: compose(
        *COMMON, f"optimizer={optimizer}", f"trainer.device={device}", f"trainer.epochs={epochs}"
    )
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert train(cfg(first, 2), straight, ["x"])["status"] == "completed"
    assert train(cfg(first, 1), resumed, ["x"])["status"] == "completed"
    stopped_early_of(resumed, 2)
    summary = train(cfg(then, 2), resumed, ["x"])
    assert summary["status"] == "completed", summary.get("error")
    assert summary["device"].startswith(then)
    a, b = _rows(straight), _rows(resumed)
    assert [r["epoch"] for r in b] == [r["epoch"] for r in a] == [1, 2]
    for ra, rb in zip(a, b):
        assert ra.keys() == rb.keys()
        for key, value in ra.items():
            if isinstance(value, float):  # λ_max: Lanczos to 1e-3 may stop a step apart
                rel = 1e-2 if "lambda" in key or "eos" in key else 1e-3
                assert rb[key] == pytest.approx(value, rel=rel, abs=1e-4), key
    ma, mb = (
        torch.load(d / "checkpoints" / "last.pt", weights_only=True) for d in (straight, resumed)
    )
    for key, value in ma["model"].items():
        torch.testing.assert_close(mb["model"][key], value, rtol=1e-3, atol=1e-4, msg=key)
