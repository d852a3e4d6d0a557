"""The sweep model of everything after training: jobs (one per run folder, or per job a sweep
calls for that has no folder yet), their groups and the statistics over each group.

A report is built from one or several *sources*: sweep folders (every job folder under it, and
the jobs its multirun.yaml calls for), run folders, or the rows of a results database
(``sam-index``). Groups span the sources: jobs that differ only in seed are one group wherever
they live, and each group says which sources its jobs came from.

Choices of ours (report.md's notes say them too):
- A *group* is a job's overrides minus those that do not change the experiment: ``seed``
  (the repeats a group pools) and the how-it-runs keys of ``settings.RUN_ONLY_KEYS``;
  ``--ignore KEY`` pools over more. ``+``/``++``/``~`` prefixes are ignored when naming keys.
  A job folder answers for the sweep's job with the same overrides, how-it-runs keys left out.
- ``base`` has no ρ (nothing is perturbed), whatever ``optimizer.rho`` says.
- Statistics are over *completed* jobs: mean, sample std (n − 1; blank for n = 1), n.
- A job's status is its summary's; a job folder without summary.json is *missing* (running, or
  killed); a job the sweep's overrides call for without a folder is *missing* (not started).
- Stability bound (TLC-SAM abstract): λ_max ≤ (b Γ / (2 ρ η²))^(1/3) with b =
  ``dataset.batch_size``, η = ``base_optimizer.lr`` (the schedule's peak), Γ = the largest
  ``grad_norm_max`` logged in the last 10% of the logged epochs, ρ = the mean ``rho`` logged
  over that same window (the configured ``optimizer.rho`` where none was logged).
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import require
from ..plots.style import natural_key  # matplotlib is imported only when drawing
from ..rundir import RunDir, has_rho, is_run, job_dirs
from ..runfiles import finite
from ..settings import override_key, run_only
from ..sweep.plan import expected_jobs

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Sequence
    from typing import Any

# grad_evals_per_step: the cost column (forward-backward passes per step, counted by the run)
DEFAULT_METRICS = ("test_acc", "test_ece", "test_nll", "lambda_max", "grad_evals_per_step")
BOUND_STATS = ("bound", "lambda_max_over_bound")  # per group, over jobs with both λ_max and a bound
LABELS = {
    "test_acc": "test accuracy",
    "test_ece": "ECE",
    "test_nll": "NLL",
    "lambda_max": "λ_max",
    "grad_evals_per_step": "passes/step",
    "bound": "bound",
    "lambda_max_over_bound": "λ_max/bound",
    "test_bpc": "bits/token",
    "test_ppl": "perplexity",
}
STATUSES = ("completed", "diverged", "failed", "missing")
SPLIT_METRICS = ("test_acc_many", "test_acc_medium", "test_acc_few")
TOKEN_METRICS = ("test_bpc", "test_ppl")  # language-model runs (model=gpt): per token
NEAR_END = 0.1  # Γ: the last 10% of the logged epochs


def group_overrides(overrides: Iterable[str], ignore: Iterable[str] = ()) -> tuple:
    """The overrides that define a job's group: all but seed and the ones that don't change the
    experiment."""
    return tuple(
        o for o in experiment_overrides(overrides) if override_key(o) not in ("seed", *ignore)
    )


def experiment_overrides(overrides: Iterable[str]) -> tuple:
    """A job's overrides without the how-it-runs keys (what identifies the job in its sweep)."""
    return tuple(o for o in overrides if not run_only(override_key(o)))


def tlc_bound(
    batch_size: float | None, gamma: float | None, rho: float | None, lr: float | None
) -> float | None:
    """(b Γ / (2 ρ η²))^(1/3): the λ_max that SAM-type dynamics stay under (TLC-SAM abstract)."""
    if not all(finite(v) and v > 0 for v in (batch_size, gamma, rho, lr)):
        return None
    return (batch_size * gamma / (2 * rho * lr**2)) ** (1 / 3)


def near_end(
    rows: list[dict],
    key: str,
    reduce: Callable[[list[float]], float] = max,
    fraction: float = NEAR_END,
) -> float | None:
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


