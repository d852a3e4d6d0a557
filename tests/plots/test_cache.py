"""sam-report keeps a figure it drew before while its data and drawing code are unchanged
(plots/cache.py): the same bytes as a report drawn afresh, redrawn when a job changes, when the
file was touched, or in another format."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from results.results_helpers import copy_sweep

from sam_runner.plots.cache import FIGURES, Uncacheable, canonical
from sam_runner.results.report import main
from sam_runner.results.sweep import Job


def _inodes(folder: Path, fmt: str = "png") -> dict[str, int]:
    """Each figure file's inode: a figure written again (atomically) is a new file."""
    return {p.name: p.stat().st_ino for p in folder.glob(f"*.{fmt}")}


def _report(sweep: Path, out: Path, *words: str) -> None:
    assert main([str(sweep), "--out", str(out), *words]) == 0


@pytest.fixture
def sweep(tmp_path):
    return copy_sweep(tmp_path / "sweep")


def test_figures_are_kept_redrawn_when_touched_or_their_job_changes_as_a_fresh_report(
    sweep, tmp_path
):
    """One sweep, four reports (each report is seconds): kept on a repeat; a touched or removed
    file drawn again; a changed job's figures redrawn with the bytes of a fresh report."""
    out, fresh = tmp_path / "out", tmp_path / "fresh"
    _report(sweep, out)
    first = _inodes(out)
    assert "acc_vs_lambda_max.png" in first
    assert set(json.loads((out / FIGURES).read_text())) == set(first)  # each figure, none else
    drawn = (out / "acc_vs_lambda_max.png").read_bytes()
    (out / "acc_vs_lambda_max.png").write_bytes(b"edited")
    (out / "ece_vs_rho.png").unlink()
    _report(sweep, out)
    assert (out / "acc_vs_lambda_max.png").read_bytes() == drawn
    assert (out / "ece_vs_rho.png").is_file()
    kept = {k: v for k, v in first.items() if k not in ("acc_vs_lambda_max.png", "ece_vs_rho.png")}
    assert {k: _inodes(out)[k] for k in kept} == kept  # the others not written again
    summary = sweep / "0" / "summary.json"
    values = json.loads(summary.read_text())
    values["test_acc"] = values["test_acc"] / 2  # job 0's accuracy halved
    summary.write_text(json.dumps(values))
    before = _inodes(out)
    _report(sweep, out)
    assert _inodes(out)["acc_vs_lambda_max.png"] != before["acc_vs_lambda_max.png"]
    _report(sweep, fresh)
    for name in first:
        assert (out / name).read_bytes() == (fresh / name).read_bytes(), name


def test_the_figures_drawn_by_the_server_are_those_drawn_here(sweep, tmp_path):
    """sam-report draws its figures in a server's workers (plots/aside.py) while it writes the
    sections: the same files, with the same cache entries, as a report drawn in this process."""
    from sam_runner.results.report import write_report
    from sam_runner.results.sweep import build_report

    out, here = tmp_path / "out", tmp_path / "here"
    _report(sweep, out)
    write_report(build_report(sweep), here)  # no server: every figure drawn here
    drawn = sorted(p.name for p in here.glob("*.png"))
    assert len(drawn) >= 4 and drawn == sorted(p.name for p in out.glob("*.png"))
    for name in drawn:
        assert (out / name).read_bytes() == (here / name).read_bytes(), name
    assert json.loads((out / FIGURES).read_text()) == json.loads((here / FIGURES).read_text())


@pytest.mark.slow
def test_a_report_again_keeps_its_figures_in_each_format(sweep, tmp_path):
    """Kept: not written again (the same file); another format draws its own."""
    out = tmp_path / "out"
    _report(sweep, out)
    _report(sweep, out, "plots.format=svg")
    svg = _inodes(out, "svg")
    assert "acc_vs_lambda_max.svg" in svg and not _inodes(out, "png")  # the PNGs' files dropped
    _report(sweep, out, "plots.format=svg")
    assert _inodes(out, "svg") == svg


def test_equal_arguments_share_a_key_and_any_difference_changes_it():
    job = Job(path=Path("a"), overrides=["seed=0"], metrics={"test_acc": 0.5})
    args = ([{"rho": 0.05, "stats": {"n": 3}}], "test_acc", job, {1.0, 2.0}, math.nan)
    same = ([{"rho": 0.05, "stats": {"n": 3}}], "test_acc", job, {2.0, 1.0}, math.nan)
    assert canonical(args) == canonical(same)
    other = Job(path=Path("a"), overrides=["seed=0"], metrics={"test_acc": 0.5000000001})
    assert canonical((other,)) != canonical((job,))
    assert canonical(({"rho": 0.05},)) != canonical(({"rho": math.nextafter(0.05, 1)},))
    assert canonical(([0.0],)) != canonical(([-0.0],))
    assert canonical((Path("a"),)) != canonical(("a",))  # tagged by kind
    with pytest.raises(Uncacheable):
        canonical((lambda: 0,))  # its code is not keyed: drawn every time
    with pytest.raises(Uncacheable):
        canonical(({(1, 2): 0},))
