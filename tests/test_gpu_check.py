"""scripts/gpu_check.py before any GPU is lent: its CPU dry run takes the GPU check's own code path
minus CUDA (every part, tiny sizes, a stand-in model), installs a real wheel as it would the
carried ones, and writes gpu_check.json and gpu_check.md; the budget skips what it cannot fit;
the presets' extrapolation is the documented formula."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "scripts"))

from gpu_check import PARTS  # noqa: E402
from gpu_presets import job_seconds, presets  # noqa: E402


def _probe_wheel(folder):
    """A minimal real wheel (pure Python, hashed RECORD) that pip installs offline."""
    files = {
        "gpu_check_probe/__init__.py": "VALUE = 42\n",
        "gpu_check_probe-1.0.dist-info/METADATA": (
            "Metadata-Version: 2.1\nName: gpu-check-probe\nVersion: 1.0\n"
        ),
        "gpu_check_probe-1.0.dist-info/WHEEL": (
            "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        ),
    }
    digest = lambda text: base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest())
    record = [
        f"{p},sha256={digest(t).decode().rstrip('=')},{len(t.encode())}" for p, t in files.items()
    ]
    files["gpu_check_probe-1.0.dist-info/RECORD"] = "\n".join(
        [*record, "gpu_check_probe-1.0.dist-info/RECORD,,"]
    )
    folder.mkdir()
    with zipfile.ZipFile(folder / "gpu_check_probe-1.0-py3-none-any.whl", "w") as z:
        for path, text in files.items():
            z.writestr(path, text)


def _check(tmp_path, *args, timeout=600):
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), str(out), "--cpu", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc, json.loads((out / "gpu_check.json").read_text()), (out / "gpu_check.md")


def _assert_trained(configs: dict, names: tuple, evaluated: tuple) -> None:
    for config, c in configs.items():
        assert set(c["images_per_s"]) == set(names), config
        assert all(v > 0 for v in c["images_per_s"].values()), config
        assert c["sam_over_base"] > 0 and c["data_device"] == "cpu", config
        if "gear_sam" in names:
            assert c["gear_sam_over_sam"] > 0 and c["spectral_sam_over_sam"] > 0, config
        if config in evaluated:
            assert c["eval_images_per_s"] > 0, config


@pytest.mark.slow  # 80-165 s (its compile part now compiles on the CPU): CI's 30 minutes
def test_the_dry_run_runs_every_part_and_writes_the_report(tmp_path):
    _probe_wheel(tmp_path / "wheels")
    wheels = ["--wheels", str(tmp_path / "wheels"), "--site", str(tmp_path / "site")]
    proc, results, md = _check(tmp_path, *wheels)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    parts = results["parts"]
    assert list(parts) == [p.name for p in PARTS]
    assert {name: p["status"] for name, p in parts.items()} == {p.name: "ok" for p in PARTS}
    assert results["check"]["mode"] == "cpu" and results["check"]["seconds"] < 300
    # the carried wheel: installed, and importable from every part (PYTHONPATH)
    assert results["wheels"]["status"] == "ok"
    assert results["wheels"]["installed"]["gpu-check-probe"]["modules"] == ["gpu_check_probe"]
    probe = parts["env"]["result"]["carried"]["gpu_check_probe"]
    assert probe.startswith("gpu-check-probe 1.0") and str(tmp_path / "site") in probe
    tests = parts["cuda_tests"]["result"]["tests"]
    assert len(tests) >= 20 and any("test_sgs_on_cuda" in name for name in tests)
    assert {t["outcome"] for t in tests.values()} == {"skipped"}
    assert all("needs a CUDA GPU" in t["message"] for t in tests.values())
    optimizers = ("base", "sam", "gear_sam", "spectral_sam")
    for model in ("resnet18", "wrn16_8"):
        trained = parts[f"train:{model}"]["result"]
        assert set(trained["configs"]) == {"fp32", "bf16", "bf16_cl"}
        _assert_trained(trained["configs"], optimizers, ("fp32", "bf16", "bf16_cl"))
        compiled = parts[f"compile:{model}"]["result"]["configs"]
        _assert_trained(compiled, optimizers, ())
        assert compiled["bf16_cl_compile"]["compiled"] is True  # CPU inductor here (g++)
        curvature = parts[f"curvature:{model}"]["result"]
        assert curvature["hvp_over_grad"] > 0 and curvature["lambda_max_s"] > 0
        assert curvature["hessian_num_samples"] == 16
    models = parts["models"]["result"]["models"]
    assert set(models) == {"wrn28_10", "vgg19_bn", "vit_tiny", "timm:resnet50"}
    for configs in models.values():
        _assert_trained(configs, ("base", "sam"), ("fp32", "bf16_cl"))
    estimates = parts["estimates"]["result"]["presets"]
    assert set(estimates) == set(presets())
    assert estimates["tlc_rho_sweep"]["jobs"] == 108 and estimates["variant_zoo"]["jobs"] == 36
    assert "not extrapolated" in estimates["edge_of_stability"]["not_estimated"]
    for name, e in estimates.items():
        if "not_estimated" not in e:
            assert e["missing"] == [] and e["fp32_gpu_h"] > 0 and e["bf16_cl_gpu_h"] > 0, name
    text = md.read_text()
    assert text.startswith("## GPU check: no GPU (CPU dry run)")
    assert "| `sam_wrn_cifar` | 6 |" in text and "skipped: needs a CUDA GPU" in text
    assert all(f"| {p.name} | ok |" in text for p in PARTS)


def test_parts_the_budget_cannot_fit_are_recorded_as_skipped(tmp_path):
    proc, results, md = _check(tmp_path, "--budget", "10", "--only", "env", timeout=120)
    assert proc.returncode == 1
    assert list(results["parts"]) == ["env", "data", "estimates"]
    for part in results["parts"].values():
        assert part["status"] == "skipped" and "budget (10 s) is spent" in part["error"]
    assert "| env | skipped |" in md.read_text()


def test_a_jobs_gpu_time_is_the_documented_formula():
    """epochs × (steps × batch / base images/s × cost in base steps) + evaluations + λ_max."""
    rate = {"base": 1000.0, "sam_over_base": 2.0, "eval_images_per_s": 4000.0, "lambda_max_s": 9}
    job = dict(model="resnet18", optimizer="sam", dataset="cifar100", batch=128)
    job.update(imbalance_ratio=None, epochs=200, eval_every=1)
    seconds, with_lambda = job_seconds(job, rate)
    assert with_lambda
    assert seconds == pytest.approx(200 * (50000 // 128) * 0.128 * 2.0 + 200 * 2.5 + 9)
    # a long-tailed CIFAR-100 (ratio 100: 10,847 images), an unmeasured variant (3 passes at
    # SAM's cost per pass), evaluated every 3rd epoch and at the last
    job.update(
        dataset="cifar100_lt", imbalance_ratio=100, optimizer="eisam", epochs=10, eval_every=3
    )
    seconds, _ = job_seconds(job, rate)
    assert seconds == pytest.approx(10 * (10847 // 128) * 0.128 * 3.0 + 4 * 2.5 + 9)
