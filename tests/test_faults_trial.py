"""What a new user's trial found (#58): a late error, silent settings, tracebacks, misleading
answers and files left behind; each case refused or said in one line, before anything runs."""

from __future__ import annotations

import json

import pytest
from conftest import TINY, compose, run_cli

from sam_runner.errors import UserError
from sam_runner.preflight import check_jobs
from sam_runner.sweep.hydra_api import args_parser
from sam_runner.sweep.objective import require_logged
from sam_runner.train import train


# ---------------------------------------------------------------------------- item 12
def test_an_objective_no_run_logs_is_refused_before_the_run_writes_anything(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    code, _, err = run_cli(["trainer.objective=no_such_key"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(
        "sam-run: error: trainer.objective=no_such_key is not a key any run logs; this run logs "
        "test_acc, test_loss"
    )
    assert list(tmp_path.iterdir()) == []
    found, _ = check_jobs(args_parser().parse_args(["-m", "trainer.objective=lambda_maxx"]))
    assert found.startswith("trainer.objective=lambda_maxx is never logged by this run (did you")


def test_every_number_a_run_logs_is_accepted_as_its_objective(tmp_path):
    extra = ["dataset.val_split=0.1", "optimizer=tlc_sam", "weight_decay=ouidecay"]
    cfg = compose(*TINY, "model=mlp", "trainer.device=cpu", f"dataset.data_dir={tmp_path}", *extra)
    summary = train(cfg, tmp_path / "run", [])
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    logged = {**lines[-1], **summary}
    numbers = [k for k, v in logged.items() if type(v) in (int, float)]
    assert {"test_acc", "val_acc", "lambda_max", "oui", "rho", "grad_evals"} <= set(numbers)
    for key in numbers:
        with_key = compose(*TINY, *extra, f"trainer.objective={key}")
        require_logged(with_key)  # raises UserError on a key this check does not know
    with pytest.raises(UserError, match="lambda_max is never logged by this run with these"):
        require_logged(compose("metrics.hessian.enabled=false", "trainer.objective=lambda_max"))
