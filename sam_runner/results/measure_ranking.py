"""Which measure tracks generalization: ``sam-report``'s measures section, ``measures.csv`` and
``measures.png`` (or .pdf, .svg: ``plots.format``).

Per completed job, its measures and its generalization, from its eval.json when ``sam-eval``
measured it (status completed: eval.json wins), else from training (summary.json, and the last
evaluation line of metrics.jsonl for what summary.json lacks). The targets: ``gen_gap`` =
train_acc − test_acc, and the test error 1 − test_acc. From training logs, train_acc is the
running mean of the last epoch (train mode, with augmentation): an estimate, which sam-eval
replaces by the whole training set in eval mode.

For each measure (``MEASURE_KEYS``: λ_max, λ_k, tr(H), every sharpness measure, Fisher–Rao, the
Armijo curvature, the sharpness dimension, the input-gradient norm, the complexity norms, the
quantization drops and their prediction, the calibration errors, the corruption accuracy and ECE):

- Kendall's τ (tau-b, ``scipy.stats.kendalltau``) with gen_gap and with the test error, across
  the completed jobs that have both the measure and the target;
- the granulated Kendall coefficient Ψ of Jiang et al. 2020: for each axis of the sweep (each
  override key with two or more values, ``seed`` excepted), ψ_axis = the mean τ (with gen_gap)
  over the groups of jobs that differ only in that axis; Ψ = the mean of ψ over the axes.

Choices of ours: ``seed`` is no axis (jobs of different seeds are never in one group); a job
without an axis's override (a variant that ignores it, e.g. ``base`` and ``optimizer.rho``: our
sweeper runs it once for every value) belongs to every group that matches it on its other
values; groups of one job, and groups where τ is undefined (a constant measure or gap), are left
out of the means; tau-b in every group (Jiang et al. rank without ties). Measures are ranked by
|τ| with gen_gap. mCE: each corruption's error relative to the mean error of the sweep's
completed ``base`` jobs (the reference model of Hendrycks & Dietterich 2019's CE), averaged over
corruptions, in %.
"""

from __future__ import annotations

import csv
import io
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..rundir import RunDir, eval_file
from ..runfiles import finite
from ..settings import override_key, run_only
from .sections import SECTIONS, figure

if TYPE_CHECKING:
    from collections.abc import Sequence

    from .sweep import Report

MEASURED = eval_file("last")  # a point's source when sam-eval measured it (its file's name)

LABELS = {
    "lambda_max": "λ_max",
    "hessian_trace": "tr(H)",
    "sharpness_worst": "worst-case sharpness",
    "sharpness_avg": "average sharpness",
    "sharpness_dir": "directional sharpness (mean)",
    "sharpness_dir_max": "directional sharpness (max)",
    "armijo_curvature": "Armijo curvature 2(1−c)/α",
    "fisher_trace_ratio": "Fisher trace ratio Σ H_ii/(F_ii+δ)",
    "fisher_rao_norm": "Fisher–Rao norm ⟨θ, Fθ⟩",
    "sharpness_dim": "sharpness dimension",
    "input_grad_norm": "input-gradient norm",
    "flip_prob": "flip probability",
    "param_norm": "Σ‖W‖²_F",
    "dist_from_init": "Σ‖W − W⁰‖²_F",
    "path_norm": "path norm",
    "spectral_norm_product": "log Π‖W‖²₂",
    "quant_drop_8bit": "8-bit accuracy drop",
    "quant_drop_4bit": "4-bit accuracy drop",
    "quant_loss_rise_pred_8bit": "predicted 8-bit loss rise",
    "quant_loss_rise_pred_4bit": "predicted 4-bit loss rise",
    "test_ece": "ECE",
    "test_ece_adaptive": "adaptive ECE",
    "test_mce": "MCE",
    "test_brier": "Brier score",
    "test_acc_c": "corruption accuracy",
    "test_ece_c": "corruption ECE",
}
MEASURE_KEYS = tuple(LABELS)
LAMBDA_K = re.compile(r"lambda_(\d+)$")
MIN_JOBS = 3  # fewer completed jobs: no section, no files
CORRUPTION_PREFIX = "test_acc_c_"


def label(key: str) -> str:
    """A measure's label in tables and figures (λ_k for the top-k eigenvalues)."""
    k = LAMBDA_K.match(key)
    return f"λ_{k.group(1)}" if k else LABELS.get(key, key)


def is_measure(key: str) -> bool:
    """Whether ``key`` names a ranked measure."""
    return key in LABELS or bool(LAMBDA_K.match(key))


