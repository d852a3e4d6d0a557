"""What ``sam-run`` checks before Hydra runs anything: every job of the command composes, and
every value in it is one a run accepts (``validate.validate_config``); keys added with ``+``
under the runner's own groups exist; the run or sweep folder (by default named after the
command's overrides) can be created. A bad input is one line on stderr and exit status 2, and
nothing is written: no run folder, no sweep folder."""

from __future__ import annotations

import difflib
import os
import re
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from . import interrupts
from .errors import UserError, first_line
from .paths import config_dir
from .rundir import RunDir
from .settings import override_key

if TYPE_CHECKING:
    from argparse import Namespace

    from hydra.errors import MissingConfigException
    from omegaconf import DictConfig

    from .progress import Counter

# the config groups whose keys the runner reads: a key added under them with "+" must exist
RUNNER_GROUPS = (
    "dataset",
    "model",
    "optimizer",
    "base_optimizer",
    "scheduler",
    "trainer",
    "logger",
    "metrics",
    "regularizer",
    "weight_decay",
    "federated",
)
_ABSENT = object()
# the topmost folder this command created for its run or sweep folder (None: that existed)
created: Path | None = None
# whether this command's jobs were composed and checked here (the sweeper then does not again)
checked = False


def preflight(argv: list[str]) -> list[str]:
    """``argv`` checked (exit 2 with one line on a bad input), with its default folder added."""
    from .sweep.hydra_api import args_parser

    args = args_parser().parse_args(argv)
    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        return argv
    if _not_a_run(args):
        message = config_source_error(args) or (
            check_jobs(args, validate=False)[0] if args.cfg or args.help else None
        )
        if message:
            fail(message)
        return argv
    if not args.multirun:
        say_if_completed(args)
    message, notes = check_jobs(args)
    if message:
        fail(message)
    global checked
    checked = True
    for note in notes:
        print(f"sam-run: warning: {note}", file=sys.stderr)
    argv = with_default_folder(argv, args)
    make_output_folder(argv, args.multirun)
    return argv


def _not_a_run(args: Namespace) -> bool:
    return bool(
        args.help
        or args.hydra_help
        or args.shell_completion
        or args.config_path
        or args.config_name
        or args.config_dir
        or args.experimental_rerun
        or args.cfg
        or args.info
    )


def config_source_error(args: Namespace) -> str | None:
    """``--config-dir``, ``--config-path`` and ``--config-name`` that name no folder or config:
    the message (Hydra's own is several lines, exit 1), else None."""
    for flag, folder in (("--config-dir", args.config_dir), ("--config-path", args.config_path)):
        if folder and (flag == "--config-dir" or Path(folder).is_absolute()):
            if not Path(folder).is_dir():
                return f"{flag}={folder}: no such folder; give a folder of config YAML files"
    name = args.config_name
    if not name:
        return None
    if args.config_path and not Path(args.config_path).is_absolute():
        return None  # relative to the app's module, as Hydra takes it: Hydra answers
    folders = [Path(f) for f in (args.config_path or config_dir(), args.config_dir) if f]
    if any((f / name).is_file() or (f / f"{name}.yaml").is_file() for f in folders):
        return None
    return (
        f"--config-name={name}: no config {name}.yaml in {', '.join(map(str, folders))}; "
        "sam-run's own config is config (the default: leave --config-name out)"
    )


def fail(message: str) -> None:
    """``sam-run: error: <message>`` on stderr, and exit 2."""
    interrupts.raise_pending()  # a signal a library turned into an error
    print(f"sam-run: error: {message}", file=sys.stderr)
    sys.exit(2)


