"""sam-index on a real sweep: one row per job equal to its files, incremental, concurrent, and
a corrupt summary.json is one warning; and sam-report over several sweeps or a database."""

from __future__ import annotations

import csv
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from results_helpers import copy_sweep

from sam_runner.lock import job_lock
from sam_runner.results import index as index_module
from sam_runner.results.index import index, main
from sam_runner.results.report import main as report_main


def rows(db, sql):
    con = sqlite3.connect(db)
    con.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in con.execute(sql)]
    finally:
        con.close()


def count_reads(monkeypatch) -> list:
    """The folders index_folder reads (the real function, counted)."""
    read, real = [], index_module.run_row

    def counted(run, sweep_dir):
        read.append(run.path)
        return real(run, sweep_dir)

    monkeypatch.setattr(index_module, "run_row", counted)
    return read


def test_runs_hold_each_jobs_summary_and_eval_values(tmp_path):
    sweep = copy_sweep(tmp_path / "s")
    job = sorted(p for p in sweep.iterdir() if (p / "summary.json").is_file())[0]
    (job / "eval.json").write_text(json.dumps({"status": "completed", "lambda_max": 3.5}))
    (job / "landscape").mkdir()
    (job / "landscape" / "landscape.json").write_text(json.dumps({"basin_width_1d": 0.4}))
    db = tmp_path / "r.sqlite"
    assert main([str(sweep), "--db", str(db)]) == 0
    runs = {r["run_dir"]: r for r in rows(db, "SELECT * FROM runs")}
    jobs = [p for p in sweep.iterdir() if (p / "summary.json").is_file()]
    assert set(runs) == {str(p.resolve()) for p in jobs}
    for p in jobs:
        summary, row = json.loads((p / "summary.json").read_text()), runs[str(p.resolve())]
        assert row["sweep_dir"] == str(sweep.resolve()) and row["status"] == summary["status"]
        for key in ("test_acc", "test_ece", "lambda_max", "epochs"):
            assert row[key] == summary[key], key
        assert row["optimizer.name"] and row["seed"] is not None
    assert runs[str(job.resolve())]["eval.lambda_max"] == 3.5
    assert runs[str(job.resolve())]["landscape.basin_width_1d"] == 0.4
    lines = rows(db, f"SELECT * FROM epochs WHERE run_dir = '{job.resolve()}' ORDER BY step")
    logged = [json.loads(x) for x in (job / "metrics.jsonl").read_text().splitlines()]
    assert [r["test_acc"] for r in lines] == [x.get("test_acc") for x in logged]


def test_reindexing_reads_only_what_changed_and_drops_removed_folders(tmp_path, monkeypatch):
    sweep = copy_sweep(tmp_path / "s")
    db = tmp_path / "r.sqlite"
    index([sweep], db)
    read = count_reads(monkeypatch)
    assert index([sweep], db)["unchanged"] > 0 and read == []
    jobs = sorted(p for p in sweep.iterdir() if (p / "summary.json").is_file())
    (jobs[0] / "eval.json").write_text(json.dumps({"status": "completed", "lambda_max": 7.0}))
    counts = index([sweep], db)
    assert read == [jobs[0].resolve()] and counts["read"] == 1
    value = rows(db, f"SELECT \"eval.lambda_max\" v FROM runs WHERE run_dir='{jobs[0].resolve()}'")
    assert value == [{"v": 7.0}]
    shutil.rmtree(jobs[-1])
    assert index([sweep], db)["removed"] == 1
    assert str(jobs[-1].resolve()) not in {r["run_dir"] for r in rows(db, "SELECT * FROM runs")}
    assert not rows(db, f"SELECT * FROM epochs WHERE run_dir='{jobs[-1].resolve()}'")


def test_rows_a_query_deleted_or_a_dropped_table_come_back_on_reindexing(tmp_path, capsys):
    """#42: a user's DELETE or DROP TABLE through --query; the folders are unchanged."""
    sweep = copy_sweep(tmp_path / "s")
    db = tmp_path / "r.sqlite"
    index([sweep], db)
    full = {t: rows(db, f"SELECT * FROM {t} ORDER BY run_dir, step" if t == "epochs" else
                    f"SELECT * FROM {t} ORDER BY run_dir") for t in ("runs", "epochs")}  # fmt: skip
    job = sorted(full["runs"], key=lambda r: r["run_dir"])[0]["run_dir"]
    for sql in (f"DELETE FROM runs WHERE run_dir = '{job}'", "DELETE FROM epochs",
                "DROP TABLE runs", "DROP TABLE epochs"):  # fmt: skip
        assert main(["--db", str(db), "--query", sql]) == 0
        counts = index([sweep], db)
        assert counts["read"] > 0, sql
        for t in ("runs", "epochs"):
            order = "run_dir, step" if t == "epochs" else "run_dir"
            again = rows(db, f"SELECT * FROM {t} ORDER BY {order}")
            assert [{k: r[k] for k in sorted(r) if k != "indexed_at"} for r in again] == [
                {k: r[k] for k in sorted(r) if k != "indexed_at"} for r in full[t]
            ], (sql, t)
    capsys.readouterr()


