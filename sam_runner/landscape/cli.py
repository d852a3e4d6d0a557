"""``sam-landscape``: loss-landscape slices around a run, and mode connectivity between runs.

    sam-landscape RUN_DIR                          1-D and 2-D slices around the run
    sam-landscape RUN_A landscape.to=RUN_B         the straight line between two runs (barrier)
    sam-landscape SWEEP_DIR landscape.pairs=seeds  every pair of a sweep's jobs differing in seed
    sam-landscape SWEEP_DIR                        every completed job's slices

The options are ``landscape.KEY=VALUE`` words, with sam-run's ``trainer.device=``,
``trainer.progress=``, ``plots.format=`` and ``hydra/launcher=`` (the one grammar of the
analysis commands, grammar.py); ``translate`` turns them into the argparse flags that
parse them, and the earlier flags still work with a notice. Bad input is one line,
``sam-landscape: error: ...`` in the spelling the call used, exit 2, before anything is written.
"""

from __future__ import annotations

import argparse
import functools
import math
import re
import sys
from pathlib import Path

from ..errors import UserError, require
from ..jobarray import TasksFailed
from ..rundir import CHECKPOINT, has_checkpoint, is_run
from ..runfiles import read_json
from .figures import draw_pair, draw_slices, slice_figures
from .files import SUMMARY, connectivity_done, folder, pair_folder, slices_done
from .options import Options

PROG = "sam-landscape"
SLICE_FLAGS = ("slices", "directions", "span", "points", "grid", "include_bias_bn", "fit_radius")
PAIR_FLAGS = ("alpha_range", "alphas", "curve", "curve_epochs")
PROGRESS = ("auto", "bar", "lines", "none")
SETTINGS_HELP = (
    "how it runs, spelled as for sam-run: trainer.device=auto|cpu|cuda|cuda:N, "
    "trainer.progress=auto|bar|lines|none, hydra/launcher=local|slurm|submitit_local, "
    "hydra.launcher.KEY=VALUE, plots.format=png|pdf|svg (--device, --progress, --launcher, "
    "--launcher-option: the earlier spellings)"
)
LAUNCHERS = ("local", "slurm", "submitit_local")


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # argparse reads -5e-1 as an option; a number in e-notation is a value (--span -5e-1 5e-1)
        self._negative_number_matcher = re.compile(r"^-\d+$|^-\d*\.?\d+([eE][-+]?\d+)?$")

    def error(self, message):  # one line, not argparse's usage block
        self.exit(2, f"{PROG}: error: {message}\n")


def _slice_flags(ap) -> None:
    g = ap.add_argument_group("slices around one run (RUN_DIR, or each job of SWEEP_DIR)")
    g.add_argument("--slices", choices=("1d", "2d", "both"), help="which slices (default both)")
    g.add_argument(
        "--directions",
        choices=("random", "hessian"),
        help="filter-normalized random directions (default), or the top Hessian eigenvectors",
    )
    g.add_argument("--span", nargs=2, type=float, metavar=("LO", "HI"), help="default -1 1")
    g.add_argument("--points", type=int, help="points of the 1-D slice (default 51)")
    g.add_argument("--grid", type=int, help="points per axis of the 2-D slice (default 21)")
    g.add_argument(
        "--include-bias-bn",
        action="store_true",
        default=None,
        help="random directions also move biases and BatchNorm parameters (default: zero there)",
    )
    g.add_argument("--fit-radius", type=float, help="|α| of the quadratic fit (default 0.1)")


def _pair_flags(ap) -> None:
    g = ap.add_argument_group("between two runs (--to, --pairs)")
    g.add_argument("--to", type=Path, metavar="RUN_B", help="the other run (same architecture)")
    g.add_argument(
        "--pairs", choices=("seeds",), help="SWEEP_DIR: every pair of jobs differing only in seed"
    )
    g.add_argument(
        "--alpha-range", nargs=2, type=float, metavar=("LO", "HI"), help="default -0.25 1.25"
    )
    g.add_argument("--alphas", type=int, help="points along α (default 31; 0, 0.5, 1 among them)")
    g.add_argument(
        "--curve",
        choices=("linear", "bezier"),
        help="also train a quadratic Bézier curve between the runs (default linear: the line only)",
    )
    g.add_argument("--curve-epochs", type=int, help="epochs of curve training (default: the run's)")