def stats(values: Iterable[float | None]) -> dict:
    """Mean, standard deviation and count of the finite values (None without any)."""
    vals = [v for v in values if finite(v)]
    if not vals:
        return {"mean": None, "std": None, "n": 0}
    return {
        "mean": statistics.fmean(vals),
        "std": statistics.stdev(vals) if len(vals) > 1 else None,
        "n": len(vals),
    }


def stats_cell(s: dict) -> str:
    """A report cell of ``stats``: mean ± std (4 and 2 significant digits), "—" with no value."""
    if not s["n"]:
        return "—"
    return f"{s['mean']:.4g}" + (f" ± {s['std']:.2g}" if s["std"] is not None else "")


def _num(v):
    return v if finite(v) else None


@dataclass
class Job:
    path: Path | None  # None: the sweep calls for it but it has no folder (not started)
    overrides: list
    name: str = "(no folder)"  # how tables name it: relative to its source
    source: str = ""  # the sweep or run folder it came from, as given
    status: str = "missing"  # completed | diverged | pruned | failed | missing
    detail: str = ""  # why it is not completed
    variant: str = "unknown"
    rho: float | None = None
    batch_size: float | None = None
    lr: float | None = None
    metrics: dict = field(default_factory=dict)
    bound: float | None = None
    study: dict | None = None  # a study preset's name and reference figures (conf/experiment)
    stage: str = ""  # a preset in stages: the stage it belongs to (its folder under the sweep)
    stage_index: int = 0  # the stage's place in the preset's order
    run: RunDir | None = field(default=None, repr=False, compare=False)  # its folder's reader


@dataclass
class Report:
    sweep_dir: Path  # the first source (where the report goes by default)
    jobs: list
    groups: list
    metrics: tuple
    notes: list
    study: dict | None = None
    sources: list = field(default_factory=list)  # every source folder, as given
    plot_format: str = "png"  # plots.format: the figures' file format (png, pdf, svg)
    _shared: set | None = field(default=None, repr=False)  # the overrides every job has
    _once: dict = field(default_factory=dict, repr=False)  # what the sections share (``once``)

    @property
    def title(self) -> str:
        """The report's heading: its sources, or the sweep folder."""
        return ", ".join(str(s) for s in self.sources) or str(self.sweep_dir)

    def counts(self) -> Counter:
        """The number of jobs of each status."""
        return Counter(j.status for j in self.jobs)

    def once(self, key: str, make: Callable[[], Any]) -> Any:
        """``make()``, made once per report and shared by every section that asks for ``key``
        (the jobs' measures: one pass over the jobs' files, not one per section)."""
        if key not in self._once:
            self._once[key] = make()
        return self._once[key]

    @property
    def bound_shown(self) -> bool:
        """Whether the report shows TLC-SAM's stability bound (table columns, dashed curves):
        where the sweep has TLC-SAM jobs, whose controller steers ρ by it, and some job has one;
        a sweep of SAM or GEAR-SAM alone keeps it in report.csv only."""
        return has_tlc_sam(self.groups)

    def completed(self) -> list:
        """The completed jobs that have a folder (what the analyses read files from)."""
        return [j for j in self.jobs if j.status == "completed" and j.path is not None]

    def varying(self, job: Job) -> str:
        """The job's overrides that are not every job's (how-it-runs keys aside): what tells it
        apart in a list of jobs (``missing:``, ``pruned:``); the shared ones are said once."""
        if self._shared is None:
            sets = [set(experiment_overrides(j.overrides)) for j in self.jobs]
            self._shared = set.intersection(*sets) if len(sets) > 1 else set()
        return " ".join(o for o in experiment_overrides(job.overrides) if o not in self._shared)


TLC_SAM = "tlc_sam"  # the variant whose bound the report shows


def has_tlc_sam(groups: list) -> bool:
    """Whether some group is TLC-SAM's and some group has a stability bound."""
    tlc = any(g["variant"] == TLC_SAM for g in groups)
    return tlc and any(g["stats"]["bound"]["n"] for g in groups)


