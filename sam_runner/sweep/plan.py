"""A sweep's plan: its jobs in Hydra's basic-sweeper order, their folders, and when two
overrides lists are the same job.

Our choices (not Hydra's): two overrides lists are "the same job" when they are equal after
dropping the keys in ``hydra.job.config.override_dirname.exclude_keys`` and
``settings.RUN_ONLY_KEYS`` (``trainer.device``, ``logger``, ``hydra/launcher``...: how a job
runs, not what it computes); a job that left no folder at all is ``missing``.
"""

from __future__ import annotations

import hashlib
import itertools
import math
import re
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import OmegaConf

from ..errors import RunFolderConflict, UserError
from ..rundir import RunDir, holds_results
from ..settings import RUN_ONLY_KEYS, describe_changes, override_key, run_only
from . import hydra_api

if TYPE_CHECKING:
    from collections.abc import Container, Mapping, Sequence
    from typing import Any

    from hydra.core.override_parser.types import Override
    from omegaconf import DictConfig

DEFAULT_EXCLUDE = ("trainer.device", "trainer.progress")
NAME_LIMIT = 120  # characters of a folder name; longer names end in a hash of the whole


# ---------------------------------------------------------------------------- folder names
def folder_name(overrides: list[str]) -> str:
    """The default folder of a run or a sweep (under outputs/ or multirun/): what the command
    asks for, so that the same command lands in the same folder and resumes there. The
    experiment preset's name first, then the other overrides sorted by key, how-it-runs keys
    (logger, device, progress, ...) and Hydra's own left out; ``key=a,b`` is written ``key-a+b``
    so that the name is a valid ``hydra.run.dir=`` value as it is."""
    kept = [o for o in overrides if not run_only(o) and not override_key(o).startswith("hydra")]
    experiment = [o.split("=", 1)[1] for o in kept if override_key(o) == "experiment"]
    rest = sorted((o for o in kept if override_key(o) != "experiment"), key=override_key)
    name = "__".join([*experiment, *(_safe(o) for o in rest)]) or "default"
    if len(name) > NAME_LIMIT:
        name = name[: NAME_LIMIT - 11] + "-" + hashlib.sha1(name.encode()).hexdigest()[:10]
    return _safe(name)


def _safe(text: str) -> str:
    """``key=a,b`` as ``key-a+b``; any character Hydra's grammar or a file system would trip on
    becomes ``_``."""
    text = text.lstrip("+").replace("~", "no-", 1).replace("=", "-", 1).replace(",", "+")
    return re.sub(r"[^A-Za-z0-9._+\-]", "_", text)


# ---------------------------------------------------------------------------- expansion
def _parser():
    return hydra_api.overrides_parser()


def expand(
    arguments: list[str], sweeper_params: Mapping[str, object] | None = None
) -> list[list[str]]:
    """The jobs of a sweep, one overrides list per job number: Hydra's basic-sweeper order, with
    the repeats ``collapse`` finds left out."""
    lines = [f"{k}={v}" for k, v in (sweeper_params or {}).items()] + list(arguments)
    jobs = plain_product(lines)
    if jobs is None:
        jobs = product(_parser().parse_overrides(lines))
    return collapse(jobs)[0]


PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
PLAIN_VALUE = re.compile(r"0|[1-9][0-9]*|[A-Za-z_][A-Za-z0-9_]*")
GRAMMAR_WORDS = {"null", "true", "false", "inf", "nan"}  # Hydra reads these as non-strings


def plain_product(lines: list[str]) -> list[list[str]] | None:
    """``product`` of override lines that are all ``key=value`` or ``key=a,b`` with plain
    values (words and integers written as Hydra writes them back), without Hydra's grammar (a
    fifth of a second to import at a report's start); None for any other line."""
    swept: dict[str, list[str]] = {}  # a later override of a key replaces it in its place
    for line in lines:
        key, sep, value = line.partition("=")
        values = value.split(",")
        if not sep or not PLAIN_KEY.fullmatch(key):
            return None
        if not all(PLAIN_VALUE.fullmatch(v) and v.lower() not in GRAMMAR_WORDS for v in values):
            return None
        swept[key] = [f"{key}={v}" for v in values]
    return [list(job) for job in itertools.product(*swept.values())]