def test_a_corrupt_summary_is_one_warning_and_the_others_are_indexed(tmp_path, capsys):
    sweep = copy_sweep(tmp_path / "s")
    jobs = sorted(p for p in sweep.iterdir() if (p / "summary.json").is_file())
    (jobs[0] / "summary.json").write_text("{not json")
    db = tmp_path / "r.sqlite"
    assert main([str(sweep), "--db", str(db)]) == 0
    warnings = [x for x in capsys.readouterr().err.splitlines() if "warning" in x]
    assert len(warnings) == 1 and str(jobs[0].resolve()) in warnings[0]
    status = {r["run_dir"]: r["status"] for r in rows(db, "SELECT * FROM runs")}
    assert len(status) == len(jobs) and status.pop(str(jobs[0].resolve())) == "unreadable"
    assert set(status.values()) == {"completed"}


def _job(folder: Path, **files) -> Path:
    """A job folder as sam-run leaves one: its config, metrics lines and summary (real files)."""
    (folder / ".hydra").mkdir(parents=True)
    config = "optimizer:\n  name: sam\n  rho: 0.05\nseed: 0\n"
    (folder / ".hydra" / "config.yaml").write_text(config)
    lines = [{"epoch": 1, "step": 6, "test_acc": 0.5}, {"epoch": 2, "step": 12, "test_acc": 0.6}]
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    (folder / "summary.json").write_text(json.dumps({"status": "completed", "test_acc": 0.6}))
    for name, text in files.items():
        path = folder / name.replace("__", "/")
        if text is None:  # a folder where the file goes: unreadable, even for root
            path.unlink()
            path.mkdir()
        else:
            path.write_text(text)
    return folder


@pytest.mark.parametrize(
    "files, problem",
    [({"summary.json": "{\"status\": \"compl"}, "summary.json is corrupt (not JSON: "),
     ({"summary.json": ""}, "summary.json is corrupt (empty)"),
     ({"summary.json": "[1, 2]"}, "summary.json is corrupt (not a JSON object)"),
     ({"metrics.jsonl": None}, "metrics.jsonl is unreadable (Is a directory)"),
     ({"metrics.jsonl": '{"epoch": 1}\ngarbage\n{"epoch": 2}\n'}, "metrics.jsonl is corrupt "
      "(line 2 is not a JSON object)"),
     ({"metrics.jsonl": '{"epoch": 1}\n{"epo'}, "metrics.jsonl is corrupt (line 2 is not a "
      "JSON object)"),
     ({".hydra__config.yaml": "optimizer: [unclosed"}, ".hydra/config.yaml is corrupt (not a "
      "YAML mapping)")],
)  # fmt: skip
def test_a_file_that_cannot_be_read_is_one_line_and_a_row_marked_unreadable(
    files, problem, tmp_path, capsys
):
    sweep = tmp_path / "sweep"
    bad, good = _job(sweep / "0", **files), _job(sweep / "1")
    db = tmp_path / "r.sqlite"
    assert main([str(sweep), "--db", str(db)]) == 0  # the index goes on: no traceback
    out, err = capsys.readouterr()
    assert err.startswith(f"sam-index: warning: {bad.resolve()}: {problem}"), err
    assert err.count("\n") == 1
    assert err.endswith("; indexed with status unreadable\n")
    assert "2 run folder(s): 1 read, 0 unchanged, 1 unreadable, 0 removed" in out
    runs = {r["run_dir"]: r for r in rows(db, "SELECT * FROM runs")}
    assert runs[str(bad.resolve())]["status"] == "unreadable"
    assert runs[str(bad.resolve())]["problem"].startswith(problem)
    assert runs[str(good.resolve())]["status"] == "completed"
    assert runs[str(good.resolve())]["problem"] is None
    assert runs[str(good.resolve())]["test_acc"] == 0.6
    # indexed again, unchanged: still unreadable and said again (mended permissions keep the
    # file's size and time); once mended, the folder is read as any other
    assert main([str(sweep), "--db", str(db)]) == 0
    assert capsys.readouterr().err == err
    shutil.rmtree(bad)
    _job(bad)
    assert main([str(sweep), "--db", str(db)]) == 0
    assert capsys.readouterr().err == ""
    assert {r["status"] for r in rows(db, "SELECT status FROM runs")} == {"completed"}


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its permissions")
def test_a_summary_without_read_permission_is_a_row_marked_unreadable(tmp_path, capsys):
    job = _job(tmp_path / "sweep" / "0")
    (job / "summary.json").chmod(0)
    assert main([str(tmp_path / "sweep"), "--db", str(tmp_path / "r.sqlite")]) == 0
    assert capsys.readouterr().err == (
        f"sam-index: warning: {job.resolve()}: summary.json is unreadable (Permission denied); "
        "indexed with status unreadable\n"
    )


def test_a_last_line_cut_by_a_kill_of_a_run_without_summary_is_no_fault(tmp_path, capsys):
    job = _job(tmp_path / "sweep" / "0", **{"metrics.jsonl": '{"epoch": 1}\n{"epo'})
    (job / "summary.json").unlink()  # stopped (or training): resuming drops the cut line
    assert main([str(tmp_path / "sweep"), "--db", str(tmp_path / "r.sqlite")]) == 0
    assert capsys.readouterr().err == ""
    assert [r["status"] for r in rows(tmp_path / "r.sqlite", "SELECT status FROM runs")] == [
        "missing"]  # fmt: skip


