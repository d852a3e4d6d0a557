"""train(cfg): the run folder's files, determinism, exact resume, failure and divergence."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import threading

import pytest
import torch
from conftest import ROOT, TINY, compose, run_cli, stopped_early_of, wait_for

from sam_runner.errors import RunFolderConflict, UserError
from sam_runner.train import train

VOLATILE = {"time_s", "hessian_time_s"}


def rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def stable(rs):
    return [{k: v for k, v in r.items() if k not in VOLATILE} for r in rs]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    summary = train(compose(*TINY), run_dir, ["x=1"])
    return run_dir, summary


def test_run_leaves_the_contract_files(finished):
    run_dir, summary = finished
    lines = rows(run_dir)
    assert [r["epoch"] for r in lines] == [1, 2]
    for key in (
        "epoch",
        "step",
        "train_loss",
        "train_acc",
        "test_loss",
        "test_acc",
        "test_ece",
        "test_nll",
        "lr",
        "rho",
        "time_s",
    ):
        assert key in lines[-1], key
    assert "lambda_max" in lines[-1] and lines[-1]["lambda_max"] > 0
    on_disk = json.loads((run_dir / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    assert on_disk["status"] == "completed" and on_disk["overrides"] == ["x=1"]
    for key in ("test_acc", "test_ece", "test_nll", "lambda_max", "epochs", "train_time_s"):
        assert on_disk[key] is not None, key
    assert 0 <= on_disk["test_acc"] <= 1 and on_disk["test_acc"] == lines[-1]["test_acc"]
    state = torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)
    assert state["clock"]["epoch"] == 2 and state["clock"]["step"] == lines[-1]["step"]
    assert not list((run_dir / "checkpoints").glob(".*tmp*")), "temporary files left behind"


def test_same_seed_same_metrics(finished, tmp_path):
    run_dir, _ = finished
    train(compose(*TINY), tmp_path, [])
    assert stable(rows(tmp_path)) == stable(rows(run_dir))


def test_other_seed_other_metrics(finished, tmp_path):
    run_dir, _ = finished
    train(compose(*TINY, "seed=1"), tmp_path, [])
    assert stable(rows(tmp_path)) != stable(rows(run_dir))


def test_completed_run_is_not_retrained(finished, capsys):
    run_dir, summary = finished
    ckpt = run_dir / "checkpoints" / "last.pt"
    before = (ckpt.stat().st_mtime_ns, (run_dir / "metrics.jsonl").read_text())
    again = train(compose(*TINY), run_dir, ["x=1"])
    assert again == json.loads(json.dumps(summary))
    assert (ckpt.stat().st_mtime_ns, (run_dir / "metrics.jsonl").read_text()) == before
    assert "already completed" in capsys.readouterr().out


def test_completed_run_refuses_other_settings_and_stays_as_it_was(finished):
    run_dir, _ = finished
    before = {p: p.read_bytes() for p in (run_dir / "summary.json", run_dir / "metrics.jsonl")}
    with pytest.raises(
        RunFolderConflict,
        match=r"the completed run in .* belongs to a different run "
        r"\(optimizer.rho 0.05 -> 0.1\); use another run folder",
    ):
        train(
            compose(*TINY, "optimizer.rho=0.1", "trainer.device=cpu"),
            run_dir,
            ["optimizer.rho=0.1"],
        )
    assert {p: p.read_bytes() for p in before} == before


def test_resume_refuses_other_settings_naming_a_few(finished, tmp_path):
    # as if interrupted after its last checkpoint
    run_dir = _fresh_copy(finished[0], tmp_path / "run")
    ckpt = (run_dir / "checkpoints" / "last.pt").read_bytes()
    with pytest.raises(RunFolderConflict) as e:
        train(
            compose(
                *TINY,
                "seed=1",
                "optimizer.rho=0.5",
                "base_optimizer.lr=0.01",
                "trainer.label_smoothing=0.1",
            ),
            run_dir,
            [],
        )
    changes = (
        "seed 0 -> 1",
        "optimizer.rho 0.05 -> 0.5",
        "base_optimizer.lr 0.1 -> 0.01",
        "trainer.label_smoothing",
    )
    # a few, not all
    assert "belongs to a different run" in str(e.value) and "and 1 more" in str(e.value)
    assert sum(change in str(e.value) for change in changes) == 3
    assert not (run_dir / "summary.json").exists(), "a refused run writes nothing"
    assert (run_dir / "checkpoints" / "last.pt").read_bytes() == ckpt


def test_resume_accepts_how_it_runs_changes_and_checkpoints_from_before_configs(finished, tmp_path):
    run_dir = _fresh_copy(finished[0], tmp_path / "run")
    path = run_dir / "checkpoints" / "last.pt"
    state = torch.load(path, weights_only=True)
    del state["fingerprint"]["config"]  # a checkpoint of an older version
    torch.save(state, path)
    # older: no settings to compare
    summary = train(compose(*TINY, "optimizer.rho=0.5"), run_dir, [])
    assert summary["status"] == "completed"
    again = train(
        compose(
            *TINY,
            "optimizer.rho=0.5",
            "trainer.device=cpu",
            "trainer.progress=lines",
            "logger=wandb",
            "logger.mode=disabled",
            "dataset.data_dir=/elsewhere",
        ),
        run_dir,
        [],
    )
    assert again == summary  # "already completed": how a run runs is not what it computes


def test_curvature_epochs_measure_on_epochs_without_evaluation(tmp_path):
    train(
        compose(
            *TINY,
            "trainer.epochs=3",
            "metrics.hessian.every_n_epochs=1",
            "trainer.eval_every_n_epochs=2",
        ),
        tmp_path,
        [],
    )
    lines = rows(tmp_path)
    assert [r["epoch"] for r in lines if "lambda_max" in r] == [1, 2, 3]
    assert [r["epoch"] for r in lines if "test_acc" in r] == [2, 3]
    assert set(lines[0]) >= {"epoch", "step", "time_s", "lambda_max", "hessian_time_s"}


RESUME = [
    "trainer.epochs=6",
    "dataset.num_samples=5000",
    "metrics.hessian.num_samples=256",
    "metrics.hessian.every_n_epochs=2",
    "metrics.hessian.max_iter=20",
    "trainer.progress=lines",
]


@pytest.mark.slow  # 10-30 s: outside CI's 30-minute budget; run with -m slow
def test_sigkill_then_restart_ends_exactly_like_an_uninterrupted_run(tmp_path):
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    cmd = [sys.executable, "-m", "sam_runner.cli", *RESUME, f"hydra.run.dir={killed}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    m = killed / "metrics.jsonl"
    wait_for(lambda: m.exists() and len(m.read_text().splitlines()) >= 2, "the second epoch", proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert not (killed / "summary.json").exists(), "the run finished before it could be killed"
    done_epochs = len(rows(killed))
    assert 2 <= done_epochs < 6
    resumed = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming" in resumed.stderr
    train(compose(*RESUME), whole, [])
    got, want = rows(killed), rows(whole)
    assert [r["epoch"] for r in got] == [1, 2, 3, 4, 5, 6]  # no epoch lost, none repeated
    assert stable(got) == stable(want)
    s_killed, s_whole = (json.loads((d / "summary.json").read_text()) for d in (killed, whole))
    assert (
        s_killed["test_acc"] == s_whole["test_acc"]
        and s_killed["lambda_max"] == s_whole["lambda_max"]
    )


@contextlib.contextmanager
def requeue_signal_once(path):
    """SIGUSR2 to this process once ``path`` exists, handled as submitit's handler ends:
    sys.exit(-1).
    """

    done = threading.Event()

    def send():
        while not path.exists():  # the test fails on its own if the run ends without it
            if done.wait(0.01):
                return
        os.kill(os.getpid(), signal.SIGUSR2)

    previous = signal.signal(signal.SIGUSR2, lambda *_: sys.exit(-1))
    try:
        threading.Thread(target=send, daemon=True).start()
        yield
    finally:
        done.set()
        signal.signal(signal.SIGUSR2, previous)


def test_a_requeue_exit_is_an_interruption_not_a_failure(tmp_path):
    """submitit's SIGUSR2 handler requeues the job, then sys.exit()s in the middle of train(): the
    run is interrupted (the requeued job resumes from its checkpoint), not failed."""
    ckpt = tmp_path / "checkpoints" / "last.pt"
    cfg = compose(
        *(o for o in TINY if not o.startswith("trainer.epochs=")),
        "trainer.epochs=50",
        "metrics.hessian.enabled=false",
    )
    with requeue_signal_once(ckpt), pytest.raises(SystemExit):
        train(cfg, tmp_path, [])
    assert ckpt.exists() and not (tmp_path / "summary.json").exists()


def _fresh_copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    (dst / "summary.json").unlink()
    return dst


def test_truncated_checkpoint_is_an_error_naming_the_file(finished, tmp_path):
    run_dir = _fresh_copy(finished[0], tmp_path / "run")
    ckpt = run_dir / "checkpoints" / "last.pt"
    data = ckpt.read_bytes()
    ckpt.write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match=str(ckpt)):
        train(compose(*TINY), run_dir, [])
    assert ckpt.read_bytes() == data[: len(data) // 2], "the bad checkpoint must not be overwritten"


def test_checkpoint_of_another_model_is_an_error(finished, tmp_path):
    run_dir = _fresh_copy(finished[0], tmp_path / "run")
    with pytest.raises(UserError, match="belongs to a different run"):
        train(compose(*TINY, "model=mlp"), run_dir, [])


def test_divergence_is_a_result_not_a_crash(tmp_path, capsys):
    code, out, _ = run_cli(
        [*TINY, "base_optimizer.lr=1e20", "optimizer=base", f"hydra.run.dir={tmp_path}"], capsys
    )
    assert code == 0
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "diverged"
    assert "non-finite" in summary["error"] and "step" in summary["error"]
    assert "diverged" in out


def test_accumulation_matches_one_big_batch(tmp_path):
    """BN-free model: 4 micro-batches of 32 give the run of one batch of 128."""
    common = [*TINY, "model=mlp", "metrics.hessian.enabled=false", "trainer.epochs=1"]
    one = train(compose(*common), tmp_path / "one", [])
    four = train(compose(*common, "trainer.accumulate=4"), tmp_path / "four", [])
    a, b = rows(tmp_path / "one")[-1], rows(tmp_path / "four")[-1]
    assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
    assert one["test_acc"] == pytest.approx(four["test_acc"], abs=2e-3)
    assert one["test_nll"] == pytest.approx(four["test_nll"], rel=1e-3)


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_runs(precision, tmp_path):
    summary = train(
        compose(*TINY, f"trainer.precision={precision}", "metrics.hessian.enabled=false"),
        tmp_path,
        [],
    )
    assert summary["status"] == "completed" and summary["test_acc"] > 0.2


def test_label_noise_and_gradient_clip_run(tmp_path):
    summary = train(
        compose(
            *TINY,
            "dataset.label_noise=0.4",
            "trainer.gradient_clip=1.0",
            "metrics.hessian.enabled=false",
        ),
        tmp_path,
        [],
    )
    assert summary["status"] == "completed"


@pytest.mark.slow
def test_default_run_reaches_half_accuracy(tmp_path):
    """`sam-run` with no overrides: the embedded default reaches >= 50% test accuracy."""
    p = subprocess.run(
        [sys.executable, "-m", "sam_runner.cli", f"hydra.run.dir={tmp_path}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert p.returncode == 0, p.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["test_acc"] >= 0.5 and summary["lambda_max"] > 0
    assert "test_acc=" in p.stdout and "lambda_max=" in p.stdout


@pytest.mark.slow  # CI's time (~11 s; Muon is trained in the golden and build tests)
def test_muon_base_optimizer_trains_and_resumes(tmp_path):
    """Muon on the hidden matrices, AdamW on the rest; its state survives a checkpoint round
    trip."""
    # constant lr: stopping after epoch 1 of 1 == of 2
    common = [
        *TINY,
        "model=mlp",
        "base_optimizer=muon",
        "base_optimizer.lr=0.01",
        "scheduler=constant",
        "metrics.hessian.enabled=false",
    ]
    whole = train(compose(*common, "trainer.epochs=2"), tmp_path / "whole", [])
    assert whole["status"] == "completed" and whole["test_acc"] > 0.15  # above chance (0.1)
    train(compose(*common, "trainer.epochs=1"), tmp_path / "split", [])
    stopped_early_of(tmp_path / "split", 2)  # as if stopped after epoch 1 of 2
    resumed = train(compose(*common, "trainer.epochs=2"), tmp_path / "split", [])
    assert resumed["test_acc"] == whole["test_acc"] and resumed["test_nll"] == whole["test_nll"]


@pytest.mark.slow  # 30 s: the README command on real CIFAR-100 files
def test_gear_sam_on_cifar100_verbatim(tmp_path, monkeypatch):
    """`sam-run optimizer=gear_sam dataset=cifar100` where CIFAR-100 is present: the default model
    fits CIFAR (a CIFAR ResNet-18), and the run completes (torchvision's reader, files written
    here)."""
    from cifar_files import install

    install(monkeypatch, tmp_path / "data", "cifar100", n_train=64, n_test=50)
    cfg = compose(
        "optimizer=gear_sam",
        "dataset=cifar100",
        f"dataset.data_dir={tmp_path / 'data'}",
        "trainer.epochs=1",
        "dataset.batch_size=32",
        "metrics.hessian.num_samples=16",
        "metrics.hessian.max_iter=3",
        "trainer.progress=none",
    )
    summary = train(cfg, tmp_path / "run", [])
    assert summary["status"] == "completed" and summary["lambda_max"] is not None
    state = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert "layer4.1.conv2.weight" in state["model"], (
        "the default model on CIFAR is the CIFAR ResNet-18"
    )


GD = [
    "model=mlp",
    "model.hidden=[32,32]",
    "model.activation=tanh",
    "dataset.batch_size=full",
    "dataset.train_subset=300",
    "dataset.num_samples=1000",
    "trainer.loss=mse",
    "optimizer=base",
    "base_optimizer.momentum=0",
    "base_optimizer.weight_decay=0",
    "base_optimizer.lr=0.1",
    "scheduler=constant",
    "metrics.hessian.every_n_steps=10",
    "metrics.hessian.num_samples=300",
    "trainer.progress=lines",
]


def test_full_batch_gradient_descent_with_a_step_budget(tmp_path):
    """batch_size=full: one step an epoch over the whole (class-balanced) subset; trainer.steps
    ends the run; eval_every_n_steps sets when it evaluates and checkpoints; the tracked lines
    carry 2/η and the step's loss."""
    summary = train(compose(*GD, "trainer.steps=40", "trainer.eval_every_n_steps=15"), tmp_path)
    assert summary["status"] == "completed" and summary["step"] == 40 and summary["epochs"] == 40
    lines = rows(tmp_path)
    evaluated = [r["step"] for r in lines if "test_acc" in r]
    assert evaluated == [15, 30, 40]  # every 15 steps, and the last
    tracked = [r for r in lines if "lambda_max" in r and "test_acc" not in r]
    assert [r["step"] for r in tracked] == [10, 20, 30, 40]
    assert all(r["eos_threshold"] == pytest.approx(2 / 0.1) for r in tracked)
    assert all(r["eos_ratio"] == pytest.approx(r["lambda_max"] * 0.1 / 2) for r in tracked)
    assert all(math.isfinite(r["step_loss"]) for r in tracked)
    # the final line reuses the measurement of step 40, not a second one
    assert lines[-1]["lambda_max"] == tracked[-1]["lambda_max"]


