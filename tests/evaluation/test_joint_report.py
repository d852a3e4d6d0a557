"""sam-report's joint analysis: R² equal to scikit-learn's, the Pareto agreement by its
definition, joint.csv and joint.png written, and a notice with too few jobs."""

from __future__ import annotations

import csv
import itertools
import random

import numpy as np
import pytest
from sklearn.linear_model import LinearRegression
from test_measures_report import job

from sam_runner.results.joint import COLUMNS, pareto_agreement
from sam_runner.results.report import build_report, write_report


def jobs(folder, n, seed=0):
    rng = random.Random(seed)
    values = []
    for i in range(n):
        lam, norm = rng.uniform(1, 50), rng.uniform(10, 100)
        gap = 0.002 * lam + 0.001 * norm + rng.gauss(0, 0.01)
        v = {
            "status": "completed",
            "lambda_max": lam,
            "path_norm": norm,
            "gen_gap": gap,
            "test_acc": 0.9 - gap,
        }
        job(
            folder,
            i,
            ["optimizer=sam", f"optimizer.rho={0.01 * (i + 1)}", "seed=0"],
            {"test_acc": 0.9},
            v,
        )
        values.append(v)
    return values


def test_r2_equals_sklearn_and_the_files_are_written(tmp_path):
    values = jobs(tmp_path, 12)
    write_report(build_report(tmp_path))
    with open(tmp_path / "joint.csv") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == COLUMNS and len(rows) == 1
    row = rows[0]
    assert (row["sharpness"], row["complexity"], row["n"]) == ("lambda_max", "path_norm", "12")
    X = np.array([[v["lambda_max"], v["path_norm"]] for v in values])
    y = np.array([v["gen_gap"] for v in values])
    assert float(row["r2"]) == pytest.approx(LinearRegression().fit(X, y).score(X, y), abs=1e-12)
    alone = LinearRegression().fit(X[:, :1], y).score(X[:, :1], y)
    assert float(row["r2_sharpness"]) == pytest.approx(alone, abs=1e-12)
    # the pairs by their definition, recounted here
    pairs = agree = 0
    for a, b in itertools.permutations(values, 2):
        if a["lambda_max"] < b["lambda_max"] and a["path_norm"] < b["path_norm"]:
            pairs += 1
            agree += a["gen_gap"] < b["gen_gap"]
    assert int(row["pareto_pairs"]) == pairs
    assert float(row["pareto_agreement"]) == pytest.approx(agree / pairs)
    report = (tmp_path / "report.md").read_text()
    assert "## Sharpness and complexity together" in report and "![joint](joint.png)" in report
    assert (tmp_path / "joint.png").stat().st_size > 10_000


def test_pareto_agreement_by_hand():
    # job 0 lower in both than jobs 1 and 2; 1 and 2 cross: two pairs, one agrees
    assert pareto_agreement([1, 2, 3], [1, 3, 2], [0.1, 0.0, 0.2]) == (2, 0.5)
    assert pareto_agreement([1, 2], [2, 1], [0.1, 0.2]) == (0, None)


def test_too_few_jobs_is_a_notice_and_no_file(tmp_path):
    jobs(tmp_path, 2)
    write_report(build_report(tmp_path))
    report = (tmp_path / "report.md").read_text()
    assert "Too few jobs for the joint analysis: 2 completed job(s)" in report
    assert not (tmp_path / "joint.csv").exists()


def test_few_jobs_are_cautioned(tmp_path):
    jobs(tmp_path, 4)
    write_report(build_report(tmp_path))
    assert "not to be trusted" in (tmp_path / "report.md").read_text()


def test_pareto_agreement_in_blocks_equals_the_pairs_counted_one_by_one(monkeypatch):
    """Ties included, over several blocks of rows (ROWS made small): the counts of the loop over
    pairs by the definition."""
    import sam_runner.results.joint as joint

    rng = random.Random(1)
    s, c, g = ([rng.choice(range(8)) for _ in range(40)] for _ in range(3))
    pairs = agree = 0
    for i, j in itertools.permutations(range(40), 2):
        if s[i] < s[j] and c[i] < c[j]:
            pairs += 1
            agree += g[i] < g[j]
    monkeypatch.setattr(joint, "ROWS", 7)
    assert pareto_agreement(s, c, g) == (pairs, agree / pairs)


def test_the_sections_share_one_read_of_the_jobs_measures(tmp_path):
    from sam_runner.results.measure_ranking import points_of

    jobs(tmp_path, 5)
    report = build_report(tmp_path)
    write_report(report)  # the measures, joint and sharpness-dimension sections all read them
    first = report._once["points"]
    assert len(first) == 5 and points_of(report) is first
    for path in tmp_path.glob("*/eval.json"):
        path.unlink()  # read again, the jobs would have no measures
    assert points_of(report)[0].values["lambda_max"] == first[0].values["lambda_max"]