def _dump(db) -> dict:
    return {
        t: sorted(
            json.dumps({k: v for k, v in r.items() if k != "indexed_at"}, sort_keys=True)
            for r in rows(db, f"SELECT * FROM {t}")
        )
        for t in ("runs", "epochs", "files")
    }


def test_two_indexers_at_once_end_with_the_database_of_one(tmp_path):
    sweep = copy_sweep(tmp_path / "s")
    together, alone = tmp_path / "two.sqlite", tmp_path / "one.sqlite"
    cmd = [sys.executable, "-m", "sam_runner.results.index", str(sweep), "--db", str(together)]
    procs = [subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    assert all(p.wait(timeout=120) == 0 for p in procs), [p.stderr.read() for p in procs]
    index([sweep], alone)
    assert _dump(together) == _dump(alone)


def test_a_second_indexer_waits_for_the_first_and_says_for_whom(tmp_path):
    sweep = copy_sweep(tmp_path / "s")
    db = tmp_path / "r.sqlite"
    index([sweep], db)
    cmd = [sys.executable, "-m", "sam_runner.results.index", str(sweep), "--db", str(db)]
    with job_lock(tmp_path, "r.sqlite"):  # as an indexer of r.sqlite holds it
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert proc.stderr.readline() == (
            f"sam-index: {tmp_path} is being worked on by pid {os.getpid()} on {os.uname()[1]} "
            "(r.sqlite lock .r.sqlite.lock): waiting for it\n"
        )
        time.sleep(0.5)
        assert proc.poll() is None  # still waiting
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert " 0 read, " in out and " unchanged" in out


def test_query_prints_a_table_and_writes_csv(tmp_path, capsys):
    sweep = copy_sweep(tmp_path / "s")
    db, out = tmp_path / "r.sqlite", tmp_path / "q.csv"
    sql = 'SELECT "optimizer.name" AS v, count(*) AS n FROM runs GROUP BY 1 ORDER BY 1'
    assert main([str(sweep), "--db", str(db), "--query", sql]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[1].split()[:2] == ["v", "n"]
    assert main(["--db", str(db), "--query", sql, "--csv", str(out)]) == 0
    with open(out) as f:
        table = list(csv.reader(f))
    assert table[0] == ["v", "n"] and sum(int(r[1]) for r in table[1:]) == len(
        rows(db, "SELECT * FROM runs")
    )
    assert main(["--db", str(db), "--query", "SELECT nope FROM runs"]) == 2
    assert "--query failed" in capsys.readouterr().err


def test_a_schema_of_another_version_is_rebuilt(tmp_path):
    db = tmp_path / "r.sqlite"
    con = sqlite3.connect(db)
    con.executescript("CREATE TABLE meta (key, value); INSERT INTO meta VALUES ('schema', '0');")
    con.executescript("CREATE TABLE runs (x); INSERT INTO runs VALUES (1);")
    con.close()
    index([copy_sweep(tmp_path / "s")], db)
    assert "run_dir" in rows(db, "SELECT * FROM runs")[0]


def _csv_without_from(path: Path) -> list[dict]:
    with open(path) as f:
        return [{k: v for k, v in r.items() if k != "from"} for r in csv.DictReader(f)]


@pytest.mark.slow  # two sweeps trained and reported: ~13 s (CI's time)
def test_a_report_of_two_sweeps_equals_the_report_of_one_holding_their_jobs(tmp_path):
    whole = copy_sweep(tmp_path / "whole")
    a, b = tmp_path / "a", tmp_path / "b"
    jobs = sorted(p for p in whole.iterdir() if p.is_dir() and (p / ".hydra").is_dir())
    for i, job in enumerate(jobs):
        shutil.copytree(job, (a if i % 2 else b) / job.name)
    (whole / "multirun.yaml").unlink()  # the parts have none either: folders alone tell
    assert report_main([str(whole), "--out", str(tmp_path / "r1")]) == 0
    assert report_main([str(a), str(b), "--out", str(tmp_path / "r2")]) == 0
    one, two = tmp_path / "r1" / "report.csv", tmp_path / "r2" / "report.csv"
    assert _csv_without_from(one) == _csv_without_from(two)
    with open(two) as f:
        sources = {r["from"] for r in csv.DictReader(f)}
    assert any(str(a) in s and str(b) in s for s in sources)  # seeds split across the sweeps
    db = tmp_path / "r.sqlite"
    index([a, b], db)
    out = tmp_path / "r3"
    assert report_main(["--db", str(db), "--where", "status = 'completed'", "--out", str(out)]) == 0
    assert _csv_without_from(out / "report.csv") == _csv_without_from(one)
    bad = ["--db", str(db), "--where", "nope = 1", "--out", str(tmp_path / "r4")]
    assert report_main(bad) == 2 and not (tmp_path / "r4").exists()
