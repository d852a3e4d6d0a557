"""A sweep folder: seed pairs (resumable), every job's slices, and what sam-report makes of them."""

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

JOBS = [("sam", 0), ("sam", 1), ("base", 0), ("base", 1), ("sam", 2)]
PAIRS = [("0", "1"), ("0", "4"), ("1", "4"), ("2", "3")]  # jobs of one group, differing in seed


@functools.lru_cache(maxsize=None)
def sweep_once():
    """Five jobs of two groups, as `sam-run -m optimizer=sam,base seed=...` lays them out."""
    root = session_root() / "sweep"
    for num, (variant, seed) in enumerate(JOBS):
        train_into(root / str(num), [*MLP, f"optimizer={variant}", f"seed={seed}"])
    return root


@pytest.fixture
def sweep(tmp_path):
    return shutil.copytree(sweep_once(), tmp_path / "sweep")


def pair_files(sweep):
    return {(a, b): sweep / a / "landscape" / b / "landscape.json" for a, b in PAIRS}


@pytest.mark.slow  # every seed pair's connectivity, twice: ~18 s (CI's time)
def test_seed_pairs_are_connected_once_and_a_second_call_skips_them(sweep, capsys):
    argv = [str(sweep), "landscape.pairs=seeds", "landscape.alphas=5", "trainer.progress=none"]
    assert main(argv) == 0
    assert "4 seed pair(s) among 5 completed job(s): 0 already done, 4 to compute" in (
        capsys.readouterr().out
    )
    files = pair_files(sweep)
    assert all(f.exists() for f in files.values())
    assert not (sweep / "0" / "landscape" / "2").exists()  # sam and base: not a seed pair
    mtimes = {k: f.stat().st_mtime_ns for k, f in files.items()}
    files[("1", "4")].unlink()  # as if stopped before this pair was done
    assert main(argv) == 0
    assert "3 already done, 1 to compute" in capsys.readouterr().out
    assert all(files[k].stat().st_mtime_ns == mtimes[k] for k in files if k != ("1", "4"))
    assert files[("1", "4")].exists()
    assert main(argv) == 0
    assert "4 already done, 0 to compute" in capsys.readouterr().out
    assert (
        main([*argv[:-2], "landscape.alphas=7", "trainer.progress=none"]) == 0
    )  # other options: redone
    assert "0 already done, 4 to compute" in capsys.readouterr().out


def test_every_jobs_slices_and_the_report_columns(sweep, capsys):
    assert (
        main([str(sweep), "landscape.slices=1d", "landscape.points=11", "trainer.progress=none"])
        == 0
    )
    assert "5 completed job(s): 0 already done, 5 to compute" in capsys.readouterr().out
    assert (
        main([str(sweep), "landscape.slices=1d", "landscape.points=11", "trainer.progress=none"])
        == 0
    )
    assert "5 already done, 0 to compute" in capsys.readouterr().out
    assert (
        main([str(sweep), "landscape.pairs=seeds", "landscape.alphas=5", "trainer.progress=none"])
        == 0
    )
    assert report_main([str(sweep), "--out", str(sweep / "report")]) == 0
    with open(sweep / "report" / "report.csv") as f:
        rows = {r["variant"]: r for r in csv.DictReader(f)}
    for variant, jobs, pairs in (
        ("sam", ["0", "1", "4"], PAIRS[:3]),
        ("base", ["2", "3"], PAIRS[3:]),
    ):
        row = rows[variant]
        widths = [
            json.loads((sweep / j / "landscape" / "landscape.json").read_text()) for j in jobs
        ]
        widths = [w["basin_width_1d"] for w in widths]
        assert float(row["landscape_basin_width_mean"]) == pytest.approx(statistics.fmean(widths))
        assert int(row["landscape_basin_width_n"]) == len(jobs)
        barriers = [
            json.loads((sweep / a / "landscape" / b / "landscape.json").read_text())
            for a, b in pairs
        ]
        values = [b["barrier_test_error"] for b in barriers]
        assert float(row["barrier_test_error_mean"]) == pytest.approx(statistics.fmean(values))
        assert int(row["barrier_test_error_n"]) == len(pairs)
    md = (sweep / "report" / "report.md").read_text()
    assert "## Loss landscape" in md and "barrier, test error" in md


