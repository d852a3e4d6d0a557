"""Ctrl-C and SIGTERM at any moment of any console script (#42): one line, exit 130 or 143."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import tomllib
from conftest import ROOT

SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
ENV = dict(os.environ, OMP_NUM_THREADS="1")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """1500 finished-looking jobs: every command has seconds of work on them."""
    root = tmp_path_factory.mktemp("sweep")
    for i in range(1500):
        (root / str(i)).mkdir()
        (root / str(i) / "summary.json").write_text(json.dumps({"status": "completed"}))
    return root


def _start(prog, sweep, tmp_path):
    """The console script as pip writes it: import the entry point, exit with its value."""
    module, function = SCRIPTS[prog].split(":")
    argv = {
        "sam-run": ["-m", "seed=range(0,3000)", f"hydra.sweep.dir={tmp_path / 's'}"],
        "sam-sweep-lines": ["seed=range(0,3000)"],
        "sam-index": [str(sweep), "--db", str(tmp_path / "db.sqlite")],
        "sam-report": [str(sweep), "--out", str(tmp_path / "report")],
    }.get(prog, [str(sweep)])
    code = f"import sys; from {module} import {function}; sys.exit({function}())"
    return subprocess.Popen(
        [sys.executable, "-c", code, *argv], cwd=tmp_path, env=ENV, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
    )  # fmt: skip


@pytest.mark.parametrize("delay", [0.05, 0.3])
@pytest.mark.parametrize("prog", sorted(SCRIPTS))
def test_ctrl_c_while_a_command_starts_is_one_line_exit_130(prog, delay, sweep, tmp_path):
    proc = _start(prog, sweep, tmp_path)
    time.sleep(delay)
    assert proc.poll() is None, "the command ended before the signal"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.count("\n") == 1, err
    assert err.startswith(f"{prog}: interrupted"), err


@pytest.mark.parametrize("prog", ["sam-report", "sam-index", "sam-eval", "sam-landscape"])
def test_sigterm_is_one_line_exit_143_and_nothing_half_written(prog, sweep, tmp_path):
    proc = _start(prog, sweep, tmp_path)
    # sam-landscape has under a second of work here (no job has weights): signalled sooner
    time.sleep(0.25 if prog == "sam-landscape" else 0.5)
    assert proc.poll() is None, "the command ended before the signal"
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143 and err.count("\n") == 1, err
    assert err.startswith(f"{prog}: SIGTERM: interrupted"), err
    assert not [p for p in [*tmp_path.rglob("*"), *sweep.rglob(".*")] if ".tmp" in p.name]
