"""``sam-report SWEEP_DIR``: one table and a few plots for a sweep.

Reads every job's ``summary.json`` and ``.hydra/`` files (never live state), so it works on
a sweep that is still running or partly failed, and says which jobs are missing. Writes,
into the sweep folder (or ``--out``):

- ``report.md``: one row per group with mean ± std and n of test accuracy, ECE, NLL,
  λ_max (and each ``--metric``), the job counts per status, and what is missing;
- ``report.csv``: the same numbers, one row per group, one column per statistic;
- where ``sam-landscape`` wrote into the jobs: per group, the basin width, the slice curvature
  and the barrier between seeds (a report.md section, report.csv columns; landscape/summary.py);
- ``acc_vs_rho.png``, ``lambda_max_vs_rho.png`` (log scale, with the TLC-SAM stability
  bound where the jobs logged what it needs), ``ece_vs_rho.png``, ``acc_vs_lambda_max.png``.

Choices of ours (documented in report.md too):
- A *group* is a job's overrides minus those that do not change the experiment: ``seed``
  (the repeats a group pools) and the how-it-runs keys of ``runfiles.RUN_ONLY_KEYS``
  (``hydra*``, ``logger*``, ``trainer.device``, ``trainer.progress``, ``trainer.compile``,
  ``trainer.channels_last``, ``dataset.data_dir``, ``dataset.download``); ``--ignore KEY``
  pools over more. ``+``/``++``/``~`` prefixes are ignored when naming keys. A job folder
  answers for the sweep's job with the same overrides, how-it-runs keys left out (a rerun
  may add ``trainer.device=cpu``, as the sweep's own resume check allows).
- ``base`` has no ρ (nothing is perturbed), whatever ``optimizer.rho`` says: no ρ cell, drawn
  as a horizontal level, no bound.
- Statistics are over *completed* jobs: mean, sample std (n − 1; blank for n = 1), n.
  Diverged and failed jobs are counted, not averaged.
- A job's status is its summary's; a job folder without summary.json is *missing*
  (running, or killed); a job the sweep's overrides call for without a folder is
  *missing* (not started) — expected jobs are enumerated the way Hydra's basic sweeper
  does; other sweepers' sweeps are reported from the folders alone.
- Stability bound (TLC-SAM abstract): λ_max ≤ (b Γ / (2 ρ η²))^(1/3) with b =
  ``dataset.batch_size``, η = ``base_optimizer.lr`` (the schedule's peak), Γ = the largest
  ``grad_norm_max`` logged in the last 10% of the logged epochs (at least the last one), ρ =
  the mean ``rho`` logged over that same window (TLC-SAM's controller moves it; the
  configured ``optimizer.rho`` where none was logged). For jobs that logged ``grad_norm_max``
  and have ρ > 0; each group's bound and λ_max/bound (mean ± std) and how many jobs exceed it
  are in the table.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from .errors import UserError, require
from .landscape.summary import csv_cells, csv_columns
from .landscape.summary import landscape_section as _landscape
from .plots.style import natural_key  # matplotlib is imported only when drawing
from .registry import VARIANTS
from .report_measures import measures_section, write_measures
from .runfiles import atomic_write_bytes, finite, read_json, read_rows
from .settings import override_key, run_only
from .sweep.plan import expected_jobs, job_dirs

DEFAULT_METRICS = ("test_acc", "test_ece", "test_nll", "lambda_max")
BOUND_STATS = ("bound", "lambda_max_over_bound")  # per group, over jobs with both λ_max and a bound
LABELS = {
    "test_acc": "test accuracy",
    "test_ece": "ECE",
    "test_nll": "NLL",
    "lambda_max": "λ_max",
    "bound": "bound",
    "lambda_max_over_bound": "λ_max/bound",
}
STATUSES = ("completed", "diverged", "failed", "missing")
SPLIT_METRICS = ("test_acc_many", "test_acc_medium", "test_acc_few")
NEAR_END = 0.1  # Γ: the last 10% of the logged epochs


def group_overrides(overrides, ignore=()) -> tuple:
    """The overrides that define a job's group: all but seed and the ones that don't change the
    experiment."""
    return tuple(
        o for o in experiment_overrides(overrides) if override_key(o) not in ("seed", *ignore)
    )


def experiment_overrides(overrides) -> tuple:
    """A job's overrides without the how-it-runs keys (what identifies the job in its sweep)."""
    return tuple(o for o in overrides if not run_only(override_key(o)))


