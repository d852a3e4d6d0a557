"""The report of a search folder (``sam-run -m hparams_search=...``): its Optuna study and the
trials' run folders, as tables and figures.

Writes, into the report folder:

- ``search.md``: the trials sorted by the objective (best first; failed and diverged trials,
  which scored the worst value, last), the best trial's settings, and its validation metrics
  beside its test metrics (the test numbers of the model the validation split selected);
- ``search.csv``: the trials table, one row per trial;
- ``search_<key>.png``: the objective against each searched key, one point per trial with a
  finite objective, on a log axis where the space is logarithmic;
- ``trials.csv``: every trial by number, its Optuna state, its job folder, its searched keys
  and its objective(s);
- with several objectives, ``pareto.csv`` (the columns of trials.csv: the completed trials
  with finite objectives that no other such trial dominates) and ``pareto.png``;
- ``importances.csv``: Optuna's parameter importances (fANOVA, seeded) of each objective, when
  at least two completed trials and a searched key that varies allow them.
"""

from __future__ import annotations

import csv
import io
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import UserError
from ..rundir import RunDir
from ..runfiles import atomic_write_bytes
from ..sweep.objective import OLD_STORAGE_FILE, STORAGE_FILE, STUDY_NAME
from .sections import SECTIONS, figure

if TYPE_CHECKING:
    from .sweep import Report

METRICS = ("loss", "acc", "ece", "nll")


@dataclass
class Trial:
    number: int
    state: str
    value: float | None  # the first objective's
    params: dict
    folder: Path
    run: RunDir  # its job folder's reader
    values: list | None = None  # one per objective

    @property
    def summary(self) -> dict:
        """The trial's summary.json ({} when absent)."""
        return self.run.summary or {}

    @property
    def finite(self) -> bool:
        """Completed, with a finite value of every objective (failed jobs score ±inf)."""
        good = self.values is not None and all(math.isfinite(v) for v in self.values)
        return self.state == "COMPLETE" and good


@dataclass
class Study:
    sweep_dir: Path
    direction: str  # maximize | minimize (the first objective's)
    objective: str  # the first objective's key
    trials: list[Trial]
    log_keys: set
    directions: list = None  # one per objective
    objectives: list = None  # their keys
    optuna_study: object = None

    def __post_init__(self):
        self.directions = self.directions or [self.direction]
        self.objectives = self.objectives or [self.objective]

    @property
    def several(self) -> bool:
        """Whether the study has several objectives."""
        return len(self.directions) > 1

    def pareto(self) -> list[Trial]:
        """The completed trials with finite objectives that no other such trial dominates (as
        good in every objective, better in one), by number."""
        signs = [1 if d == "maximize" else -1 for d in self.directions]
        done = [t for t in self.trials if t.finite]

        def dominates(a, b) -> bool:
            pairs = [(s * x, s * y) for s, x, y in zip(signs, a.values, b.values)]
            return all(x >= y for x, y in pairs) and any(x > y for x, y in pairs)

        front = [t for t in done if not any(dominates(o, t) for o in done if o is not t)]
        return sorted(front, key=lambda t: t.number)

    def ranked(self) -> list[Trial]:
        """Best first (by the first objective); then the pruned trials, by the value they
        stopped at (a partial run's, not comparable with a finished one's); trials without a
        finite value last, by number."""
        sign = -1 if self.direction == "maximize" else 1
        good = [t for t in self.trials if t.value is not None and math.isfinite(t.value)]
        pruned = [t for t in good if t.state == "PRUNED"]
        done = [t for t in good if t not in pruned]
        rest = [t for t in self.trials if t not in good]

        def best(trials):
            return sorted(trials, key=lambda t: (sign * t.value, t.number))

        return best(done) + best(pruned) + rest


def is_search(sweep_dir: Path | str) -> bool:
    """Whether a folder holds a search's study (the sweeper's journal, or an older SQLite file)."""
    return any((Path(sweep_dir) / f).is_file() for f in (STORAGE_FILE, OLD_STORAGE_FILE))


def load_study(sweep_dir: Path | str) -> Study:
    """The study of a search's sweep folder, read from its storage (one line when it cannot be)."""
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
        values = list(t.values) if t.values is not None else None
        first = values[0] if values else None
        trials.append(Trial(t.number, t.state.name, first, dict(t.params), folder, run, values))
        log_keys |= {
            k
            for k, d in t.distributions.items()
            if "Log" in type(d).__name__ or getattr(d, "log", False)
        }
    directions = [d.name.lower() for d in study.directions]
    keys = study.user_attrs.get("objectives") or (
        [objective] if isinstance(objective, str) else objective
    )
    if not keys or len(keys) != len(directions):
        keys = [f"objective_{i}" for i in range(len(directions))] if len(directions) > 1 else []
        keys = keys or ["objective"]
    return Study(sweep_dir, directions[0], keys[0], trials, log_keys, directions, list(keys), study)