def jobs_of(args: Namespace) -> list[tuple[list[str], str | None]]:
    """The overrides of every job of the command (one for a run), without repeats, each with
    the search bound it stands for (None: a job that runs). A search's jobs are not known
    before it runs: its fixed settings stand for them, once alone and once with each bound of
    each searched key."""
    if not args.multirun:
        return [(args.overrides, None)]
    from .sweep import hydra_api
    from .sweep.plan import completed_jobs, exclude_keys, expand, fixed_config, sweeper_params

    began = time.monotonic()
    try:
        fixed = fixed_config(args.overrides)
    except Exception:  # a key of one swept variant only: each job's own compose names it
        fixed = fixed_config([o for o in args.overrides if _choice_or_hydra(o)])
    if hydra_api.is_search(OmegaConf.select(fixed, "hydra.sweeper._target_", default="")):
        return search_jobs(args.overrides, fixed)
    require_confirmed(args.overrides, sweeper_params(fixed), time.monotonic() - began)
    jobs = expand(args.overrides, sweeper_params(fixed))
    done = completed_jobs(sweep_folder(args), jobs, exclude_keys(fixed))
    if done:  # their configs are not composed again; one stands for them all (see below)
        first = min(done)
        require_same_result(sweep_folder(args) / str(first), jobs[first], done[first])
    left = [j for num, j in enumerate(jobs) if num not in done]
    return [(list(j), None) for j in {tuple(j): j for j in left}.values()]


# a grid of more jobs than this runs only when confirmed: each job is composed and checked
# before the first one starts (0.04-0.15 s each here), and such a sweep is more often a typo
# (range(0,100000)) than meant; SAM_RUNNER_MAX_JOBS=N confirms a sweep of up to N jobs
MAX_JOBS, MAX_JOBS_ENV = 10_000, "SAM_RUNNER_MAX_JOBS"
PROGRESS_FROM = 100  # jobs: a sweep of as many says how its checks go (on stderr),
CHECKS_QUIET_S = 5.0  # once they have taken this long (checks done by then say nothing)


def require_confirmed(arguments: list[str], params: dict, per_job: float) -> None:
    """UserError when the sweep has more jobs than ``SAM_RUNNER_MAX_JOBS`` (``MAX_JOBS``
    unless set) allows, naming the count, its factors, about how long the checks would take
    (``per_job``: what composing one config took here) and how to confirm it."""
    from .errors import integer
    from .progress import _duration
    from .sweep.plan import sweep_size

    given = os.environ.get(MAX_JOBS_ENV, "").strip()
    allowed = int(given) if given.isdigit() else (given or MAX_JOBS)
    allowed = integer(MAX_JOBS_ENV, allowed, "a whole number of jobs >= 1", lambda n: n >= 1)
    count, parts = sweep_size(arguments, params)
    if count <= allowed:
        return
    raise UserError(
        f"this sweep is {count:,} jobs ({' x '.join(parts)}), more than the {allowed:,} a sweep "
        f"runs unconfirmed: sam-run checks every job before the first starts, about "
        f"{_duration(count * per_job)} here; confirm with {MAX_JOBS_ENV}={count} sam-run ..., "
        "or sweep fewer values"
    )


def _choice_or_hydra(override: str) -> bool:
    """A group choice (``optimizer=sam``) or a Hydra setting: what the sweeper's config needs."""
    key = override_key(override)
    return "." not in key or key.startswith("hydra")


def say_if_completed(args: Namespace) -> None:
    """A run whose folder holds it completed (the same job, the same config): its closing line
    again, and exit 0, composed once and before Hydra or torch load (what ``train()`` does for
    it, at a fraction of the start-up). Anything else goes the usual way."""
    from .sweep.plan import same_job

    given = [o.split("=", 1)[1] for o in args.overrides if override_key(o) == "hydra.run.dir"]
    run_dir = Path(given[-1] if given else default_folder(args))
    done = RunDir(run_dir).summary
    if not done or done.get("status") != "completed" or done.get("overrides") is None:
        return
    if not same_job(done["overrides"], args.overrides):
        return  # the callback refuses the folder, or the run takes it over
    from .errors import RunFolderConflict
    from .progress import print_final

    try:
        require_same_result(run_dir, args.overrides, done)
        redraw_in_format(run_dir, args.overrides)
    except (RunFolderConflict, UserError) as e:
        fail(str(e))
    print_final(done, run_dir, already=True)
    sys.exit(0)


def redraw_in_format(run_dir: Path, overrides: list[str]) -> None:
    """A completed run asked for with ``plots.format=F``: its figures in F, drawn from its files
    when it has none in F yet (a bad F: one line, exit 2)."""
    given = [o.split("=", 1)[1] for o in overrides if override_key(o) == "plots.format"]
    if not given:
        return
    from .cli_words import check_format

    fmt = check_format(given[-1])
    if not (run_dir / f"curves.{fmt}").exists():
        from .plots.run import write_run_plots

        write_run_plots(run_dir, fmt)