def load_job(
    path: Path,
    metrics: Iterable[str],
    name: str = "",
    source: str = "",
    run: RunDir | None = None,
) -> Job:
    """One job folder's overrides, status and metrics (the last logged value where the summary
    lacks one).

    Args:
        path: the job folder.
        metrics: the keys to read (summary.json's, else the last logged value).
        name: how tables name the job (default: the folder's name).
        source: the sweep or run folder it came from, as given.
        run: the folder's reader, where one has read some of its files already.
    """
    run = run or RunDir(path)
    job = Job(path=path, overrides=run.overrides, name=name or path.name, source=source, run=run)
    cfg = run.config(checkpoint=False)
    variant = run.get("optimizer.name")
    if variant is None:
        variant = _override_value(job.overrides, "optimizer") or "unknown"
    job.variant = str(variant)
    job.study = cfg.get("study") if run.hydra_config is not None else None
    job.rho = _num(run.get("optimizer.rho")) if has_rho(job.variant) else None
    job.batch_size, job.lr = _num(run.get("dataset.batch_size")), _num(run.get("base_optimizer.lr"))
    summary = run.summary
    if run.status == "missing":
        epoch = max((r.get("epoch", 0) for r in run.rows()), default=0)
        job.detail = f"{run.missing_reason} (last logged epoch {epoch})"
        return job
    job.status = run.status
    if job.status != "completed":
        job.detail = str(summary.get("error") or job.status)
    job.metrics = {m: _num(summary.get(m)) for m in metrics}
    if any(job.metrics[m] is None and m not in summary for m in metrics) or job.rho:
        rows = run.rows()
        for m in metrics:
            # asked with --metric: its last logged value
            if job.metrics[m] is None and m not in summary:
                job.metrics[m] = next((_num(r[m]) for r in reversed(rows) if m in r), None)
        # ρ over Γ's window: TLC-SAM's controller moves it away from the configured start. η is
        # our choice (the abstract says only "the learning rate"): the peak, the sweeps' η axis;
        # the lr logged in that window is ~0 under a cosine schedule, a vacuous bound.
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
        shown_override(o)
        for o in key
        if o not in common and override_key(o) not in ("optimizer", "optimizer.rho")
    )


def source_jobs(
    path: Path, metrics: Iterable[str], label: str, runs: dict | None = None
) -> tuple[list[Job], list[str]]:
    """The jobs of one source folder (a sweep, or one run) and its notes; ``runs``: readers of
    job folders already made ({folder: RunDir})."""
    runs = runs or {}
    if is_run(path):
        return [load_job(path, metrics, label or path.name, str(path), runs.get(path))], []
    dirs = job_dirs(path)
    expected = expected_jobs(path)
    require(
        dirs or expected,
        f"no jobs in {path}: no job folder with a .hydra/ inside and no "
        "multirun.yaml; pass the folder a `sam-run -m` wrote (hydra.sweep.dir)",
    )
    prefix = f"{label}/" if label else ""
    jobs = [
        load_job(d, metrics, prefix + (str(d.relative_to(path)) or "."), str(path), runs.get(d))
        for d in dirs
    ]
    if expected is not None:
        return jobs + not_started(jobs, expected, str(path)), []
    stages = [d for d in sorted(path.iterdir()) if (d / "multirun.yaml").is_file()]
    if stages:
        # a preset in stages: one sweep per stage folder, each with its own job list
        missing = []
        order = _stage_order(jobs)
        for d in stages:
            own = [j for j in jobs if j.path.is_relative_to(d)]
            absent = not_started(own, expected_jobs(d) or [], str(path))
            for j in own + absent:
                j.stage, j.stage_index = d.name, order.get(d.name, len(order))
            missing += absent
        return jobs + missing, []
    return jobs, [
        f"The job list of {path} could not be read from multirun.yaml (not Hydra's basic "
        "sweeper): jobs that have not started are not counted."
    ]


