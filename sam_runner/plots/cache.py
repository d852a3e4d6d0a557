"""Figures a report drew before, kept while what they show is unchanged (``sam-report``).

Drawing is most of a report's time: a study of 1,000 jobs spends ~4 s of CPU in matplotlib (its
layout, ticks and text, twice per figure: the constrained layout's pass and the drawing) and
~0.7 s importing it. A figure's *key* is a digest of everything that decides its bytes: the
drawing function (module and name), the arguments it is given (its data, canonically), the
file format, the drawing code (the bytes of ``sam_runner/plots`` and ``sam_runner/results``),
the variants' names (their colours), matplotlib's version and the matplotlibrc files that set
its defaults. The report's folder keeps, per figure file, its key and the digest of the bytes
written (``FIGURES``); a figure whose key is unchanged and whose file still holds those bytes
is not drawn again (and matplotlib not imported, where no figure is drawn). An argument that
cannot be put canonically (an object of another kind, a lambda) makes its figure drawn always.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from contextvars import ContextVar
from pathlib import Path, PurePath
from typing import TYPE_CHECKING

from ..runfiles import atomic_write_bytes, read_json
from .style import save_figure, variant_names

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator
    from typing import Any

    from matplotlib.figure import Figure

    from .aside import DrawnAside

FIGURES = ".sam-report-figures.json"  # {file name: {"key": ..., "sha256": ...}} in its folder
CODE = ("plots", "results")  # the packages whose code decides what a figure shows
_KEPT: ContextVar[KeptFigures | None] = ContextVar("kept_figures", default=None)


class Uncacheable(TypeError):
    """An argument with no canonical form: its figure is drawn every time."""


def canonical(args: tuple) -> bytes:
    """``args`` as bytes that two equal arguments share and two different ones do not (order
    kept: a figure may draw in its arguments' order), by the C JSON encoder (floats as their
    repr: exact); ``Uncacheable`` for what has no such form."""
    try:
        return json.dumps(args, default=_plain, separators=(",", ":")).encode()
    except (TypeError, ValueError) as e:  # a dict keyed by tuples, a circular reference
        raise Uncacheable(str(e)) from None


def _plain(obj: Any) -> Any:
    """JSON's fallback: what the encoder does not know, as data it does (tagged by kind)."""
    if isinstance(obj, PurePath):
        return ["path", str(obj)]
    if isinstance(obj, (set, frozenset)):
        return ["set", sorted(canonical((v,)).decode() for v in obj)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        # the fields that make it what it is (a job's folder reader, compare=False, is not)
        shown = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.compare}
        return [type(obj).__qualname__, shown]
    if type(obj).__module__ == "numpy" and hasattr(obj, "tolist"):
        return ["numpy", str(getattr(obj, "dtype", "")), obj.tolist()]
    name = getattr(obj, "__qualname__", "")
    if callable(obj) and name and "<" not in name:  # a module-level function: its code is keyed
        return ["function", f"{obj.__module__}.{name}"]
    raise Uncacheable(f"{type(obj).__name__} has no canonical form")


