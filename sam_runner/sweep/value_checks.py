"""A sweep's jobs checked once per shape, and per job only where a changed value is read.

The jobs of a sweep that differ only in plain values (``seed=3``, ``optimizer.rho=0.1``: one
shape, ``plan.ValueVariants``) share every check that reads none of those values. The first
job of a shape is composed and checked in full, each check (``validate.config_checks``, the
interpolations, the objective, the warnings) run while the config records which of its values
are read (``ConfigReads``). A later job of the shape sets its values on that config in place
(as Hydra's compose sets them, and back afterwards) and runs again only the checks that read
one of the values it changes; a check run before with the same values of the plain keys it
read is not run again. A check reads the same values and takes the same path whenever the
values it reads are the same, so a job passes exactly when checking it in full would pass; the
checks of its overrides themselves (keys added or removed, two budgets, options its variant
ignores, settings that do nothing) run for every job. A sweep of 3 variants × 5 ρ × 200 seeds
runs the seed's own check per job and the others once per variant and ρ. Our choice, not
Hydra's.

Interpolations: a plain value set on a key that an interpolation names resolves as before
(a value in place of a value), unless the interpolation calls a resolver (``${oc.decode:...}``),
which may refuse it: the interpolations are then resolved again for that job.
"""

from __future__ import annotations

import copy
import re
from collections import Counter
from collections.abc import Callable

from omegaconf import DictConfig, ListConfig, OmegaConf

from . import hydra_api
from .plan import _plain_value, compose

Check = Callable[[], "list[str] | None"]


class ConfigReads:
    """While active, the keys of ``root`` that are read: a value's full key when its node is
    fetched, a list's when it is fetched and a mapping's when it is copied or its items listed
    (read whole). One at a time; the patched methods are restored on exit."""

    _active: ConfigReads | None = None

    def __init__(self, root: DictConfig) -> None:
        self.root, self.keys = root, set()

    def __enter__(self):
        assert ConfigReads._active is None, "ConfigReads does not nest"
        ConfigReads._active = self
        self._saved = {
            (DictConfig, "_get_node"): DictConfig._get_node,
            (ListConfig, "_get_node"): ListConfig._get_node,
            (DictConfig, "items_ex"): DictConfig.items_ex,
            (DictConfig, "__deepcopy__"): DictConfig.__deepcopy__,
            (ListConfig, "__deepcopy__"): ListConfig.__deepcopy__,
        }
        reads = self

        def dict_node(node, key, *args, **kwargs):
            child = reads._saved[(DictConfig, "_get_node")](node, key, *args, **kwargs)
            # a value, or a list (whose elements are read past _get_node): read; a mapping's
            # own reads are its values'
            if child is not None and not isinstance(child, DictConfig):
                reads._add(node, key)
            return child

        def list_node(node, key, *args, **kwargs):
            reads._add(node, None)  # an element: the list read whole
            return reads._saved[(ListConfig, "_get_node")](node, key, *args, **kwargs)

        def items(node, *args, **kwargs):
            reads._add(node, None)
            return reads._saved[(DictConfig, "items_ex")](node, *args, **kwargs)

        def deep(kind):
            def copy_of(node, memo=None):
                reads._add(node, None)
                return reads._saved[(kind, "__deepcopy__")](node, memo)

            return copy_of

        DictConfig._get_node, ListConfig._get_node = dict_node, list_node
        DictConfig.items_ex = items
        DictConfig.__deepcopy__, ListConfig.__deepcopy__ = deep(DictConfig), deep(ListConfig)
        return self

    def __exit__(self, *exc):
        for (kind, name), method in self._saved.items():
            setattr(kind, name, method)
        ConfigReads._active = None

    def _add(self, node, key) -> None:
        """``node``'s child ``key`` (None: ``node`` itself, whole) read, when ``node`` is part of
        the root config ("" for the root itself). A list's element reads the list whole."""
        names = [] if key is None else [str(key)]
        while True:
            parent = node._get_parent()
            if parent is None:
                break
            if isinstance(parent, ListConfig):
                names = []  # within a list: the list, whole
            else:
                names.append(str(node._key()))
            node = parent
        if node is self.root:  # not a copy made by a check, nor another config
            self.keys.add(".".join(reversed(names)))

    def read(self, key: str) -> bool:
        """Whether the plain key ``key`` (dotted) was read, itself or within a container read
        whole."""
        return any(
            r == "" or r == key or key.startswith(r + ".") or r.startswith(key + ".")
            for r in self.keys
        )


