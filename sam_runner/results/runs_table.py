"""The runs table of ``sam-report``: the head (sources, counts), one row per group with mean ±
std of each metric, the jobs not completed, the figures, one row per job, and the notes."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..rundir import SUMMARY
from .sections import SECTIONS, figure
from .sweep import BOUND_STATS, LABELS, NEAR_END, STATUSES, Job, Report

if TYPE_CHECKING:
    from pathlib import Path


def _fmt(v, spec=".4g"):
    return "—" if v is None else format(v, spec)


def _cell(s: dict, completed: int) -> str:
    if not s["n"]:
        return "—"
    text = _fmt(s["mean"]) + (f" ± {_fmt(s['std'], '.2g')}" if s["std"] is not None else "")
    return text + (f" (n={s['n']})" if s["n"] != completed else "")


def counts_line(report: Report) -> str:
    """report.md's line of the jobs' counts by status (and the missing ones' numbers)."""
    c = report.counts()
    missing = [j for j in report.jobs if j.status == "missing"]
    not_started = sum(1 for j in missing if j.path is None)
    line = (
        f"{len(report.jobs)} jobs: {c['completed']} completed, {c['diverged']} diverged, "
        f"{c['failed']} failed, {c['missing']} missing"
    )
    if c.get("pruned"):  # a search's pruner stopped them: results, not failures
        line = line.replace(" diverged, ", f" diverged, {c['pruned']} pruned, ", 1)
    corrupt = sum(1 for j in missing if j.detail.startswith(f"{SUMMARY} is "))
    if missing:
        parts = [
            (len(missing) - not_started - corrupt, "running or killed"),
            (corrupt, f"with an unreadable {SUMMARY}"),
            (not_started, "not started"),
        ]
        line += " (" + ", ".join(f"{n} {why}" for n, why in parts if n or why != parts[1][1]) + ")"
    return line


def _job_name(_report: Report, job: Job) -> str:
    return "(no folder)" if job.path is None else job.name


@SECTIONS.register("head", "the sources, the study preset and the job counts", order=0)
def head(report: Report, _plots: list[Path]) -> list[str]:
    """report.md's title, its study and sources."""
    out = [f"# Sweep report: {report.title}", ""]
    if report.study:
        out += [
            f"Study preset `{report.study.get('name')}`. Published reference: "
            f"{report.study.get('reference') or 'none given'}.",
            "",
        ]
    return out + [counts_line(report) + ".", ""]


def _several(report: Report) -> bool:
    """Whether the report has several sources (its group table says where each group is)."""
    return len(report.sources) > 1


@SECTIONS.register("runs", "one row per group: mean ± std of each metric", order=5)
def group_table(report: Report, _plots: list[Path]) -> list[str]:
    """report.md's table of the groups: each metric's statistics over their completed jobs."""
    bounded = report.bound_shown  # the bound's columns where TLC-SAM's jobs make it relevant
    cols = report.metrics + BOUND_STATS if bounded else report.metrics
    head = ["group", "variant", "ρ", "n"] + [LABELS.get(k, k) for k in cols]
    head += ["λ_max > bound"] * bounded + list(STATUSES) + ["from"] * _several(report)
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for g in report.groups:
        cells = [g["label"], g["variant"], _fmt(g["rho"]), str(g["completed"])]
        cells += [_cell(g["stats"][k], g["completed"]) for k in cols]
        n_bound = g["stats"]["bound"]["n"]
        cells += [f"{g['above_bound']}/{n_bound}" if n_bound else "—"] * bounded
        cells += [str(g[s]) for s in STATUSES]
        cells += [", ".join(g["sources"])] * _several(report)
        out.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    out += [
        "",
        "Mean ± sample std (n − 1) over the completed jobs of each group; n = completed "
        'jobs ("(n=k)" where fewer logged the metric). A group is the jobs\' overrides '
        "without `seed`.",
        "",
    ]
    if bounded:
        out += [
            "`bound`: TLC-SAM's stability bound λ_max ≤ (bΓ/(2ρη²))^(1/3), the sharpness above "
            "which a SAM step of radius ρ and learning rate η is no longer stable (b the batch "
            "size, Γ the largest gradient norm logged near the end); TLC-SAM's controller steers "
            "ρ by it. `λ_max > bound` counts the jobs above theirs; the Notes say which Γ, ρ "
            "and η.",
            "",
        ]
    return out


@SECTIONS.register("unfinished", "the jobs not completed and why", order=60)
def unfinished(report: Report, _plots: list[Path]) -> list[str]:
    """report.md's list of the jobs that did not complete, with their reasons."""
    jobs = [j for j in report.jobs if j.status != "completed"]
    if not jobs:
        return []
    return [
        "## Not completed",
        "",
        *(
            f"- `{_job_name(report, j)}`{' ' * bool(report.varying(j))}{report.varying(j)}: "
            f"**{j.status}** — {j.detail}"
            for j in jobs
        ),
        "",
    ]


@SECTIONS.register("plots", "links to the figures", order=70)
def plot_links(_report: Report, plots: list[Path]) -> list[str]:
    """report.md's links to the figures written."""
    return ["## Plots", "", *(figure(p.name) for p in plots), ""] if plots else []


@SECTIONS.register("jobs", "one row per job", order=80)
def job_table(report: Report, _plots: list[Path]) -> list[str]:
    """report.md's table of every job: status, metrics and overrides."""
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


@SECTIONS.register("notes", "the notes and the bound's definition", order=90)
def notes(report: Report, _plots: list[Path]) -> list[str]:
    """report.md's notes (and the bound's, where TLC-SAM's jobs make it relevant)."""
    if not report.bound_shown:
        return ["", "## Notes", "", *(f"- {n}" for n in report.notes), ""]
    bound = (
        "- Stability bound: b = dataset.batch_size; Γ = the largest grad_norm_max logged in "
        f"the last {NEAR_END:.0%} of the epochs; ρ = the mean ρ the job logged over that "
        "window (TLC-SAM's controller moves it; the configured optimizer.rho if none was "
        "logged); η = base_optimizer.lr, the schedule's peak (a cosine schedule ends at 0, "
        "where the bound is vacuous). `bound` and `λ_max/bound` are over the completed jobs "
        "with both; `λ_max > bound` counts those above their bound. base has no ρ and no bound."
    )
    return ["", "## Notes", "", *(f"- {n}" for n in report.notes), bound, ""]
