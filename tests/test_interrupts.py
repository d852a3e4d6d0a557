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
    """30,000 finished-looking jobs: every command has a second or more of work on them even on a
    fast machine (with 1,500, sam-index and sam-landscape ended within half a second)."""
    root = tmp_path_factory.mktemp("sweep")
    for i in range(30_000):
        (root / str(i)).mkdir()
        (root / str(i) / "summary.json").write_text(json.dumps({"status": "completed"}))
    return root


def _script(prog: str, folder):
    """The console script's file as pip writes it, named as the command (the package leaves the
    signals to it)."""
    module, function = SCRIPTS[prog].split(":")
    script = folder / prog
    script.write_text(f"import sys\nfrom {module} import {function}\nsys.exit({function}())\n")
    return script


def _start(prog, sweep, tmp_path):
    """The console script as pip writes it: import the entry point, exit with its value."""
    argv = {
        "sam-run": ["-m", "seed=range(0,3000)", f"hydra.sweep.dir={tmp_path / 's'}"],
        "sam-sweep-lines": ["seed=range(0,3000)"],
        "sam-index": [str(sweep), "--db", str(tmp_path / "db.sqlite")],
        "sam-report": [str(sweep), "--out", str(tmp_path / "report")],
    }.get(prog, [str(sweep)])
    return subprocess.Popen(
        [sys.executable, str(_script(prog, tmp_path)), *argv], cwd=tmp_path, env=ENV, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as in a terminal
    )  # fmt: skip


# 0.3 s: within torch's import; sooner, a loaded machine may not have started Python's own
# signal handling yet (the package itself imports nothing before the command's handlers are in:
# test_a_console_script_catches_signals_before_it_imports_omegaconf)
@pytest.mark.parametrize("delay", [0.3, 0.5])
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


FAKE_GMPY2 = """
import os, pathlib, time
mark = pathlib.Path(os.environ["GMPY2_MARK"])
if mark.exists():  # sympy's import, after mpmath's
    raise ImportError("no gmpy2 here")
mark.write_text("importing")
time.sleep(30)
"""


def test_a_ctrl_c_that_a_library_swallows_still_stops_the_command(tmp_path):
    """mpmath (imported with torch) imports gmpy2 inside a bare ``except:``; a Ctrl-C landing
    there was swallowed, and a 3000-job sweep went on checking its jobs. A gmpy2 that takes its
    time holds the window open: the signal lands in it, and the command still stops."""
    (tmp_path / "fake").mkdir()
    (tmp_path / "fake" / "gmpy2.py").write_text(FAKE_GMPY2)
    mark = tmp_path / "mark"
    env = dict(ENV, PYTHONPATH=str(tmp_path / "fake"), GMPY2_MARK=str(mark))
    module, function = SCRIPTS["sam-run"].split(":")
    code = f"import sys; from {module} import {function}; sys.exit({function}())"
    argv = ["-m", "seed=range(0,30)", f"hydra.sweep.dir={tmp_path / 's'}"]
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *argv], cwd=tmp_path, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert mark.exists(), "the command never imported gmpy2"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.count("\n") == 1, err
    assert err.startswith("sam-run: interrupted"), err
    assert not list((tmp_path / "s").glob("*/summary.json")), "a job ran after the Ctrl-C"


def test_a_swallowed_signal_is_raised_once_at_the_next_unit_of_progress():
    from sam_runner import interrupts
    from sam_runner.progress import Counter, Progress

    before = signal.getsignal(signal.SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        interrupts.catch_signals()
        counter, bar = Counter(3, "checks", "none"), Progress("none", 1, 3).epoch_bar(0)
        for unit in (counter.update, lambda: bar.update(0.0, 0, 1)):
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(5)
            except:  # noqa: E722 - as a library's bare except does
                pass
            with pytest.raises(KeyboardInterrupt):
                unit()
            unit()  # once, not again
    finally:
        signal.signal(signal.SIGINT, before)
        interrupts.PENDING.clear()


CONVERTING = """
import os, signal, sys, time
from omegaconf import OmegaConf
from sam_runner import cli
from sam_runner.help import config_groups

def groups(*args):  # Hydra's help resolves it: Ctrl-C lands inside the composition
    try:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(1.0)
    except KeyboardInterrupt as e:  # as a library may: the signal turned into its own error
        raise ValueError("a library's own error") from e
    return config_groups(*args)

OmegaConf.register_new_resolver("sam_runner_groups", groups, replace=True)
sys.argv = ["sam-run", "--help"]
from sam_runner.entry_points import sam_run
sys.exit(sam_run())
"""


def test_ctrl_c_during_help_is_one_line_even_where_a_library_converts_it(tmp_path):
    """#58 item 10: Ctrl-C while `sam-run --help` composed came out as Hydra's traceback of a
    ConfigCompositionException; --help and --cfg now take the signal once they are done."""
    proc = subprocess.run(
        [sys.executable, "-c", CONVERTING], cwd=tmp_path, env=ENV, text=True,
        capture_output=True, timeout=120,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert (proc.returncode, proc.stderr) == (130, "sam-run: interrupted\n"), proc.stderr[-2000:]


def test_a_console_script_catches_signals_before_it_imports_omegaconf(tmp_path):
    """The package registers its OmegaConf resolver on import, except in a console script's own
    process, whose entry point catches signals first and then registers it."""
    import sam_runner
    from sam_runner.entry_points import COMMANDS

    assert tuple(COMMANDS) == sam_runner.CONSOLE_SCRIPTS == tuple(SCRIPTS)
    out = subprocess.run(
        [sys.executable, "-X", "importtime", str(_script("sam-run", tmp_path)), "--version"],
        capture_output=True, text=True, env=ENV, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    names = [line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines()]
    assert names.index("sam_runner.interrupts") < names.index("omegaconf"), names[:80]


def test_a_ctrl_c_while_a_file_is_written_waits_for_the_whole_file(tmp_path):
    """torch's zip writer turned a KeyboardInterrupt inside it into its own RuntimeError (a
    SIGTERM during a checkpoint's save ended the run with exit 1): the signal now waits for the
    file, then stops the command."""
    from sam_runner import interrupts
    from sam_runner.runfiles import atomic_write

    old = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupts.catch_signals()

    def write(f):
        f.write(b"a")
        os.kill(os.getpid(), signal.SIGINT)  # arrives while the file is written
        f.write(b"b")

    try:
        with pytest.raises(KeyboardInterrupt):
            atomic_write(tmp_path / "x", write)
        assert (tmp_path / "x").read_bytes() == b"ab"
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        interrupts.PENDING.clear()