def _stage_order(jobs: list[Job]) -> dict[str, int]:
    """The preset's stage names in its order (from a job's recorded ``stages:`` map)."""
    for job in jobs:
        spec = job.run.config(checkpoint=False).get("stages") if job.run else None
        if isinstance(spec, dict):
            return {name: i for i, name in enumerate(spec)}
    return {}


def _labels(paths: list[Path]) -> list[str]:
    """How job names say their source: nothing for one source, else the shortest distinct
    tail of each folder's path."""
    if len(paths) == 1:
        return [""]
    for depth in range(1, max(len(p.resolve().parts) for p in paths) + 1):
        tails = ["/".join(p.resolve().parts[-depth:]) for p in paths]
        if len(set(tails)) == len(tails):
            return tails
    return [str(p) for p in paths]


def build_report(
    sweep_dir: Path | str | Sequence[Path | str],
    metrics: Iterable[str] = (),
    ignore: Iterable[str] = (),
) -> Report:
    """The report of one source folder or several (a list): sweep folders or run folders."""
    paths = [Path(p) for p in (sweep_dir if isinstance(sweep_dir, (list, tuple)) else [sweep_dir])]
    for p in paths:
        require(
            p.is_dir(),
            f"sweep folder {str(p)!r} does not exist or is not a folder; "
            "pass the folder a `sam-run -m` wrote (hydra.sweep.dir)",
        )
    paths, said = distinct_sources(paths)
    dirs = [d for p in paths for d in ([p] if is_run(p) else job_dirs(p))]
    report = build_from_dirs(paths, dirs, metrics, ignore)
    report.notes += said
    return report


def distinct_sources(paths: list[Path]) -> tuple[list[Path], list[str]]:
    """The folders without one given twice (``SWEEP SWEEP``, ``SWEEP ./SWEEP``) or inside
    another given one (``SWEEP SWEEP/0``): each job is counted once; a note for each dropped."""
    kept, notes = [], []
    for p in paths:
        inside = next((k for k in kept if p.resolve().is_relative_to(k.resolve())), None)
        if inside is None:
            outer = [k for k in kept if k.resolve().is_relative_to(p.resolve())]
            kept = [k for k in kept if k not in outer] + [p]
            notes += [f"{k} is inside {p}, given too: its jobs are counted once" for k in outer]
        else:
            how = "the same folder as" if p.resolve() == inside.resolve() else "inside"
            notes.append(f"{p} is {how} {inside}, given too: its jobs are counted once")
    return kept, notes


def build_from_dirs(
    paths: list[Path],
    dirs: list[Path],
    metrics: Iterable[str] = (),
    ignore: Iterable[str] = (),
    jobs: list[tuple[Path, str, str]] | None = None,
) -> Report:
    """The report over ``paths`` (the sources), with ``dirs`` their job folders (for the
    metrics they logged) and ``jobs`` already loaded (else read from ``paths``)."""
    runs = {d: RunDir(d) for d in dirs}  # each summary read once, here and by load_job
    # long-tail studies log per-split accuracies: report them without being asked
    logged = set().union(*((r.summary or {}).keys() for r in runs.values()))
    # ... and language models their bits per token and perplexity
    splits = [k for k in (*SPLIT_METRICS, *TOKEN_METRICS) if k in logged]
    metrics = tuple(dict.fromkeys(list(DEFAULT_METRICS) + splits + list(metrics)))
    notes = []
    if jobs is None:
        jobs = []
        for path, label in zip(paths, _labels(paths)):
            found, said = source_jobs(path, metrics, label, runs)
            jobs += found
            notes += said
    else:
        jobs = [load_job(j[0], metrics, j[1], j[2], runs.get(j[0])) for j in jobs]
    rows, common = group_rows(jobs, metrics, ignore)
    if common:
        notes.insert(0, "Overrides common to all groups: " + " ".join(common))
    n_bound = sum(len(g["bounds"]) for g in rows)
    if has_tlc_sam(rows):  # the bound is TLC-SAM's: said where its jobs are, not elsewhere
        notes.append(
            f"Stability bound λ_max ≤ (bΓ/(2ρη²))^(1/3) drawn for {n_bound} job(s)"
            if n_bound
            else "Stability bound not drawn: no completed job with ρ > 0 logged grad_norm_max."
        )
    study = next((j.study for j in jobs if isinstance(j.study, dict)), None)
    return Report(paths[0], jobs, rows, metrics, notes, study, [str(p) for p in paths])