def run_folder(args: Namespace) -> Path:
    """The run folder of a single run: its ``hydra.run.dir``, else the default one."""
    given = [o.split("=", 1)[1] for o in args.overrides if override_key(o) == "hydra.run.dir"]
    return Path(given[-1] if given else default_folder(args))


def sweep_folder(args: Namespace) -> Path:
    """The sweep folder of a ``-m`` command: its ``hydra.sweep.dir``, else the default one."""
    given = [o.split("=", 1)[1] for o in args.overrides if override_key(o) == "hydra.sweep.dir"]
    return Path(given[-1] if given else default_folder(args))


def require_same_result(run_dir: Path, overrides: list[str], summary: dict) -> None:
    """RunFolderConflict when a completed run's recorded config is not what its overrides
    compose to now (a default changed since it ran): the check ``train()`` makes of a completed
    run; in a sweep, made on its first completed job instead of once per finished job."""
    from .settings import require_same_config, result_config
    from .sweep import stages
    from .sweep.plan import compose

    own = [o for o in overrides if not override_key(o).startswith("hydra")]
    # a preset from another config folder is found there again
    own += [o for o in overrides if override_key(o) == "hydra.searchpath"]
    cfg = compose(own)
    stages.resolve(cfg, list(overrides), Path(run_dir).parent.parent)  # as train_job does
    cfg = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])  # what train() is given
    require_same_config(
        summary.get("config"), result_config(cfg), f"the completed run in {run_dir}", run_dir
    )


def search_jobs(arguments: list[str], fixed: DictConfig) -> list[tuple[list[str], str | None]]:
    """A search's settings without the searched keys, then with each bound of each searched key
    (UserError on a malformed space, or without an objective to select on)."""
    from .errors import integer
    from .sweep import hydra_api, objective
    from .sweep.plan import sweeper_params

    for key in ("n_trials", "n_jobs"):
        value = OmegaConf.select(fixed, f"hydra.sweeper.{key}", default=1)
        integer(f"hydra.sweeper.{key}", value, "an integer >= 1", lambda n: n >= 1)
    lines = [f"{k}={v}" for k, v in sweeper_params(fixed).items()] + list(arguments)
    searched = hydra_api.search_space(lines)
    keys = {s.key for s in searched}
    base = [o for o in lines if override_key(o) not in keys]
    cfg = hydra_api.compose(base)
    objective.require_for_search(cfg)
    objective.require_logged(cfg)
    check_search_settings(fixed, cfg)
    jobs = [(base, None)]
    for s in searched:
        where = f"the search space {s.key}={s.text}"
        if s.malformed:
            raise UserError(f"{where} is malformed: {s.malformed}")
        _require_used(s.key, cfg, where)
        jobs += [([*base, f"{s.key}={b}"], f"{where}: its bound {s.key}={b}") for b in s.bounds]
    return jobs


def check_search_settings(fixed: DictConfig, cfg: DictConfig) -> None:
    """The search sweeper's settings (``hydra.sweeper.*``) against the job's config, before
    anything is written (one line, exit 2, on a bad one)."""
    from .sweep.search import Search

    settings = OmegaConf.to_container(fixed.hydra.sweeper, resolve=False)
    settings.pop("_target_", None)
    Search(**settings).check(cfg)


def _require_used(key: str, cfg: DictConfig, where: str) -> None:
    """A searched optimizer option the variant ignores (``optimizer=base`` and ρ) would spend
    every trial on one setting: refused."""
    from .registry import VARIANTS

    name = str(cfg.optimizer.name)
    ignored = VARIANTS.entry(name).ignored_options if name in VARIANTS else ()
    if key.startswith("optimizer.") and key.split(".", 1)[1] in ignored:
        raise UserError(
            f"{where}: optimizer={name} ignores {key}, so every trial would train the same "
            "model; search another variant, or drop the key from the space"
        )


