"""On a real SLURM cluster (CI starts a one-node one with `source .ci/slurm.sh`): the submitit
launcher preset, the sbatch array of scripts/slurm_array.sbatch, and a requeued job resuming."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from sam_runner.sweep.lines import lines_main

# Minutes on a busy 2-core machine (each job imports torch), hence slow as well:
# CI runs them with `source .ci/slurm.sh && pytest -m slurm`.
pytestmark = [pytest.mark.slurm, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]
TINY = [
    "model=mlp",
    "dataset.num_samples=1200",
    "dataset.batch_size=64",
    "metrics.hessian.enabled=false",
    "trainer.device=cpu",
    "trainer.progress=lines",
]


def _absent(reason: str):
    """Skip with the reason; in CI (SAM_RUNNER_REQUIRE_SLURM=1) a missing cluster is a failure."""
    if os.environ.get("SAM_RUNNER_REQUIRE_SLURM") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def slurm():
    """Skips (with the reason) unless sbatch and squeue answer and a node is up."""
    if shutil.which("sbatch") is None or shutil.which("squeue") is None:
        _absent(
            "SLURM is not installed here (no sbatch/squeue on PATH); CI runs `source .ci/slurm.sh`"
        )
    try:
        ok = subprocess.run(["squeue", "-h"], capture_output=True, timeout=10).returncode == 0
        states = subprocess.run(
            ["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        ok, states = False, ""
    if not ok or not any(s in states for s in ("idle", "mixed", "allocated")):
        _absent(
            "SLURM is installed but no cluster answers (squeue/sinfo); start one with `source "
            ".ci/slurm.sh`"
        )


def sbatch(*args) -> str:
    # one torch thread per job: tiny models gain nothing from more, and a busy machine loses a lot
    out = subprocess.run(
        ["sbatch", "--parsable", "--export=ALL,OMP_NUM_THREADS=1", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def squeue_states(job: str) -> list[str]:
    """The states of the job's tasks still in the queue (a failing squeue is asked again)."""
    for _ in range(20):
        out = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=30
        )
        if out.returncode == 0:
            return out.stdout.split()
        time.sleep(0.5)
    raise AssertionError(f"squeue keeps failing: {out.stderr}")


def wait_gone(job: str, timeout: float = 400) -> None:
    """Poll squeue (sbatch --wait backs off to tens of seconds) until the job has left the queue."""
    deadline, empty = time.monotonic() + timeout, 0
    while empty < 2:  # twice in a row: a requeued job can be briefly between states
        empty = empty + 1 if not squeue_states(job) else 0
        assert time.monotonic() < deadline, f"SLURM job {job} still queued after {timeout} s"
        time.sleep(0.5)


def release_requeued(job: str) -> None:
    """Wait until the requeued ``job`` is pending, then start it now: SLURM holds a requeued job
    back (BeginTime) for a while."""
    deadline = time.monotonic() + 120
    while squeue_states(job) != ["PENDING"]:
        assert time.monotonic() < deadline, f"requeued job not pending: {squeue_states(job)}"
        time.sleep(0.2)
    # started in the same second as the requeue, slurmd rejects the job ("credential revoked")
    time.sleep(2)
    subprocess.run(["scontrol", "update", f"jobid={job}", "StartTime=now"], check=True, timeout=30)


def summary(job_dir: Path) -> dict:
    return json.loads((job_dir / "summary.json").read_text())


def epochs(job_dir: Path) -> list[int]:
    return [
        json.loads(line)["epoch"] for line in (job_dir / "metrics.jsonl").read_text().splitlines()
    ]


@pytest.mark.usefixtures("slurm")
def test_submitit_launcher_runs_a_sweep_as_a_job_array(tmp_path):
    sweep_dir = tmp_path / "sweep"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sam_runner.cli",
            "-m",
            "hydra/launcher=slurm",
            *TINY,
            "trainer.epochs=1",
            "seed=0,1",
            f"hydra.sweep.dir={sweep_dir}",
            "hydra.launcher.cpus_per_task=1",
            "hydra.launcher.timeout_min=10",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    for job, seed in ((0, 0), (1, 1)):
        s = summary(sweep_dir / str(job))
        assert s["status"] == "completed" and f"seed={seed}" in s["overrides"]
    assert (sweep_dir / ".submitit").is_dir()  # it went through submitit and SLURM
    assert "#0   completed" in out.stdout and "#1   completed" in out.stdout


