"""The catalogue's variant keys from the command line: a value out of range is one line naming
the accepted range, exit 2, nothing written, before training."""

import pytest
from conftest import run_cli


@pytest.mark.parametrize(
    "optimizer, override, message",
    [
        ("fsam", "optimizer.lmbda=1.5", "optimizer=fsam: lmbda must be in [0, 1], got 1.5"),
        ("fsam", "optimizer.sigma=-1", "sigma must be a number >= 0, got -1"),
        (
            "wsam",
            "optimizer.gamma=1.0",
            "optimizer=wsam: gamma must be a number in [0, 1), got 1.0",
        ),
        (
            "gcsam",
            "optimizer.gc_norm=l1",
            "gc_norm must be one of ('centralized', 'raw'), got 'l1'",
        ),
        ("bsam", "optimizer.beta2=1.0", "optimizer=bsam: beta2 must be in [0, 1), got 1.0"),
        ("bsam", "optimizer.num_data=0", "num_data must be a number > 0, got 0"),
        ("msam", "optimizer.perturb_schedule=adaptive", "does not apply to msam"),
        ("focal_sam", "optimizer.sharpness=2", "sharpness must be in [0, 1], got 2"),
        ("functional_sam", "optimizer.precondition=adam", "use base_optimizer=adamw"),
        ("sampa", "optimizer.lam=-0.5", "optimizer=sampa: lam must be in [0, 1], got -0.5"),
        (  # one process without the sequential fallback accepted
            "sampa",
            "optimizer.sequential_fallback=false",
            "optimizer=sampa: sequential_fallback=false runs only the two-process form, which "
            "needs an even number of data-parallel processes (trainer.devices=2, 4, ...) without "
            "sharding, and this run has 1 process; set sequential_fallback=true",
        ),
        ("sampa", "optimizer.sequential_fallback=maybe", "sequential_fallback must be true or"),
    ],
)
def test_a_bad_catalogue_key_is_one_line_and_nothing_is_written(
    optimizer, override, message, tmp_path, capsys
):
    run_dir = tmp_path / "run"
    code, _, err = run_cli([f"optimizer={optimizer}", override, f"hydra.run.dir={run_dir}"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert message in err
    assert not run_dir.exists()