def environment_key() -> str:
    """What decides every figure's bytes beside its arguments: the drawing code, the variants'
    names, matplotlib's version and the matplotlibrc files it would read."""
    from importlib.metadata import version

    digest = hashlib.sha256()
    package = Path(__file__).resolve().parent.parent
    for folder in CODE:
        for path in sorted((package / folder).glob("*.py")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(json.dumps([version("matplotlib"), list(variant_names())]).encode())
    for path in _rc_files():
        with contextlib.suppress(OSError):
            digest.update(str(path).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def _rc_files() -> list[Path]:
    """The user's matplotlibrc files matplotlib may read (matplotlib_fname's places, without
    importing matplotlib): the working folder's, $MATPLOTLIBRC's, the config folder's."""
    env = os.environ
    config = env.get("MPLCONFIGDIR") or os.path.join(
        env.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "matplotlib"
    )
    paths = [Path("matplotlibrc"), Path(config) / "matplotlibrc"]
    if env.get("MATPLOTLIBRC"):
        paths += [Path(env["MATPLOTLIBRC"]), Path(env["MATPLOTLIBRC"]) / "matplotlibrc"]
    return [p for p in paths if p.is_file()]


def _sha256(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


class KeptFigures:
    """The figures of one folder, as the last report there drew them (``FIGURES``)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        kept = read_json(self.folder / FIGURES)
        self.before = kept if isinstance(kept, dict) else {}
        self.now: dict[str, dict] = {}
        self.environment = environment_key()
        self.aside: DrawnAside | None = None  # where figures are drawn while the report goes on

    def save(self, stem: str, fmt: str, draw: Callable[..., Figure], args: tuple) -> Path:
        """``folder/stem.fmt``: kept where its key and bytes are unchanged, else drawn (by a
        child of ``aside``'s where there is one: the file is there once ``finish`` returns)."""
        path = self.folder / f"{stem}.{fmt}"
        try:
            data = canonical(args)
        except Uncacheable:
            self._draw(stem, fmt, draw, args, None)
            return path
        head = f"{self.environment} {draw.__module__}.{draw.__qualname__} {fmt} "
        key = hashlib.sha256(head.encode() + data).hexdigest()
        entry = self.before.get(path.name)
        if isinstance(entry, dict) and entry.get("key") == key and path.is_file():
            if entry.get("sha256") == _sha256(path):
                self.now[path.name] = entry
                return path
        self._draw(stem, fmt, draw, args, key)
        return path

    def _draw(self, stem: str, fmt: str, draw: Callable[..., Figure], args: tuple, key) -> None:
        """The figure drawn, here or by ``aside``'s server; recorded under ``key`` (None: a
        figure drawn every time, not recorded)."""
        name = f"{stem}.{fmt}"

        def done(sha256: str | None) -> None:
            if key is not None:
                self.now[name] = {"key": key, "sha256": sha256}

        call = (self.folder, stem, fmt, draw, args)
        if self.aside is None:
            done(drawn_file(*call))
        else:
            self.aside.submit(drawn_file, call, done)

    def write(self) -> None:
        """Record the figures drawn or kept by this report (others are not the folder's now)."""
        text = json.dumps(self.now, indent=1, sort_keys=True).encode()
        atomic_write_bytes(self.folder / FIGURES, text)


def drawn_file(folder: Path, stem: str, fmt: str, draw: Callable[..., Figure], args: tuple) -> str:
    """``folder/stem.fmt`` drawn by ``draw(*args)`` and written; the sha256 of its bytes (the
    record ``KeptFigures`` keeps). Module-level: a drawing server is sent it by name."""
    return _sha256(save_figure(draw(*args), folder, stem, fmt))


@contextlib.contextmanager
def figures_kept_in(folder: Path | str, aside: DrawnAside | None = None) -> Iterator[KeptFigures]:
    """Within: ``save_plot`` into ``folder`` reuses the figures drawn there before while their
    keys are unchanged; the record is written on leaving (not after an error).

    Args:
        folder: the report's folder.
        aside: a drawing server (``plots.aside``) that draws the figures while the caller
            goes on: every figure is written when the context closes (after an error, those
            already sent are finished and the rest dropped).
    """
    kept = KeptFigures(Path(folder))
    kept.aside = aside
    token = _KEPT.set(kept)
    try:
        yield kept
    except BaseException:
        if kept.aside is not None:
            kept.aside.abandon()
        raise
    finally:
        _KEPT.reset(token)
    if kept.aside is not None:
        kept.aside.finish()
    kept.write()


def save_plot(folder: Path | str, stem: str, fmt: str, draw: Callable[..., Figure], *args) -> Path:
    """``save_figure(draw(*args), folder, stem, fmt)``, unless ``figures_kept_in(folder)`` holds
    that figure drawn from the same arguments by the same code.

    Args:
        folder: where the figure goes.
        stem: its file name without the format.
        fmt: png, pdf or svg.
        draw: the function that draws it (a Figure), given ``args`` and nothing else: it reads
            no file, so that its arguments decide what it shows.
        *args: what it draws.
    """
    kept = _KEPT.get()
    if kept is None or Path(folder) != kept.folder:
        return save_figure(draw(*args), folder, stem, fmt)
    return kept.save(stem, fmt, draw, args)
