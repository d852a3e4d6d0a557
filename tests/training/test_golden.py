"""Golden results: one tiny run of each training feature, recorded before the training loop was
split into parts (sam_runner/training/), must leave the same metrics lines, summary and checkpoint
structure after it (and after any later change that is meant to move no result).

The files in tests/training/golden/ were written by this module with
``SAM_RUNNER_RECORD_GOLDEN=1``. Keys, strings, integers and the checkpoint's structure compare
exactly. Floats compare to 1e-4 relative here: a run is bit-identical on one machine (checked
with ``SAM_RUNNER_GOLDEN_EXACT=1`` when the files were recorded and after the move), but another
CPU's kernels may round a float32 sum differently in its last bits, which a few steps carry into
the fifth digit (an AMD EPYC against the Intel Xeon that recorded them: 1.2e-5 relative on a
GPT's, a LoRA run's and a distilled student's weight sums). They were written again when the
parameter groups were merged (one group per distinct hyperparameter, not per block: the
checkpoint's structure changed; every metric stayed within 1e-4 of the earlier files).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import optuna
import pytest
import torch
from conftest import TINY, compose, stopped_early_of

from sam_runner.sweep.study import open_storage, pruner_settings
from sam_runner.sweep.trial import TrialLink, env_overrides
from sam_runner.train import train

GOLDEN = Path(__file__).parent / "golden"
RECORD = os.environ.get("SAM_RUNNER_RECORD_GOLDEN") == "1"
EXACT = RECORD or os.environ.get("SAM_RUNNER_GOLDEN_EXACT") == "1"

QUIET = [*TINY, "trainer.threads=1", "metrics=off"]
MLP = ["model=mlp", "model.hidden=[32]"]
FEDERATED = [
    *QUIET,
    *MLP,
    "scheduler=constant",
    "federated.clients=4",
    "federated.rounds=2",
    "federated.local_steps=3",
]
GPT = [
    "dataset=text",
    "dataset.block_size=16",
    "dataset.batch_size=8",
    "trainer.steps=6",
    "model=gpt",
    "model.n_layer=1",
    "model.n_head=2",
    "model.n_embd=16",
    "base_optimizer=adamw",
    "base_optimizer.lr=3e-3",
    "trainer.threads=1",
    "trainer.progress=none",
    "metrics.hessian.num_samples=32",
    "metrics.hessian.max_iter=20",
]

# name -> the run's overrides (the default run measures λ_max; the rest are quick)
PLAIN = {
    "default": [*TINY, "trainer.threads=1"],
    "esam": [*QUIET, "optimizer=esam"],
    "look_sam": [*QUIET, "optimizer=look_sam", "optimizer.k=2"],
    "ouidecay": [*QUIET, "weight_decay=ouidecay", "weight_decay.every_n_steps=2"],
    "jsd": [*QUIET, "regularizer=jsd"],
    "fedavg": [*FEDERATED, "federated=fedavg"],
    "fedfft": [*FEDERATED, "federated=fedfft", "federated.fft_cutoff=0.3"],
    "swa": [*QUIET, "trainer.epochs=3", "trainer.weight_averaging=swa", "trainer.swa_start=2"],
    "sgs": [*QUIET, "dataset.sampler=sgs"],
    "gpt": GPT,
}


def _without_times(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.endswith("time_s")}


def _portable(value, tmp: Path):
    """A value with the test's temporary folder written as <tmp> (paths in configs)."""
    if isinstance(value, str):
        return value.replace(str(tmp), "<tmp>")
    if isinstance(value, dict):
        return {k: _portable(v, tmp) for k, v in value.items()}
    if isinstance(value, list):
        return [_portable(v, tmp) for v in value]
    return value


