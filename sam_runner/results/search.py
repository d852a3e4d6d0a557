"""The report of a search folder (``sam-run -m hparams_search=...``): its Optuna study and the
trials' run folders, as tables and figures.

Writes, into the report folder:

- ``search.md``: the trials sorted by the objective (best first; failed and diverged trials,
  which scored the worst value, last), the best trial's settings, and its validation metrics
  beside its test metrics (the test numbers of the model the validation split selected);
- ``search.csv``: the trials table, one row per trial;
- ``search_<key>.png``: the objective against each searched key, one point per trial with a
  finite objective, on a log axis where the space is logarithmic.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..rundir import RunDir
from ..runfiles import atomic_write_bytes
from ..sweep.objective import OLD_STORAGE_FILE, STORAGE_FILE, STUDY_NAME
from .sections import SECTIONS, figure

METRICS = ("loss", "acc", "ece", "nll")


@dataclass
class Trial:
    number: int
    state: str
    value: float | None
    params: dict
    folder: Path
    run: RunDir  # its job folder's reader

    @property
    def summary(self) -> dict:
        return self.run.summary or {}


@dataclass
class Study:
    sweep_dir: Path
    direction: str  # maximize | minimize
    objective: str
    trials: list[Trial]
    log_keys: set

    def ranked(self) -> list[Trial]:
        """Best first; trials without a finite value last, by number."""
        sign = -1 if self.direction == "maximize" else 1
        good = [t for t in self.trials if t.value is not None and math.isfinite(t.value)]
        rest = [t for t in self.trials if t not in good]
        return sorted(good, key=lambda t: (sign * t.value, t.number)) + rest


def is_search(sweep_dir) -> bool:
    """Whether a folder holds a search's study (the sweeper's journal, or an older SQLite file)."""
    return any((Path(sweep_dir) / f).is_file() for f in (STORAGE_FILE, OLD_STORAGE_FILE))


def load_study(sweep_dir) -> Study:
    import optuna

    from ..sweep.study import open_storage

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    sweep_dir = Path(sweep_dir)
    storage = open_storage(sweep_dir, None, migrate=False)
    names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
    if not names:
        raise UserError(f"{sweep_dir} holds no Optuna study")
    study = optuna.load_study(
        study_name=STUDY_NAME if STUDY_NAME in names else names[0], storage=storage
    )
    trials, log_keys, objective = [], set(), None
    for t in study.trials:
        folder = sweep_dir / str(t.number)
        run = RunDir(folder)
        objective = objective or (run.summary or {}).get("objective")
        trials.append(Trial(t.number, t.state.name, t.value, dict(t.params), folder, run))
        log_keys |= {
            k
            for k, d in t.distributions.items()
            if "Log" in type(d).__name__ or getattr(d, "log", False)
        }
    return Study(
        sweep_dir, study.direction.name.lower(), objective or "objective", trials, log_keys
    )


def write_search_report(sweep_dir, out_dir=None, fmt: str = "png") -> list[Path]:
    """search.md, search.csv and one search_<key>.<fmt> per searched key, into ``out_dir``
    (default: the sweep folder); their paths."""
    study = load_study(sweep_dir)
    out_dir = Path(out_dir or sweep_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = [scatter(study, key, out_dir, fmt) for key in searched_keys(study)]
    atomic_write_bytes(out_dir / "search.csv", render_csv(study).encode())
    atomic_write_bytes(out_dir / "trials.csv", trials_csv(study).encode())
    atomic_write_bytes(out_dir / "search.md", render_markdown(study, plots).encode())
    return [out_dir / "search.md", out_dir / "search.csv", out_dir / "trials.csv", *plots]


def trials_csv(study: Study) -> str:
    """Every trial by number: its Optuna state, its job folder (relative to the search folder),
    each searched key by its override name and the objective by its key."""
    import csv
    import io

    keys = searched_keys(study)
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["number", "state", "job_dir", *keys, study.objective])
    for t in sorted(study.trials, key=lambda t: t.number):
        job_dir = (
            t.folder.relative_to(study.sweep_dir)
            if t.folder.is_relative_to(study.sweep_dir)
            else t.folder
        )
        w.writerow(
            [
                t.number,
                t.state,
                job_dir,
                *(t.params.get(k, "") for k in keys),
                "" if t.value is None else t.value,
            ]
        )
    return out.getvalue()


def searched_keys(study: Study) -> list[str]:
    return list(dict.fromkeys(k for t in study.trials for k in t.params))


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def table_rows(study: Study) -> tuple[list[str], list[list]]:
    keys = searched_keys(study)
    head = [
        "rank",
        "trial",
        "status",
        f"objective ({study.objective})",
        *keys,
        "val_acc",
        "test_acc",
    ]
    rows = []
    for rank, t in enumerate(study.ranked(), 1):
        status = t.summary.get("status") or t.state.lower()
        rows.append(
            [
                rank,
                t.number,
                status,
                t.value,
                *(t.params.get(k) for k in keys),
                t.summary.get("val_acc"),
                t.summary.get("test_acc"),
            ]
        )
    return head, rows


def render_csv(study: Study) -> str:
    buf = io.StringIO()
    head, rows = table_rows(study)
    w = csv.writer(buf)
    w.writerow(head)
    w.writerows(rows)
    return buf.getvalue()


def render_markdown(study: Study, plots: list[Path]) -> str:
    head, rows = table_rows(study)
    lines = [
        f"# Search {study.sweep_dir}",
        "",
        f"{len(study.trials)} trial(s); objective {study.objective} ({study.direction}).",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    best = study.ranked()[0] if study.trials else None
    if best is not None and best.value is not None and math.isfinite(best.value):
        lines += ["", f"## Best trial: #{best.number}", ""]
        lines += [
            f"- `{o}`"
            for o in best.summary.get("overrides") or [f"{k}={v}" for k, v in best.params.items()]
        ]
        lines += ["", "| metric | validation | test |", "|---|---|---|"]
        lines += [
            f"| {m} | {_cell(best.summary.get(f'val_{m}', _last(best, f'val_{m}')))} | "
            f"{_cell(best.summary.get(f'test_{m}', _last(best, f'test_{m}')))} |"
            for m in METRICS
        ]
        if best.summary.get("selected_on_test"):
            lines += [
                "",
                "Selected on test data (trainer.objective names a test metric): the "
                "test numbers are not a held-out estimate.",
            ]
    lines += ["", *(figure(p.name) for p in plots)]
    return "\n".join(lines) + "\n"


def _last(trial: Trial, key: str):
    """A key of the trial's final metrics line (val_loss, val_ece ... are not in summary.json)."""
    return next((r for r in reversed(trial.run.rows()) if "test_acc" in r), {}).get(key)