def tlc_bound(batch_size, gamma, rho, lr):
    """(b Γ / (2 ρ η²))^(1/3): the λ_max that SAM-type dynamics stay under (TLC-SAM abstract)."""
    if not all(finite(v) and v > 0 for v in (batch_size, gamma, rho, lr)):
        return None
    return (batch_size * gamma / (2 * rho * lr**2)) ** (1 / 3)


def near_end(rows, key, reduce=max, fraction=NEAR_END):
    """``reduce`` (max: Γ; mean: ρ) of ``key`` over the last ``fraction`` of the logged epochs
    (at least the last epoch); None if ``key`` was not logged there."""
    last = max((r["epoch"] for r in rows if finite(r.get("epoch"))), default=None)
    if last is None:
        return None
    window = max(1, math.ceil(fraction * last))
    vals = [
        r[key]
        for r in rows
        if finite(r.get(key)) and finite(r.get("epoch")) and r["epoch"] > last - window
    ]
    return reduce(vals) if vals else None


def stats(values) -> dict:
    vals = [v for v in values if finite(v)]
    if not vals:
        return {"mean": None, "std": None, "n": 0}
    return {
        "mean": statistics.fmean(vals),
        "std": statistics.stdev(vals) if len(vals) > 1 else None,
        "n": len(vals),
    }


def _num(v):
    return v if finite(v) else None


@dataclass
class Job:
    path: Path | None  # None: the sweep calls for it but it has no folder (not started)
    overrides: list
    status: str = "missing"  # completed | diverged | failed | missing
    detail: str = ""  # why it is not completed
    variant: str = "unknown"
    rho: float | None = None
    batch_size: float | None = None
    lr: float | None = None
    metrics: dict = field(default_factory=dict)
    bound: float | None = None
    study: dict | None = None  # a study preset's name and reference figures (conf/experiment)


@dataclass
class Report:
    sweep_dir: Path
    jobs: list
    groups: list
    metrics: tuple
    notes: list
    study: dict | None = None

    def counts(self) -> Counter:
        return Counter(j.status for j in self.jobs)

    def completed(self) -> list:
        """The completed jobs that have a folder (what the analyses read files from)."""
        return [j for j in self.jobs if j.status == "completed" and j.path is not None]


def _read_yaml(path: Path):
    import yaml

    try:
        return yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError):
        return None


def _get(cfg, dotted):
    for part in dotted.split("."):
        if not isinstance(cfg, dict):
            return None
        cfg = cfg.get(part)
    return cfg


def has_rho(variant: str) -> bool:
    """Whether a variant's ``optimizer.rho`` is a perturbation radius (not for ``base``; an unknown
    variant is taken at its configured ρ)."""
    return VARIANTS.entry(variant).has_rho if variant in VARIANTS else True