def test_a_report_without_landscape_files_has_blank_columns_and_no_section(sweep):
    assert report_main([str(sweep), "--out", str(sweep / "report")]) == 0
    with open(sweep / "report" / "report.csv") as f:
        rows = list(csv.DictReader(f))
    assert all(
        r["landscape_basin_width_mean"] == "" and r["barrier_train_loss_n"] == "0" for r in rows
    )
    assert "## Loss landscape" not in (sweep / "report" / "report.md").read_text()


@pytest.mark.slow  # CI runs the array path on real SLURM (tests/scale/test_slurm.py)
def test_seed_pairs_as_a_submitit_array_equal_the_local_ones_and_resume(sweep, tmp_path, capsys):
    """One task a pair (submitit's local processes: the SLURM array's code path without a
    cluster); the same numbers as computing the pairs here, and a rerun submits nothing."""
    local = shutil.copytree(sweep, tmp_path / "local")
    argv = ["landscape.pairs=seeds", "landscape.alphas=5", "trainer.progress=none"]
    assert main([str(local), *argv]) == 0
    array = [*argv, "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10"]
    assert main([str(sweep), *array]) == 0
    captured = capsys.readouterr()
    assert "submitted 4 task(s)" in captured.err and (sweep / ".sam-landscape").is_dir()
    for (a, b), f in pair_files(sweep).items():
        got, want = (json.loads(p.read_text()) for p in (f, local / a / "landscape" / b / f.name))
        for key in ("barrier_train_loss", "barrier_test_error"):
            assert got[key] == pytest.approx(want[key], rel=1e-9, abs=1e-12), (a, b, key)
    assert main([str(sweep), *array]) == 0
    captured = capsys.readouterr()
    assert "4 already done, 0 to compute" in captured.out and "submitted" not in captured.err


@pytest.mark.parametrize(
    ("job", "args", "message"),
    [
        ("0", ["hydra/launcher=slurm"], "hydra/launcher applies to a sweep folder"),
        (
            "",
            ["hydra.launcher.partition=x"],
            "hydra.launcher.partition sets a job array's launcher",
        ),
    ],
)
def test_array_flags_are_refused_where_they_do_not_apply(sweep, capsys, job, args, message):
    assert main([str(sweep / job), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"sam-landscape: error: {message}") and err.count("\n") == 1, err


def test_an_unknown_launcher_option_names_the_keys(sweep, capsys):
    argv = [str(sweep), "hydra/launcher=submitit_local", "hydra.launcher.partiton=gpu"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith(
            "sam-landscape: error: hydra.launcher.partiton is not a key of this launcher"
        )
        and "its keys are" in err
        and err.count("\n") == 1
    ), err
    assert not (sweep / ".sam-landscape").exists()


@pytest.mark.slow  # 10-30 s: outside CI's 30-minute budget; run with -m slow
def test_a_done_sweep_asked_in_another_format_is_drawn_from_its_files(sweep, capsys):
    """plots.format=pdf on seed pairs and slices already computed as PNG: each figure is drawn
    again as a PDF from the folder's files, and nothing is computed (landscape.json untouched);
    an unknown format is one line, exit 2."""
    pairs = [str(sweep), "landscape.pairs=seeds", "landscape.alphas=5", "trainer.progress=none"]
    slices = [str(sweep), "landscape.points=5", "landscape.grid=3", "trainer.progress=none"]
    assert main(pairs) == 0 and main(slices) == 0
    jsons = [*pair_files(sweep).values(), *sweep.glob("*/landscape/landscape.json")]
    before = {f: f.stat().st_mtime_ns for f in jsons}
    capsys.readouterr()
    assert main([*pairs, "plots.format=pdf"]) == 0 and main([*slices, "plots.format=pdf"]) == 0
    assert "4 already done, 0 to compute" in capsys.readouterr().out
    assert all(f.stat().st_mtime_ns == t for f, t in before.items())
    for a, b in PAIRS:
        assert (sweep / a / "landscape" / b / "connectivity.pdf").read_bytes()[:4] == b"%PDF"
    for stem in ("slice_1d", "slice_2d", "surface_2d"):
        assert (sweep / "0" / "landscape" / f"{stem}.pdf").read_bytes()[:4] == b"%PDF"
    assert main([*pairs, "plots.format=tiff"]) == 2
    err = capsys.readouterr().err
    assert "plots.format='tiff' is unknown; choose one of png, pdf, svg" in err