def scatter(study: Study, key: str, out_dir: Path, fmt: str = "png") -> Path:
    from ..plots.style import figure, log_scale, save_figure

    points = [
        (t.params[key], t.value)
        for t in study.trials
        if key in t.params and t.value is not None and math.isfinite(t.value)
    ]
    fig, axes = figure()
    ax = axes[0][0]
    numeric = all(isinstance(x, (int, float)) for x, _ in points)
    xs = [x if numeric else str(x) for x, _ in points]
    ax.scatter(xs, [v for _, v in points], s=24)
    if key in study.log_keys and numeric:
        log_scale(ax, "x", xs)
    ax.set_xlabel(key + (" (log)" if key in study.log_keys else ""))
    ax.set_ylabel(study.objective)
    ax.set_title(f"{study.objective} against {key} ({len(points)} trials)")
    return save_figure(fig, out_dir, f"search_{key.replace('/', '_')}", fmt)


def _search_sources(report) -> list[Path]:
    return [Path(s) for s in report.sources or [report.sweep_dir] if is_search(s)]


def _search_files(report, out_dir) -> list[Path]:
    """Each search source's trials table and figures (a subfolder when there are several)."""
    sources = _search_sources(report)
    return [
        p
        for s in sources
        for p in write_search_report(
            s, Path(out_dir) / (s.name if len(sources) > 1 else ""), report.plot_format
        )
    ]


@SECTIONS.register("search", "an Optuna search's trials", order=15, files=_search_files)
def search_section(report, _plots=None) -> list[str]:
    sources = _search_sources(report)
    if not sources:
        return []
    names = ["search.md"] if len(sources) == 1 else [f"{s.name}/search.md" for s in sources]
    links = [f"The trials, ranked by the objective: [{n}]({n})." for n in names]
    return ["## Search", "", *links, ""]