def load_job(path: Path, metrics) -> Job:
    overrides = _read_yaml(path / ".hydra" / "overrides.yaml")
    summary = read_json(path / "summary.json")
    if not isinstance(overrides, list):
        overrides = list((summary or {}).get("overrides") or [])
    job = Job(path=path, overrides=[str(o) for o in overrides])
    cfg = _read_yaml(path / ".hydra" / "config.yaml") or {}
    name = _get(cfg, "optimizer.name")
    if name is None:
        name = _override_value(job.overrides, "optimizer") or "unknown"
    job.variant = str(name)
    job.study = _get(cfg, "study")
    job.rho = _num(_get(cfg, "optimizer.rho")) if has_rho(job.variant) else None
    job.batch_size, job.lr = (
        _num(_get(cfg, "dataset.batch_size")),
        _num(_get(cfg, "base_optimizer.lr")),
    )
    if summary is None or summary.get("status") not in ("completed", "diverged", "failed"):
        rows = read_rows(path / "metrics.jsonl")
        epoch = max((r.get("epoch", 0) for r in rows), default=0)
        job.detail = f"no summary.json: running, or killed (last logged epoch {epoch})"
        return job
    job.status = summary["status"]
    if job.status != "completed":
        job.detail = str(summary.get("error") or job.status)
    job.metrics = {m: _num(summary.get(m)) for m in metrics}
    if any(job.metrics[m] is None and m not in summary for m in metrics) or job.rho:
        rows = read_rows(path / "metrics.jsonl")
        for m in metrics:
            # asked with --metric: its last logged value
            if job.metrics[m] is None and m not in summary:
                job.metrics[m] = next((_num(r[m]) for r in reversed(rows) if m in r), None)
        # ρ over Γ's window: TLC-SAM's controller moves it away from the configured start. η is our
        # choice
        # (the abstract says only "the learning rate"): the peak, the sweeps' η axis; the lr logged
        # in that
        # window is ~0 under the presets' cosine schedule (0 on the last line), which makes the
        # bound vacuous.
        rho = near_end(rows, "rho", statistics.fmean)
        job.bound = tlc_bound(
            job.batch_size, near_end(rows, "grad_norm_max"), job.rho if rho is None else rho, job.lr
        )
    return job


def _override_value(overrides, key):
    return next((o.split("=", 1)[1] for o in overrides if override_key(o) == key), None)