def check_jobs(args: Namespace, validate: bool = True) -> tuple[str | None, list[str]]:
    """(the first bad input's message or None, the warnings of every job, once each); without
    ``validate``, only whether each job composes (``--cfg``: a config to look at)."""
    from hydra.errors import (
        ConfigCompositionException,
        MissingConfigException,
        OverrideParseException,
    )
    from omegaconf.errors import OmegaConfBaseException

    from .sweep import stages
    from .sweep.plan import ValueVariants
    from .sweep.value_checks import ValueChecks

    notes, job, bound = {}, args.overrides, None
    compose = ValueVariants()  # a sweep of values: composed once per set of group choices
    checks = ValueChecks()  # and checked once per shape, per job where a changed value is read
    if stages.current is None:  # a stage's sweep: its keys, then the user's (who may set one again)
        notes.update(dict.fromkeys(given_again(args.overrides)))
    try:
        message = given_twice(args.overrides) or _odd_values(args)
        if message or (args.multirun and (message := _sweep_values(args.overrides))):
            return message, []
        jobs = jobs_of(args)
        counter = checks_counter(len(jobs))
        try:
            for job, bound in jobs:
                message = None
                if validate:
                    message = _check_job(args, job, checks, notes)
                else:
                    compose(job)  # whether it composes
                counter.update()
                if message:
                    return message, []
        finally:
            counter.close()
    except OverrideParseException as e:
        empty = re.search(r"^([^=]+)=\s*choice\(\s*\)\s*$", str(e.override))
        if empty:  # Hydra's grammar has no empty choice
            return (
                f"the search space {e.override} holds no value; give {empty.group(1)} at "
                "least one (choice(a, b, ...))"
            ), []
        return (
            f"{e.override} is not a valid override ({first_line(e.message)}); see "
            "https://hydra.cc/docs/advanced/override_grammar/basic/"
        ), []
    except MissingConfigException as e:
        return _bound(bound, unknown_option(e)), []
    except ConfigCompositionException as e:
        return _bound(bound, _composition_error(e, job)), []
    except UserError as e:
        return _bound(bound, str(e)), []
    except OmegaConfBaseException as e:  # a key a check reads that the config lacks
        return _bound(bound, _in_job(args, job, _config_error(e, job))), []
    return None, list(notes)


def _check_job(args: Namespace, job: list[str], checks, notes: dict) -> str | None:
    """The checks of one job (the values a run accepts), through ``checks``
    (``sweep.value_checks.ValueChecks``: each check once per shape of job, again only where a
    value it reads changes): a bad input's message, or None with the job's notices added to
    ``notes``; Hydra's and OmegaConf's errors raised."""
    from .sweep import objective, stages
    from .training.validate import config_checks  # imports torch: only for a job to run
    from .training.warnings import warnings

    # a stage's references: read once their stage has run (a job of stage S runs in
    # <root>/S/<n>; a single run has no stages, and is told so)
    root = sweep_folder(args).parent if args.multirun else run_folder(args).parent.parent
    read = stages.current is not None or not args.multirun

    def job_checks(job, cfg):
        message = _added_keys(job) or _removed_keys(job, cfg) or _two_budgets(job)
        if message:
            return message, []
        return None, ignored_options(job, cfg) + idle_settings(job, cfg, args.multirun)

    def cfg_checks(job, cfg):
        awaiting = stages.resolve(cfg, job, root, read)
        return [
            (checks.RESOLVE, lambda: _resolve(cfg)),
            *((name, _no_notices(check)) for name, check in config_checks(cfg, awaiting)),
            ("objective", lambda: objective.validate(cfg)),
            # a key no run of it logs: before it trains
            ("objective_logged", _no_notices(lambda: objective.require_logged(cfg))),
            ("warnings", lambda: warnings(cfg)),
        ]

    # a job naming a stage's job has its config changed by the checks: checked whole
    message, found = checks(job, job_checks, cfg_checks, full=bool(stages.references(job)))
    notes.update(dict.fromkeys(found))
    return message


def _no_notices(check):
    """A check whose return value is no notice (a logger built to check its keys)."""
    return lambda: check() and None


def checks_counter(total: int) -> Counter:
    """How the checks of a sweep of ``PROGRESS_FROM`` jobs or more go, on stderr, once they
    have taken ``CHECKS_QUIET_S`` seconds: a bar on a terminal, else a line then, at every
    tenth and every half minute (a sweep of thousands takes minutes to check, and said
    nothing)."""
    from .progress import Counter

    mode = "auto" if total >= PROGRESS_FROM else "none"
    desc = "sam-run: checking the sweep's jobs"
    return Counter(total, desc, mode, unit="jobs", every=30.0, delay=CHECKS_QUIET_S)