def parser() -> argparse.ArgumentParser:
    ap = _Parser(
        prog=PROG,
        description=__doc__.split("\n\n")[0],
        epilog="docs/landscape.md: what is computed, the options and the files written.",
    )
    ap.add_argument("path", type=Path, metavar="RUN_DIR", help="a run folder, or a sweep folder")
    ap.add_argument("settings", nargs="*", metavar="KEY=VALUE", help=SETTINGS_HELP)
    _slice_flags(ap)
    _pair_flags(ap)
    g = ap.add_argument_group("evaluation")
    g.add_argument(
        "--seed",
        type=int,
        help="directions' seed (d1: seed, d2: seed + 1), Bézier t draws (default 0)",
    )
    g.add_argument(
        "--bn",
        choices=("eval", "recompute"),
        help="BatchNorm: the run's running statistics (default), or recomputed at each point",
    )
    g.add_argument(
        "--bn-samples", type=int, help="training samples of --bn recompute (default 4096)"
    )
    g.add_argument(
        "--train-samples",
        type=int,
        help="training subset size (default: the run's metrics.hessian.num_samples)",
    )
    g.add_argument("--batch-size", type=int, help="samples per forward pass (default 4096)")
    g.add_argument(
        "--weights",
        choices=("last", "averaged"),
        help="the run's final weights (default, into landscape/) or its averaged ones "
        "(checkpoints/averaged.pt of trainer.weight_averaging, into landscape_averaged/)",
    )
    g.add_argument("--device", help="auto (default), cpu, cuda or cuda:N")
    g.add_argument(
        "--progress",
        choices=PROGRESS,
        help="a tqdm bar, or a line at every tenth of a slice (auto: a bar on a terminal, else "
        "lines)",
    )
    g = ap.add_argument_group("a sweep folder's jobs or pairs as a job array")
    g.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        help="local: one after another here (default); slurm: one task of a SLURM array per job "
        "or pair, with sam-run's hydra/launcher=slurm preset; submitit_local: that array as "
        "local processes",
    )
    g.add_argument(
        "--launcher-option",
        action="append",
        metavar="KEY=VALUE",
        help="a key of that preset (partition=gpu, gpus_per_task=1, timeout_min=60); repeatable",
    )
    return ap


def _check_modes(args) -> None:
    given = {k for k, v in vars(args).items() if v is not None}
    between = args.to is not None or args.pairs is not None
    require(
        not (args.to is not None and args.pairs), "--to and --pairs exclude each other; use one"
    )
    array = args.launcher not in (None, "local") or args.launcher_option
    require(
        not array or (args.to is None and not _is_run_folder(args.path)),
        "--launcher and --launcher-option apply to a sweep folder (its jobs' slices, or "
        "--pairs seeds), not to one run or --to",
    )
    require(
        not args.launcher_option or args.launcher not in (None, "local"),
        "--launcher-option sets the array's launcher: add --launcher slurm (or submitit_local)",
    )
    wrong = [k for k in (SLICE_FLAGS if between else PAIR_FLAGS) if k in given]
    if wrong:
        flag = "--" + wrong[0].replace("_", "-")
        raise UserError(
            f"{flag} applies to slices, not to --to or --pairs"
            if between
            else f"{flag} applies to --to or --pairs, not to slices"
        )


def _count(name: str, value, least: int) -> None:
    require(value is None or value >= least, f"--{name}={value} must be an integer >= {least}")


def _range(name: str, pair, accepted: str, ok) -> None:
    if pair is None:
        return
    lo, hi = pair
    require(
        all(math.isfinite(v) for v in pair) and lo < hi and ok(lo, hi),
        f"--{name} {lo:g} {hi:g} must be {accepted}",
    )


