"""Presets in stages: sweeps that run one after another, a later one's jobs starting from an
earlier one's results (docs/studies.md, "Presets in stages").

A preset declares ``stages:``, an ordered map of stage name -> overrides (``key: value``, a
comma sweeps, as in ``hydra.sweeper.params``). ``sam-run -m +experiment=P`` runs each stage as
its own sweep into ``<sweep dir>/<stage>/<job number>``, in order; a stage starts when the one
before it ended with every job completed. Any override value ``stage:NAME`` (in practice
``model.init_from`` and ``trainer.distill.teacher``) names the folder of a job of the earlier
stage NAME: the one whose overrides hold every selector (``stage:NAME/key:value/...``) and
agree with the referring job on every other key NAME's jobs vary in and the referring job sets
(so ``seed=0`` finds the teacher of seed 0). Exactly one job must match.

Our choices: the references are checked on the job lists before anything runs (the lists are
known: a stage is a grid sweep), while a reference's folder is read only when its stage starts
(its own sweep's checks then find the earlier job completed, or refuse it in one line); a job's
overrides keep ``stage:NAME`` as written (the same job whatever the sweep folder is called), and
its recorded config holds the folder it resolved to. On SLURM each stage is one job array,
submitted when the stage before it has ended (stage by stage: no ``afterok`` chains to cancel
when a job fails; the command stays up until the last stage ends and, run again, resumes).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from omegaconf import OmegaConf, open_dict

from ..errors import UserError, require
from ..settings import override_key, run_only
from . import hydra_api

if TYPE_CHECKING:
    from omegaconf import DictConfig

PREFIX = "stage:"
NAME = re.compile(r"^[A-Za-z0-9_\-]+$")
# the stage whose sweep this process runs (its own ``sam-run -m``; staged.run sets it); None
# at the top
current: str | None = None


@dataclass
class Stage:
    name: str
    argv: list[str]  # the stage's sweep command (its overrides and hydra.sweep.dir, -m first)
    jobs: list[list[str]]  # its jobs, in job-number order


# ---------------------------------------------------------------------------- references
def unescape(value: str) -> str:
    """An override's value as the config holds it (Hydra writes ``:`` as ``\\:`` in jobs)."""
    return re.sub(r"\\(.)", r"\1", value)


def references(job: list[str]) -> list[tuple[str, str]]:
    """(key, ``stage:...`` value) of each override of ``job`` that names a stage's job."""
    out = []
    for o in job:
        if "=" in o and not o.startswith("~"):
            value = unescape(o.split("=", 1)[1].strip("'\""))
            if value.startswith(PREFIX):
                out.append((override_key(o), value))
    return out


def parse(key: str, value: str) -> tuple[str, dict[str, str]]:
    """(stage name, {selector key: value}) of ``stage:NAME/key:value/...``."""
    name, *selectors = value[len(PREFIX) :].split("/")
    picked = {}
    for s in selectors:
        k, sep, v = s.partition(":")
        require(
            bool(sep and k and v),
            f"{key}={value}: the selector {s!r} is not key:value; write "
            f"{PREFIX}NAME or {PREFIX}NAME/key:value (e.g. {PREFIX}{name}/optimizer:sam)",
        )
        picked[k] = _normal(k, v)
    return name, picked


def _normal(key: str, value: str) -> str:
    """A value in Hydra's normal form (``0.050`` and ``0.05``, ``False`` and ``false`` agree)."""
    try:
        parsed = hydra_api.overrides_parser().parse_overrides([f"{key}={value}"])[0]
        return parsed.get_value_element_as_str()
    except Exception:
        return value


def _values(job: list[str]) -> dict[str, str]:
    """{key: value} of a job's overrides that say what it computes."""
    out = {}
    for o in hydra_api.overrides_parser().parse_overrides([str(o) for o in job]):
        if not run_only(o.key_or_group) and not o.key_or_group.startswith("hydra"):
            out[o.get_key_element()] = o.get_value_element_as_str()
    return out