def write_search_report(
    sweep_dir: Path | str, out_dir: Path | str | None = None, fmt: str = "png"
) -> list[Path]:
    """search.md, search.csv and one search_<key>.<fmt> per searched key, into ``out_dir``
    (default: the sweep folder); their paths."""
    study = load_study(sweep_dir)
    out_dir = Path(out_dir or sweep_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    plots = [scatter(study, key, out_dir, fmt) for key in searched_keys(study)]
    paths = [out_dir / "search.md", out_dir / "search.csv", out_dir / "trials.csv"]
    atomic_write_bytes(out_dir / "search.csv", render_csv(study).encode())
    atomic_write_bytes(out_dir / "trials.csv", trials_csv(study, study.trials).encode())
    if study.several:
        atomic_write_bytes(out_dir / "pareto.csv", trials_csv(study, study.pareto()).encode())
        plots.insert(0, pareto_plot(study, out_dir, fmt))
        paths.append(out_dir / "pareto.csv")
    importances = importances_csv(study)
    if importances is not None:
        atomic_write_bytes(out_dir / "importances.csv", importances.encode())
        paths.append(out_dir / "importances.csv")
    atomic_write_bytes(out_dir / "search.md", render_markdown(study, plots).encode())
    return [*paths, *plots]


def trials_csv(study: Study, trials: list[Trial]) -> str:
    """Trials by number: its Optuna state, its job folder (relative to the search folder),
    each searched key by its override name and each objective by its key."""
    keys = searched_keys(study)
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["number", "state", "job_dir", *keys, *study.objectives])
    for t in sorted(trials, key=lambda t: t.number):
        job_dir = (
            t.folder.relative_to(study.sweep_dir)
            if t.folder.is_relative_to(study.sweep_dir)
            else t.folder
        )
        values = t.values or [None] * len(study.objectives)
        w.writerow(
            [
                t.number,
                t.state,
                job_dir,
                *(t.params.get(k, "") for k in keys),
                *("" if v is None else v for v in values),
            ]
        )
    return out.getvalue()


def importances_csv(study: Study) -> str | None:
    """``objective,param,importance`` rows (Optuna's fANOVA importances, seeded, over the
    completed trials with finite objectives), or None where they cannot be computed."""
    import optuna

    done = [t.number for t in study.trials if t.finite]
    seen = {
        k: {str(t.params.get(k)) for t in study.trials if t.finite} for k in searched_keys(study)
    }
    varying = [k for k, values in seen.items() if len(values) > 1]
    if len(done) < 2 or not varying or study.optuna_study is None:
        return None
    finite = set(done)
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["objective", "param", "importance"])
    for i, key in enumerate(study.objectives):
        try:
            got = optuna.importance.get_param_importances(
                study.optuna_study,
                evaluator=optuna.importance.FanovaImportanceEvaluator(seed=0),
                params=varying,
                target=lambda t, i=i: t.values[i] if t.number in finite else float("nan"),
            )
        except (RuntimeError, ValueError) as e:  # too few trials of one kind, ...
            print(f"sam-report: importances of {key} not computed ({e})", file=sys.stderr)
            continue
        w.writerows([key, k, v] for k, v in got.items())
    return out.getvalue()


def searched_keys(study: Study) -> list[str]:
    """The keys the study's trials searched, in first-seen order."""
    return list(dict.fromkeys(k for t in study.trials for k in t.params))