def _check_values(args) -> None:
    _range(
        "span",
        args.span,
        "two finite numbers LO < 0 < HI (0 is the run itself)",
        lambda a, b: a < 0 < b,
    )
    _range(
        "alpha-range",
        args.alpha_range,
        "two finite numbers LO <= 0 and HI >= 1 (α = 0 and 1 are the two runs)",
        lambda a, b: a <= 0 and b >= 1,
    )
    for name, least in (("points", 3), ("grid", 3), ("alphas", 2), ("curve_epochs", 1)):
        _count(name.replace("_", "-"), getattr(args, name), least)
    for name in ("bn_samples", "train_samples", "batch_size"):
        _count(name.replace("_", "-"), getattr(args, name), 1)
    _count("seed", args.seed, 0)
    r = args.fit_radius
    require(
        r is None or (math.isfinite(r) and r > 0),
        f"--fit-radius={r} must be a finite number > 0",
    )
    require(
        args.curve != "bezier" or args.to is not None or args.pairs,
        "--curve bezier needs two runs: --to RUN_B, or --pairs seeds",
    )
    d = args.device
    require(
        d is None or d in ("auto", "cpu", "cuda") or (d.startswith("cuda:") and d[5:].isdigit()),
        f"--device={d} is unknown; choose auto, cpu, cuda or cuda:N",
    )


def options(args) -> Options:
    """The checked flags as Options (a flag not given keeps its default)."""
    _check_modes(args)
    _check_values(args)
    opt = Options()
    for key in vars(opt):
        value = getattr(args, key, None)
        if value is not None:
            setattr(opt, key, tuple(value) if isinstance(value, list) else value)
    return opt


def _device(name: str):
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    require(
        name == "cpu" or torch.cuda.is_available(),
        f"--device={name} but CUDA is not available here; use --device=cpu or auto",
    )
    device = torch.device(name)
    count = torch.cuda.device_count() if device.type == "cuda" else 0
    require(
        device.index is None or device.index < count,
        f"--device={name} but this machine has {count} GPU(s); choose cuda:0 to cuda:{count - 1}",
    )
    return device


def _is_run_folder(path: Path) -> bool:
    return is_run(path) or has_checkpoint(path)


FLAG_OF = {
    "trainer.device": "device",
    "trainer.progress": "progress",
    "hydra/launcher": "launcher",
    "plots.format": "plot_format",
}


def run_settings(args) -> None:
    """sam-run's spellings (grammar.py) into the flags' places."""
    from ..grammar import require_known, split_run_words
    from ..plots.style import FORMATS

    words = list(getattr(args, "settings", None) or [])
    require_known(
        words,
        PROG,
        "trainer.device=, trainer.progress=, hydra/launcher=, hydra.launcher.KEY=, plots.format=",
    )
    given, launcher_options, _ = split_run_words(words)
    choices = {"trainer.progress": PROGRESS, "hydra/launcher": LAUNCHERS, "plots.format": FORMATS}
    for key, value in given.items():
        accepted = choices.get(key)
        require(
            accepted is None or value in accepted,
            f"{key}={value!r} is unknown; choose one of {', '.join(accepted or ())}",
        )
        setattr(args, FLAG_OF[key], value)
    if launcher_options:
        args.launcher_option = [*(args.launcher_option or []), *launcher_options]