@pytest.mark.usefixtures("slurm")
def test_sbatch_array_runs_one_line_per_task_in_the_sweep_layout(tmp_path, capsys):
    sweep_dir, lines = tmp_path / "sweep", tmp_path / "lines.txt"
    lines_main([*TINY, "trainer.epochs=1", "seed=0,1,2"])
    lines.write_text(capsys.readouterr().out)
    job = sbatch(
        "--array=0-2",
        "--cpus-per-task=1",
        f"--output={tmp_path}/slurm-%A_%a.out",
        str(REPO / "scripts" / "slurm_array.sbatch"),
        str(lines),
        str(sweep_dir),
    )
    wait_gone(job)
    for i in range(3):
        s = summary(sweep_dir / str(i))
        assert s["status"] == "completed", (tmp_path / f"slurm-{job}_{i}.out").read_text()[-2000:]
        assert f"seed={i}" in s["overrides"]
    # the same report as a -m sweep
    report = subprocess.run(
        ["sam-sweep-lines", "--report", str(sweep_dir), "--jobs", "3"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (
        report.returncode == 0
        and [line.split()[1] for line in report.stdout.splitlines()] == ["completed"] * 3
    )


@pytest.mark.beyond_ci  # CI's time: submitit's requeue and sam-eval's array cover these paths
@pytest.mark.usefixtures("slurm")
def test_a_requeued_job_resumes_from_its_checkpoint(tmp_path, capsys):
    sweep_dir, lines = tmp_path / "sweep", tmp_path / "lines.txt"
    lines_main([*TINY, "dataset.num_samples=4000", "trainer.epochs=6", "seed=0"])
    lines.write_text(capsys.readouterr().out)
    log = tmp_path / "task.out"
    job = sbatch(
        "--array=0-0",
        "--cpus-per-task=1",
        f"--output={log}",
        "--open-mode=append",
        str(REPO / "scripts" / "slurm_array.sbatch"),
        str(lines),
        str(sweep_dir),
    )
    ckpt = sweep_dir / "0" / "checkpoints" / "last.pt"
    deadline = time.monotonic() + 300
    while not ckpt.exists():
        assert time.monotonic() < deadline and squeue_states(job), "the job never checkpointed"
        time.sleep(0.1)
    assert not (sweep_dir / "0" / "summary.json").exists(), (
        "the job finished before the requeue: make it longer"
    )
    subprocess.run(["scontrol", "requeue", f"{job}_0"], check=True, timeout=30)
    release_requeued(f"{job}_0")
    deadline = time.monotonic() + 120
    while "restart 1" not in log.read_text():
        assert time.monotonic() < deadline, f"requeued job never restarted: {squeue_states(job)}"
        time.sleep(0.2)
    wait_gone(job)
    text = log.read_text()
    assert "restart 1" in text, text[-2000:]
    assert f"resuming {sweep_dir / '0'} from epoch" in text, text[-2000:]
    assert summary(sweep_dir / "0")["status"] == "completed"
    assert epochs(sweep_dir / "0") == [1, 2, 3, 4, 5, 6]  # nothing lost, nothing repeated


@pytest.mark.usefixtures("slurm")
def test_submitit_requeues_a_job_signalled_before_its_time_limit_and_it_resumes(tmp_path):
    """The launcher preset's timeout path: SLURM sends SIGUSR2 ``signal_delay_s`` before the time
    limit (here we send it, once the job has a checkpoint, rather than wait for the clock);
    submitit checkpoints the launcher, requeues the job and exits; the requeued job resumes from
    checkpoints/last.pt, and the waiting `sam-run -m` reports it completed: every epoch once."""
    sweep_dir = tmp_path / "sweep"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "sam_runner.cli",
            "-m",
            "hydra/launcher=slurm",
            *TINY,
            "dataset.num_samples=4000",
            "trainer.epochs=8",
            "seed=0",
            f"hydra.sweep.dir={sweep_dir}",
            "hydra.launcher.cpus_per_task=1",
            "hydra.launcher.timeout_min=10",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    try:
        ckpt, deadline = sweep_dir / "0" / "checkpoints" / "last.pt", time.monotonic() + 300
        while not ckpt.exists():
            assert time.monotonic() < deadline and proc.poll() is None, "the job never checkpointed"
            time.sleep(0.1)
        assert not (sweep_dir / "0" / "summary.json").exists(), (
            "the job finished before the signal: make it longer"
        )
        out = subprocess.run(
            ["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True, timeout=30
        ).stdout.split()
        job = out[out.index("RUNNING") - 1]
        subprocess.run(["scancel", "--signal=USR2", job], check=True, timeout=30)
        release_requeued(job)  # submitit requeued it
        stdout, stderr = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr[-3000:]
    assert "#0   completed" in stdout
    logs = "".join(p.read_text() for p in (sweep_dir / ".submitit").rglob("*_log.*"))
    assert "Requeued job" in logs and f"resuming {sweep_dir / '0'} from epoch" in logs, logs[-3000:]
    assert summary(sweep_dir / "0")["status"] == "completed"
    assert epochs(sweep_dir / "0") == list(range(1, 9))  # nothing lost, nothing repeated


def two_trained_jobs(sweep_dir: Path) -> Path:
    """A local sweep of two tiny completed jobs (seeds 0 and 1) for the commands that look at
    finished runs."""
    run = [sys.executable, "-m", "sam_runner.cli", "-m", *TINY, "trainer.epochs=1", "seed=0,1"]
    out = subprocess.run(
        [*run, f"hydra.sweep.dir={sweep_dir}"],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return sweep_dir


@pytest.mark.usefixtures("slurm")
def test_sam_eval_measures_a_sweep_as_a_slurm_array(tmp_path):
    """sam-eval with the training's SLURM preset: one array task per job folder, each writing its
    job's eval.json; a rerun with the same settings submits nothing."""
    sweep_dir = two_trained_jobs(tmp_path / "sweep")
    cmd = [
        sys.executable,
        "-m",
        "sam_runner.evaluation.cli",
        str(sweep_dir),
        "metrics.hessian.num_samples=128",
        "hydra/launcher=slurm",
        "hydra.launcher.cpus_per_task=1",
        "hydra.launcher.timeout_min=10",
        "trainer.progress=lines",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "submitted 2 task(s)" in out.stderr and (sweep_dir / ".sam-eval" / ".submitit").is_dir()
    for job in ("0", "1"):
        measured = json.loads((sweep_dir / job / "eval.json").read_text())
        assert measured["status"] == "completed" and measured["lambda_max"] > 0
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0 and "0 to measure, 2 already measured" in again.stdout
    assert "submitted" not in again.stderr


@pytest.mark.beyond_ci  # CI's time: submitit's requeue and sam-eval's array cover these paths
@pytest.mark.usefixtures("slurm")
def test_sam_landscape_computes_a_sweeps_slices_as_a_slurm_array(tmp_path):
    """sam-landscape hydra/launcher=slurm on a sweep: one array task per job, each writing its job's
    landscape.json; a rerun with the same options submits nothing."""
    sweep_dir = two_trained_jobs(tmp_path / "sweep")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [
        sys.executable,
        "-m",
        "sam_runner.landscape.cli",
        str(sweep_dir),
        "landscape.slices=1d",
        "landscape.points=7",
        "hydra/launcher=slurm",
        "hydra.launcher.cpus_per_task=1",
        "hydra.launcher.timeout_min=10",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "submitted 2 task(s)" in out.stderr
    assert (sweep_dir / ".sam-landscape" / ".submitit").is_dir()
    for job in ("0", "1"):
        folder = sweep_dir / job / "landscape"
        held = json.loads((folder / "landscape.json").read_text())
        rows = (folder / "slice_1d.csv").read_text().splitlines()
        assert held["basin_width_1d"] > 0 and len(rows) == 1 + 7  # the header and 7 points
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert again.returncode == 0 and "2 already done, 0 to compute" in again.stdout
    assert "submitted" not in again.stderr


@pytest.mark.beyond_ci  # CI's time: the other arrays cover the launcher; ~16 s
@pytest.mark.usefixtures("slurm")
def test_a_search_runs_n_jobs_trials_as_one_job_array(tmp_path):
    """hparams_search under hydra/launcher=slurm: 2 trials at once (n_jobs=2), one array, each
    task reporting its evaluations to its trial in the sweep folder's journal (the pruner)."""
    import optuna

    sweep_dir = tmp_path / "search"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sam_runner.cli",
            "-m",
            "hydra/launcher=slurm",
            "hparams_search=sam_rho_lr",
            *TINY,
            "trainer.epochs=2",
            "hydra.sweeper.n_trials=2",
            "hydra.sweeper.n_jobs=2",
            "hydra.sweeper.pruner=median",
            "hydra.sweeper.pruning.n_startup_trials=1",
            "hydra.sweeper.pruning.n_warmup_steps=0",
            f"hydra.sweep.dir={sweep_dir}",
            "hydra.launcher.cpus_per_task=1",
            "hydra.launcher.timeout_min=10",
        ],
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    from sam_runner.sweep.study import open_storage

    study = optuna.load_study(study_name="search", storage=open_storage(sweep_dir, None))
    assert len(study.trials) == 2
    for t in study.trials:
        job = summary(sweep_dir / str(t.number))
        assert t.state.name == {"completed": "COMPLETE", "pruned": "PRUNED"}[job["status"]]
        if t.state.name == "COMPLETE":
            assert t.value == job["val_acc"]
        lines = [json.loads(x) for x in (sweep_dir / str(t.number) / "metrics.jsonl").open()]
        # written by the job's own SLURM task into the shared journal
        assert t.intermediate_values == {r["epoch"]: r["val_acc"] for r in lines if "val_acc" in r}
    # both trials were tasks of one submitit array (<array id>_<task>)
    tasks = {p.name for p in (sweep_dir / ".submitit").iterdir() if re.match(r"\d+_\d+$", p.name)}
    assert len(tasks) == 2 and len({t.split("_")[0] for t in tasks}) == 1, tasks


@pytest.mark.beyond_ci  # 16 SLURM jobs, one array after the other: minutes CI has not got
@pytest.mark.usefixtures("slurm")
def test_a_preset_in_stages_runs_one_job_array_per_stage(tmp_path):
    """distill_sam_mini on SLURM: the teachers' array, then (when it has ended) the students',
    then the aligned students'; each student distilled from the teacher its stage:teacher/...
    reference names."""
    sweep_dir = tmp_path / "sweep"
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "sam_runner.cli",
            "-m",
            "experiment=distill_sam_mini",
            "hydra/launcher=slurm",
            *[o for o in TINY if not o.startswith("model=")],
            "trainer.epochs=1",
            f"hydra.sweep.dir={sweep_dir}",
            "hydra.launcher.cpus_per_task=1",
            "hydra.launcher.timeout_min=10",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    for stage, n in (("teacher", 4), ("student", 8), ("student_align", 4)):
        assert (sweep_dir / stage / ".submitit").is_dir()
        for job in range(n):
            assert summary(sweep_dir / stage / str(job))["status"] == "completed"
    # student 6: optimizer=sam, the SAM teacher (teacher job 2 or 3), seed 0: teacher job 2
    teacher = summary(sweep_dir / "student" / "6")["config"]["trainer.distill.teacher"]
    assert teacher == str((sweep_dir / "teacher" / "2").absolute())


@pytest.mark.beyond_ci  # CI's time (~31 s): submitit's array and tests/test_hf_peft.py cover it
@pytest.mark.usefixtures("slurm")
def test_a_peft_sweep_of_a_saved_hf_model_runs_as_a_job_array(tmp_path):
    """model=hf from a save_pretrained folder (the real loading path) with LoRA adapters through
    peft, two SAM variants as a submitit job array: each job completes, records the model, and
    leaves adapters that peft loads onto the saved model."""
    peft = pytest.importorskip("peft")
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    folder, sweep_dir = tmp_path / "tiny-llama", tmp_path / "sweep"
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=256, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32,
    )  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(folder)
    out = subprocess.run(
        [
            sys.executable, "-m", "sam_runner.cli", "-m", "hydra/launcher=slurm",
            "dataset=text", "dataset.block_size=16", "dataset.batch_size=8", "model=hf",
            f"model.name={folder}", "model.peft=lora", "base_optimizer=adamw",
            "scheduler=constant", "trainer.steps=3", "metrics.hessian.num_samples=16",
            "metrics.hessian.max_iter=5", "trainer.device=cpu", "trainer.progress=lines",
            "optimizer=sam,gsam", f"hydra.sweep.dir={sweep_dir}",
            "hydra.launcher.cpus_per_task=1", "hydra.launcher.timeout_min=10",
        ],
        capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert (sweep_dir / ".submitit").is_dir()
    for job, variant in ((0, "sam"), (1, "gsam")):
        s = summary(sweep_dir / str(job))
        assert s["status"] == "completed" and f"optimizer={variant}" in s["overrides"]
        assert s["peft"]["library"] == "peft" and 0 < s["trainable_parameters"] < s["parameters"]
        loaded = peft.PeftModel.from_pretrained(
            AutoModelForCausalLM.from_pretrained(folder), sweep_dir / str(job) / "adapter"
        )
        assert any("lora_B" in k and v.abs().sum() > 0 for k, v in loaded.state_dict().items())
