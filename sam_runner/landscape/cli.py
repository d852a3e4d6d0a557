"""``sam-landscape``: loss-landscape slices around a run, and mode connectivity between runs.

    sam-landscape RUN_DIR                          1-D and 2-D slices around the run
    sam-landscape RUN_A landscape.to=RUN_B         the straight line between two runs (barrier)
    sam-landscape SWEEP_DIR landscape.pairs=seeds  every pair of a sweep's jobs differing in seed
    sam-landscape SWEEP_DIR landscape.pairs=optimizers   ... in base optimizer and seed
    sam-landscape SWEEP_DIR                        every completed job's slices

The options are Hydra overrides of conf/landscape.yaml (composed as sam-eval composes
conf/eval.yaml): ``landscape.*``, and the words every command shares with sam-run
(``trainer.device``, ``trainer.progress``, ``plots.format``, ``hydra/launcher``; cli_words.py).
``--to RUN_B`` is kept as the other spelling of ``landscape.to=RUN_B``. Bad input is one line,
``sam-landscape: error: ...`` naming the key as typed, exit 2, before anything is written.
"""

from __future__ import annotations

import functools
import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

from .. import cli_words, command_config, interrupts
from ..cli_words import say_version
from ..errors import UserError, check_names, integer, number, require
from ..jobarray import TasksFailed
from ..rundir import CHECKPOINT, RunDir, has_checkpoint, is_run
from ..runfiles import read_json
from .figures import draw_pair, draw_slices, slice_figures
from .files import SUMMARY, connectivity_done, folder, pair_folder, slices_done
from .options import PAIRINGS, Options

if TYPE_CHECKING:
    from collections.abc import Callable

    from omegaconf import DictConfig

PROG = "sam-landscape"
CONFIG = "landscape"
SLICE_KEYS = ("slices", "directions", "span", "points", "grid", "include_bias_bn", "fit_radius")
PAIR_KEYS = ("alpha_range", "alphas", "curve", "curve_epochs")
CHOICES = {
    "slices": ("1d", "2d", "both"),
    "directions": ("random", "hessian"),
    "curve": ("linear", "bezier"),
    "bn": ("eval", "recompute"),
    "weights": ("last", "averaged"),
}
COUNTS = {  # the least value of each count (null: the run's own, where the yaml says so)
    "points": 3,
    "grid": 3,
    "alphas": 2,
    "curve_epochs": 1,
    "bn_samples": 1,
    "train_samples": 1,
    "batch_size": 1,
    "seed": 0,
}


def parse_argv(argv: list[str]) -> tuple[Path | None, list[str], str | None]:
    """(the folder, the overrides, the other run or None); a word that is none is refused.
    ``landscape.to=PATH`` and ``--to PATH`` are taken as they are, not as Hydra overrides: a
    sweep's job folders are named ``model.channels=8_seed=1``, which Hydra's grammar refuses."""
    path, overrides, to = None, [], None
    words = iter(argv)
    for word in words:
        if word.startswith("landscape.to="):
            to = word[len("landscape.to=") :] or None
        elif word == "--to" or word.startswith("--to="):
            to = word[5:] if "=" in word else next(words, None)
            require(to, "--to needs a run folder: --to RUN_B (or landscape.to=RUN_B)")
        elif word.startswith("-"):
            raise UserError(
                f"{word} is not an option; sam-landscape takes KEY=VALUE overrides "
                "(landscape.points=21, trainer.device=cpu): sam-landscape --help lists them"
            )
        elif path is None and "=" not in word:
            path = Path(word)
        else:
            require("=" in word, f"{word!r} is not KEY=VALUE; one folder comes first")
            overrides.append(word)
    require(path is not None, "no folder given: sam-landscape RUN_DIR [KEY=VALUE ...]")
    check_names(path, to)
    return path, overrides, to


def _check_modes(ls, given: set[str], array: bool, path: Path) -> None:
    between = ls.to is not None or ls.pairs is not None
    require(
        not (ls.to is not None and ls.pairs is not None),
        "landscape.to and landscape.pairs exclude each other; use one",
    )
    if ls.pairs is not None:
        cli_words.check_choice(ls.pairs, "landscape.pairs", PAIRINGS)
    require(
        not array or (ls.to is None and not _is_run_folder(path)),
        "hydra/launcher applies to a sweep folder (its jobs' slices, or landscape.pairs), "
        "not to one run or landscape.to",
    )
    wrong = [k for k in (SLICE_KEYS if between else PAIR_KEYS) if f"landscape.{k}" in given]
    if wrong:
        raise UserError(
            f"landscape.{wrong[0]} applies to slices, not to landscape.to or landscape.pairs"
            if between
            else f"landscape.{wrong[0]} applies to landscape.to or landscape.pairs, not to slices"
        )
    require(
        ls.curve != "bezier" or between,
        "landscape.curve=bezier needs two runs: landscape.to=RUN_B, or landscape.pairs",
    )


