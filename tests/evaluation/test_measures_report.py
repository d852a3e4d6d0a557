"""sam-report's measures section, measures.csv and measures.png: Kendall's τ equal to scipy's
tau-b on the same numbers, the granulated Ψ by its definition (collapsed base jobs included),
eval.json winning over the training logs, mCE against the base jobs, and the section first."""

from __future__ import annotations

import csv
import json
import math
import statistics

import pytest
import yaml
from eval_helpers import EVAL_ARGS, JOBS, copy_of, sam_eval, trained_sweep
from scipy.stats import kendalltau

from sam_runner.results.measure_ranking import measures_table
from sam_runner.results.report import build_report, main, write_report


def rows_of(path):
    with open(path) as f:
        return {r["measure"]: r for r in csv.DictReader(f)}


def tau(x, y):
    return kendalltau(x, y).statistic


def cell(text) -> float:
    """A measures.csv number (empty: undefined)."""
    return float(text) if text else math.nan


def same(a, b) -> bool:
    return a == b or (math.isnan(a) and math.isnan(b))


# ---------------------------------------------------------------------------- a real sweep
@pytest.fixture(scope="module")
def reported(tmp_path_factory):
    sweep = copy_of(trained_sweep(), tmp_path_factory.mktemp("measures") / "sweep")
    code, _, err = sam_eval(sweep, *EVAL_ARGS, "metrics.sharpness.armijo.enabled=true")
    assert code == 0, err
    assert main([str(sweep)]) == 0
    return sweep


def test_tau_equals_scipys_tau_b_on_the_eval_json_numbers(reported):
    rows = rows_of(reported / "measures.csv")
    evals = [json.loads((reported / j / "eval.json").read_text()) for j in JOBS]
    assert {"lambda_max", "armijo_curvature", "test_ece", "test_acc_c", "test_ece_c"} <= set(rows)
    for key, row in rows.items():
        x = [e[key] for e in evals]
        assert same(cell(row["tau_gen_gap"]), tau(x, [e["gen_gap"] for e in evals])), key
        assert same(cell(row["tau_test_error"]), tau(x, [1 - e["test_acc"] for e in evals])), key
        assert int(row["n"]) == 4


def test_psi_is_the_mean_tau_over_groups_differing_only_in_the_axis(reported):
    """The sweep's one axis is the variant: the groups are the seeds, {base, sam} each."""
    rows = rows_of(reported / "measures.csv")
    evals = {j: json.loads((reported / j / "eval.json").read_text()) for j in JOBS}
    # jobs 0, 1: base seed 0, 1; jobs 2, 3: sam seed 0, 1
    for key, row in rows.items():
        taus = [
            tau([evals[a][key], evals[b][key]], [evals[a]["gen_gap"], evals[b]["gen_gap"]])
            for a, b in (("0", "2"), ("1", "3"))
        ]
        taus = [t for t in taus if math.isfinite(t)]
        want = statistics.fmean(taus) if taus else math.nan
        assert cell(row["psi_optimizer"]) == pytest.approx(want, nan_ok=True), key
        assert row["psi"] == row["psi_optimizer"]  # one axis: Ψ is its ψ


def test_the_sweeps_table_comes_first_and_a_ranking_of_few_jobs_after_it(reported):
    """#58 item 9: report.md opened with a ranking of 4 jobs; the sweep's own table leads, and
    a ranking on fewer than FEW_JOBS jobs follows the analyses, with its caution."""
    md = (reported / "report.md").read_text()
    first_table = md[md.index("\n|") :].split("\n\n")[0]
    assert "| rank | measure | τ with gen gap | p | τ with test error | Ψ | ψ optimizer | n |" in md
    assert first_table.lstrip().startswith("| group | variant | ρ | n |")
    assert md.index("**Caution: few jobs.**") < md.index("| rank | measure") < md.index("## Plots")
    assert "Measured by sam-eval (eval.json): 4 job(s); from the training logs: 0." in md
    assert "![measures](measures.png)" in md
    rows = list(rows_of(reported / "measures.csv").values())
    ranked = [abs(float(r["tau_gen_gap"])) for r in rows if r["tau_gen_gap"]]
    assert ranked == sorted(ranked, reverse=True)
    assert (reported / "measures.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    header = (reported / "measures.csv").read_text().splitlines()[0].split(",")
    assert header[:5] == ["measure", "tau_gen_gap", "tau_test_error", "psi", "psi_optimizer"]
    assert "n" in header


# ---------------------------------------------------------------------------- made-up jobs
def job(folder, n, overrides, values, evaluated=None, training=None):
    """A completed job folder: overrides, summary.json, metrics.jsonl and maybe eval.json."""
    d = folder / str(n)
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    variant = next(o.split("=")[1] for o in overrides if o.startswith("optimizer="))
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump({"optimizer": {"name": variant}}))
    summary = {"status": "completed", "overrides": overrides, **values}
    (d / "summary.json").write_text(json.dumps(summary))
    (d / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "step": 5, **(training or {})}) + "\n")
    if evaluated is not None:
        (d / "eval.json").write_text(json.dumps(evaluated))
    return d


