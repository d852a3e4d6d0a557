"""``sam-report FOLDER...``: one table and a few plots for one sweep or several.

Reads every job's ``summary.json`` and ``.hydra/`` files through ``rundir.RunDir`` (never live
state), so it works on a sweep that is still running or partly failed, and says which jobs are
missing. FOLDER is a sweep folder or a run folder; several make one report whose groups span
them (``sweep.py``), and ``--db FILE --where "SQL"`` takes the run folders of a results database
(``sam-index``). Writes, into the (first) folder or ``--out``:

- ``report.md``: the registered sections (``sections.py``), in order: the head, the runs table
  (runs_table.py: the sweep's own table leads), the measures (measure_ranking.py; a ranking of
  fewer than 10 jobs after the analyses), the corruption mCE (corruption.py), the edge of
  stability (eos.py), the loss landscape (landscape.py), the jobs not completed, the figures,
  one row per job, the notes; with several folders, the runs table says where each group came
  from; TLC-SAM's stability bound is shown (and explained under the table) where the sweep has
  TLC-SAM jobs;
- ``report.csv``: the runs table, one row per group, one column per statistic (and the columns
  sections add: the landscape's; ``from`` with several folders);
- ``acc_vs_rho``, ``lambda_max_vs_rho`` (log scale, with TLC-SAM's stability bound where the
  sweep has TLC-SAM jobs that logged what it needs), ``ece_vs_rho`` (variants at one ρ set apart
  sideways), ``acc_vs_lambda_max``, ``compute`` (accuracy and λ_max per gradient evaluation,
  where the groups' costs differ, compute.py), ``eos`` (each a .png, or
  .pdf or .svg with ``plots.format=``), and the files sections write (``measures.csv``,
  ``measures.<format>``).

Written again into one folder, a report removes the files the last one wrote there and this one
does not (``MANIFEST``), and reuses the jobs' YAML files as the last one parsed them while they
are unchanged (``CACHE``, ``rundir.ParsedYaml``), and the figures it drew while their data and
drawing code are unchanged (``plots.cache.FIGURES``). The choices (groups, statistics, missing
jobs, the bound) are sweep.py's.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING

from .. import interrupts
from ..cli_words import say_version
from ..errors import UserError, check_names, require
from ..rundir import parsed_yaml_kept_in
from ..runfiles import atomic_write_bytes, finite, read_json
from .runs_table import _job_name, counts_line
from .sections import ordered
from .sweep import BOUND_STATS, STATUSES, Report, build_report

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..plots.aside import DrawnAside

__all__ = ["build_report", "write_report", "render_markdown", "render_csv", "main"]

# what the last report wrote into its folder, so that the next one removes the files of what no
# longer applies (a section whose jobs are gone, ρ figures of a sweep without ρ): never a file
# the report did not write
MANIFEST = ".sam-report-files.json"
# the jobs' YAML files as the last report parsed them, reused while unchanged (rundir.ParsedYaml)
CACHE = ".sam-report-cache.json"


def render_markdown(report: Report, plots: list[Path]) -> str:
    """report.md: one registered section after another."""
    return "\n".join(line for e in ordered() for line in e.target(report, plots))


def render_csv(report: Report) -> str:
    """report.csv: one row per group (its series, variant, ρ, job counts and statistics)."""
    buf = io.StringIO()
    cols = ["group", "series", "variant", "rho", "jobs", *STATUSES]
    cols += [f"{k}_{s}" for k in report.metrics + BOUND_STATS for s in ("mean", "std", "n")] + [
        "above_bound"
    ]
    extra = [e for e in ordered() if e.csv_columns is not None]
    cols += [c for e in extra for c in e.csv_columns()]
    cols += ["from"] * (len(report.sources) > 1)
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
        row += [g["above_bound"], *(c for e in extra for c in e.csv_cells(g))]
        w.writerow(row + [" ".join(g["sources"])] * (len(report.sources) > 1))
    return buf.getvalue()


def write_plots(report: Report, out_dir: Path) -> list[Path]:
    """The report's figures into ``out_dir``; their paths."""
    from ..plots.cache import save_plot
    from ..plots.compute import PANELS, plot_compute
    from ..plots.sweep import plot_acc_vs_lambda, plot_eos_traces, plot_metric_vs_rho
    from .compute import compute_points, costs_differ, pareto_front
    from .eos import traces

    g = report.groups
    points = [
        (j.variant, j.metrics.get("lambda_max"), j.metrics.get("test_acc"))
        for j in report.jobs
        if j.status == "completed"
    ]
    figures = []  # (stem, the function that draws it, its arguments): drawn unless kept
    if any(finite(row["rho"]) for row in g):  # gradient descent against itself has no ρ figures
        lam = ("λ_max (log scale)", True, report.bound_shown, "λ_max against ρ")
        figures += [
            ("acc_vs_rho", plot_metric_vs_rho, (g, "test_acc", "test accuracy")),
            ("lambda_max_vs_rho", plot_metric_vs_rho, (g, "lambda_max", *lam)),
            ("ece_vs_rho", plot_metric_vs_rho, (g, "test_ece", "test ECE")),
        ]
    figures.append(("acc_vs_lambda_max", plot_acc_vs_lambda, (points,)))
    cost = compute_points(report)
    if costs_differ(cost):  # accuracy per compute: groups that counted different passes
        fronts = {key: pareto_front(cost, key, up) for key, _, up in PANELS}
        figures.append(("compute", plot_compute, (cost, fronts)))
    eos = traces(report)
    if eos:
        figures.append(("eos", plot_eos_traces, (eos,)))
    fmt = report.plot_format
    return [save_plot(out_dir, name, fmt, draw, *args) for name, draw, args in figures]


