from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path
"""User-facing errors: one line, naming the bad value and what would be accepted."""


class UserError(Exception):
    """Bad input (config, files, environment). The CLI prints it as one line and exits non-zero."""


class RunFolderConflict(UserError):
    """The run folder holds a run made with other settings. Nothing in it is written: it is another
    run's."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during ``train()``. The last checkpoint is kept, so the same call resumes from it."""

    def __init__(self, epoch: int = 0, step: int = 0, in_epoch: int = 0) -> None:
        if not in_epoch:
            message = "interrupted before training"
        elif epoch:
            message = (
                f"interrupted in epoch {in_epoch}; the checkpoint holds epoch {epoch} (step {step})"
            )
        else:
            message = f"interrupted in epoch {in_epoch}, before the first checkpoint"
        super().__init__(message)
        self.epoch, self.step = epoch, step


def require(ok: bool, message: str) -> None:
    """A UserError with ``message`` unless ``ok``."""
    if not ok:
        raise UserError(message)


def number(key: str, value: object, accepted: str, ok: Callable[[float], bool]) -> float:
    """``value`` as a float if it is a number (not a bool) that passes ``ok``; else a one-line
    error.
    """
    try:
        x = None if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        x = None
    require(x is not None and ok(x), f"{key}={value!r} must be {accepted}")
    return x


def integer(key: str, value: object, accepted: str, ok: Callable[[int], bool] | None = None) -> int:
    """``value`` if it is an int (not a bool) that passes ``ok``; else a one-line error."""
    require(
        isinstance(value, int) and not isinstance(value, bool) and (ok is None or ok(value)),
        f"{key}={value!r} must be {accepted}",
    )
    return value


def first_line(text: str) -> str:
    """The first line of ``text`` (stripped), or ""."""
    text = str(text).strip()
    return text.splitlines()[0] if text else ""


def one_line(e: BaseException) -> str:
    """An exception as one line: a UserError's message, else ``Type: first line``."""
    msg = first_line(str(e))
    if isinstance(e, UserError):
        return msg or type(e).__name__
    if no_space(e):  # torch's own words for it are "unexpected pos 370304 vs 370256"
        return "no space left on the device"
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__


NAME_MAX = 255  # bytes of one file or folder name on the usual file systems (ext4, xfs, APFS)


def check_names(*paths: Path | str | None) -> None:
    """A UserError for a path with a file or folder name longer than file systems allow (the OS
    would answer ``File name too long`` from deep inside a command); None paths are skipped."""
    import os

    for path in paths:
        for part in str(path or "").split(os.sep):
            n = len(os.fsencode(part))
            require(
                n <= NAME_MAX,
                f"{path}: its name {part[:20]}... is {n} bytes long, and a file or folder name "
                f"is at most {NAME_MAX}; use a shorter one",
            )


def no_space(e: BaseException | None) -> bool:
    """Whether ``e``, or an error it was raised from or while handling, is a full disk (ENOSPC):
    torch's writer answers one with its own RuntimeError, the full disk in its context."""
    import errno

    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False
