"""CI smoke sweep: `sam-run -m optimizer=<every variant>` on the embedded default with a tiny
budget, one process for all jobs (real Hydra multirun); every job completes with finite metrics.
The full sweep is marked slow (about 45 s of CPU, minutes on a busy machine); the default
suite sweeps the variants whose runner wiring differs from SAM's (three passes, the
reweighted loss, the Polyak step and its global-package preset, the class counts of
Focal-SAM, bSAM's N, Functional-SAM's logits, MSAM's single pass)."""

import json
import math
import os
import subprocess
import sys

import pytest

from sam_runner.optim import VARIANTS


@pytest.mark.slow
def test_every_variant_completes_a_tiny_sweep(tmp_path):
    _sweep(tmp_path, sorted(VARIANTS))


@pytest.mark.slow  # 10-30 s: outside CI's 30-minute budget; run with -m slow
def test_variants_with_their_own_wiring_complete_a_tiny_sweep(tmp_path):
    _sweep(tmp_path, ["bsam", "csam", "eisam", "focal_sam", "functional_sam", "msam", "sam_sps"])


def _sweep(tmp_path, names):
    cmd = [
        sys.executable,
        "-m",
        "sam_runner.cli",
        "-m",
        f"optimizer={','.join(names)}",
        "trainer.epochs=1",
        f"dataset.num_samples={600 if len(names) > 3 else 400}",
        "dataset.batch_size=64",
        "trainer.device=cpu",
        "metrics.hessian.enabled=false",
        "trainer.progress=none",
        f"hydra.sweep.dir={tmp_path}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "offline"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = {}
    for job in sorted(p for p in tmp_path.iterdir() if p.is_dir() and p.name.isdigit()):
        summary = json.loads((job / "summary.json").read_text())
        name = next(o.split("=", 1)[1] for o in summary["overrides"] if o.startswith("optimizer="))
        assert summary["status"] == "completed", (name, summary.get("error"))
        for key in ("test_acc", "test_ece", "test_nll"):
            assert math.isfinite(summary[key]), (name, key)
        last = [json.loads(line) for line in (job / "metrics.jsonl").read_text().splitlines()][-1]
        assert math.isfinite(last["train_loss"]) and math.isfinite(last["grad_norm_max"]), name
        assert name == "base" or math.isfinite(last["rho"]), name
        seen[name] = summary
    assert sorted(seen) == names
    for name, passes in (("msam", 1.0), ("focal_sam", 3.0), ("eisam", 3.0)):
        if name in seen:
            assert seen[name]["grad_evals_per_step"] == pytest.approx(passes, rel=1e-12), name