def write_report(
    report: Report, out_dir: Path | str | None = None, aside: DrawnAside | None = None
) -> list[Path]:
    """report.md, report.csv, the figures and every section's files into ``out_dir`` (default:
    the sweep folder); their paths.

    Args:
        report: what ``build_report`` read.
        out_dir: where the files go.
        aside: a drawing server (``plots.aside``) for the figures, started before the report
            was read; None draws them here.
    """
    from ..plots.cache import figures_kept_in

    out_dir = Path(out_dir or report.sweep_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        # a figure drawn before from the same data is kept; the others are drawn aside while
        # the tables are made (the sweep's figures first: their data is at hand)
        with figures_kept_in(out_dir, aside):
            plots = write_plots(report, out_dir)
            files = [p for e in ordered() if e.files is not None for p in e.files(report, out_dir)]
            csv_text, markdown = render_csv(report), render_markdown(report, plots)
        atomic_write_bytes(out_dir / "report.csv", csv_text.encode())
        atomic_write_bytes(out_dir / "report.md", markdown.encode())
        written = [out_dir / "report.md", out_dir / "report.csv", *plots, *files]
        _drop_stale(out_dir, written)
    except OSError as e:
        raise UserError(
            f"cannot write the report into {out_dir} ({e.strerror or e}); choose another with --out"
        ) from None
    return written


def _drop_stale(out_dir: Path, written: list[Path]) -> None:
    """Remove what the last report here wrote and this one did not; record what this one did."""
    names = sorted({p.relative_to(out_dir).as_posix() for p in written})
    before = (read_json(out_dir / MANIFEST) or {}).get("files")
    for name in before if isinstance(before, list) else []:
        stale = isinstance(name, str) and name not in names and ".." not in Path(name).parts
        if stale and not Path(name).is_absolute():
            (out_dir / name).unlink(missing_ok=True)
    atomic_write_bytes(out_dir / MANIFEST, json.dumps({"files": names}, indent=1).encode())


def parser() -> argparse.ArgumentParser:
    """``sam-report``'s argument parser."""
    ap = argparse.ArgumentParser(
        prog="sam-report",
        description="Tables and plots for sam-run sweep folders (one, or several in one report).",
        epilog="Settings among the folders: plots.format=png|pdf|svg (the figures' file format; "
        "default png).",
    )
    ap.add_argument(
        "folders",
        type=Path,
        nargs="*",
        metavar="FOLDER",
        help="sweep folders (hydra.sweep.dir of `sam-run -m`) or run folders",
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
    ap.add_argument("--db", type=Path, metavar="FILE", help="a results database of sam-index")
    ap.add_argument(
        "--where",
        metavar="SQL",
        help='with --db: the runs to report, an SQL condition on table runs (e.g. "'
        '\\"dataset.name\\" = \'cifar100\'")',
    )
    ap.add_argument(
        "--out",
        type=Path,
        help="where to write the report (default: the sweep folder; needed with several)",
    )
    return ap


def build(args: argparse.Namespace) -> Report:
    """The report the arguments ask for (one-line errors for bad ones)."""
    require(
        bool(args.folders) != bool(args.db),
        "give sweep or run folders, or --db FILE (with --where), not both and not neither",
    )
    require(args.where is None or args.db, "--where filters a database: add --db FILE")
    require(
        args.db is None or args.db.is_file(),
        f"--db {args.db} does not exist; index folders into it first: sam-index PATH --db "
        f"{args.db}",
    )
    require(
        args.out is not None or (len(args.folders) == 1 and not args.db),
        "a report of several folders or of a database needs --out FOLDER (where to write it)",
    )
    if args.db is None:
        return check_asked(build_report(args.folders, args.metric, args.ignore), args)
    from .index import selected_runs
    from .sweep import build_from_dirs

    runs = selected_runs(args.db, args.where)
    sources = list(dict.fromkeys(source for _, source in runs))
    jobs = [(Path(d), _name(Path(d), Path(s)), s) for d, s in runs]
    return check_asked(
        build_from_dirs(
            [Path(s) for s in sources], [Path(d) for d, _ in runs], args.metric, args.ignore, jobs
        ),
        args,
    )


def check_asked(report: Report, args: argparse.Namespace) -> Report:
    """The report, unless a ``--metric`` no job logged or an ``--ignore`` no job overrides was
    asked for (a typo that would leave a blank column or pool nothing): a one-line error naming
    the nearest key, else the keys there are."""
    from ..settings import override_key

    overridden = {"seed"} | {override_key(o) for j in report.jobs for o in j.overrides}
    for key in args.ignore:
        what = "an override key of any job"
        require(key in overridden, _unknown("--ignore", key, overridden, what))
    asked = [m for m in args.metric if all(j.metrics.get(m) is None for j in report.jobs)]
    if asked:
        logged = set()  # the keys with a number (a column of config or bins is no metric)
        for j in report.completed():
            run = j.run
            for values in (run.summary or {}, *run.rows()):
                logged |= {k for k, v in values.items() if _is_number(v)}
        for key in asked:
            what = "a numeric summary.json or metrics.jsonl key of any completed job"
            require(key in logged, _unknown("--metric", key, logged, what))
    return report


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _unknown(option: str, key: str, keys: set, what: str) -> str:
    import difflib

    near = difflib.get_close_matches(key, sorted(keys), n=1)
    hint = f"did you mean {near[0]}?" if near else "choose one of " + ", ".join(sorted(keys))
    return f"{option} {key} is not {what}; {hint}"


def _name(run_dir: Path, source: Path) -> str:
    try:
        rel = str(run_dir.relative_to(source))
    except ValueError:
        return run_dir.name
    return f"{source.name}/{rel}" if rel != "." else source.name


SETTINGS = ("plots.format",)  # key=value words among the folders: the figures' file format
VALUE_OPTIONS = ("--metric", "--ignore", "--db", "--where", "--out")
EVAL_SETTINGS = ("metrics", "eval", "weights")  # sam-eval's words, given to sam-report by mistake


def split_settings(argv: list[str]) -> tuple[list[str], dict]:
    """(the other words, {key: value} of the ``plots.KEY=VALUE`` words), the one grammar of the
    analysis commands (cli_words.py); an unknown ``plots.`` key is a one-line error."""
    rest, given = [], {}
    for i, word in enumerate(argv):
        key, _, value = word.partition("=")
        if not (key.startswith("plots.") and value):
            # a setting of another command (sam-eval's metrics=full), not a folder, nor the value
            # of an option (--where "status = 'completed'")
            setting = re.fullmatch(r"[A-Za-z_][\w.]*=\S+", word) is not None
            after_option = i > 0 and argv[i - 1] in VALUE_OPTIONS
            other = setting and not after_option and not Path(word).exists()
            require(
                not other,
                f"{word} is not a setting of sam-report, which takes {', '.join(SETTINGS)}"
                + (
                    f"; {key}= is sam-eval's: run sam-eval FOLDER {word}, then sam-report FOLDER"
                    if key.split(".")[0] in EVAL_SETTINGS
                    else ""
                ),
            )
            rest.append(word)
            continue
        require(key in SETTINGS, f"{key} is not a setting; sam-report takes {', '.join(SETTINGS)}")
        given[key] = value
    return rest, given


def main(argv: Sequence[str] | None = None) -> int:
    """``sam-report``: the report of the folders given; the exit status."""
    argv = [str(a) for a in (sys.argv[1:] if argv is None else argv)]
    if say_version(argv):
        return 0
    interrupts.catch_signals()
    try:
        return report_main(argv)
    except KeyboardInterrupt:  # each file is written whole (atomically): old or new, never half
        interrupts.stopping()
        print(
            interrupts.said(
                "sam-report",
                "interrupted; the files already written are complete: run the "
                "same command again for the whole report",
            ),
            file=sys.stderr,
        )
        return interrupts.exit_code()


def report_main(argv: list[str]) -> int:
    """``sam-report`` after ``--version``: its settings split off, the report built and written;
    the exit status."""
    try:
        argv, settings = split_settings(argv)
        from ..cli_words import check_format

        fmt = check_format(settings.get("plots.format", "png"))
    except UserError as e:
        interrupts.raise_pending()  # a signal a library turned into an error
        print(f"sam-report: error: {e}", file=sys.stderr)
        return 2
    args = parser().parse_args(argv)
    from ..plots.aside import DrawnAside

    aside = DrawnAside()  # started now: it imports matplotlib while the jobs are read
    try:
        check_names(*args.folders, args.out, args.db)
        out = args.out or (args.folders[0] if len(args.folders) == 1 else None)
        with parsed_yaml_kept_in(out / CACHE) if out is not None else nullcontext():
            report = build(args)
            report.plot_format = fmt
            paths = write_report(report, args.out, aside)
    except UserError as e:
        interrupts.raise_pending()  # a signal a library turned into an error
        print(f"sam-report: error: {e}", file=sys.stderr)
        return 2
    finally:
        aside.abandon()  # nothing left to do after write_report, else its work dropped
    print(f"{counts_line(report)}; report: {paths[0]}")
    for j in report.jobs:
        if j.status == "missing":
            print(_listed("missing", report, j, j.detail))
        if j.status == "pruned":
            s = (j.run.summary if j.run is not None else None) or {}
            where = f"at epoch {s.get('pruned_epoch')} of {s.get('planned_epochs')}"
            print(_listed("pruned", report, j, where))
    return 0


def _listed(status: str, report, job, why: str) -> str:
    """``  STATUS: JOB OVERRIDES (WHY)``, of the job's overrides those not every job's (what
    sets it apart; a sweep's shared settings would hide it in a long line)."""
    said = [_job_name(report, job), report.varying(job), f"({why})"]
    return f"  {status}: " + " ".join(x for x in said if x)


if __name__ == "__main__":
    sys.exit(main())
