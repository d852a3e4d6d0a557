"""Sweeps: job numbering, the resume/skip rule under SIGKILL, failed jobs, refused folders."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import wait_for

from sam_runner.errors import UserError
from sam_runner.runfiles import write_json
from sam_runner.sweep.callback import report
from sam_runner.sweep.lines import lines_main
from sam_runner.sweep.plan import check_folder, check_run_folder, expand

# a job of a few seconds at most: tiny data, tiny model, no Hessian
TINY = [
    "model=mlp",
    "dataset.num_samples=1200",
    "dataset.batch_size=64",
    "metrics.hessian.enabled=false",
    "trainer.device=cpu",
    "trainer.progress=lines",
]


# one torch thread per job: tiny models gain nothing from more, and a busy machine loses a lot
ENV = dict(os.environ, OMP_NUM_THREADS="1")


def sam_run(*args, env=ENV, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "sam_runner.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


def rows(job_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (job_dir / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------- expansion and folder rules (in-
# process)
def test_expand_numbers_jobs_as_hydra_basic_sweeper_does():
    jobs = expand(["optimizer=sam,base", "seed=0,1", "trainer.epochs=2"])
    assert jobs == [
        ["optimizer=sam", "seed=0", "trainer.epochs=2"],
        ["optimizer=sam", "seed=1", "trainer.epochs=2"],
        ["optimizer=base", "seed=0", "trainer.epochs=2"],
        ["optimizer=base", "seed=1", "trainer.epochs=2"],
    ]
    # sweeper params (an experiment preset's) come first, as in BasicSweeper.sweep
    assert expand(["seed=range(0,2)"], {"optimizer": "base,sam"})[1] == ["optimizer=base", "seed=1"]


def test_sweep_lines_prints_one_shell_quoted_line_per_job(capsys):
    lines_main(["seed=0,1,2", 'dataset.data_dir="/a b"'])
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"seed={i} 'dataset.data_dir=\"/a b\"'" for i in range(3)]
    lines_main(["experiment=example"])  # the preset sweeps optimizer x seed in hydra.sweeper.params
    assert capsys.readouterr().out.splitlines() == [
        "optimizer=base seed=0 experiment=example",
        "optimizer=base seed=1 experiment=example",
        "optimizer=sam seed=0 experiment=example",
        "optimizer=sam seed=1 experiment=example",
    ]
    with pytest.raises(SystemExit) as e:
        lines_main(["seed=0,,"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sam-sweep-lines: error: cannot expand seed=0,,") and "\n" not in err


def test_a_folder_of_a_different_sweep_is_refused(tmp_path):
    jobs = expand(["seed=0,1", "optimizer.rho=0.1"])
    (tmp_path / "1" / ".hydra").mkdir(parents=True)
    (tmp_path / "1" / ".hydra" / "overrides.yaml").write_text(
        "- seed=1\n- optimizer.rho=0.1\n- trainer.device=cpu\n"
    )
    check_folder(tmp_path, jobs)  # same job (how-to-run keys aside): accepted
    (tmp_path / "1" / ".hydra" / "overrides.yaml").write_text("- seed=1\n- optimizer.rho=0.2\n")
    with pytest.raises(
        UserError,
        match=r"holds jobs of a different sweep: job 1 was run with seed=1 optimizer.rho=0.2",
    ):
        check_folder(tmp_path, jobs)
    # summary.json alone (no .hydra) identifies a job too
    write_json(
        tmp_path / "0" / "summary.json",
        {"status": "completed", "overrides": ["seed=5", "optimizer.rho=0.1"]},
    )
    with pytest.raises(UserError, match="job 0"):
        check_folder(tmp_path, jobs)


def test_report_has_one_line_per_job_and_names_what_did_not_complete(tmp_path):
    write_json(
        tmp_path / "0" / "summary.json",
        {"status": "completed", "test_acc": 0.5, "overrides": ["a=1", "s=0"]},
    )
    write_json(
        tmp_path / "1" / "summary.json",
        {"status": "failed", "error": "boom", "overrides": ["a=1", "s=1"]},
    )
    lines, failed = report(tmp_path, n_jobs=3)
    assert len(lines) == 3
    assert lines[0].split() == ["#0", "completed", "test_acc=0.5000", "s=0"]
    assert lines[1].split()[:4] == ["#1", "failed", "test_acc=-", "s=1"] and lines[1].endswith(
        "[boom]"
    )
    assert lines[2].split()[:2] == ["#2", "missing"] and lines[2].endswith("(overrides unknown)")
    assert failed == ["#1 (failed: s=1)", "#2 (missing: overrides unknown)"]
    write_json(
        tmp_path / "2" / "summary.json", {"status": "completed", "test_acc": 0.5, "overrides": []}
    )
    assert report(tmp_path, n_jobs=3)[0][2].endswith("(defaults)")  # known to be none


def test_a_run_folder_refuses_other_overrides_only_when_it_holds_a_run_to_continue(tmp_path):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- optimizer.rho=-1\n- trainer.epochs=3\n")
    write_json(tmp_path / "summary.json", {"status": "failed", "error": "bad rho"})
    # nothing to continue: free
    check_run_folder(tmp_path, ["optimizer.rho=0.1", "trainer.epochs=3"])
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "last.pt").write_bytes(b"")
    with pytest.raises(
        UserError,
        match=r"run folder .* holds a run made with other settings \(optimizer.rho -1 "
        r"-> 0.1, seed \(default\) -> 2\); use another folder \(hydra.run.dir=...\), "
        r"or delete",
    ):
        check_run_folder(tmp_path, ["optimizer.rho=0.1", "trainer.epochs=3", "seed=2"])
    # how a run runs (device, progress, logger, launcher) is not a different run
    check_run_folder(
        tmp_path,
        [
            "optimizer.rho=-1",
            "trainer.epochs=3",
            "trainer.device=cpu",
            "logger=wandb",
            "logger.project=p",
            "hydra/launcher=slurm",
            "dataset.data_dir=/d",
        ],
    )


# ---------------------------------------------------------------- real sweeps (subprocesses)
def test_sigkill_mid_job_then_same_command_resumes_and_never_repeats(tmp_path):
    sweep_dir = tmp_path / "sweep"
    args = ["-m", *TINY, "trainer.epochs=4", "seed=0,1", f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sam_runner.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=ENV,
    )
    ckpt = sweep_dir / "0" / "checkpoints" / "last.pt"
    wait_for(ckpt.exists, "job 0's first checkpoint", proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert ckpt.exists(), "job 0 never checkpointed"
    assert not (sweep_dir / "0" / "summary.json").exists(), (
        "job 0 finished before the kill: make it longer"
    )
    assert not (sweep_dir / "1").exists()

    again = sam_run(*args)
    assert again.returncode == 0, again.stderr
    # from the checkpoint, not from scratch
    assert f"resuming {sweep_dir / '0'} from epoch" in again.stderr
    # job 1 had not started: it runs from scratch
    assert f"resuming {sweep_dir / '1'}" not in again.stderr
    for job in ("0", "1"):
        summary = json.loads((sweep_dir / job / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["epochs"] == 4
        assert [r["epoch"] for r in rows(sweep_dir / job)] == [1, 2, 3, 4]  # every epoch once
    assert "#0   completed" in again.stdout and "#1   completed" in again.stdout

    before = {job: (sweep_dir / job / "metrics.jsonl").read_bytes() for job in ("0", "1")}
    third = sam_run(*args)
    assert third.returncode == 0, third.stderr
    assert third.stdout.count("already completed") == 2  # skipped, not run twice
    assert {job: (sweep_dir / job / "metrics.jsonl").read_bytes() for job in ("0", "1")} == before


def test_a_bad_value_in_any_job_is_refused_before_any_job_runs(tmp_path):
    """Every job's config is checked first: job 1's ρ < 0 stops the sweep before job 0 trains."""
    sweep_dir = tmp_path / "sweep"
    out = sam_run(
        "-m", *TINY, "trainer.epochs=1", "optimizer.rho=0.05,-1", f"hydra.sweep.dir={sweep_dir}"
    )
    assert out.returncode == 2
    assert out.stderr == "sam-run: error: optimizer.rho=-1 must be a finite number >= 0\n"
    assert not sweep_dir.exists()


def test_a_failed_job_is_recorded_the_sweep_goes_on_and_ends_nonzero(tmp_path):
    """A job that fails at run time (its batch is larger than the training set of 960, which
    only the data tells) is recorded, and the sweep goes on."""
    sweep_dir = tmp_path / "sweep"
    args = [
        "-m",
        *TINY,
        "trainer.epochs=1",
        "dataset.batch_size=2000,64",
        f"hydra.sweep.dir={sweep_dir}",
    ]
    out = sam_run(*args)
    assert out.returncode == 1
    failed = json.loads((sweep_dir / "0" / "summary.json").read_text())
    assert failed["status"] == "failed" and "larger than the training set" in failed["error"]
    assert "\n" not in failed["error"] and "dataset.batch_size=2000" in failed["overrides"]
    # went on
    assert json.loads((sweep_dir / "1" / "summary.json").read_text())["status"] == "completed"
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "sam-run: error: 1 of 2 job(s) failed or did not finish: "
        "#0 (failed: dataset.batch_size=2000)"
    )
    assert [
        line.split()[:2] for line in out.stdout.splitlines() if line.strip().startswith("#")
    ] == [["#0", "failed"], ["#1", "completed"]]

    tiny = [o for o in TINY if not o.startswith("dataset.batch_size=")]  # swept here instead
    other = sam_run(
        "-m", *tiny, "trainer.epochs=1", "dataset.batch_size=32,64", f"hydra.sweep.dir={sweep_dir}"
    )
    assert other.returncode == 2
    err = other.stderr.strip()
    assert err.startswith(
        f"sam-run: error: sweep folder {sweep_dir} holds jobs of a different sweep: job 0"
    )
    assert "\n" not in err


def test_slurm_launcher_without_sbatch_is_a_one_line_error(tmp_path):
    env = dict(os.environ, PATH=str(Path(sys.executable).parent))
    out = sam_run(
        "-m", "hydra/launcher=slurm", "seed=0,1", f"hydra.sweep.dir={tmp_path / 's'}", env=env
    )
    assert out.returncode == 2
    err = out.stderr.strip()
    assert (
        err.startswith("sam-run: error: hydra/launcher=slurm needs SLURM's sbatch on PATH")
        and "\n" not in err
    )
    assert not (tmp_path / "s" / "0").exists()


# ---------------------------------------------------------------- default folders, repeats
def test_folder_names_come_from_the_command_and_are_valid_run_dir_values():
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from sam_runner.sweep.plan import folder_name

    assert folder_name([]) == "default"
    assert folder_name(["trainer.epochs=3"]) == "trainer.epochs-3"
    assert folder_name(["experiment=tlc_rho_sweep_mini"]) == "tlc_rho_sweep_mini"
    # how a run runs is not in its name: adding W&B or a device to a command keeps its folder
    plain = folder_name(["seed=0,1", "optimizer=sam,gear_sam"])
    assert plain == "optimizer-sam+gear_sam__seed-0+1"
    assert (
        folder_name(
            [
                "optimizer=sam,gear_sam",
                "logger=wandb",
                "logger.mode=offline",
                "trainer.device=cpu",
                "trainer.progress=none",
                "trainer.threads=1",
                "trainer.on_locked=wait",
                "dataset.num_workers=8",
                "seed=0,1",
            ]
        )
        == plain
    )
    long = folder_name([f"optimizer.rho={'1' * 200}"])
    assert len(long) == 120
    parser = OverridesParser.create()
    for name in (plain, long, folder_name(["model.name='a b/c'", "+trainer.x=1"])):
        parsed = parser.parse_override(f"hydra.run.dir=outputs/{name}")
        assert parsed.value() == f"outputs/{name}" and not parsed.is_sweep_override()


def test_the_same_sweep_command_resumes_in_the_same_folder(tmp_path, monkeypatch, capsys):
    """No hydra.sweep.dir: the folder is named after the command, so running it again skips the
    finished jobs instead of starting a new sweep; adding how-it-runs keys keeps the folder."""
    from conftest import run_cli

    monkeypatch.chdir(tmp_path)
    args = ["-m", *TINY, "trainer.epochs=1", "seed=0,1"]
    code, out, err = run_cli(args, capsys)
    assert code == 0, err
    (folder,) = (tmp_path / "multirun").iterdir()
    assert folder.name.startswith("dataset.batch_size-64__") and "seed-0+1" in folder.name
    code, out, err = run_cli([*args, "trainer.progress=none", "logger=none"], capsys)
    assert code == 0 and out.count("already completed") == 2, out
    assert list((tmp_path / "multirun").iterdir()) == [folder]


def test_a_variant_that_ignores_a_swept_option_runs_once(tmp_path, capsys):
    """base ignores ρ: `optimizer=base,sam optimizer.rho=0.02,0.1` is 3 jobs, not 4, numbered the
    same on every run of the command; the sweep says what it left out."""
    from conftest import run_cli

    args = ["optimizer=base,sam", "optimizer.rho=0.02,0.1"]
    assert expand(args) == [
        ["optimizer=base"],
        ["optimizer=sam", "optimizer.rho=0.02"],
        ["optimizer=sam", "optimizer.rho=0.1"],
    ]
    code, out, err = run_cli(
        ["-m", *TINY, "trainer.epochs=1", *args, f"hydra.sweep.dir={tmp_path}"], capsys
    )
    assert code == 0, err
    assert "1 job(s) left out, each the same as one that runs" in err
    assert "optimizer=base optimizer.rho=0.1" not in out and sorted(
        p.name for p in tmp_path.iterdir() if p.is_dir()
    ) == ["0", "1", "2"]
    from sam_runner.results.report import build_report

    report = build_report(tmp_path)
    assert len(report.jobs) == 3 and [g["variant"] for g in report.groups].count("base") == 1


def test_sweep_lines_report_and_sam_report_count_the_same_jobs(tmp_path, capsys):
    """A half-run sweep: both count the jobs the sweep calls for, missing ones included."""
    from conftest import run_cli

    from sam_runner.results.report import build_report

    code, _, err = run_cli(
        ["-m", *TINY, "trainer.epochs=1", "seed=0,1,2", f"hydra.sweep.dir={tmp_path}"], capsys
    )
    assert code == 0, err
    import shutil

    shutil.rmtree(tmp_path / "1")
    shutil.rmtree(tmp_path / "2")
    lines, failed = report(tmp_path)
    assert len(lines) == 3 and len(failed) == 2
    assert len(build_report(tmp_path).jobs) == 3


def test_a_density_models_report_line_gives_its_bits_per_dimension(tmp_path):
    write_json(
        tmp_path / "0" / "summary.json",
        {"status": "completed", "test_bpd": 0.6755, "test_ll": -29.9, "overrides": ["s=0"]},
    )
    lines, _ = report(tmp_path, n_jobs=1)
    assert lines[0].split() == ["#0", "completed", "test_bpd=0.6755", "s=0"]
