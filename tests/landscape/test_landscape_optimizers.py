"""landscape.pairs=optimizers: every pair of a sweep's jobs that differ only in base optimizer and
seed (within one optimizer and across two), and sam-report's barrier matrix by optimizer pair."""

from __future__ import annotations

import csv
import functools
import json
import shutil
import statistics

import pytest
from landscape_helpers import MLP, session_root, train_into

from sam_runner.landscape.cli import main
from sam_runner.results.report import main as report_main

# as `sam-run -m base_optimizer=adamw,lion seed=0,1` lays them out, and one SAM job that differs
# in more than optimizer and seed (paired with nothing)
JOBS = [
    ("base", "adamw", 0),
    ("base", "adamw", 1),
    ("base", "lion", 0),
    ("base", "lion", 1),
    ("sam", "adamw", 0),
]
OPTIMIZER_PAIRS = [("0", "1"), ("0", "2"), ("0", "3"), ("1", "2"), ("1", "3"), ("2", "3")]
SEED_PAIRS = [("0", "1"), ("2", "3")]
ARGS = ["landscape.alphas=5", "trainer.progress=none"]


@functools.lru_cache(maxsize=None)
def sweep_once():
    root = session_root() / "optimizer_sweep"
    for num, (variant, base, seed) in enumerate(JOBS):
        overrides = [*MLP, f"optimizer={variant}", f"base_optimizer={base}", f"seed={seed}"]
        train_into(root / str(num), overrides)
    return root


@pytest.fixture
def sweep(tmp_path):
    return shutil.copytree(sweep_once(), tmp_path / "sweep")


def barrier(sweep, a, b) -> dict:
    return json.loads((sweep / a / "landscape" / b / "landscape.json").read_text())


def connected(sweep) -> set:
    return {
        (p.parent.parent.parent.name, p.parent.name)
        for p in sweep.glob("*/landscape/*/landscape.json")
    }


@pytest.mark.slow  # about 30 s on two loaded cores: five runs and six pairs
def test_optimizer_pairs_add_the_across_pairs_to_the_seed_pairs_and_the_report_matrix(
    sweep, capsys
):
    assert main([str(sweep), "landscape.pairs=seeds", *ARGS]) == 0
    assert connected(sweep) == set(SEED_PAIRS)
    assert report_main([str(sweep), "--out", str(sweep / "report")]) == 0
    assert not (sweep / "report" / "barriers.csv").exists()  # no pair across two optimizers
    assert "## Barriers by optimizer pair" not in (sweep / "report" / "report.md").read_text()
    capsys.readouterr()

    assert main([str(sweep), "landscape.pairs=optimizers", *ARGS]) == 0
    out = capsys.readouterr().out
    assert "6 optimizer pair(s) among 5 completed job(s): 2 already done, 4 to compute" in out
    assert connected(sweep) == set(OPTIMIZER_PAIRS)  # the SAM job (4) is paired with nothing
    assert main([str(sweep), "landscape.pairs=optimizers", *ARGS]) == 0
    assert "6 already done, 0 to compute" in capsys.readouterr().out

    assert report_main([str(sweep), "--out", str(sweep / "report")]) == 0
    with open(sweep / "report" / "barriers.csv") as f:
        rows = {(r["optimizer_a"], r["optimizer_b"], r["seeds"]): r for r in csv.DictReader(f)}
    job = {str(n): (base, seed) for n, (_, base, seed) in enumerate(JOBS)}
    want: dict = {}
    for a, b in OPTIMIZER_PAIRS:
        names = sorted((job[a][0], job[b][0]), key=["adamw", "lion"].index)
        seeds = "same" if job[a][1] == job[b][1] else "different"
        want.setdefault((*names, seeds), []).append(barrier(sweep, a, b))
    assert set(rows) == set(want)
    assert set(want) == {
        ("adamw", "adamw", "different"),
        ("adamw", "lion", "different"),  # 0-3, 1-2
        ("adamw", "lion", "same"),  # 0-2, 1-3: one initialization
        ("lion", "lion", "different"),
    }
    for key, pairs in want.items():
        for column in ("barrier_train_loss", "barrier_test_error"):
            mean = statistics.fmean(p[column] for p in pairs)
            assert float(rows[key][f"{column}_mean"]) == pytest.approx(mean, rel=1e-12), key
            assert int(rows[key][f"{column}_n"]) == len(pairs)
    assert int(rows[("adamw", "lion", "different")]["barrier_train_loss_n"]) == 2
    md = (sweep / "report" / "report.md").read_text()
    assert "## Barriers by optimizer pair" in md and "![barriers](barriers.png)" in md
    assert (sweep / "report" / "barriers.png").stat().st_size > 0


def test_an_unknown_pairing_is_one_line_naming_the_choices(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    (sweep / "0").mkdir(parents=True)
    assert main([str(sweep), "landscape.pairs=optimiser"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "sam-landscape: error: landscape.pairs='optimiser' is unknown; choose one of seeds, "
        "optimizers\n"
    )
    assert not list(sweep.glob("*/landscape"))