def run(args, say=print) -> dict:
    """What the flags ask for; returns the landscape.json written (or the sweep's counts)."""
    run_settings(args)
    opt = options(args)
    path = args.path
    require(
        path.is_dir(),
        f"folder {str(path)!r} does not exist or is not a folder; pass a run folder or a sweep "
        "folder sam-run wrote",
    )
    array = None
    if args.launcher not in (None, "local"):
        from ..jobarray import CLUSTERS, check_cluster, launcher_params

        check_cluster(CLUSTERS[args.launcher], f"--launcher {args.launcher}")
        array = (
            CLUSTERS[args.launcher],
            launcher_params(args.launcher, args.launcher_option or [], path / ".sam-landscape"),
        )
    # torch loads only for work to do here (an array's task resolves its device where it runs)
    device = functools.cache(lambda: _device(opt.device) if array is None else None)
    from . import pairs

    if args.pairs:
        require(
            not (path / CHECKPOINT).is_file(),
            f"--pairs seeds needs a sweep folder; {path} is a run folder (two runs: --to RUN_B)",
        )
        return pairs.connect_pairs(path, opt, device, say, array)
    if args.to is not None:
        return _connect_two(path, args.to, opt, device, say)
    if not _is_run_folder(path):
        return pairs.slice_jobs(path, opt, device, say, array)
    if slices_done(path, opt):  # nothing to compute: said from the folder, before torch loads
        say(_kept(folder(path, opt.weights), opt, "slices", slice_figures(opt.slices)))
        summary = read_json(folder(path, opt.weights) / SUMMARY)
        say(_slice_lines(path, opt, summary))
        return summary
    from ..rebuild import load_run
    from .slices import run_slices

    summary = run_slices(load_run(path, device(), opt.weights), opt)
    say(_slice_lines(path, opt, summary))
    return summary


def _connect_two(path: Path, to: Path, opt, device, say) -> dict:
    require(to.is_dir(), f"--to {str(to)!r} does not exist or is not a folder; pass a run folder")
    if to.resolve() == path.resolve():  # a valid check of the tool, but say so
        print(
            f"sam-landscape: warning: landscape.to={str(to)!r} is the run itself: every "
            "point is the same weights and the barrier is 0",
            file=sys.stderr,
        )
    out = pair_folder(path, to, opt.weights)
    if connectivity_done(path, to, opt):
        say(_kept(out, opt, "connectivity", ["connectivity"]))
        summary = read_json(out / SUMMARY)
        say(_pair_line(path, summary))
        return summary
    from ..rebuild import load_run
    from .connectivity import connect
    from .files import require_writable

    require_writable(path, opt.weights)  # before any point is computed
    run_a = load_run(path, device(), opt.weights)
    summary = connect(run_a, load_run(to, device(), opt.weights), opt)
    say(_pair_line(run_a.path, summary))
    return summary


def _kept(out: Path, opt, what: str, stems) -> str:
    """The line for a folder that holds the asked computation already (its figures in
    ``plots.format`` drawn from its files if missing)."""
    from .pairs import redraw_missing

    draw = draw_pair if what == "connectivity" else lambda o, f: draw_slices(o, f, opt.slices)
    redrawn = redraw_missing([out], stems, opt, draw)
    return f"{out}/: the {what} with these settings, newer than the weights: kept{redrawn}"


def _num(v) -> str:
    return "n/a" if v is None else f"{v:.4g}"


def _slice_lines(path: Path, opt, s: dict) -> str:
    from .files import folder

    out = [
        f"L(θ): train loss {_num(s.get('train_loss'))}, test loss {_num(s.get('test_loss'))} "
        f"({s.get('train_samples')} training samples, {s.get('test_samples')} test samples)"
    ]
    if opt.slices in ("1d", "both"):
        out.append(
            f"1-D slice: basin width {_num(s.get('basin_width_1d'))} (train loss <= L(θ) + 0.1), "
            f"curvature {_num(s.get('curvature_1d'))}"
        )
    if opt.slices in ("2d", "both"):
        widths = ", ".join(_num(w) for w in s.get("basin_width_2d") or [])
        out.append(f"2-D slice: basin widths {widths} along its two axes")
    out.append(f"written: {folder(path, opt.weights)}/")
    return "\n".join(out)


def _pair_line(run_a: Path, s: dict) -> str:
    line = (
        f"barrier: train loss {_num(s.get('barrier_train_loss'))}, test loss "
        f"{_num(s.get('barrier_test_loss'))}, train error {_num(s.get('barrier_train_error'))}, "
        f"test error {_num(s.get('barrier_test_error'))}"
    )
    curve = s.get("curve")
    if curve:
        line += (
            f"\nBézier curve: barrier train loss {_num(curve.get('barrier_train_loss'))}, "
            f"mean train loss {_num(curve.get('mean_train_loss'))} "
            f"(straight line {_num(curve.get('line_mean_train_loss'))})"
        )
    from .files import pair_folder

    weights = (s.get("run_a") or {}).get("weights", "last")
    return line + f"\nwritten: {pair_folder(run_a, Path(s['run_b']['run']), weights)}/"


