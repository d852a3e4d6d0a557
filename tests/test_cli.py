"""sam-run as a user meets it: composition, help, and one-line errors on bad input."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import ROOT, TINY, run_cli


def test_cfg_job_prints_the_composed_config(capsys):
    code, out, _ = run_cli(["--cfg", "job", "optimizer=sam", "optimizer.rho=0.1"], capsys)
    assert code == 0
    assert "rho: 0.1" in out and "name: mnist1d" in out and "arch: auto" in out


def test_help_lists_the_groups(capsys):
    code, out, _ = run_cli(["--help"], capsys)
    assert code == 0
    for group in ("dataset", "model", "optimizer", "base_optimizer", "scheduler", "logger", "trainer", "experiment"):
        assert f"{group}:" in out


def test_unknown_group_option_is_hydras_error(capsys, tmp_path):
    code, _, err = run_cli(["optimizer=no_such_variant", f"hydra.run.dir={tmp_path}"], capsys)
    assert code != 0
    assert "Could not find 'optimizer/no_such_variant'" in err
    assert "Traceback" not in err


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
]


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="the cuda case needs a machine without CUDA")
@pytest.mark.parametrize("overrides,named", BAD, ids=[b[1] for b in BAD])
def test_bad_input_is_one_line_and_nonzero(overrides, named, capsys, tmp_path):
    run_dir = tmp_path / "run"
    env_data = os.environ.get("SAM_RUNNER_DATA")
    other_dataset = any(o.startswith("dataset=") for o in overrides)
    base = [f"dataset.data_dir={tmp_path / 'empty'}"] if other_dataset else TINY
    code, out, err = run_cli([*overrides, *base, f"hydra.run.dir={run_dir}"] if other_dataset
                             else [*base, *overrides, f"hydra.run.dir={run_dir}"], capsys)
    assert code == 2
    lines = [line for line in err.strip().splitlines() if line.startswith("sam-run: error:")]
    assert len(lines) == 1 and named in lines[0], err
    assert "Traceback" not in err
    summary = run_dir / "summary.json"
    assert not summary.exists() or json.loads(summary.read_text())["status"] == "failed"
    assert env_data == os.environ.get("SAM_RUNNER_DATA")


def test_missing_dataset_names_the_files_to_put_where(capsys, tmp_path):
    empty = tmp_path / "nowhere"
    code, _, err = run_cli(["dataset=cifar100", "dataset.download=false", f"dataset.data_dir={empty}",
                            f"hydra.run.dir={tmp_path / 'run'}"], capsys)
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
    p = subprocess.run([sys.executable, "-m", "sam_runner.cli", "optimizer.rho=-1", f"hydra.run.dir={tmp_path}"],
                       capture_output=True, text=True, env=env, cwd=ROOT)
    assert p.returncode != 0
    assert "Traceback" in p.stderr and "optimizer.rho=-1" in p.stderr