def _same(a, b) -> bool:
    """Equal values of the same type (``1``, ``1.0`` and ``True`` are different settings)."""
    return type(a) is type(b) and a == b


def _typed(values: dict, keys) -> tuple:
    """The values of ``keys`` with their types (``1``, ``1.0`` and ``True`` hash alike)."""
    return tuple((k, type(values[k]).__name__, values[k]) for k in sorted(keys))


_RESOLVER = re.compile(r"\$\{[\w.]+:")  # an interpolation that calls a resolver


class _Shape:
    """A composed job (the base), its plain values, and each check's runs: for each set of plain
    keys a run read, the values it read -> the notices it gave."""

    def __init__(self, cfg, values: dict):
        self.cfg, self.values = cfg, values
        self.runs: dict[str, dict[frozenset, dict[tuple, list]]] = {}
        # the interpolations that call a resolver (the rest take a plain value as it comes)
        text = OmegaConf.to_yaml(OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"]))
        self.resolver_lines = [line for line in text.splitlines() if _RESOLVER.search(line)]

    def cached(self, name: str, values: dict):
        for keys, runs in self.runs.get(name, {}).items():
            notes = runs.get(_typed(values, keys))
            if notes is not None:
                return notes
        return None

    def record(self, name: str, reads: ConfigReads, values: dict, notes) -> None:
        keys = frozenset(k for k in values if reads.read(k))
        self.runs.setdefault(name, {}).setdefault(keys, {})[_typed(values, keys)] = list(notes)

    def needs_resolving(self, changed: dict) -> bool:
        return any(k.rsplit(".", 1)[-1] in line for k in changed for line in self.resolver_lines)


class ValueChecks:
    """The checks of a sweep's jobs (see the module docstring). ``__call__(job, job_checks,
    config_checks)``: ``job_checks(job, cfg)`` -> (message or None, notices), run for every job;
    ``config_checks(job, cfg)`` -> [(name, check)], each check reading only ``cfg`` and
    returning notices (or None), raising on a bad value; ``resolve`` names the interpolations'
    check. Returns (message or None, notices)."""

    RESOLVE = "resolve"

    def __init__(self) -> None:
        self._shapes: dict[tuple, _Shape] = {}
        self.ran: Counter = Counter()  # check name -> times run (the rest answered from runs)

    def __call__(self, job: list[str], job_checks, config_checks, full: bool = False):
        """``full``: this job composed and checked whole (a job whose checks change its config,
        e.g. a stage reference resolved)."""
        parsed = hydra_api.parse_overrides(job)
        plain = [_plain_value(o) for o in parsed]
        values = {o.key_or_group: o.value() for o, p in zip(parsed, plain) if p}
        fast = values and not any(isinstance(v, str) and "${" in v for v in values.values())
        fast = fast and not full
        if not fast:
            return self._in_full(job, compose(job), job_checks, config_checks)
        key = tuple(o.key_or_group + "=" if p else o.input_line for o, p in zip(parsed, plain))
        shape = self._shapes.get(key)
        if shape is None:
            cfg = compose(job)
            shape = _Shape(copy.deepcopy(cfg), values)
            result = self._in_full(job, cfg, job_checks, config_checks, shape, values)
            self._shapes[key] = shape  # only once its first job passed
            return result
        changed = {k: v for k, v in values.items() if not _same(v, shape.values[k])}
        cfg = shape.cfg
        try:
            for key, value in changed.items():
                OmegaConf.update(cfg, key, value, merge=True)
            message, job_notes = job_checks(job, cfg)
            if message:
                return message, []
            notes = []
            for name, check in config_checks(job, cfg):
                if name == self.RESOLVE and not shape.needs_resolving(changed):
                    continue
                done = shape.cached(name, values)
                if done is None:
                    done = self._run(name, check, cfg, shape, values)
                notes += done
            return None, notes + job_notes
        finally:
            for key in changed:
                OmegaConf.update(cfg, key, shape.values[key], merge=True)

    def _in_full(self, job, cfg, job_checks, config_checks, shape=None, values=None):
        message, job_notes = job_checks(job, cfg)
        if message:
            return message, []
        notes = []
        for name, check in config_checks(job, cfg):
            if shape is None:
                self.ran[name] += 1
                notes += check() or []
            else:
                notes += self._run(name, check, cfg, shape, values)
        return None, notes + job_notes

    def _run(self, name: str, check: Check, cfg, shape: _Shape, values: dict) -> list:
        self.ran[name] += 1
        with ConfigReads(cfg) as reads:
            notes = list(check() or [])
        shape.record(name, reads, values, notes)
        return notes
