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


@pytest.mark.slow  # 10-30 s: outside CI's 30-minute budget; run with -m slow
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


# ---------------------------------------------------------------------------- item 10
def _main_of(command: str):
    from sam_runner.evaluation.cli import main as eval_main
    from sam_runner.landscape.cli import main as landscape_main
    from sam_runner.results.index import main as index_main
    from sam_runner.results.report import main as report_main

    return {"sam-eval": eval_main, "sam-report": report_main, "sam-index": index_main,
            "sam-landscape": landscape_main}[command]  # fmt: skip


def _call(command: str, argv: list[str], capsys) -> tuple[int, str]:
    """A command's main in this process: (its exit status, its stderr)."""
    try:
        code = _main_of(command)(argv) or 0
    except SystemExit as e:
        code = e.code
    return code, capsys.readouterr().err


def _other_program_sweep(root):
    """Two job folders of another program's Hydra sweep (no trainer, no optimizer, no summary)."""
    for i in (0, 1):
        (root / str(i) / ".hydra").mkdir(parents=True)
        (root / str(i) / ".hydra" / "config.yaml").write_text("model:\n  width: 3\nlr: 0.1\n")
    return root


def _a_run_folder(folder):
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text('{"status": "completed"}')
    return folder


def test_a_search_preset_without_m_says_no_search_runs():
    _, notes = check_jobs(args_parser().parse_args(["hparams_search=sam_rho_lr"]))
    assert notes == [
        "hparams_search=sam_rho_lr is a search: without -m one run trains with the settings as "
        "given and nothing is searched; add -m to run the search"
    ]
    _, notes = check_jobs(args_parser().parse_args(["-m", "hparams_search=sam_rho_lr"]))
    assert not any("is a search" in n for n in notes)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-m", "seed=range(0,3,0)"], "seed=range(0,3,0) is not a sweep (range() arg 3 must not "
         "be zero); give range(start,stop,step) with a step other than 0"),
        (["optimizer.rho=0.05,0.1"], "optimizer.rho=0.05,0.1 lists several values: to sweep over "
         "them, add -m (--multirun); for a list, optimizer.rho=[...]; for a string, quote it"),
    ],
)  # fmt: skip
def test_a_zero_step_range_and_a_sweep_without_m_are_one_line(argv, message):
    found, _ = check_jobs(args_parser().parse_args(argv))
    assert found == message


def test_a_text_file_given_as_arrays_is_one_line(tmp_path):
    (tmp_path / "bad.npz").write_text("x,y\n1,2\n")
    argv = ["dataset=arrays", f"dataset.path={tmp_path / 'bad.npz'}"]
    found, _ = check_jobs(args_parser().parse_args(argv))
    assert found == (
        f"dataset.path={tmp_path / 'bad.npz'} cannot be read as an .npz file (numpy reads it as "
        "pickled Python objects, which are never loaded); give arrays written by numpy.savez or "
        "numpy.save (numbers, no Python objects), or a .csv"
    )


@pytest.mark.parametrize("command", ["sam-eval", "sam-landscape", "sam-index"])
def test_another_programs_sweep_is_refused_in_one_line(command, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    sweep = _other_program_sweep(tmp_path / "other")
    before = sorted(tmp_path.rglob("*"))
    code, err = _call(command, ["other"], capsys)
    what = "RUN_DIR" if command == "sam-landscape" else "PATH"
    assert code == 2 and err.count("\n") == 1, err
    assert err == (f"{command}: error: {what}='other' holds no job of sam-run: its job folder(s) "
                   "0, 1 were written by another program (no summary.json status, and no trainer "
                   "or optimizer in .hydra/config.yaml); pass a run folder or a sweep folder of "
                   "sam-run\n")  # fmt: skip
    assert sorted(tmp_path.rglob("*")) == before and sweep.is_dir()


def test_sam_index_refuses_an_empty_folder_a_text_database_and_a_bad_query_writing_nothing(
    tmp_path, capsys, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "empty").mkdir()
    code, err = _call("sam-index", ["empty", "--db", "r.sqlite"], capsys)
    assert code == 2 and err.startswith("sam-index: error: PATH='empty' holds no run: no .hydra/")
    run = _a_run_folder(tmp_path / "run")
    (tmp_path / "notes.txt").write_text("my notes\n")
    code, err = _call("sam-index", [str(run), "--db", "notes.txt"], capsys)
    assert (code, err) == (2, "sam-index: error: --db notes.txt is not an SQLite database (it "
                              "holds other data); choose another file\n")  # fmt: skip
    code, err = _call("sam-index", [str(run), "--db", "r.sqlite", "--query", "SELEC 1"], capsys)
    assert code == 2 and err.startswith('sam-index: error: --query failed: near "SELEC": syntax')
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "notes.txt", "run"]