@dataclass
class Point:
    """One completed job: its measures, targets, sweep settings and where they came from."""

    name: str
    variant: str
    settings: dict  # override key -> value (how-it-runs keys left out)
    values: dict  # every number the job has (measures, targets, corruption accuracies)
    source: str  # eval.json | training
    why: str = ""  # with source training: why not eval.json (none, failed, unreadable)

    @property
    def gen_gap(self) -> float | None:
        """The job's generalization gap."""
        return self.values.get("gen_gap")

    @property
    def test_error(self) -> float | None:
        """1 − test accuracy (None without a finite accuracy)."""
        acc = self.values.get("test_acc")
        return 1.0 - acc if finite(acc) else None


@dataclass
class Table:
    points: list
    axes: list
    rows: list = field(default_factory=list)  # one dict per measure, ranked

    def sources(self) -> dict:
        """The number of points per source (measured afterwards, or logged in training)."""
        return {s: sum(p.source == s for p in self.points) for s in (MEASURED, "training")}


# ---------------------------------------------------------------------------- reading jobs
def _training_values(run: RunDir) -> dict:
    summary = run.summary or {}
    last = next((r for r in reversed(run.rows()) if "train_acc" in r), {})
    values = {**last, **{k: v for k, v in summary.items() if finite(v)}}
    if finite(values.get("train_acc")) and finite(values.get("test_acc")):
        values["gen_gap"] = values["train_acc"] - values["test_acc"]
    if finite(values.get("train_loss")) and finite(values.get("test_loss")):
        values["gen_gap_loss"] = values["test_loss"] - values["train_loss"]
    return values


def job_values(run: RunDir) -> tuple[dict, str, str]:
    """(the job's numbers, their source, why the source is not eval.json): eval.json when
    sam-eval measured the job, else the training logs; ``run`` is the job's reader."""
    measured = run.eval() or {}
    if measured.get("status") == "completed":
        return {k: v for k, v in measured.items() if finite(v)}, MEASURED, ""
    values = {k: v for k, v in _training_values(run).items() if finite(v)}
    return values, "training", _not_measured(run, measured)


def _not_measured(run: RunDir, measured: dict) -> str:
    """Why a job's eval.json is not its source: absent, unreadable, or a failed measurement."""
    from ..errors import first_line
    from ..rundir import eval_file
    from ..runfiles import json_problem

    problem = json_problem(run.path / eval_file())
    if problem == "missing":
        return f"no {eval_file()}: not measured by sam-eval"
    if problem is not None:
        return f"{eval_file()} is {problem}"
    error = first_line(measured.get("error") or "no error recorded")
    return f"{eval_file()} says sam-eval failed: {error}"


def _settings(overrides) -> dict:
    keep = [o for o in overrides if not run_only(override_key(o)) and "=" in o]
    return {override_key(o): o.split("=", 1)[1] for o in keep if not o.startswith("hydra")}


def points_of(report: Report) -> list[Point]:
    """Every completed job's Point, read once per report (the sections share the pass)."""
    return report.once("points", lambda: _read_points(report))


def _read_points(report) -> list[Point]:
    out = []
    for job in report.completed():
        values, source, why = job_values(job.run)
        out.append(Point(job.name, job.variant, _settings(job.overrides), values, source, why))
    return out


def sweep_axes(points: list[Point]) -> list[str]:
    """Override keys with two or more values among the jobs (``seed`` excepted), in the order
    of the overrides of the job that has the most (a collapsed job lacks some)."""
    ordered = sorted(points, key=lambda p: -len(p.settings))
    keys = list(dict.fromkeys(k for p in ordered for k in p.settings))
    values = {k: {p.settings[k] for p in points if k in p.settings} for k in keys}
    return [k for k in keys if k != "seed" and len(values[k]) >= 2]


# ---------------------------------------------------------------------------- statistics
def kendall_tau(x: Sequence[float], y: Sequence[float]) -> float:
    """Kendall's tau-b of paired values (``scipy.stats.kendalltau``'s, to the last bit); NaN when
    undefined (fewer than 2 pairs, or a constant side).

    Args:
        x: one side's values.
        y: the other side's, paired with ``x``.
    """
    return kendall(x, y)[0]