@pytest.mark.slow  # CI's time (~17 s; killed and resumed runs: test_cli, scale/test_sweep)
def test_a_full_batch_run_killed_and_resumed_ends_like_an_uninterrupted_one(tmp_path):
    killed, whole = tmp_path / "killed", tmp_path / "whole"
    args = [*GD, "trainer.steps=60", "trainer.eval_every_n_steps=10"]
    cmd = [sys.executable, "-m", "sam_runner.cli", *args, f"hydra.run.dir={killed}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    m = killed / "metrics.jsonl"
    wait_for(
        lambda: (
            m.exists() and sum('"test_acc"' in line for line in m.read_text().splitlines()) >= 2
        ),
        "the second evaluation",
        proc,
    )
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (killed / "summary.json").exists(), "the run finished before it could be killed"
    resumed = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert resumed.returncode == 0 and "resuming" in resumed.stderr, resumed.stderr
    train(compose(*args), whole, [])
    assert stable(rows(killed)) == stable(rows(whole))
    s_killed, s_whole = (json.loads((d / "summary.json").read_text()) for d in (killed, whole))
    assert (
        s_killed["test_loss"] == s_whole["test_loss"]
        and s_killed["lambda_max"] == s_whole["lambda_max"]
    )


def test_a_full_batch_split_unevenly_into_micro_batches_is_still_full_batch_gd(tmp_path):
    """300 examples in 7 micro-batches (43 or 42 each): each micro-batch's loss is weighted by
    its size, so the steps, and the losses they lead to, are those of one batch of 300."""
    common = [*GD, "trainer.steps=8", "metrics.hessian.enabled=false"]
    train(compose(*common), tmp_path / "one")
    train(compose(*common, "trainer.accumulate=7"), tmp_path / "seven")
    one, seven = rows(tmp_path / "one")[-1], rows(tmp_path / "seven")[-1]
    for key in ("train_loss", "test_loss", "test_nll"):
        assert seven[key] == pytest.approx(one[key], rel=1e-5), key


@pytest.mark.parametrize("optimizer, passes", [("base", 1), ("sam", 2), ("eisam", 3)])
def test_summary_counts_grad_evals_per_step(optimizer, passes, tmp_path):
    overrides = [*TINY, f"optimizer={optimizer}", "metrics.hessian.enabled=false"]
    summary = train(compose(*overrides), tmp_path, [])
    assert summary["grad_evals_per_step"] == passes
    assert summary["perturbed_fraction"] == (0.0 if optimizer == "base" else 1.0)
    assert [r["grad_evals"] for r in rows(tmp_path)] == [passes * r["step"] for r in rows(tmp_path)]


def test_summary_counts_the_passes_of_a_random_schedule(tmp_path):
    cfg = compose(*TINY, "optimizer.perturb_schedule=random", "metrics.hessian.enabled=false")
    summary = train(cfg, tmp_path, [])
    steps, last = summary["step"], rows(tmp_path)[-1]
    perturbed = round(summary["perturbed_fraction"] * steps)
    assert 0 < perturbed < steps
    assert last["grad_evals"] == steps + perturbed
    assert summary["grad_evals_per_step"] == (steps + perturbed) / steps


def test_late_from_an_epoch_perturbs_every_step_of_that_epoch_on(tmp_path):
    """``perturb_from=2`` (an integer: an epoch) on a 2-epoch run: epoch 1 plain, epoch 2 SAM."""
    cfg = compose(*TINY, "dataset.num_samples=300", "metrics.hessian.enabled=false",
                  "optimizer.perturb_schedule=late", "optimizer.perturb_from=2")  # fmt: skip
    summary = train(cfg, tmp_path / "late", [])
    first, last = [r for r in rows(tmp_path / "late") if "grad_evals" in r][-2:]
    assert summary["status"] == "completed" and summary["perturbed_fraction"] == 0.5
    assert first["grad_evals"] == first["step"]  # epoch 1: one pass a step
    assert last["grad_evals"] == first["step"] + 2 * (last["step"] - first["step"])


def test_look_sam_and_esam_train_and_count_their_passes(tmp_path):
    """From the CLI's config: LookSAM k=2 refreshes every other step (2 passes, then 1); ESAM's
    steps cost 1 + ⅓ + the kept share of each micro-batch (γ = 0.5, two micro-batches)."""
    common = [*TINY, "metrics.hessian.enabled=false"]
    look = train(compose(*common, "optimizer=look_sam", "optimizer.k=2"), tmp_path / "look", [])
    n, refreshes = look["step"], -(-look["step"] // 2)
    assert look["status"] == "completed"
    assert look["grad_evals_per_step"] == pytest.approx((n + refreshes) / n, rel=1e-12)
    assert look["perturbed_fraction"] == pytest.approx(refreshes / n, rel=1e-12)
    esam = train(
        compose(*common, "optimizer=esam", "optimizer.gamma=0.5", "trainer.accumulate=2"),
        tmp_path / "esam",
        [],
    )
    assert esam["status"] == "completed" and esam["perturbed_fraction"] == 1.0
    # ⌊B/2⌋ of B rows per step: half the batch, a little less on an odd last batch
    assert 1 + 1 / 3 + 0.49 <= esam["grad_evals_per_step"] <= 1 + 1 / 3 + 0.5 + 1e-12