def sweep_size(
    arguments: list[str], sweeper_params: Mapping[str, object] | None = None
) -> tuple[int, list[str]]:
    """(the number of jobs of a sweep before ``collapse`` leaves repeats out, ``key: n values``
    for each swept key), counted without listing the jobs: a sweep of a million jobs is known
    to be one in a blink."""
    params = [f"{k}={v}" for k, v in (sweeper_params or {}).items()]
    counts: dict[str, int] = {}
    for o in _parser().parse_overrides(params + list(arguments)):
        key = o.get_key_element()
        counts.pop(key, None)  # a later override of the key replaces the earlier one
        if o.is_sweep_override() and not o.is_interval_sweep():
            counts[key] = sum(1 for _ in o.sweep_string_iterator())
    return math.prod(counts.values()), [f"{k}: {n} values" for k, n in counts.items()]


def product(parsed: list[Override]) -> list[list[str]]:
    """Every combination of parsed overrides, in Hydra's basic-sweeper order."""
    return hydra_api.basic_product(parsed)


def collapse(jobs: list[list[str]]) -> tuple[list[list[str]], list[str]]:
    """(the jobs without repeats, one line per job left out). A job of a variant drops the
    ``optimizer.<option>`` overrides the variant ignores (``base``: ρ and the other perturbation
    options); a job that then repeats an earlier one is left out, so ``optimizer=base,sam
    optimizer.rho=0.02,0.1`` trains base once (and a job with ``regularizer.weight=0`` drops the
    regularizer's other keys). The order of the rest is kept: job numbers stay
    the same from run to run of the command."""
    from ..registry import VARIANTS

    kept, seen, left_out = [], set(), []
    for job in jobs:
        variant = next((o.split("=", 1)[1] for o in job if override_key(o) == "optimizer"), None)
        # the variants' registry imports torch: read only when a job names a variant
        ignored = VARIANTS.entry(variant).ignored_options if variant and variant in VARIANTS else ()
        job = [o for o in job if override_key(o) not in {f"optimizer.{k}" for k in ignored}]
        job = _without_idle_regularizer(job)
        if tuple(job) in seen:
            left_out.append(" ".join(job))
            continue
        seen.add(tuple(job))
        kept.append(job)
    return kept, left_out


def _without_idle_regularizer(job: list[str]) -> list[str]:
    """A job with ``regularizer.weight=0`` trains the plain run whatever the regularizer's other
    keys: they are dropped, so ``regularizer.weight=0,1 regularizer.alpha=0.1,0.5`` trains the
    plain run once."""
    weight = next((o.split("=", 1)[1] for o in job if override_key(o) == "regularizer.weight"), "")
    try:
        idle = float(weight) == 0
    except ValueError:
        idle = False
    if not idle:
        return job
    keep = ("regularizer.weight",)
    return [o for o in job if not override_key(o).startswith("regularizer.") or
            override_key(o) in keep]  # fmt: skip


def compose(overrides: list[str], config_name: str = "config") -> DictConfig:
    """The config of one job (or of ``sam-eval``: ``config_name="eval"``), Hydra's part included,
    composed by Hydra's own compose."""
    return hydra_api.compose(overrides, config_name)


class ValueVariants:
    """``compose`` for the jobs of one sweep, each set of group choices and other overrides
    composed once: a job whose overrides differ from a composed job's only in the values of plain
    ones (``key=scalar``: a number, a string, a bool or null, on a key of the config, no ``+``,
    ``~``, ``@``, config group or Hydra key: ``seed=3``, ``optimizer.rho=0.1``) gets a copy of
    that job's config with each set as Hydra's compose sets a value (``OmegaConf.update`` in
    struct mode, in the job's order, the value as Hydra's parser reads it) and Hydra's record of
    the overrides (``hydra.overrides.task``, ``hydra.job.override_dirname``) made anew. The same
    config, key for key (tested against Hydra's own compose), at a copy's cost: a sweep of
    3,000 seeds composed 3,000 times took minutes to check. Our choice, not Hydra's."""

    def __init__(self) -> None:
        self._composed: dict = {}

    def __call__(self, job: list[str]):
        import copy

        parsed = hydra_api.parse_overrides(job)
        plain = [_plain_value(o) for o in parsed]
        shape = tuple(o.key_or_group + "=" if p else o.input_line for o, p in zip(parsed, plain))
        if not any(plain):
            return compose(job)
        if shape not in self._composed:
            cfg = compose(job)
            self._composed[shape] = copy.deepcopy(cfg)  # the checks may resolve theirs
            return cfg
        cfg = copy.deepcopy(self._composed[shape])
        for o in (o for o, p in zip(parsed, plain) if p):
            OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
        cfg.hydra.overrides.task, cfg.hydra.job.override_dirname = hydra_api.task_record(cfg, job)
        return cfg