def _cell(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    return "" if v is None else str(v)


def table_rows(study: Study) -> tuple[list[str], list[list]]:
    """The header and one row per trial: number, state, values and searched values."""
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
    """search.csv: one row per trial."""
    buf = io.StringIO()
    head, rows = table_rows(study)
    w = csv.writer(buf)
    w.writerow(head)
    w.writerows(rows)
    return buf.getvalue()


def outcome_lines(study: Study) -> list[str]:
    """How the trials ended, and the epochs pruning saved (against every trial run to its
    planned epochs)."""
    states = [t.summary.get("status") or t.state.lower() for t in study.trials]
    counts = {s: states.count(s) for s in dict.fromkeys(states)}
    ways = ", ".join(f"{k} ({d})" for k, d in zip(study.objectives, study.directions))
    said = ", ".join(f"{n} {s}" for s, n in counts.items())
    lines = [f"{len(study.trials)} trial(s) ({said}); objective {ways}."]
    pruned = [t.summary for t in study.trials if t.summary.get("status") == "pruned"]
    planned = [t.summary.get("planned_epochs") or t.summary.get("epochs") for t in study.trials]
    trained = [t.summary.get("epochs") for t in study.trials]
    if pruned and all(isinstance(x, int) for x in planned + trained):
        saved = sum(planned) - sum(trained)
        lines += [
            "",
            f"Pruning stopped {len(pruned)} trial(s) early and saved {saved} of "
            f"{sum(planned)} epochs ({saved / sum(planned):.0%}): the search trained "
            f"{sum(trained)} epochs.",
        ]
    return lines


def render_markdown(study: Study, plots: list[Path]) -> str:
    """search.md: the study's best trial(s), its table of trials and its figures."""
    head, rows = table_rows(study)
    lines = [
        f"# Search {study.sweep_dir}",
        "",
        *outcome_lines(study),
        "",
        "| " + " | ".join(head) + " |",
        "|" + "---|" * len(head),
    ]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    if study.several:
        lines += ["", *front_lines(study)]
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


def front_lines(study: Study) -> list[str]:
    """The Pareto front as a table (pareto.csv holds it too)."""
    keys = searched_keys(study)
    head = ["trial", *study.objectives, *keys]
    out = [f"## Pareto front: {len(study.pareto())} trial(s)", ""]
    out += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for t in study.pareto():
        cells = [t.number, *t.values, *(t.params.get(k) for k in keys)]
        out.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return out


def pareto_plot(study: Study, out_dir: Path, fmt: str = "png") -> Path:
    """The first two objectives of every completed trial, the Pareto front joined and each of
    its trials numbered."""
    from ..plots.style import figure, save_figure

    (kx, ky), (dx, dy) = study.objectives[:2], study.directions[:2]
    done = [t for t in study.trials if t.finite]
    front = sorted(study.pareto(), key=lambda t: t.values[0])
    fig, axes = figure()
    ax = axes[0][0]
    ax.scatter(
        [t.values[0] for t in done],
        [t.values[1] for t in done],
        s=18,
        c="0.7",
        label=f"completed ({len(done)})",
    )
    ax.plot(
        [t.values[0] for t in front],
        [t.values[1] for t in front],
        "o-",
        ms=6,
        label=f"Pareto front ({len(front)})",
    )
    for t in front:
        ax.annotate(
            f"#{t.number}",
            (t.values[0], t.values[1]),
            textcoords="offset points",
            xytext=(4, 4),
            fontsize=8,
        )
    arrow = {"maximize": "higher is better", "minimize": "lower is better"}
    ax.set_xlabel(f"{kx} ({arrow[dx]})")
    ax.set_ylabel(f"{ky} ({arrow[dy]})")
    ax.set_title(f"{ky} against {kx}: {len(front)} of {len(done)} trials on the front")
    ax.legend(fontsize=8)
    return save_figure(fig, out_dir, "pareto", fmt)


def _last(trial: Trial, key: str):
    """A key of the trial's final metrics line (val_loss, val_ece ... are not in summary.json)."""
    return next((r for r in reversed(trial.run.rows()) if "test_acc" in r), {}).get(key)


def scatter(study: Study, key: str, out_dir: Path, fmt: str = "png") -> Path:
    """search_<key>.<fmt>: the objective against one searched key, one point per trial."""
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
def search_section(report: Report, _plots: list[Path] | None = None) -> list[str]:
    """report.md's search section: each search source's best trial and trials table."""
    sources = _search_sources(report)
    if not sources:
        return []
    out = ["## Search", ""]
    for s in sources:
        name = "search.md" if len(sources) == 1 else f"{s.name}/search.md"
        study = load_study(s)
        out += [*outcome_lines(study), ""]
        if study.several:
            front = ", ".join(
                f"#{t.number} ("
                + ", ".join(f"{k}={_cell(v)}" for k, v in zip(study.objectives, t.values))
                + ")"
                for t in study.pareto()
            )
            out += [f"Pareto front: {front or 'no completed trial'}.", ""]
        else:
            best = [t for t in study.ranked()[:3] if t.finite]
            shown = "; ".join(
                f"#{t.number} {study.objective}={_cell(t.value)} "
                + " ".join(f"{k}={_cell(v)}" for k, v in t.params.items())
                for t in best
            )
            out += [f"Best trials: {shown or 'none completed'}.", ""]
        out += [f"The trials, ranked by the objective: [{name}]({name}).", ""]
    return out