def _to_float(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _panel(key: tuple, common: set) -> str:
    """The group's varying overrides other than the variant and ρ (a figure's panel)."""
    return " ".join(
        o for o in key if o not in common and override_key(o) not in ("optimizer", "optimizer.rho")
    )


def build_report(sweep_dir, metrics=(), ignore=()) -> Report:
    sweep_dir = Path(sweep_dir)
    require(
        sweep_dir.is_dir(),
        f"sweep folder {str(sweep_dir)!r} does not exist or is not a folder; "
        "pass the folder a `sam-run -m` wrote (hydra.sweep.dir)",
    )
    dirs = job_dirs(sweep_dir)
    # long-tail studies log per-split accuracies: report them without being asked (any job may be
    # the first done)
    logged = set().union(*((read_json(d / "summary.json") or {}).keys() for d in dirs))
    splits = [k for k in SPLIT_METRICS if k in logged]
    metrics = tuple(dict.fromkeys(list(DEFAULT_METRICS) + splits + list(metrics)))
    expected = expected_jobs(sweep_dir)
    require(
        dirs or expected,
        f"no jobs in {sweep_dir}: no job folder with a .hydra/ inside and no "
        "multirun.yaml; pass the folder a `sam-run -m` wrote (hydra.sweep.dir)",
    )
    jobs = [load_job(d, metrics) for d in dirs]
    notes = []
    if expected is not None:
        jobs += not_started(jobs, expected)
    else:
        notes.append(
            "The sweep's job list could not be read from multirun.yaml (not Hydra's basic "
            "sweeper): jobs that have not started are not counted."
        )
    rows, common = group_rows(jobs, metrics, ignore)
    if common:
        notes.insert(0, "Overrides common to all groups: " + " ".join(common))
    n_bound = sum(len(g["bounds"]) for g in rows)
    notes.append(
        f"Stability bound λ_max ≤ (bΓ/(2ρη²))^(1/3) drawn for {n_bound} job(s)"
        if n_bound
        else "Stability bound not drawn: no completed job with ρ > 0 logged grad_norm_max."
    )
    study = next((j.study for j in jobs if isinstance(j.study, dict)), None)
    return Report(sweep_dir, jobs, rows, metrics, notes, study)


def not_started(jobs: list[Job], expected: list[list[str]]) -> list[Job]:
    """The jobs a sweep calls for that no job folder answers (how-it-runs keys left out)."""
    started = Counter(experiment_overrides(j.overrides) for j in jobs)
    missing = []
    for ov in expected:
        if started[experiment_overrides(ov)] > 0:
            started[experiment_overrides(ov)] -= 1
            continue
        variant = _override_value(ov, "optimizer") or "unknown"
        rho = _num(_to_float(_override_value(ov, "optimizer.rho"))) if has_rho(variant) else None
        missing.append(
            Job(
                path=None,
                overrides=list(ov),
                detail="not started (no job folder yet)",
                variant=variant,
                rho=rho,
            )
        )
    return missing


def group_rows(jobs: list[Job], metrics, ignore=()) -> tuple[list[dict], list[str]]:
    """One row per group of jobs (statistics over its completed jobs), in display order, and the
    overrides every group shares (said once, not on every row and plot label)."""
    groups: dict = {}
    for job in jobs:
        groups.setdefault(group_overrides(job.overrides, ignore), []).append(job)
    common = set.intersection(*(set(k) for k in groups)) if len(groups) > 1 else set()
    rows = [_group_row(key, members, common, metrics) for key, members in groups.items()]
    rows.sort(
        key=lambda g: (
            g["variant"] != "base",
            natural_key(g["series"]),
            g["rho"] if finite(g["rho"]) else -1,
            natural_key(g["group"]),
        )
    )
    return rows, [o for o in next(iter(groups), ()) if o in common]


def _group_row(key: tuple, members: list[Job], common: set, metrics) -> dict:
    done = [j for j in members if j.status == "completed"]
    first = next((j for j in members if j.path is not None), members[0])
    counts = Counter(j.status for j in members)
    checked = [
        (j.metrics["lambda_max"], j.bound)
        for j in done
        if j.bound is not None and finite(j.metrics.get("lambda_max"))
    ]
    row = {
        "group": " ".join(key) or "(defaults)",
        "series": " ".join([first.variant, _panel(key, common)]).strip(),
        "panel": _panel(key, common),
        "label": " ".join(o for o in key if o not in common) or "(defaults)",
        "variant": first.variant,
        "rho": first.rho,
        "jobs": len(members),
        **{s: counts.get(s, 0) for s in STATUSES},
        "stats": {m: stats([j.metrics.get(m) for j in done]) for m in metrics},
        "bounds": [(j.rho, j.bound) for j in done if j.bound is not None],
        "dirs": [j.path for j in done],  # where landscape_section finds sam-landscape's files
        "above_bound": sum(lam > b for lam, b in checked),
    }
    row["stats"].update(
        bound=stats([b for _, b in checked]),
        lambda_max_over_bound=stats([lam / b for lam, b in checked]),
    )
    return row


# ---- output ------------------------------------------------------------------------


def _fmt(v, spec=".4g"):
    return "—" if v is None else format(v, spec)


def _cell(s: dict, completed: int) -> str:
    if not s["n"]:
        return "—"
    text = _fmt(s["mean"]) + (f" ± {_fmt(s['std'], '.2g')}" if s["std"] is not None else "")
    return text + (f" (n={s['n']})" if s["n"] != completed else "")


def counts_line(report: Report) -> str:
    c = report.counts()
    missing = [j for j in report.jobs if j.status == "missing"]
    not_started = sum(1 for j in missing if j.path is None)
    line = (
        f"{len(report.jobs)} jobs: {c['completed']} completed, {c['diverged']} diverged, "
        f"{c['failed']} failed, {c['missing']} missing"
    )
    if missing:
        line += f" ({len(missing) - not_started} running or killed, {not_started} not started)"
    return line


def _job_name(report: Report, job: Job) -> str:
    return (
        "(no folder)" if job.path is None else (str(job.path.relative_to(report.sweep_dir)) or ".")
    )


def render_markdown(report: Report, plots) -> str:
    """report.md: one section after another (each a function of the report and its plots)."""
    sections = (
        _head,
        measures_section,
        _group_table,
        _eos,
        _landscape,
        _unfinished,
        _plot_links,
        _job_table,
        _notes,
    )
    return "\n".join(line for section in sections for line in section(report, plots))


def _head(report: Report, _plots) -> list[str]:
    out = [f"# Sweep report: {report.sweep_dir}", ""]
    if report.study:
        out += [
            f"Study preset `{report.study.get('name')}`. Published reference: "
            f"{report.study.get('reference') or 'none given'}.",
            "",
        ]
    return out + [counts_line(report) + ".", ""]


def _group_table(report: Report, _plots) -> list[str]:
    bounded = any(
        g["stats"]["bound"]["n"] for g in report.groups
    )  # the bound's columns where it applies
    cols = report.metrics + BOUND_STATS if bounded else report.metrics
    head = ["group", "variant", "ρ", "n"] + [LABELS.get(k, k) for k in cols]
    head += ["λ_max > bound"] * bounded + list(STATUSES)
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for g in report.groups:
        cells = [g["label"], g["variant"], _fmt(g["rho"]), str(g["completed"])]
        cells += [_cell(g["stats"][k], g["completed"]) for k in cols]
        n_bound = g["stats"]["bound"]["n"]
        cells += [f"{g['above_bound']}/{n_bound}" if n_bound else "—"] * bounded
        cells += [str(g[s]) for s in STATUSES]
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return out + [
        "",
        "Mean ± sample std (n − 1) over the completed jobs of each group; n = completed "
        'jobs ("(n=k)" where fewer logged the metric). A group is the jobs\' overrides '
        "without `seed`.",
        "",
    ]


def _eos(report: Report, _plots) -> list[str]:
    from .eos_report import section, traces

    return section(report, traces(report))


def _unfinished(report: Report, _plots) -> list[str]:
    jobs = [j for j in report.jobs if j.status != "completed"]
    if not jobs:
        return []
    return [
        "## Not completed",
        "",
        *(
            f"- `{_job_name(report, j)}` {' '.join(j.overrides)}: **{j.status}** — {j.detail}"
            for j in jobs
        ),
        "",
    ]


def _plot_links(_report: Report, plots) -> list[str]:
    return ["## Plots", "", *(f"![{p.stem}]({p.name})" for p in plots), ""] if plots else []


def _job_table(report: Report, _plots) -> list[str]:
    out = [
        "## Jobs",
        "",
        "| job | overrides | status | test accuracy | λ_max |",
        "|---|---|---|---|---|",
    ]
    return out + [
        f"| {_job_name(report, j)} | {' '.join(j.overrides)} | {j.status} | "
        f"{_fmt(j.metrics.get('test_acc'))} | {_fmt(j.metrics.get('lambda_max'))} |"
        for j in report.jobs
    ]


def _notes(report: Report, _plots) -> list[str]:
    bound = (
        "- Stability bound: b = dataset.batch_size; Γ = the largest grad_norm_max logged in "
        f"the last {NEAR_END:.0%} of the epochs; ρ = the mean ρ the job logged over that "
        "window (TLC-SAM's controller moves it; the configured optimizer.rho if none was "
        "logged); η = base_optimizer.lr, the schedule's peak (a cosine schedule ends at 0, "
        "where the bound is vacuous). `bound` and `λ_max/bound` are over the completed jobs "
        "with both; `λ_max > bound` counts those above their bound. base has no ρ and no bound."
    )
    return ["", "## Notes", "", *(f"- {n}" for n in report.notes), bound, ""]


def render_csv(report: Report) -> str:
    buf = io.StringIO()
    cols = ["group", "series", "variant", "rho", "jobs", *STATUSES]
    cols += [f"{k}_{s}" for k in report.metrics + BOUND_STATS for s in ("mean", "std", "n")] + [
        "above_bound"
    ]
    cols += csv_columns()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(cols)
    for g in report.groups:
        row = [
            g["group"],
            g["series"],
            g["variant"],
            "" if g["rho"] is None else repr(g["rho"]),
            g["jobs"],
        ]
        row += [g[s] for s in STATUSES]
        for k in report.metrics + BOUND_STATS:
            s = g["stats"][k]
            row += [
                "" if s["mean"] is None else repr(s["mean"]),
                "" if s["std"] is None else repr(s["std"]),
                s["n"],
            ]
        w.writerow(row + [g["above_bound"]] + csv_cells(g))
    return buf.getvalue()


def write_plots(report: Report, out_dir: Path) -> list[Path]:
    from .eos_report import traces
    from .plots.style import save_png
    from .plots.sweep import plot_acc_vs_lambda, plot_eos_traces, plot_metric_vs_rho

    g = report.groups
    points = [
        (j.variant, j.metrics.get("lambda_max"), j.metrics.get("test_acc"))
        for j in report.jobs
        if j.status == "completed"
    ]
    figures = []
    if any(finite(row["rho"]) for row in g):  # gradient descent against itself has no ρ figures
        figures += [
            ("acc_vs_rho.png", plot_metric_vs_rho(g, "test_acc", "test accuracy")),
            (
                "lambda_max_vs_rho.png",
                plot_metric_vs_rho(
                    g,
                    "lambda_max",
                    "λ_max",
                    logy=True,
                    bounds=True,
                    title="λ_max (log scale) against ρ, with the stability bound where logged",
                ),
            ),
            ("ece_vs_rho.png", plot_metric_vs_rho(g, "test_ece", "test ECE")),
        ]
    figures.append(("acc_vs_lambda_max.png", plot_acc_vs_lambda(points)))
    eos = traces(report)
    if eos:
        figures.append(("eos.png", plot_eos_traces(eos)))
    return [save_png(fig, out_dir / name) for name, fig in figures]


def write_report(report: Report, out_dir=None) -> list[Path]:
    out_dir = Path(out_dir or report.sweep_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        plots = write_plots(report, out_dir)
        measures = write_measures(report, out_dir)  # measures.csv, measures.png
        atomic_write_bytes(out_dir / "report.csv", render_csv(report).encode())
        atomic_write_bytes(out_dir / "report.md", render_markdown(report, plots).encode())
    except OSError as e:
        raise UserError(
            f"cannot write the report into {out_dir} ({e.strerror or e}); choose another with --out"
        ) from None
    return [out_dir / "report.md", out_dir / "report.csv", *plots, *measures]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="sam-report", description="Tables and plots for a sam-run sweep folder."
    )
    ap.add_argument(
        "sweep_dir", type=Path, help="the sweep folder (hydra.sweep.dir of `sam-run -m`)"
    )
    ap.add_argument(
        "--metric",
        action="append",
        default=[],
        metavar="KEY",
        help="another metric to tabulate (a summary.json key, else its last metrics.jsonl value); "
        "repeatable",
    )
    ap.add_argument(
        "--ignore",
        action="append",
        default=[],
        metavar="KEY",
        help="an override key to pool over, like seed (e.g. --ignore dataset.batch_size); "
        "repeatable",
    )
    ap.add_argument(
        "--out", type=Path, help="where to write the report (default: the sweep folder)"
    )
    args = ap.parse_args(argv)
    from .search_report import is_search, write_search_report

    try:
        report = build_report(args.sweep_dir, args.metric, args.ignore)
        paths = write_report(report, args.out)
        if is_search(args.sweep_dir):  # a search's study: its trials table and figures too
            paths += write_search_report(args.sweep_dir, args.out)
    except UserError as e:
        print(f"sam-report: error: {e}", file=sys.stderr)
        return 2
    print(f"{counts_line(report)}; report: {paths[0]}")
    for j in report.jobs:
        if j.status == "missing":
            print(f"  missing: {_job_name(report, j)} {' '.join(j.overrides)} ({j.detail})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