def _structure(value):
    """A checkpoint's structure: nested keys, and each tensor's dtype and shape."""
    if isinstance(value, dict):
        return {str(k): _structure(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_structure(v) for v in value]
    if isinstance(value, torch.Tensor):
        return f"{value.dtype} {list(value.shape)}"
    return type(value).__name__


def _files(run_dir: Path, tmp: Path) -> dict:
    """What the golden file holds of a finished run."""
    summary = json.loads((run_dir / "summary.json").read_text())
    # machine and moment (fast_path: what auto resolved to on this device)
    for key in ("train_time_s", "versions", "device", "git_commit", "fast_path"):
        summary.pop(key, None)
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    clock = state["clock"]
    state["clock"] = {k: v for k, v in clock.items() if k not in ("elapsed", "train_time")}
    weights = {k: float(v.double().abs().sum()) for k, v in state["model"].items()}
    return _portable(
        {
            "summary": _without_times(summary),
            "metrics": [_without_times(r) for r in lines],
            "checkpoint": _structure(state),
            "clock": state["clock"],
            "weights_abs_sum": weights,
        },
        tmp,
    )


# a config key added later (with its default) is no change of result: the recorded keys must
# hold their values, new ones may join
CONFIGS = (".summary.config", ".checkpoint.fingerprint.config", ".fingerprint.config")


def _same(got, want, where: str) -> None:
    if isinstance(want, dict) and where.endswith(CONFIGS):
        got = {k: v for k, v in got.items() if k in want}
    if isinstance(want, dict):
        assert isinstance(got, dict) and sorted(got) == sorted(want), (where, got, want)
        for k in want:
            _same(got[k], want[k], f"{where}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), (where, got, want)
        for i, (g, w) in enumerate(zip(got, want)):
            _same(g, w, f"{where}[{i}]")
    elif isinstance(want, float) and not isinstance(got, bool):
        if EXACT or not math.isfinite(want):
            assert got == want or (got != got and want != want), (where, got, want)
        else:
            assert math.isclose(got, want, rel_tol=1e-4, abs_tol=1e-7), (where, got, want)
    else:
        assert got == want, (where, got, want)


def _check(name: str, run_dir: Path, tmp: Path) -> None:
    got = _files(run_dir, tmp)
    path = GOLDEN / f"{name}.json"
    if RECORD:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(json.dumps(got, indent=1, sort_keys=True) + "\n")
        return
    _same(got, json.loads(path.read_text()), name)


@pytest.mark.parametrize("name", sorted(PLAIN))
def test_a_feature_s_run_leaves_its_golden_files(name, tmp_path):
    train(compose(*PLAIN[name]), tmp_path / "run", [])
    _check(name, tmp_path / "run", tmp_path)


def test_a_distillation_pair_leaves_its_golden_files(tmp_path):
    train(compose(*QUIET, *MLP, "trainer.epochs=1", "optimizer=base"), tmp_path / "teacher", [])
    student = [*QUIET, f"trainer.distill.teacher={tmp_path / 'teacher'}", "trainer.distill.align=1"]
    train(compose(*student), tmp_path / "run", [])
    _check("distill", tmp_path / "run", tmp_path)


def test_a_lora_run_leaves_its_golden_files(tmp_path):
    train(compose(*QUIET, "trainer.epochs=1", "optimizer=base"), tmp_path / "pretrained", [])
    lora = [f"model.init_from={tmp_path / 'pretrained'}", "model.peft=lora", "model.lora.rank=2"]
    train(compose(*QUIET, *lora), tmp_path / "run", [])
    _check("lora", tmp_path / "run", tmp_path)


def test_an_interrupted_and_resumed_run_leaves_its_golden_files(tmp_path):
    """Stopped after its first epoch's checkpoint (the run asked for one epoch), then the same
    run asked for three: it resumes and ends like the uninterrupted run."""
    steady = [*TINY, "trainer.threads=1", "scheduler=constant", "metrics.hessian.every_n_epochs=1"]
    train(compose(*steady, "trainer.epochs=3"), tmp_path / "whole", [])
    train(compose(*steady, "trainer.epochs=1"), tmp_path / "run", [])
    stopped_early_of(tmp_path / "run", 3)  # as if killed after that checkpoint
    train(compose(*steady, "trainer.epochs=3"), tmp_path / "run", [])
    _check("resumed", tmp_path / "run", tmp_path)
    whole, resumed = (_files(tmp_path / r, tmp_path) for r in ("whole", "run"))
    assert whole["metrics"] == resumed["metrics"]
    assert whole["weights_abs_sum"] == resumed["weights_abs_sum"]


def test_a_pruned_search_trial_leaves_its_golden_files(tmp_path, monkeypatch):
    """A trial of a real journal study whose median pruner (two finished trials at accuracy 0.99)
    stops it after its first evaluation."""
    study = optuna.create_study(
        study_name="search", direction="maximize", storage=open_storage(tmp_path, None)
    )
    settings = pruner_settings("median", {"n_startup_trials": 2, "n_warmup_steps": 0}, 3)
    study.set_user_attr("pruner", settings)
    x = {"x": optuna.distributions.FloatDistribution(0, 1)}
    for _ in range(2):
        t = study.ask(x)
        for epoch in (1, 2, 3):
            t.report(0.99, epoch)
        study.tell(t, 0.99)
    trial = study.ask(x)
    for line in env_overrides(tmp_path, None, "search", trial.number):
        key, value = line.split(".env_set.")[1].split("=", 1)
        monkeypatch.setenv(key, value.strip("'"))
    cfg = compose(*QUIET, "trainer.epochs=3", "dataset.val_split=0.2")
    summary = train(cfg, tmp_path / "run", [], TrialLink.from_env())
    assert summary["status"] == "pruned" and summary["pruned_epoch"] == 1
    _check("pruned", tmp_path / "run", tmp_path)