def _range(name: str, pair, accepted: str, ok) -> tuple:
    key = f"landscape.{name}"
    shown = f"[{', '.join(f'{v:g}' for v in pair)}]" if _numbers(pair) else repr(pair)
    require(
        _numbers(pair) and len(pair) == 2 and all(math.isfinite(v) for v in pair),
        f"{key}={shown} must be {accepted}",
    )
    lo, hi = pair
    require(lo < hi and ok(lo, hi), f"{key}={shown} must be {accepted}")
    return float(lo), float(hi)


def _numbers(value) -> bool:
    return isinstance(value, (list, tuple)) and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) for v in value
    )


def _check_values(ls) -> dict:
    """The landscape keys, checked, as Options' values."""
    out = {k: v for k, v in vars(ls).items() if k not in ("to", "pairs")}
    for key, values in CHOICES.items():
        cli_words.check_choice(getattr(ls, key), f"landscape.{key}", values)
    for key, least in COUNTS.items():
        value = getattr(ls, key)
        if value is not None or key not in ("curve_epochs", "train_samples"):
            integer(f"landscape.{key}", value, f"an integer >= {least}", lambda v: v >= least)
    span = "two finite numbers [LO, HI], LO < 0 < HI (0 is the run itself)"
    out["span"] = _range("span", ls.span, span, lambda a, b: a < 0 < b)
    alphas = "two finite numbers [LO, HI], LO <= 0 and HI >= 1 (α = 0 and 1 are the two runs)"
    out["alpha_range"] = _range("alpha_range", ls.alpha_range, alphas, lambda a, b: a <= 0 <= b - 1)
    out["fit_radius"] = number(
        "landscape.fit_radius",
        ls.fit_radius,
        "a finite number > 0",
        lambda r: math.isfinite(r) and r > 0,
    )
    reach = max(-out["span"][0], out["span"][1])
    require(
        out["fit_radius"] < reach,
        f"landscape.fit_radius={ls.fit_radius} reaches the slice's ends (landscape.span="
        f"[{out['span'][0]:g}, {out['span'][1]:g}]), so the fit would take the whole slice; give "
        f"a radius below {reach:g}",
    )
    require(
        isinstance(ls.include_bias_bn, bool),
        f"landscape.include_bias_bn={ls.include_bias_bn!r} must be true or false",
    )
    return out


def options(cfg: DictConfig, given: set[str], path: Path) -> Options:
    """The composed config, checked, as Options."""
    from omegaconf import OmegaConf

    # plain values (lists, not ListConfig), by attribute
    ls = SimpleNamespace(**OmegaConf.to_container(cfg.landscape, resolve=True))
    _check_modes(ls, given, command_config.array_launcher(cfg) is not None, path)
    return Options(
        **_check_values(ls),
        device=cli_words.check_device(cfg.trainer.device),
        progress=cli_words.check_progress(cfg.trainer.progress),
        plot_format=cli_words.check_format(cfg.plots.format),
    )


def _is_run_folder(path: Path) -> bool:
    return is_run(path) or has_checkpoint(path)


def compose(path: Path, overrides: list[str], to: str | None) -> tuple[DictConfig, set[str]]:
    """conf/landscape.yaml with the overrides (the other run set after composing: a path is
    not an override's grammar), and the keys the call gave."""
    from omegaconf import OmegaConf

    from ..settings import override_key

    cfg = command_config.compose_command(CONFIG, overrides, path / ".sam-landscape")
    given = {override_key(o) for o in overrides}
    if to is not None:
        OmegaConf.update(cfg, "landscape.to", to)
        given.add("landscape.to")
    return cfg, given