def not_started(jobs: list[Job], expected: list[list[str]], source: str = "") -> list[Job]:
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
                source=source,
                variant=variant,
                rho=rho,
            )
        )
    return missing


def group_rows(
    jobs: list[Job], metrics: Iterable[str], ignore: Iterable[str] = ()
) -> tuple[list[dict], list[str]]:
    """One row per group of jobs (statistics over its completed jobs), in display order, and the
    overrides every group shares (said once, not on every row and plot label). In a preset in
    stages, a group is a stage's, and the overrides its stage's groups share are said by the
    stage's name."""
    groups: dict = {}
    for job in jobs:
        key = group_overrides(job.overrides, ignore)
        groups.setdefault((job.stage_index, job.stage, key), []).append(job)
    keys = [set(key) for _, _, key in groups]
    common = set.intersection(*keys) if len(keys) > 1 else set()
    by_stage: dict = {}
    for _, stage, key in groups:
        by_stage.setdefault(stage, []).append(set(key))
    shared = {stage: set.intersection(*ks) if stage else common for stage, ks in by_stage.items()}
    rows = [
        _group_row(key, members, shared[stage], metrics, stage)
        for (_, stage, key), members in groups.items()
    ]
    rows.sort(
        key=lambda g: (
            g["stage_index"],
            g["variant"] != "base",
            natural_key(g["series"]),
            g["rho"] if finite(g["rho"]) else -1,
            natural_key(g["group"]),
        )
    )
    return rows, [o for o in next(iter(groups))[2] if o in common] if groups else []


REFERENCE_KEYS = {"model.init_from": "from", "trainer.distill.teacher": "taught by"}


def shown_override(o: str) -> str:
    """An override as labels show it: a stage reference as ``from STAGE key=value`` (a teacher:
    ``taught by STAGE ...``)."""
    key, _, value = o.partition("=")
    value = value.replace("\\:", ":")
    if key in REFERENCE_KEYS and value.startswith("stage:"):
        name, *selectors = value.removeprefix("stage:").split("/")
        return " ".join([REFERENCE_KEYS[key], name, *(k.replace(":", "=", 1) for k in selectors)])
    return o


def _group_row(key: tuple, members: list[Job], common: set, metrics, stage: str = "") -> dict:
    done = [j for j in members if j.status == "completed"]
    first = next((j for j in members if j.path is not None), members[0])
    counts = Counter(j.status for j in members)
    checked = [
        (j.metrics["lambda_max"], j.bound)
        for j in done
        if j.bound is not None and finite(j.metrics.get("lambda_max"))
    ]
    label = " ".join(shown_override(o) for o in key if o not in common)
    row = {
        "group": " ".join(key) or "(defaults)",
        "series": " ".join([first.variant, _panel(key, common)]).strip(),
        "panel": " ".join(filter(None, [stage, _panel(key, common)])),
        "label": ": ".join(filter(None, [stage, label])) or "(defaults)",
        "stage": stage,
        "stage_index": first.stage_index,
        "variant": first.variant,
        "rho": first.rho,
        "jobs": len(members),
        **{s: counts.get(s, 0) for s in STATUSES},
        "stats": {m: stats([j.metrics.get(m) for j in done]) for m in metrics},
        "bounds": [(j.rho, j.bound) for j in done if j.bound is not None],
        "dirs": [j.path for j in done],  # where landscape_section finds sam-landscape's files
        "sources": list(dict.fromkeys(j.source for j in members if j.source)),
        "above_bound": sum(lam > b for lam, b in checked),
    }
    row["stats"].update(
        bound=stats([b for _, b in checked]),
        lambda_max_over_bound=stats([lam / b for lam, b in checked]),
    )
    return row
