"""Shared test helpers: real Hydra composition of the project's config tree, tiny budgets."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# one data cache for the whole session (MNIST-1D is generated, not downloaded)
_DATA = Path(
    os.environ.setdefault("SAM_RUNNER_DATA", str(Path.home() / ".cache" / "sam-runner-tests"))
)

# small, fast settings shared by the tests that train
# model=hf on a tiny from-config model (tests/test_models_hf.py, test_tokenized.py)
HF_TINY = [
    "model=hf",
    "base_optimizer=adamw",
    "base_optimizer.lr=3e-3",
    "scheduler=constant",
    "metrics.hessian.num_samples=16",
    "metrics.hessian.max_iter=10",
    "trainer.progress=none",
]

TINY = [
    "trainer.epochs=2",
    "dataset.num_samples=1000",
    "metrics.hessian.num_samples=256",
    "metrics.hessian.max_iter=20",
    "trainer.progress=none",
]


def compose(*overrides: str):
    """The composed config, exactly as `sam-run` would build it (real Hydra)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    from sam_runner.cli import register_resolvers
    from sam_runner.paths import config_dir

    register_resolvers()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        return hydra_compose("config", overrides=list(overrides))


def run_cli(argv: list[str], capsys=None) -> tuple[int, str, str]:
    """Run `sam-run` in this process (real Hydra app); returns (exit code, stdout, stderr)."""
    from sam_runner import cli

    old = sys.argv
    sys.argv = ["sam-run", *argv]
    code = 0
    try:
        cli.main()
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = old
    out, err = ("", "")
    if capsys is not None:
        captured = capsys.readouterr()
        out, err = captured.out, captured.err
    return code, out, err


def stopped_early_of(run_dir: Path, epochs: int) -> None:
    """Make a completed run in ``run_dir`` look stopped after its last epoch of ``epochs``: no
    summary, and a checkpoint whose stored settings say ``trainer.epochs=epochs`` (a resume
    with other settings is refused, and a run that really stops early is slow to stage)."""
    import torch

    (run_dir / "summary.json").unlink()
    path = run_dir / "checkpoints" / "last.pt"
    state = torch.load(path, weights_only=True)
    state["fingerprint"]["config"]["trainer.epochs"] = epochs
    torch.save(state, path)


def wait_for(condition, what: str, proc=None, timeout: float = 900.0, poll: float = 0.02) -> None:
    """Wait until ``condition()`` holds: the test then acts on that event, however slow the machine.
    Fails with a clear message if ``proc`` (a Popen) exits first, or after ``timeout`` seconds (a
    generous bound, only there so that a broken run cannot hang the suite)."""
    end = time.monotonic() + timeout
    while not condition():
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"the process exited (code {proc.returncode}) before {what}")
        if time.monotonic() > end:
            pytest.fail(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(poll)


def pytest_collection_modifyitems(config, items):  # noqa: ARG001 (pytest's hook signature)
    """Tests marked ``cuda`` skip, with the reason, where CUDA is absent (the default run here)."""
    marked = [item for item in items if item.get_closest_marker("cuda")]
    if not marked:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in marked:
        item.add_marker(skip)


@pytest.fixture
def tiny():
    return list(TINY)
