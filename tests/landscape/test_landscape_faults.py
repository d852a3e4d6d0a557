"""sam-landscape's refusals before anything is computed: a run another sam-landscape measures,
a landscape folder that cannot be written, one run connected to itself; e-notation spans."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from landscape_helpers import MLP, copy_run, trained

from sam_runner.landscape.cli import compose, main
from sam_runner.lock import job_lock


def refused(argv, capsys) -> str:
    code = main([str(a) for a in argv])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("sam-landscape: error: "), err
    return err


@pytest.fixture
def run(tmp_path):
    return copy_run(trained(*MLP), tmp_path / "run")


def test_a_negative_span_in_e_notation_is_a_value():
    cfg, given = compose(Path("x"), ["landscape.span=[-5e-1,5e-1]"], None)
    assert list(cfg.landscape.span) == [-0.5, 0.5] and given == {"landscape.span"}


def test_a_run_connected_to_itself_is_refused_before_computing(run, capsys):
    for to in (["--to", run], [f"landscape.to={run}/."]):  # #42: however the path is spelled
        err = refused([run, *to, "landscape.alphas=3", "trainer.progress=none"], capsys)
        assert "is the run itself" in err and "give another run's folder" in err
    assert not (run / "landscape").exists()


def test_a_landscape_folder_that_cannot_be_written_is_refused_before_computing(run, capsys):
    (run / "landscape").write_text("")  # a file where the folder goes: unwritable even for root
    err = refused([run, "landscape.slices=1d", "landscape.points=3"], capsys)
    assert f"{run / 'landscape'} cannot be written" in err


def test_a_run_another_sam_landscape_measures_is_refused_with_who(run, capsys):
    with job_lock(run, "landscape"):
        err = refused([run, "landscape.slices=1d", "landscape.points=3"], capsys)
    assert f"is being worked on by pid {os.getpid()}" in err
    assert not (run / "landscape" / "slice_1d.csv").exists()