def test_psi_groups_a_collapsed_base_job_with_every_rho(tmp_path):
    """Axes optimizer (base, sam), optimizer.rho (0.1, 0.2), lr (0.1, 0.2); base has no ρ.
    Grouped on the variant, the base job of an lr joins the sam jobs of both ρ at that lr."""
    m = {}  # (variant, rho, lr) -> (measure, gen_gap)
    m["base", None, "0.1"], m["base", None, "0.2"] = (1.0, 0.10), (2.0, 0.30)
    m["sam", "0.1", "0.1"], m["sam", "0.2", "0.1"] = (3.0, 0.20), (0.5, 0.05)
    m["sam", "0.1", "0.2"], m["sam", "0.2", "0.2"] = (4.0, 0.40), (5.0, 0.25)
    for n, ((v, rho, lr), (mu, gap)) in enumerate(m.items()):
        ov = [
            f"optimizer={v}",
            *([f"optimizer.rho={rho}"] if rho else []),
            f"base_optimizer.lr={lr}",
        ]
        job(
            tmp_path,
            n,
            [*ov, "seed=0"],
            {"test_acc": 0.5},
            {"status": "completed", "lambda_max": mu, "gen_gap": gap, "test_acc": 0.5 - gap},
        )
    table = measures_table(build_report(tmp_path))
    assert table.axes == ["optimizer", "optimizer.rho", "base_optimizer.lr"]
    row = table.rows[0]
    pts = lambda keys: ([m[k][0] for k in keys], [m[k][1] for k in keys])  # noqa: E731
    psi_variant = statistics.fmean(
        tau(*pts([("base", None, lr), ("sam", rho, lr)]))
        for rho in ("0.1", "0.2")
        for lr in ("0.1", "0.2")
    )
    psi_rho = statistics.fmean(
        tau(*pts([("sam", "0.1", lr), ("sam", "0.2", lr)])) for lr in ("0.1", "0.2")
    )
    psi_lr = statistics.fmean(
        [tau(*pts([("base", None, "0.1"), ("base", None, "0.2")]))]
        + [tau(*pts([("sam", rho, "0.1"), ("sam", rho, "0.2")])) for rho in ("0.1", "0.2")]
    )
    assert row["psi_optimizer"] == pytest.approx(psi_variant)
    assert row["psi_optimizer.rho"] == pytest.approx(psi_rho)
    assert row["psi_base_optimizer.lr"] == pytest.approx(psi_lr)
    assert row["psi"] == pytest.approx((psi_variant + psi_rho + psi_lr) / 3)
    x, y = pts(list(m))
    assert row["tau_gen_gap"] == tau(x, y) and row["n"] == 6


def test_eval_json_wins_over_the_training_logs_and_a_failed_one_does_not(tmp_path):
    train = {"train_acc": 0.9, "train_loss": 0.2, "test_loss": 1.0, "lambda_max": 100.0}
    for n, (lam, gap) in enumerate([(1.0, 0.1), (2.0, 0.3), (3.0, 0.2)]):
        measured = {"status": "completed", "lambda_max": lam, "gen_gap": gap, "test_acc": 0.6}
        job(
            tmp_path,
            n,
            ["optimizer=sam", f"seed={n}"],
            {"test_acc": 0.5, "lambda_max": 50.0 + n},
            measured,
            train,
        )
    failed = {"status": "failed", "error": "x", "lambda_max": 7.0}
    job(
        tmp_path,
        3,
        ["optimizer=sam", "seed=3"],
        {"test_acc": 0.4, "lambda_max": 60.0},
        failed,
        train,
    )
    table = measures_table(build_report(tmp_path))
    by = {p.name: p for p in table.points}
    assert [by[str(n)].values["lambda_max"] for n in range(3)] == [1.0, 2.0, 3.0]
    assert by["3"].source == "training" and by["3"].values["lambda_max"] == 60.0  # summary's
    assert by["3"].gen_gap == pytest.approx(0.9 - 0.4)  # the last epoch's train_acc − test_acc
    assert table.sources() == {"eval.json": 3, "training": 1}


def test_mce_is_relative_to_the_base_jobs(tmp_path):
    accs = {"base": (0.8, 0.6), "sam": (0.9, 0.7)}  # per corruption a, b
    for n, (variant, seed) in enumerate([("base", 0), ("base", 1), ("sam", 0), ("sam", 1)]):
        a, b = accs[variant]
        values = {
            "status": "completed",
            "gen_gap": 0.1 * n,
            "test_acc": 0.9,
            "test_acc_c": 0.7,
            "test_acc_c_contrast": a + 0.01 * seed,
            "test_acc_c_brightness": b,
        }
        job(tmp_path, n, [f"optimizer={variant}", f"seed={seed}"], {"test_acc": 0.9}, values)
    report = build_report(tmp_path)
    write_report(report)
    md = (tmp_path / "report.md").read_text()
    ref_a, ref_b = statistics.fmean([0.2, 0.19]), 0.4
    sam = [100 * statistics.fmean([(0.1 - 0.01 * s) / ref_a, 0.3 / ref_b]) for s in (0, 1)]
    assert (
        f"| optimizer=sam | {statistics.fmean(sam):.1f} ± {statistics.stdev(sam):.1f} | 2 |" in md
    )
    assert "| optimizer=base | 100.0 ± " in md