def _in_job(args: Namespace, job: list[str], message: str) -> str:
    """A sweep job's error names the job (its swept values) when the sweep has several."""
    if not args.multirun:
        return message
    swept = [o for o in job if o not in args.overrides]
    return f"the job {' '.join(swept)}: {message}" if swept else message


DIGITS_LIMIT = 4300  # Python's (and so Hydra's) limit on the digits of an int it parses


def _odd_values(args: Namespace) -> str | None:
    """An empty ``hydra.run.dir``/``hydra.sweep.dir`` (Hydra would write into the current folder),
    or a number too long for Hydra's parser: the message, else None."""
    for o in args.overrides:
        key, _, value = o.partition("=")
        if key.lstrip("+") in ("hydra.run.dir", "hydra.sweep.dir") and value.strip("'\" ") == "":
            return (
                f"{key}={value} is empty, which would write into the current folder; give a "
                f"folder ({key}=outputs/NAME), or leave {key} out for the default one"
            )
        long = re.search(r"\d{%d,}" % (DIGITS_LIMIT + 1), value)
        if long:
            return (
                f"{key}={value[:12]}... holds a number of {len(long.group())} digits; Hydra "
                f"parses numbers of at most {DIGITS_LIMIT} digits"
            )
    return None


def _sweep_values(overrides: list[str]) -> str | None:
    """A swept key with no value (``seed=range(0,0)``) or one value listed twice
    (``optimizer=sam,sam``, ``optimizer.rho=0.05,0.050``): the message, else None."""
    from .sweep import hydra_api

    for o in hydra_api.overrides_parser().parse_overrides(list(overrides)):
        if not (o.is_sweep_override() and o.is_discrete_sweep()):
            continue
        try:
            values = list(o.sweep_string_iterator())
        except ValueError as e:  # range(0,3,0): Python's range refuses a zero step
            return (
                f"{o.input_line} is not a sweep ({first_line(str(e))}); give "
                "range(start,stop,step) with a step other than 0"
            )
        if not values:
            return f"{o.input_line} sweeps no value; give at least one ({o.get_key_element()}=a,b)"
        seen: set[str] = set()  # a set: a sweep of 100,000 values is checked in a blink
        twice = next((v for v in values if v in seen or seen.add(v)), None)
        if twice is not None:
            return (
                f"{o.input_line} lists {o.get_key_element()}={twice} twice (duplicates would "
                "train the same job again); list each value once"
            )
    return None


def _removed_keys(job: list[str], cfg: DictConfig) -> str | None:
    """``~optimizer``, ``~trainer.epochs``: a key the runner reads, removed (it has no default
    to fall back on); the message, else None. Keys added by the user may go."""
    from .sweep.plan import compose

    for o in job:
        if not o.startswith("~"):
            continue
        key = override_key(o)
        if OmegaConf.select(cfg, key, default=_ABSENT) is not _ABSENT or key.startswith("hydra"):
            continue
        without = compose([x for x in job if x is not o])
        if OmegaConf.select(without, key, default=_ABSENT) is not _ABSENT:
            o = o.removesuffix("=null")  # a sweep's job spells ~key as ~key=null
            return (
                f"{o} removes {key}, which the runner reads; set a value instead "
                f"({key}=...), or drop {o}"
            )
    return None


def _two_budgets(job: list[str]) -> str | None:
    """``trainer.steps`` and ``trainer.epochs`` both given: a run trains for one budget."""
    given = {override_key(o): o for o in job if "=" in o}
    steps, epochs = given.get("trainer.steps"), given.get("trainer.epochs")
    if steps and epochs and steps.split("=", 1)[1].strip().lower() not in ("null", "none", ""):
        return (
            f"{steps} and {epochs} are both given, and a run trains for one budget (steps "
            "override epochs); give one of them"
        )
    return None


def _resolve(cfg: DictConfig) -> None:
    """Every interpolation of the run's part of the config resolved, so that one naming no key
    (``optimizer.rho=${nope}``) is an error here, not in the middle of a run."""
    OmegaConf.to_container(
        OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]), resolve=True
    )