RUN_SPELLING = {
    "device": "trainer.device=",
    "progress": "trainer.progress=",
    "launcher": "hydra/launcher=",
    "launcher_option": "hydra.launcher.KEY=VALUE",
}


def _as_flags(word: str, actions: dict) -> list[str]:
    """``landscape.KEY=VALUE`` as the flag argparse reads (``landscape.span=[-1,1]``: ``--span
    -1 1``; ``landscape.include_bias_bn=true``: ``--include-bias-bn``)."""
    import difflib

    key, value = word[len("landscape.") :].split("=", 1)
    if key not in actions:
        near = difflib.get_close_matches(key, list(actions), n=1)
        hint = f" (did you mean landscape.{near[0]}?)" if near else ""
        raise UserError(
            f"landscape.{key} is not an option{hint}; choose one of "
            + ", ".join(f"landscape.{k}" for k in actions)
        )
    action = actions[key]
    flag = action.option_strings[0]
    if action.nargs == 0:
        require(
            value.lower() in ("true", "false"),
            f"landscape.{key}={value!r} must be true or false",
        )
        return [flag] if value.lower() == "true" else []
    if action.nargs == 2:
        return [flag, *value.strip("[]").split(",")]
    return [flag, value]


def translate(argv: list[str]) -> tuple[list[str], list[str]]:
    """The one grammar (grammar.py): ``landscape.KEY=VALUE`` words as flags; and the
    notes of the earlier spellings (the flags) used."""
    from ..grammar import deprecated

    actions = {
        a.dest: a
        for a in parser()._actions
        if a.option_strings and a.dest not in ("help", *RUN_SPELLING)
    }
    by_flag = {o: a.dest for a in parser()._actions for o in a.option_strings}
    out, notes = [], []
    for word in argv:
        if word.startswith("landscape.") and "=" in word:
            out += _as_flags(word, actions)
            continue
        dest = by_flag.get(word.split("=", 1)[0]) if word.startswith("--") else None
        if dest is not None and dest != "help":
            new = RUN_SPELLING.get(dest, f"landscape.{dest}=")
            notes.append(deprecated(PROG, word.split("=", 1)[0], new))
        out.append(word)
    return out, notes


def in_grammar(message: str) -> str:
    """An error's flags (``--points=0``, ``--to``) in the one grammar's spellings
    (``landscape.points=0``, ``landscape.to``), for a call that used no flag."""
    by_flag = {o: a.dest for a in parser()._actions for o in a.option_strings}

    def word(m) -> str:
        dest = by_flag.get(m.group(1))
        if dest is None or dest == "help":
            return m.group(0)
        new = RUN_SPELLING.get(dest, f"landscape.{dest}=")
        if m.group(3):  # a range: --span -1 1 is landscape.span=[-1, 1]
            return f"{new}[{', '.join(m.group(3).split())}]"
        return new if m.group(2) else new.rstrip("=")

    number = r" [-+]?(?:[\d.]+(?:e[-+]?\d+)?|nan|inf)"
    return re.sub(rf"(?<![\w-])(--[a-z][a-z-]*)(=?)((?:{number}){{2}}(?![\w.]))?", word, message)


def main(argv=None) -> int:
    argv = [str(a) for a in (sys.argv[1:] if argv is None else argv)]
    try:
        argv, notes = translate(argv)
    except UserError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    args = parser().parse_intermixed_args(argv)
    try:
        run(args)
    except UserError as e:
        print(f"{PROG}: error: {e if notes else in_grammar(str(e))}", file=sys.stderr)
        return 2
    except TasksFailed as e:  # the others' results are written; the same command retries these
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; files already written are complete", file=sys.stderr)
        return 130
    from ..grammar import say_notes

    say_notes(notes)  # after the work: an error stays one line
    return 0


if __name__ == "__main__":
    sys.exit(main())