def test_sam_report_names_a_missing_database_and_sam_evals_settings(tmp_path, capsys):
    run = _a_run_folder(tmp_path / "run")
    code, err = _call("sam-report", ["--db", str(tmp_path / "missing.sqlite")], capsys)
    assert (code, err) == (2, f"sam-report: error: --db {tmp_path / 'missing.sqlite'} does not "
                              "exist; index folders into it first: sam-index PATH --db "
                              f"{tmp_path / 'missing.sqlite'}\n")  # fmt: skip
    code, err = _call("sam-report", [str(run), "metrics=full"], capsys)
    assert (code, err) == (2, "sam-report: error: metrics=full is not a setting of sam-report, "
                              "which takes plots.format; metrics= is sam-eval's: run sam-eval "
                              "FOLDER metrics=full, then sam-report FOLDER\n")  # fmt: skip


@pytest.mark.parametrize(
    "argv, message",
    [
        (["points=11"], "points is not a key; did you mean landscape.points?"),
        (["landscape.fit_radius=1.5"], "landscape.fit_radius=1.5 reaches the slice's ends "
         "(landscape.span=[-1, 1]), so the fit would take the whole slice; give a radius below 1"),
    ],
)  # fmt: skip
def test_sam_landscape_points_at_its_own_key_and_refuses_a_fit_past_the_slice(
    argv, message, tmp_path, capsys
):
    run = _a_run_folder(tmp_path / "run")
    code, err = _call("sam-landscape", [str(run), *argv], capsys)
    assert (code, err) == (2, f"sam-landscape: error: {message}\n")


def test_a_summary_holding_no_status_is_not_called_running(tmp_path):
    from sam_runner.rundir import RunDir

    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "summary.json").write_text("{}")
    assert RunDir(tmp_path / "job").missing_reason == (
        "its summary.json holds no status (sam-run writes one in every summary)"
    )


def test_a_run_that_did_not_complete_is_measured_at_its_checkpoint_with_a_note(tmp_path, capsys):
    import torch

    from sam_runner.rebuild import load_run

    run = tmp_path / "run"
    train(compose(*TINY, "model=mlp", "metrics.hessian.enabled=false", "trainer.device=cpu",
                  f"dataset.data_dir={tmp_path}"), run, [])  # fmt: skip
    (run / "summary.json").unlink()  # as a run killed in its third epoch leaves it
    capsys.readouterr()
    load_run(run, torch.device("cpu"))
    assert capsys.readouterr().err == (
        f"sam-landscape: note: {run} did not complete (no summary.json: running, or killed); its "
        "checkpoint of epoch 2 (step 12) is used\n"
    )


def test_a_job_an_identical_sweep_still_trains_is_not_counted_completed(tmp_path):
    from sam_runner.lock import job_lock
    from sam_runner.sweep.callback import closing_line, report

    for i in range(3):
        (tmp_path / str(i) / ".hydra").mkdir(parents=True)
        done = i < 2
        summary = {"status": "completed", "test_acc": 0.5, "overrides": [f"seed={i}"]}
        if done:
            (tmp_path / str(i) / "summary.json").write_text(json.dumps(summary))
    with job_lock(tmp_path / "2", "train"):  # the other sweep trains job 2
        lines, failed = report(tmp_path, 3)
    assert lines[2].split()[1] == "running" and failed == []
    assert closing_line(str(tmp_path), lines, failed) == (
        f"sweep {tmp_path}: 3 job(s), 2 completed, 1 running in another process"
    )