def _config_error(e, job: list[str]) -> str:
    """An OmegaConf error met while checking a job, as one line naming the override."""
    key = str(getattr(e, "full_key", "") or "")
    given = [
        o for o in job if override_key(o) == key or (key and key.startswith(override_key(o) + "."))
    ]
    text = first_line(getattr(e, "msg", "") or str(e))
    if given:
        return f"{given[-1]}: {text}; `sam-run --cfg job` lists the keys"
    return f"{key + ': ' if key else ''}{text}"


def given_twice(overrides: list[str]) -> str | None:
    """A key swept twice (``-m seed=0,1 seed=2,3``): Hydra keeps the last and the folder is named
    after both, so the message of the first such key, else None."""
    seen: dict[str, str] = {}
    for o in overrides:
        key = override_key(o)
        if not _is_sweep(o):  # a plain value after another: the last one counts (given_again)
            continue
        if key in seen and not o.startswith("~"):
            return (
                f"{key} is given twice ({seen[key]} and {o}); give it once (a sweep lists its "
                f"values in one override: {key}=a,b,c)"
            )
        seen[key] = o
    return None


def given_again(overrides: list[str]) -> list[str]:
    """A notice for each key given twice where one of the two is a plain value
    (``optimizer.rho=0.1 optimizer.rho=0.2``): Hydra keeps the last in silence. Not refused:
    setting a key again after a list of shared settings is how scripts and the tests' tiny
    budgets override one of them."""
    given: dict[str, str] = {}
    out = []
    for o in overrides:
        key = override_key(o)
        if o.startswith("~"):  # a removal, then a value (or the other way): two different acts
            given.pop(key, None)
            continue
        first = given.get(key)
        if first is not None and first != o and not (_is_sweep(first) and _is_sweep(o)):
            out.append(f"{key} is given twice ({first} and {o}): the last counts, {o}")
        given[key] = o
    return out


def _is_sweep(override: str) -> bool:
    """Whether an override sweeps (a top-level comma, or range/choice/interval/glob/tag)."""
    value = override.split("=", 1)[1] if "=" in override else ""
    if value.startswith(("range(", "choice(", "interval(", "glob(", "tag(")):
        return True
    depth = 0
    for ch in value:
        if ch in "[({":
            depth += 1
        elif ch in "])}":
            depth -= 1
        if ch == "," and depth == 0:
            return True
    return False


# a key the user sets that does nothing unless another has this value: (key, needs, its value)
NEEDS = (
    ("trainer.ema_decay", "trainer.weight_averaging", "ema"),
    ("trainer.ema_warmup", "trainer.weight_averaging", "ema"),
    ("trainer.swa_start", "trainer.weight_averaging", "swa"),
    ("trainer.swa_lr", "trainer.weight_averaging", "swa"),
    ("trainer.swa_anneal_epochs", "trainer.weight_averaging", "swa"),
)


def idle_settings(job: list[str], cfg: DictConfig, multirun: bool) -> list[str]:
    """A notice for each setting the user gave that changes nothing in this job: an option of
    weight averaging without it, ``model.reset_head`` without ``model.init_from``, a preset's
    sweep run without ``-m``."""
    given = {override_key(o): o for o in job}
    out = [
        f"{given[key]} does nothing without {needs}={value}: the run trains as without it"
        for key, needs, value in NEEDS
        if key in given and str(OmegaConf.select(cfg, needs)) != value
    ]
    if "model.reset_head" in given and OmegaConf.select(cfg, "model.init_from") is None:
        out.append(f"{given['model.reset_head']} does nothing without model.init_from=RUN_DIR")
    out += _idle_augment(given.get("dataset.augment"), cfg) + _idle_eval_period(given, cfg)
    out += _idle_curvature_period(given, cfg)
    out += never_acting(cfg)  # periods longer than the run (idle_periods.py)
    params = OmegaConf.select(cfg, "hydra.sweeper.params")
    if not multirun and params and "experiment" in given:
        swept = " ".join(f"{k}={v}" for k, v in params.items())
        out.append(
            f"{given['experiment']} is a sweep ({swept}): without -m one run trains, with the "
            "preset's other settings; add -m to run the sweep"
        )
    if not multirun and "hparams_search" in given:
        out.append(
            f"{given['hparams_search']} is a search: without -m one run trains with the settings "
            "as given and nothing is searched; add -m to run the search"
        )
    return out