def run(
    path: Path, overrides: list[str], to: str | None = None, say: Callable[..., None] = print
) -> dict:
    """What the overrides ask for; returns the landscape.json written (or the sweep's counts)."""
    require(
        path.is_dir(),
        f"folder {str(path)!r} does not exist or is not a folder; pass a run folder or a sweep "
        "folder sam-run wrote",
    )
    cfg, given = compose(path, overrides, to)
    for run_dir in (path, *([Path(to)] if to else [])):  # a density model has no accuracy
        require(
            RunDir(run_dir).get("model.arch") != "pc",
            f"{run_dir} is a probabilistic circuit's run (model=pc): sam-landscape draws a "
            "classifier's loss and accuracy; its curvature is in metrics.jsonl "
            "(hessian_trace_exact)",
        )
    opt = options(cfg, given, path)
    array = command_config.array_launcher(cfg)
    if array is not None:
        from ..jobarray import check_cluster

        check_cluster(array[0], "hydra/launcher=slurm")
    return _dispatch(path, cfg.landscape, opt, array, say)


def _dispatch(path: Path, ls, opt: Options, array, say) -> dict:
    from . import pairs

    # torch loads only for work to do here (an array's task resolves its device where it runs)
    device = functools.cache(lambda: _device(opt.device) if array is None else None)
    if ls.pairs is not None:
        require(
            not (path / CHECKPOINT).is_file(),
            f"landscape.pairs={ls.pairs} needs a sweep folder; {path} is a run folder (two runs: "
            "landscape.to=RUN_B)",
        )
        return pairs.connect_pairs(path, opt, device, say, array, ls.pairs)
    if ls.to is not None:
        return _connect_two(path, Path(ls.to), opt, device, say)
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


def _device(name: str):
    from ..distributed import resolve_device

    return resolve_device(name)


def _connect_two(path: Path, to: Path, opt, device, say) -> dict:
    require(
        to.is_dir(),
        f"landscape.to={str(to)!r} does not exist or is not a folder; pass a run folder",
    )
    require(  # every point would be the run's own weights, the barrier 0: surely a slip
        to.resolve() != path.resolve(),
        f"landscape.to={str(to)!r} is the run itself ({path}): the line between a run and itself "
        "is one point; give another run's folder (the same architecture)",
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


def shown_default(value: object) -> str:
    """A default as it is typed on the command line: ``[-1.0, 1.0]`` for a list (block YAML
    printed ``- -1.0``), ``null``, ``51``."""
    import yaml

    return yaml.safe_dump(value, default_flow_style=True).splitlines()[0]


def help_text() -> str:
    """The usage and every key of conf/landscape.yaml with the comment beside it."""
    import yaml

    from ..help import yaml_comments
    from ..paths import config_dir

    conf = Path(config_dir()) / f"{CONFIG}.yaml"
    tree = yaml.safe_load(conf.read_text())
    keys = {}
    for key, text in yaml_comments(conf).items():
        if not key.startswith("hydra."):
            section, leaf = key.split(".", 1)
            keys[f"{key}={shown_default(tree[section][leaf])}"] = text
    width = max(len(k) for k in keys) + 2
    lines = [__doc__.split("\n\n")[0], "", *__doc__.split("\n\n")[1].splitlines(), ""]
    lines += ["Overrides (KEY=VALUE after the folder; the defaults shown):"]
    lines += [f"  {k:<{width}}{text}" for k, text in keys.items()]
    lines += [
        "  hydra/launcher=slurm|submitit_local: a sweep folder's jobs or pairs as a job array",
        "    (hydra.launcher.KEY=VALUE: the launcher's keys, as for sam-run)",
        "",
        "--to RUN_B is the other spelling of landscape.to=RUN_B.",
        "docs/landscape.md: what is computed, the options and the files written.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``sam-landscape PATH [overrides]``; returns the exit status."""
    argv = [str(a) for a in (sys.argv[1:] if argv is None else argv)]
    if say_version(argv):
        return 0
    if any(a in ("-h", "--help") for a in argv):
        print(help_text())
        return 0
    interrupts.catch_signals()
    try:
        path, overrides, to = parse_argv(argv)
        run(path, overrides, to)
    except UserError as e:
        interrupts.raise_pending()  # a signal a library turned into an error
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except TasksFailed as e:  # the others' results are written; the same command retries these
        interrupts.raise_pending()  # a signal a library turned into an error
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        interrupts.stopping()
        print(
            interrupts.said(PROG, "interrupted; files already written are complete"),
            file=sys.stderr,
        )
        return interrupts.exit_code()
    return 0


if __name__ == "__main__":
    sys.exit(main())
