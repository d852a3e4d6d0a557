"""sam-run as a user meets it: composition, help, and one-line errors on bad input."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, TINY, run_cli, wait_for


def test_cfg_job_prints_the_composed_config(capsys):
    code, out, _ = run_cli(["--cfg", "job", "optimizer=sam", "optimizer.rho=0.1"], capsys)
    assert code == 0
    assert "rho: 0.1" in out and "name: mnist1d" in out and "arch: auto" in out


def test_help_lists_the_groups(capsys):
    code, out, _ = run_cli(["--help"], capsys)
    assert code == 0
    assert out.startswith("sam-run is powered by Hydra")
    for group in (
        "dataset",
        "model",
        "optimizer",
        "base_optimizer",
        "scheduler",
        "logger",
        "trainer",
        "experiment",
    ):
        assert f"{group}:" in out

    assert "trainer.loss (a key of trainer):" in out and "mse " in out


def test_help_describes_every_option_in_whole_words():
    from sam_runner.help import config_groups

    lines = [line for line in config_groups().splitlines() if line.startswith("  ")]
    assert len(lines) > 50
    for line in lines:
        name, _, text = line.strip().partition(" ")
        assert text.strip(), f"{name} has no description"
        assert len(line) <= 130 and not text.rstrip().endswith(":"), line


UNKNOWN = [
    (
        ["optimizer=no_such_variant"],
        "optimizer=no_such_variant is unknown; choose one of asam, base, bsam, csam, eisam",
    ),
    (["optimizer=gearsam"], "optimizer=gearsam is unknown (did you mean gear_sam?)"),
    (
        ["trainer.epoch=1"],
        "trainer.epoch is not a key of trainer=default; did you mean trainer.epochs?",
    ),
    (["optimizr=sam"], "optimizr is not a key; did you mean optimizer?"),
    (["-m", "optimizer=sam,nope", "trainer.epochs=1"], "optimizer=nope is unknown; choose one of"),
    (
        ["-m", "optimizer=base,sam", "optimizer.rhoo=0.1,0.2"],
        "optimizer.rhoo is not a key of optimizer=base; did you mean optimizer.rho?",
    ),
    (["seed=0,,"], "seed=0,, is not a valid override"),
]


@pytest.mark.parametrize("argv,message", UNKNOWN, ids=[u[1].split(" ")[0] for u in UNKNOWN])
def test_unknown_option_or_key_is_one_line_exit_2_and_writes_nothing(
    argv, message, capsys, tmp_path
):
    """Checked with Hydra's own compose before Hydra runs: no run or sweep folder is made."""
    code, out, err = run_cli(
        [*argv, f"hydra.run.dir={tmp_path / 'run'}", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        capsys,
    )
    assert code == 2
    assert err.startswith(f"sam-run: error: {message}") and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists() and not (tmp_path / "sweep").exists()


def test_full_error_keeps_hydras_report_of_an_unknown_option(monkeypatch, tmp_path):
    from hydra.errors import MissingConfigException

    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(MissingConfigException, match="Could not find 'optimizer/no_such_variant'"):
        run_cli(["optimizer=no_such_variant", f"hydra.run.dir={tmp_path}"])


BAD = [
    (["optimizer.rho=-0.1"], "optimizer.rho=-0.1"),
    (["base_optimizer.lr=0"], "base_optimizer.lr=0"),
    (["base_optimizer.lr=nan"], "base_optimizer.lr=nan"),
    (["dataset.batch_size=0"], "dataset.batch_size=0"),
    (["dataset.batch_size=100000"], "dataset.batch_size=100000"),
    (["trainer.epochs=0"], "trainer.epochs=0"),
    (["trainer.device=cuda"], "trainer.device=cuda"),
    (["trainer.precision=fp8"], "trainer.precision='fp8'"),
    (["dataset=cifar10", "dataset.download=false"], "dataset cifar10"),
    # each of these ended in a traceback, or failed only once training had started
    (["trainer.label_smoothing=2"], "trainer.label_smoothing=2 must be a number in [0, 1]"),
    (["seed=abc"], "seed='abc' must be an integer"),
    (["model=cnn1d", "model.channels=0"], "model.channels=0 must be an integer >= 1"),
    (["metrics.ece_bins=0"], "metrics.ece_bins=0 must be an integer >= 1"),
    (["base_optimizer.momentum=-1"], "base_optimizer.momentum=-1 must be a number in [0, 1)"),
    (["trainer.eval_every_n_epochs=0"], "trainer.eval_every_n_epochs=0 must be an integer >= 1"),
    (["+trainer.foo=1"], "trainer.foo is not a key of trainer=default"),
    (
        ["+trainer.epoch=3"],
        "trainer.epoch is not a key of trainer=default; did you mean trainer.epochs?",
    ),
]


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="the cuda case needs a machine without CUDA"
)
@pytest.mark.parametrize("overrides,named", BAD, ids=[b[1] for b in BAD])
def test_bad_input_is_one_line_and_nonzero(overrides, named, capsys, tmp_path):
    run_dir = tmp_path / "run"
    env_data = os.environ.get("SAM_RUNNER_DATA")
    other_dataset = any(o.startswith("dataset=") for o in overrides)
    base = [f"dataset.data_dir={tmp_path / 'empty'}"] if other_dataset else TINY
    code, out, err = run_cli(
        [*overrides, *base, f"hydra.run.dir={run_dir}"]
        if other_dataset
        else [*base, *overrides, f"hydra.run.dir={run_dir}"],
        capsys,
    )
    assert code == 2
    lines = [line for line in err.strip().splitlines() if line.startswith("sam-run: error:")]
    assert len(lines) == 1 and named in lines[0], err
    assert "Traceback" not in err
    assert not run_dir.exists(), "a refused input leaves no run folder behind"
    assert env_data == os.environ.get("SAM_RUNNER_DATA")