def never_acting(cfg: DictConfig) -> list[str]:
    """A notice for each period longer than the run (``idle_periods.never_acting``)."""
    from .idle_periods import never_acting as periods

    return periods(cfg)


def _idle_augment(given: str | None, cfg: DictConfig) -> list[str]:
    """``dataset.augment=true`` (basic crop and flip) given for a dataset that is not augmented
    (the policies with an image operation are refused there: data/augment.py)."""
    from .data.augment import augmented, policy_name

    name = str(cfg.dataset.name)
    if given is None or policy_name(cfg.dataset.get("augment", True)) == "none":
        return []
    if augmented(name):
        return []
    return [f"{given} does nothing on dataset={name}, which is not augmented: the run trains as "
            "without it"]  # fmt: skip


def _idle_eval_period(given: dict, cfg: DictConfig) -> list[str]:
    """``trainer.eval_every_n_epochs`` beside ``trainer.eval_every_n_steps``: the steps decide."""
    steps = OmegaConf.select(cfg, "trainer.eval_every_n_steps")
    if "trainer.eval_every_n_epochs" in given and steps is not None:
        return [
            f"{given['trainer.eval_every_n_epochs']} does nothing with "
            f"trainer.eval_every_n_steps={steps}: the steps decide when a run evaluates"
        ]
    return []


def _idle_curvature_period(given: dict, cfg: DictConfig) -> list[str]:
    """A federated run measures λ_max every ``every_n_rounds`` rounds, a centralized one every
    ``every_n_epochs`` epochs: a notice for the one a job gives that its run does not read."""
    federated = str(OmegaConf.select(cfg, "federated.name", default="none")) != "none"
    rounds, epochs = "metrics.hessian.every_n_rounds", "metrics.hessian.every_n_epochs"
    if federated:
        unread, why = epochs, f"in a federated run, which measures every {rounds} rounds"
    else:
        unread, why = rounds, f"without a federated run (federated=fedavg, ...): use {epochs}"
    if unread in given and OmegaConf.select(cfg, unread):
        return [f"{given[unread]} does nothing {why}"]
    return []


def ignored_options(job: list[str], cfg: DictConfig) -> list[str]:
    """A notice for each ``optimizer.<option>`` a job sets that its variant ignores (``optimizer=
    base optimizer.rho=0.5``: nothing is perturbed), as a sweep leaves them out of its jobs."""
    from .registry import VARIANTS

    name = str(cfg.optimizer.name)
    ignored = VARIANTS.entry(name).ignored_options if name in VARIANTS else ()
    return [
        f"optimizer={name} ignores {o} (nothing is perturbed): the run trains as without it"
        for o in job
        if override_key(o).startswith("optimizer.") and override_key(o).split(".", 1)[1] in ignored
    ]


def _bound(bound: str | None, message: str) -> str:
    """A job's error; a search bound's names the bound first (the rest of the space is fine)."""
    return message if bound is None else f"{bound} is refused: {message}"


def _composition_error(e, job) -> str:
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    bad = re.match(r"Could not override '([^']+)'", str(e))
    if bad and isinstance(e.__cause__, (ConfigAttributeError, ConfigKeyError)):
        return _unknown_key(bad.group(1), job)
    text = str(e.__cause__ or e)
    ambiguous = re.match(r"Ambiguous value for argument '(([^'=]+)=[^']*)'", text)
    if ambiguous:  # Hydra's hint to add --multirun is on its later lines: kept in the one
        line, key = ambiguous.groups()
        return (
            f"{line} lists several values: to sweep over them, add -m (--multirun); for a list, "
            f"{key}=[...]; for a string, quote it"
        )
    return first_line(text)


def _added_keys(job: list[str]) -> str | None:
    """A key added with ``+`` under the runner's groups that the config does not have (a typo the
    runner would silently ignore): its message, else None."""
    from .sweep.plan import compose

    for o in job:
        key = override_key(o)
        hydra_top = key.startswith("hydra.") and key.count(".") == 1  # +hydra.foo: Hydra lacks it
        if not o.startswith("+") or "/" in key or (key.startswith("hydra") and not hydra_top):
            continue
        top = "." not in key  # +foo=1: a top-level key nothing reads, unless a config group
        if top and (Path(config_dir()) / key).is_dir():
            continue
        if not top and not hydra_top and key.split(".")[0] not in RUNNER_GROUPS:
            continue
        without = compose([x for x in job if x is not o])
        if OmegaConf.select(without, key, default=_ABSENT) is _ABSENT:
            return _unknown_key(key, job) + " (keys added with + must be keys the runner reads)"
    return None