def _plain_value(o) -> bool:
    """Whether a parsed override sets one scalar value on a key of the config (not a group)."""
    from ..paths import config_dir

    key = o.key_or_group
    if o.package is not None or o.is_add() or o.is_force_add() or o.is_delete():
        return False
    if o.is_hydra_override() or "/" in key or o.is_sweep_override():
        return False
    if "." not in key and (Path(config_dir()) / key).is_dir():  # optimizer=sam: a group
        return False
    return isinstance(o.value(), (int, float, str, bool, type(None)))


def fixed_config(arguments: list[str]) -> DictConfig:
    """The composed config of a sweep's overrides that do not sweep."""
    return compose(
        [o.input_line for o in _parser().parse_overrides(arguments) if not o.is_sweep_override()]
    )


def sweeper_params(cfg: DictConfig) -> dict:
    """``hydra.sweeper.params`` of a composed config (an experiment preset may sweep)."""
    params = OmegaConf.select(cfg, "hydra.sweeper.params")
    return dict(OmegaConf.to_container(params, resolve=False)) if params else {}


knows_jobs = hydra_api.knows_jobs


def expected_jobs(sweep_dir: Path | str) -> list[list[str]] | None:
    """The jobs a sweep folder's multirun.yaml calls for, or None when that can't be known (no
    multirun.yaml, another sweeper, an unparsable sweep)."""
    import yaml

    try:
        conf = yaml.safe_load((Path(sweep_dir) / "multirun.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):
        return None
    hydra = conf.get("hydra") or {}
    sweeper = hydra.get("sweeper") or {}
    if not knows_jobs(sweeper.get("_target_")):
        return None
    try:
        return expand(
            list((hydra.get("overrides") or {}).get("task") or []), sweeper.get("params") or {}
        )
    except Exception:  # an unparsable sweep: the folders alone tell
        return None


# ---------------------------------------------------------------------------- job folders
def saved_overrides(job_dir: Path) -> list[str] | None:
    """The overrides a job folder was made with (``RunDir.saved_overrides``)."""
    return RunDir(job_dir).saved_overrides


def load_yaml(path: Path | str) -> Any:
    """A YAML file Hydra wrote, read with libyaml's C loader where PyYAML has it (a sweep of a
    thousand jobs reads a thousand of them)."""
    import yaml

    return yaml.load(Path(path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


# ---------------------------------------------------------------------------- finished jobs
def completed_jobs(
    sweep_dir: Path | str, jobs: list[list[str]], exclude: Sequence[str] = DEFAULT_EXCLUDE
) -> dict[int, dict]:
    """{number: summary} of the jobs that ``sweep_dir`` holds completed: ``<number>/summary.json``
    says completed and was made by the same job (``job_key``). Read from the folders alone,
    nothing composed: a sweep of a thousand finished jobs knows it in a second. (A completed
    job of a different sweep is not counted: ``check_folder`` refuses the folder.)"""
    done, present = {}, numbered_folders(sweep_dir)
    for num, overrides in enumerate(jobs):
        if num not in present:
            continue
        summary = RunDir(Path(sweep_dir) / str(num)).summary
        if not summary or summary.get("status") != "completed":
            continue
        old = summary.get("overrides")
        if old is not None and same_job(old, overrides, exclude):
            done[num] = summary
    return done


def report_completed(sweep_dir: Path | str, done: dict[int, dict]) -> None:
    """The line a completed run prints when run again, for each job left out as completed."""
    from ..progress import print_final

    for num, summary in sorted(done.items()):
        print_final(summary, Path(sweep_dir) / str(num), already=True)


def numbered_batches(
    n_jobs: int, done: Container[int], max_batch_size: int | None = None
) -> list[tuple[int, list[int]]]:
    """(first job number, job numbers) for each launch of the jobs left: runs of consecutive
    numbers (a launcher numbers a batch's jobs from its first), at most ``max_batch_size``
    each, so that leaving finished jobs out never renumbers the others' folders."""
    batches, run = [], []
    for num in range(n_jobs):
        if num not in done:
            run.append(num)
        if run and (num in done or len(run) == max_batch_size or num == n_jobs - 1):
            batches.append(run)
            run = []
    return [(b[0], b) for b in batches]


def exclude_keys(config: DictConfig) -> tuple:
    """``hydra.job.config.override_dirname.exclude_keys`` of a composed config."""
    keys = OmegaConf.select(config, "hydra.job.config.override_dirname.exclude_keys")
    return tuple(str(k) for k in keys) if keys is not None else DEFAULT_EXCLUDE


# ---------------------------------------------------------------------------- the same job
def same_job(
    old: Sequence[str], new: Sequence[str], exclude: Sequence[str] = DEFAULT_EXCLUDE
) -> bool:
    """Whether two overrides lists are the same job (the same lists but for Hydra's own keys
    are, without parsing: a parse costs milliseconds, and a sweep has thousands)."""
    return _own(old) == _own(new) or job_key(old, exclude) == job_key(new, exclude)


def _own(overrides) -> list[str]:
    return [o for o in map(str, overrides) if not override_key(o).startswith("hydra")]


def _settings(overrides, exclude) -> dict:
    """Overrides as {key: value} without how-to-run keys, in Hydra's normal form
    (``x=false`` and ``x=False`` are the same override)."""
    parsed = _parser().parse_overrides([str(o) for o in overrides])
    exclude = (*exclude, *RUN_ONLY_KEYS)
    return {
        o.get_key_element(): o.get_value_element_as_str()
        for o in parsed
        if not run_only(o.key_or_group, exclude)
    }


def job_key(overrides: Sequence[str], exclude: Sequence[str] = DEFAULT_EXCLUDE) -> list[str]:
    """What makes two jobs the same job: their overrides without how-to-run keys."""
    return sorted(f"{k}={v}" for k, v in _settings(overrides, exclude).items())


def override_changes(
    old: Sequence[str], new: Sequence[str], exclude: Sequence[str] = DEFAULT_EXCLUDE
) -> list[str]:
    """'key old -> new' for each override that differs; '(default)' where one side does not set
    it."""
    a, b = _settings(old, exclude), _settings(new, exclude)
    keys = [*b, *(k for k in a if k not in b)]
    return [
        f"{k} {a.get(k, '(default)')} -> {b.get(k, '(default)')}"
        for k in keys
        if a.get(k) != b.get(k)
    ]


def check_folder(
    sweep_dir: Path | str, jobs: list[list[str]], exclude: Sequence[str] = DEFAULT_EXCLUDE
) -> None:
    """UserError when a job folder of ``sweep_dir`` was made by a different job at its number."""
    sweep_dir, present = Path(sweep_dir), numbered_folders(sweep_dir)
    for num, overrides in enumerate(jobs):
        if num in present:
            check_job(sweep_dir / str(num), overrides, exclude, sweep_dir)


def numbered_folders(sweep_dir: Path | str) -> set[int]:
    """The job numbers that have a folder in ``sweep_dir`` (one listing: a sweep of 100,000
    jobs asks the file system once, not once per job)."""
    try:
        return {int(p.name) for p in Path(sweep_dir).iterdir() if p.name.isdigit()}
    except OSError:  # no sweep folder yet (or not a folder): no job has one
        return set()


def check_job(
    job_dir: Path, overrides: Sequence[str], exclude: Sequence[str], sweep_dir: Path
) -> None:
    """UserError when ``job_dir`` was made by a job other than ``overrides``."""
    old = saved_overrides(job_dir)
    if old is not None and not same_job(old, overrides, exclude):
        raise UserError(
            f"sweep folder {sweep_dir} holds jobs of a different sweep: job {job_dir.name} was run "
            f"with {' '.join(old) or '(no overrides)'}, this sweep's job {job_dir.name} is "
            f"{' '.join(overrides) or '(no overrides)'}; use another hydra.sweep.dir"
        )


def check_run_folder(
    run_dir: Path | str, overrides: Sequence[str], exclude: Sequence[str] = DEFAULT_EXCLUDE
) -> None:
    """RunFolderConflict when ``run_dir`` holds a run that these overrides would continue (resume
    its checkpoint, or take its completed summary as theirs) but that was made with other ones.
    A folder whose run left nothing to continue (it failed on bad input) is free to reuse."""
    run_dir = Path(run_dir)
    old = saved_overrides(run_dir)
    if old is None or not holds_results(run_dir):
        return
    changes = override_changes(old, overrides, exclude)
    if changes:
        raise RunFolderConflict(
            f"run folder {run_dir} holds a run made with other settings "
            f"({describe_changes(changes)}); use another folder (hydra.run.dir=...), or delete "
            f"{run_dir} to start over"
        )