def kendall(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """(tau-b, its two-sided p-value) of paired values as ``scipy.stats.kendalltau`` gives them
    (method ``auto``: the same counts and the same operations in the same order, so the same
    bits), O(n log n), without importing scipy.stats (seconds at a report's start); the exact
    p-value of a small sample without ties is scipy's own. (NaN, NaN) when undefined.

    Args:
        x: one side's values.
        y: the other side's, paired with ``x``.
    """
    import numpy as np

    nan = (math.nan, math.nan)
    xs, ys = np.asarray(x, dtype=float).ravel(), np.asarray(y, dtype=float).ravel()
    size = xs.size
    if size < 2 or np.isnan(xs).any() or np.isnan(ys).any():  # scipy's NaN propagates
        return nan
    x, y = xs, ys
    perm = np.argsort(y)  # y as dense ranks, then sorted on x (stable): scipy's steps
    x, y = x[perm], y[perm]
    y = np.r_[True, y[1:] != y[:-1]].cumsum(dtype=np.intp)
    perm = np.argsort(x, kind="mergesort")
    x, y = x[perm], y[perm]
    x = np.r_[True, x[1:] != x[:-1]].cumsum(dtype=np.intp)
    dis = _inversions(y)  # discordant pairs: x strictly below, y strictly above
    obs = np.r_[True, (x[1:] != x[:-1]) | (y[1:] != y[:-1]), True]
    cnt = np.diff(np.nonzero(obs)[0]).astype("int64", copy=False)
    ntie = int((cnt * (cnt - 1) // 2).sum())  # joint ties
    xtie, x0, x1 = _rank_ties(x)
    ytie, y0, y1 = _rank_ties(y)
    tot = (size * (size - 1)) // 2
    if xtie == tot or ytie == tot:
        return nan
    con_minus_dis = tot - xtie - ytie + ntie - 2 * dis
    tau = float(
        np.minimum(1.0, max(-1.0, con_minus_dis / np.sqrt(tot - xtie) / np.sqrt(tot - ytie)))
    )
    if xtie == 0 and ytie == 0 and (size <= 33 or min(dis, tot - dis) <= 1):
        return tau, _exact_p_value(xs, ys)
    from scipy.special import ndtr  # scipy.special alone: a fraction of scipy.stats' import

    m = size * (size - 1.0)
    var = (
        (m * (2 * size + 5) - x1 - y1) / 18 + (2 * xtie * ytie) / m + x0 * y0 / (9 * m * (size - 2))
    )
    z = con_minus_dis / np.sqrt(var)
    return tau, float(2 * ndtr(-np.abs(z)))


def _rank_ties(ranks) -> tuple[int, int, int]:
    """scipy's tie statistics of dense ranks (Python ints: no overflow)."""
    import numpy as np

    cnt = np.bincount(ranks).astype("int64", copy=False)
    cnt = cnt[cnt > 1]
    return (
        int((cnt * (cnt - 1) // 2).sum()),
        int((cnt * (cnt - 1.0) * (cnt - 2)).sum()),
        int((cnt * (cnt - 1.0) * (2 * cnt + 5)).sum()),
    )


def _inversions(y) -> int:
    """The pairs i < j with y[i] > y[j] (ranks ≥ 0): sorted runs of 1, 2, 4, ... merged pairwise,
    every pair of runs at once, each right run's elements counting the left run's above them."""
    import numpy as np

    a = np.asarray(y, dtype=np.int64)
    n, span = a.size, int(a.max()) + 1
    index = np.arange(n)
    count, width = 0, 1
    while width < n:
        pair = index // (2 * width)
        right = (index // width) % 2 == 1
        keyed = a + pair * span  # the runs of different pairs never interleave
        left = keyed[~right]  # sorted: each run is, and the pairs' keys increase
        ends = np.searchsorted(left, (pair[right] + 1) * span)  # past its pair's left run
        count += int((ends - np.searchsorted(left, keyed[right], side="right")).sum())
        a = np.sort(keyed) - pair * span  # each pair's two runs merged, in place
        width *= 2
    return count


def _exact_p_value(x, y) -> float:
    from scipy.stats import kendalltau

    return float(kendalltau(x, y).pvalue)


def _pairs(points, key, target) -> tuple[list, list]:
    pairs = [(p.values.get(key), target(p)) for p in points]
    pairs = [(a, b) for a, b in pairs if finite(a) and finite(b)]
    return [a for a, _ in pairs], [b for _, b in pairs]


def groups_differing_in(points: list[Point], axis: str) -> list[list[Point]]:
    """The groups of jobs equal on every setting but ``axis``; a job without a setting that
    others have (a variant that ignores it) joins every group equal to it on the rest."""
    others = [k for k in dict.fromkeys(k for p in points for k in p.settings) if k != axis]
    sig = lambda p: tuple(p.settings.get(k) for k in others)  # noqa: E731
    groups: dict = {}
    for p in points:
        if None not in sig(p):
            groups.setdefault(sig(p), []).append(p)
    for p in points:
        if None in sig(p):
            s = sig(p)
            match = [g for g in groups if all(a is None or a == b for a, b in zip(s, g))]
            for g in match or [s]:
                groups.setdefault(g, []).append(p)
    return list(groups.values())


def granulated_tau(points: list[Point], key: str, axes: list[str]) -> tuple[float, dict]:
    """(Ψ, {axis: ψ_axis}) of a measure against gen_gap (see the module docstring)."""
    per_axis = {}
    for axis in axes:
        taus = []
        for group in groups_differing_in(points, axis):
            t = kendall_tau(*_pairs(group, key, lambda p: p.gen_gap))
            if math.isfinite(t):
                taus.append(t)
        per_axis[axis] = statistics.fmean(taus) if taus else math.nan
    defined = [v for v in per_axis.values() if math.isfinite(v)]
    return (statistics.fmean(defined) if defined else math.nan), per_axis


def measures_table(report: Report) -> Table | None:
    """Every measure's τ, Ψ and n, ranked by |τ| with gen_gap; None with fewer than
    ``MIN_JOBS`` completed jobs that have gen_gap and a measure. Once per report: report.md and
    the files share it."""
    return report.once("measures_table", lambda: _measures_table(report))


def _measures_table(report) -> Table | None:
    points = [p for p in points_of(report) if finite(p.gen_gap)]
    keys = sorted(
        {k for p in points for k in p.values if is_measure(k)},
        key=lambda k: (MEASURE_KEYS.index(k) if k in LABELS else 0.5, k),
    )
    if len(points) < MIN_JOBS or not keys:
        return None
    table = Table(points, sweep_axes(points))
    for key in keys:
        x, gap = _pairs(points, key, lambda p: p.gen_gap)
        x_err, err = _pairs(points, key, lambda p: p.test_error)
        psi, per_axis = granulated_tau(points, key, table.axes)
        tau, p_value = kendall(x, gap)
        table.rows.append(
            {
                "measure": key,
                "tau_gen_gap": tau,
                "p_gen_gap": p_value,
                "tau_test_error": kendall_tau(x_err, err),
                "psi": psi,
                **{f"psi_{a}": v for a, v in per_axis.items()},
                "n": len(x),
            }
        )
    table.rows.sort(key=lambda r: -abs(r["tau_gen_gap"]) if math.isfinite(r["tau_gen_gap"]) else 1)
    return table


def _p_value(x, y) -> float:
    """The two-sided p-value of τ (scipy's)."""
    return kendall(x, y)[1]


# ---------------------------------------------------------------------------- output
def _f(v, spec="+.3f") -> str:
    return format(v, spec) if finite(v) else "—"


def write_measures(report: Report, out_dir: Path) -> list[Path]:
    """measures.csv and measures.png, when the jobs carry measures (else nothing)."""
    table = measures_table(report)
    if table is None:
        return []
    from ..plots.cache import save_plot
    from ..plots.ranking import plot_measures
    from ..runfiles import atomic_write_bytes

    csv_path = Path(out_dir) / "measures.csv"
    atomic_write_bytes(csv_path, render_measures_csv(table).encode())
    return [
        csv_path,
        save_plot(out_dir, "measures", report.plot_format, plot_measures, table, label),
    ]


@SECTIONS.register(
    "measures", "which measure tracks generalization (Kendall τ, Ψ)", order=10, files=write_measures
)
def measures_section(report: Report, _plots: list[Path] | None = None) -> list[str]:
    """The report.md section: the ranking table and measures.png, after the sweep's own table;
    a ranking on fewer than ``FEW_JOBS`` jobs goes further down (``measures_on_few_jobs``)."""
    table = measures_table(report)
    if table is None or few_jobs(table):
        return []
    return ranking_lines(report, table)


@SECTIONS.register(
    "measures_few", "the measures' ranking when it rests on few jobs, after the analyses", order=65
)
def measures_on_few_jobs(report: Report, _plots: list[Path] | None = None) -> list[str]:
    """A ranking of fewer than ``FEW_JOBS`` jobs describes those jobs, not the measures: it
    follows the sweep's table and analyses rather than open the report (with its caution)."""
    table = measures_table(report)
    if table is None or not few_jobs(table):
        return []
    return ranking_lines(report, table)


def few_jobs(table: Table) -> bool:
    """Whether some measure's ranking rests on fewer than ``FEW_JOBS`` jobs."""
    counts = [r["n"] for r in table.rows if r["n"] >= 2]
    return bool(counts) and min(counts) < FEW_JOBS


def ranking_lines(report: Report, table: Table) -> list[str]:
    """report.md's ranking table of the measures, with its axes and cautions."""
    axes = ", ".join(f"`{a}`" for a in table.axes) or "none: Ψ is undefined"
    head = ["rank", "measure", "τ with gen gap", "p", "τ with test error", "Ψ"]
    head += [f"ψ {a}" for a in table.axes] + ["n"]
    out = [
        "## Which measure tracks generalization",
        "",
        f"Kendall's τ (tau-b) of each measure with the generalization gap (gen_gap = train − "
        f"test accuracy) and with the test error across the {len(table.points)} completed jobs; "
        "p, the two-sided p-value of τ with gen_gap (scipy's: exact for small n without ties); "
        "Ψ, the granulated Kendall coefficient (Jiang et al. 2020): the mean over the sweep's "
        f"axes ({axes}) of ψ, the mean τ with gen_gap over the groups of jobs that differ only "
        "in that axis. Ranked by |τ| with gen_gap.",
        "",
        *sources_lines(table),
        *caution_lines(table),
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    for i, r in enumerate(table.rows, 1):
        cells = [str(i), f"{label(r['measure'])} (`{r['measure']}`)", _f(r["tau_gen_gap"])]
        cells += [_f(r["p_gen_gap"], ".2g"), _f(r["tau_test_error"]), _f(r["psi"])]
        cells += [_f(r[f"psi_{a}"]) for a in table.axes] + [str(r["n"])]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", figure(f"measures.{report.plot_format}"), ""]
    return out


def sources_lines(table: Table) -> list[str]:
    """Where the jobs' numbers came from; the jobs taken from the training logs named, with why
    (their gen_gap is an estimate, and mixed with sam-eval's numbers in one τ)."""
    src = table.sources()
    line = (
        f"Measured by sam-eval ({eval_file()}): {src[MEASURED]} job(s); from the training logs: "
        f"{src['training']}."
    )
    if not src["training"]:
        return [line, ""]
    by_why: dict = {}
    for p in table.points:
        if p.source == "training":
            by_why.setdefault(p.why, []).append(p.name)
    estimate = (
        "their train accuracy is the last epoch's running mean, with augmentation, so their "
        "gen_gap is an estimate"
    )
    if not src[MEASURED] and len(by_why) == 1:
        said = f"**All from the training logs** ({next(iter(by_why))}): {estimate}."
    else:
        named = "; ".join(f"{', '.join(names)} ({why})" for why, names in by_why.items())
        said = (
            f"**From the training logs**, mixed into the same τ and Ψ as sam-eval's numbers "
            f"({estimate}): job(s) {named}."
        )
    return [f"{line} {said} `sam-eval` on the folder measures every job alike.", ""]


FEW_JOBS = 10  # fewer jobs behind a ranking: a caution above its table


def caution_lines(table: Table) -> list[str]:
    """A caution when the ranking rests on fewer than ``FEW_JOBS`` jobs: τ takes few values and
    may be unable to reach significance at all (the smallest p that n jobs allow is said)."""
    counts = [r["n"] for r in table.rows if r["n"] >= 2]
    if not counts or min(counts) >= FEW_JOBS:
        return []
    n, most = min(counts), max(counts)
    jobs = f"n = {n}" if n == most else f"n = {n} to {most}"
    best = _p_value(list(range(n)), list(range(n)))  # the smallest p any τ of n jobs can have
    if best >= 0.05:
        verdict = f"no τ can reach p < 0.05 (τ = ±1 itself has p = {best:.2g} with n = {n})"
    else:
        verdict = f"|τ| = 1 has p = {best:.2g} with n = {n}; the p column gives each τ's p-value"
    return [
        f"**Caution: few jobs.** The ranking rests on {jobs} jobs: τ moves in steps of "
        f"{4 / (n * (n - 1)):.2g}, one job can reorder it, and {verdict}. Read it as a "
        "description of these jobs, not as evidence about the measures.",
        "",
    ]


def render_measures_csv(table: Table) -> str:
    """measures.csv: one row per measure (τ, Ψ and its axes, p, n, label)."""
    buf = io.StringIO()
    cols = ["measure", "tau_gen_gap", "tau_test_error", "psi"]
    cols += [f"psi_{a}" for a in table.axes] + ["p_gen_gap", "n", "label"]
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for r in table.rows:
        row = [r["measure"]] + [_csv(r[c]) for c in cols[1:-2]]
        w.writerow(row + [r["n"], label(r["measure"])])
    return buf.getvalue()


def _csv(v) -> str:
    return repr(float(v)) if finite(v) else ""