def unknown_option(e: MissingConfigException) -> str:
    """``optimizer=foo is unknown (did you mean ...?); choose one of ...`` from Hydra's
    MissingConfigException (sam-run's and sam-eval's)."""
    found = re.search(r"Could not find '([^']+)'", str(e))
    if not found or not e.options:
        return first_line(str(e))
    group, _, value = found.group(1).rpartition("/")
    near = difflib.get_close_matches(value, e.options, n=1)
    hint = f" (did you mean {near[0]}?)" if near else ""
    return f"{group}={value} is unknown{hint}; choose one of {', '.join(e.options)}"


def _unknown_key(key: str, job: list[str]) -> str:
    """``trainer.epoch is not a key; did you mean trainer.epochs?``: the nearest key where the
    config without this override has one, else the keys it has there."""
    from .sweep.plan import compose

    try:
        cfg = compose([o for o in job if override_key(o) != key])
    except Exception:
        return f"{key} is not a key; `sam-run --cfg job` lists the keys"
    parent, _, leaf = key.rpartition(".")
    tree = node = OmegaConf.to_container(cfg)
    for part in parent.split(".") if parent else []:
        node = node.get(part) if isinstance(node, dict) else None
    if not isinstance(node, dict):  # the parent is no section either: match the whole key
        paths = [
            p for p in config_paths(tree) if not p.startswith("hydra.") or key.startswith("hydra.")
        ]
        near = difflib.get_close_matches(key, paths, n=1)
        return f"{key} is not a key; " + (
            f"did you mean {near[0]}?" if near else "`sam-run --cfg job` lists the keys"
        )
    keys = [str(k) for k in node if parent or k != "hydra"]
    choice = cfg.hydra.runtime.choices.get(parent)
    where = f" of {parent}={choice}" if choice is not None else ""
    near = difflib.get_close_matches(leaf, keys, n=1)
    if near:
        return f"{key} is not a key{where}; did you mean {parent + '.' if parent else ''}{near[0]}?"
    return f"{key} is not a key{where}; choose one of {', '.join(keys)}"


def config_paths(tree: dict, prefix: str = "") -> list[str]:
    """Every key of a config tree, sections and leaves, dotted."""
    out = []
    for k, v in tree.items():
        out.append(f"{prefix}{k}")
        if isinstance(v, dict):
            out += config_paths(v, f"{prefix}{k}.")
    return out


def with_default_folder(argv: list[str], args: Namespace) -> list[str]:
    """``argv`` with ``hydra.run.dir`` (a run) or ``hydra.sweep.dir`` (a sweep) set to the folder
    the command's overrides name, unless it sets one: the same command lands in the same folder."""
    key = "hydra.sweep.dir" if args.multirun else "hydra.run.dir"
    if args.help or args.hydra_help or any(override_key(o) == key for o in args.overrides):
        return argv
    return [*argv, f"{key}={default_folder(args)}"]


def default_folder(args: Namespace) -> str:
    """The folder the command's overrides name: outputs/<name> (a run), multirun/<name>."""
    from .sweep.plan import folder_name

    return f"{'multirun' if args.multirun else 'outputs'}/{folder_name(args.overrides)}"


def make_output_folder(argv: list[str], multirun: bool) -> None:
    """Create the run or sweep folder now, so that one that cannot be created (a read-only place,
    /proc) is one line instead of Hydra's traceback."""
    key = "hydra.sweep.dir=" if multirun else "hydra.run.dir="
    folder = next(a[len(key) :] for a in argv if a.startswith(key))
    global created
    try:
        missing = [
            p for p in [Path(folder).absolute(), *Path(folder).absolute().parents] if not p.exists()
        ]
        created = missing[-1] if missing else None
        Path(folder).mkdir(parents=True, exist_ok=True)
        probe = Path(folder) / f".write_probe{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        fail(
            f"{key[:-1]}={folder} cannot be created or written ({e.strerror or e}); choose a "
            "writable folder"
        )