def test_no_section_and_no_files_without_enough_completed_jobs(tmp_path):
    job(
        tmp_path,
        0,
        ["optimizer=sam", "seed=0"],
        {"test_acc": 0.5, "lambda_max": 1.0},
        training={"train_acc": 0.9},
    )
    write_report(build_report(tmp_path))
    assert "Which measure" not in (tmp_path / "report.md").read_text()
    assert not (tmp_path / "measures.csv").exists() and not (tmp_path / "measures.png").exists()


def test_kendall_tau_and_its_p_value_are_scipys_to_the_last_bit():
    import numpy as np

    from sam_runner.results.measure_ranking import kendall, kendall_tau

    rng = np.random.default_rng(0)
    for n in (2, 3, 5, 33, 34, 40, 200, 1500):  # scipy's exact p-value up to 33 jobs
        for t in range(60):
            x = rng.integers(0, 4, n).astype(float) if t % 2 else rng.normal(size=n)
            y = (
                x.copy()
                if t % 7 == 0
                else -x
                if t % 5 == 0
                else rng.integers(0, 3, n).astype(float)
                if t % 3 == 0
                else rng.normal(size=n)
            )
            want = kendalltau(x, y)
            for got, bits in zip((*kendall(x, y), kendall_tau(x, y)), (*want, want.statistic)):
                assert got == bits or (math.isnan(bits) and math.isnan(got))
    assert all(map(math.isnan, kendall([1.0, math.nan, 3.0], [1.0, 2.0, 3.0])))


# ---------------------------------------------------------------------------- sources, few jobs
def test_the_report_names_the_jobs_whose_measures_came_from_the_training_logs_and_why(tmp_path):
    """Three jobs measured by sam-eval, one whose sam-eval failed, one never measured, one with
    a cut eval.json: the section names the three taken from the training logs, each with why."""
    train = {"train_acc": 0.9, "train_loss": 0.2, "test_loss": 1.0}
    for n in range(3):
        measured = {"status": "completed", "lambda_max": 1.0 + n, "gen_gap": 0.1 * n}
        job(tmp_path, n, ["optimizer=sam", f"seed={n}"], {"test_acc": 0.5}, measured, train)
    failed = {"status": "failed", "error": "CUDA out of memory. Tried to allocate 2 GiB"}
    job(
        tmp_path,
        3,
        ["optimizer=sam", "seed=3"],
        {"test_acc": 0.4, "lambda_max": 9.0},
        failed,
        train,
    )
    job(tmp_path, 4, ["optimizer=sam", "seed=4"], {"test_acc": 0.3, "lambda_max": 8.0}, None, train)
    d = job(
        tmp_path, 5, ["optimizer=sam", "seed=5"], {"test_acc": 0.2, "lambda_max": 7.0}, None, train
    )
    (d / "eval.json").write_text('{"status": "compl')
    write_report(build_report(tmp_path))
    md = (tmp_path / "report.md").read_text()
    assert "Measured by sam-eval (eval.json): 3 job(s); from the training logs: 3." in md
    assert "mixed into the same τ and Ψ as sam-eval's numbers" in md
    assert "3 (eval.json says sam-eval failed: CUDA out of memory. Tried to allocate 2 GiB)" in md
    assert "4 (no eval.json: not measured by sam-eval)" in md
    assert "5 (eval.json is corrupt (not JSON: " in md


def test_a_ranking_on_few_jobs_is_cautioned_and_gives_each_tau_its_p_value(tmp_path):
    """Four jobs: no τ can reach p < 0.05 (τ = ±1 has p = 2/4! · 2 = 0.083): the caution says
    so above the table, which has a p column; twelve jobs: no caution."""
    for n in range(4):
        measured = {"status": "completed", "lambda_max": float(n), "gen_gap": 0.1 * n}
        job(tmp_path / "few", n, ["optimizer=sam", f"seed={n}"], {"test_acc": 0.5}, measured)
    write_report(build_report(tmp_path / "few"))
    md = (tmp_path / "few" / "report.md").read_text()
    assert "**Caution: few jobs.** The ranking rests on n = 4 jobs" in md
    assert "no τ can reach p < 0.05 (τ = ±1 itself has p = 0.083 with n = 4)" in md
    assert "| rank | measure | τ with gen gap | p | τ with test error | Ψ | n |" in md
    assert "| 1 | λ_max (`lambda_max`) | +1.000 | 0.083 | " in md
    for n in range(12):
        gap = 0.01 * n * (-1) ** n
        measured = {"status": "completed", "lambda_max": float(n), "gen_gap": gap}
        job(tmp_path / "many", n, ["optimizer=sam", f"seed={n}"], {"test_acc": 0.5}, measured)
    write_report(build_report(tmp_path / "many"))
    assert "Caution" not in (tmp_path / "many" / "report.md").read_text()
