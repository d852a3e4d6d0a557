"""YAML files parsed by analogy: a sweep's jobs write ``.hydra/config.yaml`` files that differ
in a few scalars (the overrides' values: ``seed: 3``), and parsing a thousand of them whole is
seconds of PyYAML's constructor. ``load(text)`` parses a text whole once, keeps it as a
*template* (its lines, its value, where its one-line plain scalars lie), and builds a later text
that differs from a template only in such scalars from the template's value, each differing
scalar parsed alone. The value is the one ``yaml.load(text, SafeLoader)`` gives; any text that
differs otherwise (another line, a key, a quoted or multi-line value, an anchor) is parsed
whole.
"""

from __future__ import annotations

import pickle
import re
from typing import Any

import yaml

LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, where built: 10x faster
# a plain scalar that means the same alone as after ``key: `` or ``- `` (no quote, colon, hash,
# space, tag, anchor or alias; not ``...`` nor ``-`` alone)
SCALAR = re.compile(r"-?\.?[\w/][\w.+\-/=]*")
PREFIX = re.compile(r"[\w .\-]*(?:: +)?")  # indentation, ``- `` and a plain key: no tag, anchor
OTHER_BREAKS = re.compile("[\r\x85\u2028\u2029\ufeff]")  # YAML counts them as line breaks
KEPT_PER_LENGTH = 4  # templates kept per number of lines (a sweep over a few config groups)
KEPT_SCALARS = 4096  # scalars' values kept (a sweep's values repeat from job to job)
_MISS = object()


class Template:
    """A text parsed whole: its lines, its value and, per line holding a one-line plain scalar
    as its last thing, where that scalar sits in the value (its path) and where on the line."""

    def __init__(self, lines: list[str], value: Any, scalars: dict[int, tuple[tuple, int]]):
        self.lines, self.scalars = lines, scalars
        self.frozen = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)  # a copy per text, in C

    def fill(self, lines: list[str]) -> Any:
        """The value of ``lines`` (as many as the template's), or ``_MISS`` where they differ
        from the template's in more than scalars."""
        changed = []
        for i, (line, mine) in enumerate(zip(lines, self.lines)):
            if line != mine:
                at = self.scalars.get(i)
                if at is None or line[: at[1]] != mine[: at[1]]:
                    return _MISS
                if SCALAR.fullmatch(line, at[1]) is None:
                    return _MISS
                changed.append((at[0], line[at[1] :]))
        value = pickle.loads(self.frozen)
        for path, text in changed:
            node = value
            for step in path[:-1]:
                node = node[step]
            node[path[-1]] = _scalar(text)
        return value


_TEMPLATES: dict[int, list[Template]] = {}
_SCALARS: dict[str, Any] = {}


def load(text: str) -> Any:
    """``text``'s YAML value, as ``yaml.load(text, SafeLoader)``; raises ``yaml.YAMLError``."""
    if OTHER_BREAKS.search(text):
        return yaml.load(text, Loader=LOADER)
    lines = text.split("\n")
    kept = _TEMPLATES.setdefault(len(lines), [])
    for template in kept:
        value = template.fill(lines)
        if value is not _MISS:
            return value
    value, template = _parse(text, lines)
    if template is not None:
        kept.insert(0, template)
        del kept[KEPT_PER_LENGTH:]
    return value


def _parse(text: str, lines: list[str]) -> tuple[Any, Template | None]:
    """``text``'s value parsed whole, and its template (None where it cannot be one)."""
    loader = LOADER(text)
    try:
        node = loader.get_single_node()
        value = loader.construct_document(node) if node is not None else None
    finally:
        loader.dispose()
    scalars: dict[int, tuple[tuple, int]] = {}
    if node is None or not _walk(node, value, (), lines, scalars, set()):
        return value, None
    return value, Template(lines, value, scalars)


def _walk(node, value, path: tuple, lines: list[str], scalars: dict, seen: set) -> bool:
    """Record ``node``'s one-line plain scalars into ``scalars``; False where the value is not
    the node tree's own shape (an alias, a merge key, a repeated key)."""
    if id(node) in seen:
        return False  # an alias: one node in two places
    seen.add(id(node))
    if isinstance(node, yaml.ScalarNode):
        start, end = node.start_mark, node.end_mark
        line = lines[start.line] if start.line < len(lines) else ""
        plain = (
            path
            and start.line == end.line
            and end.column == len(line)
            and PREFIX.fullmatch(line, 0, start.column) is not None
            and SCALAR.fullmatch(line, start.column) is not None
        )
        if plain:
            scalars[start.line] = (path, start.column)
        return True
    if isinstance(node, yaml.SequenceNode):
        items = node.value
        if not isinstance(value, list) or len(items) != len(value):
            return False
        return all(_walk(n, v, (*path, i), lines, scalars, seen) for i, (n, v) in
                   enumerate(zip(items, value)))  # fmt: skip
    pairs = node.value
    if not isinstance(value, dict) or len(pairs) != len(value):
        return False  # a merge key or a repeated key
    for (key_node, child), (key, v) in zip(pairs, value.items()):
        if key_node.tag == "tag:yaml.org,2002:merge" or not _walk(
            child, v, (*path, key), lines, scalars, seen
        ):
            return False
    return True


def _scalar(text: str) -> Any:
    """A plain scalar's value (SafeLoader's: int, float, bool, None, a date or the text)."""
    if text not in _SCALARS:
        if len(_SCALARS) >= KEPT_SCALARS:  # a long index of unique values: start again
            _SCALARS.clear()
        _SCALARS[text] = yaml.load(text, Loader=LOADER)
    return _SCALARS[text]
