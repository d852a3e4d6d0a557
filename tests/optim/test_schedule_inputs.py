"""The cheaper-SAM options from the command line (``optimizer.perturb_schedule`` and its keys,
LookSAM's and ESAM's): bad values are one line, exit 2 and nothing written, before training; a
schedule on ``optimizer=base`` is a notice."""

import pytest
from conftest import run_cli

from sam_runner.preflight import check_jobs
from sam_runner.sweep.hydra_api import args_parser


@pytest.mark.parametrize(
    "optimizer, override, message",
    [
        ("sam", "optimizer.perturb_schedule=sometimes", "perturb_schedule must be one of"),
        ("sam", "optimizer.perturb_prob=1.5", "perturb_prob must be a number in [0, 1], got 1.5"),
        ("sam", "optimizer.perturb_prob=-0.1", "perturb_prob must be a number in [0, 1]"),
        ("sam", "optimizer.perturb_from=1.5", "perturb_from must be a fraction of training in"),
        ("sam", "optimizer.perturb_from=31", "perturb_from=31 is beyond the last epoch (30)"),
        ("look_sam", "optimizer.k=0", "optimizer=look_sam: k must be an integer >= 1, got 0"),
        ("look_sam", "optimizer.alpha=-1", "alpha must be a finite number >= 0, got -1"),
        ("esam", "optimizer.beta=0", "optimizer=esam: beta must be a number in (0, 1], got 0"),
        ("esam", "optimizer.beta=1.5", "beta must be a number in (0, 1], got 1.5"),
        ("esam", "optimizer.gamma=0", "gamma must be a number in (0, 1], got 0"),
        ("esam", "optimizer.gamma=2", "gamma must be a number in (0, 1], got 2"),
    ],
)
def test_a_bad_option_is_one_line_and_nothing_is_written(
    optimizer, override, message, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    code, _, err = run_cli([f"optimizer={optimizer}", override, f"hydra.run.dir={run_dir}"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert message in err
    assert not run_dir.exists()


def test_a_schedule_on_base_is_a_notice():
    args = args_parser().parse_args(["optimizer=base", "optimizer.perturb_schedule=random"])
    message, notes = check_jobs(args)
    assert message is None
    assert "optimizer=base ignores optimizer.perturb_schedule=random" in " ".join(notes)