def pick(key: str, value: str, job: list[str], ref_jobs: list[list[str]], where: str) -> int:
    """The number of the job of ``ref_jobs`` that ``key=value`` (a ``stage:`` reference of
    ``job``) names; UserError unless exactly one matches."""
    name, selectors = parse(key, value)
    mine = {k: v for k, v in _values(job).items() if k != key.lstrip("+")}
    theirs = [_values(r) for r in ref_jobs]
    keys = {k for t in theirs for k in t}
    varying = sorted(k for k in keys if len({t.get(k) for t in theirs}) > 1)
    compared = [k for k in varying if k in mine and k not in selectors]
    found = [
        i
        for i, t in enumerate(theirs)
        if all(t.get(k) == v for k, v in selectors.items())
        and all(t.get(k) == mine[k] for k in compared)
    ]
    asked = " ".join([*(f"{k}={v}" for k, v in selectors.items()),
                      *(f"{k}={mine[k]}" for k in compared)]) or "(nothing)"  # fmt: skip
    if not found:
        raise UserError(
            f"{key}={value} ({where}) matches no job of stage {name}: none has {asked} (its "
            f"jobs vary in {', '.join(varying) or 'nothing'}); name a job the stage has"
        )
    if len(found) > 1:
        apart = [k for k in varying if k not in selectors and k not in compared]
        hint = f"{value}/{apart[0]}:{theirs[found[0]].get(apart[0], 'VALUE')}" if apart else value
        raise UserError(
            f"{key}={value} ({where}) matches {len(found)} jobs of stage {name} (jobs "
            f"{', '.join(map(str, found))}: they differ in {', '.join(apart)}); select one, "
            f"e.g. {hint}"
        )
    return found[0]


def _stage_of(key: str, value: str, earlier: list[str], stage: str, names: list[str]) -> str:
    name, _ = parse(key, value)
    if name in earlier:
        return name
    if name in names:
        why = "is this stage" if name == stage else f"runs after stage {stage}"
        raise UserError(
            f"{key}={value}: stage {name} {why}; a job may name an earlier stage's job "
            f"({', '.join(earlier) or 'none before ' + stage})"
        )
    raise UserError(
        f"{key}={value}: there is no stage {name}; the preset's stages are {', '.join(names)}"
    )


# ---------------------------------------------------------------------------- the plan
def declared(cfg: DictConfig) -> dict | None:
    """A composed config's ``stages`` ({name: {key: value}}), None when it has none."""
    node = OmegaConf.select(cfg, "stages")
    return None if node is None else OmegaConf.to_container(node, resolve=False)


def plan(overrides: list[str], sweep_dir: Path, cfg: DictConfig) -> list[Stage]:
    """The stages of a staged preset's command, each with its sweep and jobs, every ``stage:``
    reference checked (UserError on a bad one)."""
    from .plan import expand, sweeper_params

    spec = declared(cfg)
    require(
        isinstance(spec, dict) and spec,
        "stages: give a map of stage name -> overrides (stage: {key: value, ...})",
    )
    user = [o for o in overrides if override_key(o) != "hydra.sweep.dir"]
    names, stages = list(spec), []
    for name, own in spec.items():
        require(
            bool(NAME.match(str(name))),
            f"stages.{name}: a stage's name is a folder name (letters, digits, _ and -)",
        )
        require(
            isinstance(own, dict),
            f"stages.{name}: give the stage's overrides as a map (key: value, a comma sweeps)",
        )
        argv = [f"{k}={v}" for k, v in own.items()] + user
        jobs = expand(argv, sweeper_params(cfg))
        stages.append(Stage(name, ["-m", *argv, f"hydra.sweep.dir={sweep_dir / name}"], jobs))
    done = {}
    for stage in stages:
        for num, job in enumerate(stage.jobs):
            for key, value in references(job):
                ref = _stage_of(key, value, list(done), stage.name, names)
                pick(key, value, job, done[ref], f"stage {stage.name}, job {num}")
        done[stage.name] = stage.jobs
    return stages


# ---------------------------------------------------------------------------- a job's folders
def resolve(cfg: DictConfig, job: list[str], root: Path, read: bool = True) -> frozenset:
    """Each ``stage:`` reference of ``job`` in ``cfg`` replaced by the folder it names: a job
    of stage S runs in ``<root>/S/<number>``, the job it names in ``<root>/NAME/<n>``. Without
    ``read`` (the checks before the first stage runs), by null: the earlier stage's job is
    checked when the referring stage starts. Returns the keys left null that way (the checks
    take them as set: ``model.peft`` needs ``model.init_from``)."""
    refs = references(job)
    pending = frozenset() if read else frozenset(key.lstrip("+") for key, _ in refs)
    if not refs:
        return pending
    root = Path(root).absolute()
    for key, value in refs:
        folder = _folder(key, value, job, root) if read else None
        with open_dict(cfg):
            OmegaConf.update(cfg, key.lstrip("+"), folder, merge=False)
    return pending


def _folder(key: str, value: str, job: list[str], root: Path) -> str:
    from .plan import expected_jobs

    name, _ = parse(key, value)
    jobs = expected_jobs(root / name)
    require(
        jobs is not None,
        f"{key}={value}: no stage {name} has run in {root} (no {root / name}/multirun.yaml); "
        "a stage reference is for the stages of a preset, run by sam-run -m +experiment=PRESET",
    )
    return str(root / name / str(pick(key, value, job, jobs, f"in {root}")))