def test_missing_dataset_names_the_files_to_put_where(capsys, tmp_path):
    empty = tmp_path / "nowhere"
    code, _, err = run_cli(
        [
            "dataset=cifar100",
            "dataset.download=false",
            f"dataset.data_dir={empty}",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        capsys,
    )
    assert code == 2
    assert "cifar-100-python.tar.gz" in err and str(empty) in err


def test_unwritable_run_folder(capsys, tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    code, _, err = run_cli([f"hydra.run.dir={blocker / 'run'}"], capsys)
    assert code == 2
    assert err.count("\n") == 1 and "hydra.run.dir=" in err and "Traceback" not in err


def test_full_error_shows_the_traceback(tmp_path):
    """HYDRA_FULL_ERROR=1 is the way to get the stack; a real process, real exit code."""
    env = dict(os.environ, HYDRA_FULL_ERROR="1")
    p = subprocess.run(
        [sys.executable, "-m", "sam_runner.cli", "optimizer.rho=-1", f"hydra.run.dir={tmp_path}"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert p.returncode != 0
    assert "Traceback" in p.stderr and "optimizer.rho=-1" in p.stderr


def test_ctrl_c_is_one_line_and_resumable_and_a_folder_refuses_other_settings(tmp_path, capsys):
    """One real process for Ctrl-C (SIGINT); the rest in this one (real Hydra, real runs)."""
    run_dir = tmp_path / "run"
    argv = [
        "trainer.epochs=8",
        "model=mlp",
        "dataset.num_samples=1000",
        "metrics.hessian.enabled=false",
        "trainer.progress=none",
        f"hydra.run.dir={run_dir}",
    ]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sam_runner.cli", *argv],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # Ctrl-C as in a terminal: a suite started in the background (`cmd &`) passes SIGINT on
        # ignored, and Python then never raises KeyboardInterrupt
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    metrics, ckpt = run_dir / "metrics.jsonl", run_dir / "checkpoints" / "last.pt"
    wait_for(ckpt.exists, "the first checkpoint", proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    said = re.fullmatch(
        r"sam-run: interrupted in epoch (\d+); the checkpoint holds epoch (\d+) \(step \d+\); "
        r"run the same command again to resume\n",
        err,
    )
    assert said, err
    held = torch.load(ckpt, weights_only=True)["clock"][
        "epoch"
    ]  # the epoch named is the checkpoint's
    assert int(said.group(2)) == held and int(said.group(1)) == held + 1
    assert not (run_dir / "summary.json").exists(), (
        "the run finished before the interrupt: make it longer"
    )

    hydra_files = {p.name: p.read_bytes() for p in (run_dir / ".hydra").iterdir()}
    # an interrupted run, other settings
    code, _, err = run_cli([*argv, "optimizer.rho=0.5", "seed=1"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(
        f"sam-run: error: run folder {run_dir} holds a run made with other settings (optimizer.rho "
        "(default) -> 0.5, seed (default) -> 1); use another folder"
    ), err
    # before Hydra rewrote it
    assert {p.name: p.read_bytes() for p in (run_dir / ".hydra").iterdir()} == hydra_files
    assert not (run_dir / "summary.json").exists()

    # the same run (how-it-runs keys aside)
    code, out, err = run_cli([*argv, "trainer.device=cpu"], capsys)
    assert code == 0 and "resuming" in err and out.startswith("completed:")
    epochs = [json.loads(line)["epoch"] for line in metrics.read_text().splitlines()]
    assert epochs == list(range(1, 9))  # each epoch once

    done = (run_dir / "summary.json").read_bytes()
    code, _, err = run_cli([*argv, "optimizer=asam"], capsys)  # a completed run, other settings
    assert code == 2 and "optimizer (default) -> asam" in err and err.count("\n") == 1
    assert (run_dir / "summary.json").read_bytes() == done
    code, out, _ = run_cli(argv, capsys)
    assert code == 0 and out.startswith("already completed")


def test_a_run_folder_that_cannot_be_made_is_one_line(capsys):
    code, _, err = run_cli(["hydra.run.dir=/proc/x"], capsys)
    assert code == 2 and err.count("\n") == 1
    assert err.startswith("sam-run: error: hydra.run.dir=/proc/x cannot be created or written")


def test_legal_but_unlikely_settings_warn_in_one_line_each():
    from conftest import compose

    from sam_runner.validate import warnings

    assert warnings(compose()) == []
    said = warnings(
        compose(
            "trainer.precision=fp16",
            "trainer.device=cpu",
            "trainer.epochs=2",
            "scheduler.warmup_epochs=2",
            "trainer.devices=64",
        )
    )
    assert len(said) == 3 and all("\n" not in w for w in said)
    assert said[0].startswith("trainer.precision=fp16 on a CPU")
    assert said[1].startswith("scheduler.warmup_epochs=2 >= trainer.epochs=2")
    assert said[2].startswith("trainer.devices=64 processes share")


def test_version_is_sam_runners(capsys):
    from sam_runner import __version__

    code, out, _ = run_cli(["--version"], capsys)
    assert code == 0 and out == f"sam-runner {__version__}\n"


@pytest.mark.slow  # CI's time (~9 s)
def test_a_run_says_what_it_was_and_keeps_third_party_logs_off_the_console(tmp_path):
    """A real process with a fresh matplotlib cache (its first-use INFO line must not show):
    the epoch lines label their time, the final curvature measurement is announced, and
    summary.json names the model built, the versions, the device and the commit."""
    env = dict(os.environ, MPLCONFIGDIR=str(tmp_path / "mpl"))
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "sam_runner.cli",
            *TINY,
            "trainer.progress=lines",
            f"hydra.run.dir={tmp_path / 'run'}",
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    assert "INFO" not in p.stderr + p.stdout, p.stderr
    epochs = [line for line in p.stderr.splitlines() if line.startswith("epoch ")]
    assert len(epochs) == 2 and all(re.search(r"\| elapsed \d+\.\ds$", line) for line in epochs)
    assert "measuring the Hessian's top eigenvalue(s) on 256 training samples" in p.stderr
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["model_built"] == "cnn1d" and summary["device"].startswith("cpu")
    from sam_runner import __version__

    assert summary["versions"]["sam_runner"] == __version__
    assert summary["versions"]["torch"] == __import__("torch").__version__
    assert re.fullmatch(r"[0-9a-f]{40}(\+dirty)?", summary["git_commit"])


# ------------------------------------------------------------ figures, keys, log file (#28)
def test_help_describes_every_key_of_the_composed_config(capsys):
    """`sam-run --help`: after the groups, the composed config with a line on each key, read
    from the comment beside the key in conf/ (a mapping's comment covers its keys); with
    overrides, the keys of what they choose."""
    code, out, _ = run_cli(["--help", "optimizer=tlc_sam", "model=mlp"], capsys)
    assert code == 0
    config = out.split("== Config (the composed config; after each key, what it is) ==")[1]
    lines = [line for line in config.splitlines() if re.match(r"^\s*\w+:", line)]
    assert len(lines) > 100
    described = []  # (indent, described) of the enclosing keys
    for line in lines:
        indent = len(line) - len(line.lstrip())
        described = [d for d in described if d[0] < indent]
        own, leaf = "  # " in line, bool(line.split("#")[0].split(":", 1)[1].strip())
        assert own or not leaf or any(d[1] for d in described), f"no description: {line}"
        described.append((indent, own))
    assert re.search(r"tau_target: 0.2 +# the Taylor error the controller steers to", config)
    assert re.search(r"hidden:\s+# widths of the hidden layers", config)
    assert re.search(r"format: png +# png \| pdf \| svg", config)


@pytest.mark.slow  # 10-30 s: outside CI's 30-minute budget; run with -m slow
def test_plots_format_draws_a_runs_figures_as_pdf_without_a_log_file_or_another_folder(
    tmp_path, capsys
):
    """plots.format=pdf: curves.pdf and reliability.pdf, no PNG; the folder is the one the
    command names without it (how a run runs); no empty cli.log beside them. The same command
    on the completed run with svg draws its figures as SVG; an unknown format is one line,
    exit 2, and no folder."""
    from sam_runner.sweep.plan import folder_name

    run = tmp_path / "run"
    argv = [*TINY, "trainer.epochs=1", f"hydra.run.dir={run}"]
    p = subprocess.run(
        [sys.executable, "-m", "sam_runner.cli", *argv, "plots.format=pdf"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    assert (run / "curves.pdf").read_bytes()[:4] == b"%PDF"
    assert (run / "reliability.pdf").read_bytes()[:4] == b"%PDF"
    assert not list(run.glob("*.png")) and not (run / "cli.log").exists()
    assert folder_name(["plots.format=pdf", "seed=1"]) == folder_name(["seed=1"])
    code, out, _ = run_cli([*argv, "plots.format=svg"], capsys)
    assert code == 0 and out.startswith("already completed")
    assert (run / "curves.svg").read_text().startswith("<?xml")
    code, _, err = run_cli([*TINY, f"hydra.run.dir={tmp_path / 'bad'}", "plots.format=eps"], capsys)
    assert code == 2 and not (tmp_path / "bad").exists()
    assert (
        err.strip() == "sam-run: error: plots.format='eps' is unknown; choose one of png, pdf, svg"
    )
