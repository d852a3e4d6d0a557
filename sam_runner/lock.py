"""One process at a time per job: an ``fcntl`` lock on a file in the job's folder.

Two identical sweeps (two terminals, an sbatch script submitted twice, a requeue racing the
original) share their jobs instead of training each twice: the first to reach a job takes its
lock, the other says who holds it and goes on (``skip``), waits for it (``wait``) or stops
(``fail``). The operating system releases the lock when its holder ends, however it ends
(SIGKILL included), so a stale lock file never blocks anything: only a live holder does.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import UserError

if TYPE_CHECKING:
    from collections.abc import Iterator

ON_LOCKED = ("skip", "wait", "fail")


class JobLocked(UserError):
    """Another live process holds the job's lock (``on_locked=fail``, or a skipped job)."""


def lock_path(folder: Path | str, what: str) -> Path:
    """The file of ``folder``'s ``what`` lock."""
    return Path(folder) / f".{what}.lock"


def holder(path: Path) -> str:
    """``pid 123 on host`` from the lock file (what its holder wrote), or ``another process``."""
    try:
        pid, host = path.read_text().split()[:2]
        return f"pid {pid} on {host}"
    except (OSError, ValueError):
        return "another process"


@contextlib.contextmanager
def job_lock(
    folder: Path | str,
    what: str,
    on_locked: str = "skip",
    tool: str = "sam-run",
    option: str | None = None,
) -> Iterator[bool]:
    """Hold ``folder``'s ``what`` lock for the block; yields True when held, False when another
    process holds it and ``on_locked`` is ``skip`` (a one-line notice says who). ``wait`` blocks
    until it is free; ``fail`` raises JobLocked (naming ``option``, the setting that chooses)."""
    if on_locked not in ON_LOCKED:
        raise UserError(f"on_locked={on_locked!r} is unknown; choose one of {', '.join(ON_LOCKED)}")
    path = lock_path(folder, what)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not _try_lock(fd):
            who = holder(path)
            message = f"{folder} is being worked on by {who} ({what} lock {path.name})"
            if on_locked == "fail":
                then = "run this again when it has ended"
                if option:
                    then = f"wait for it to end, or pass {option}=skip or wait"
                raise JobLocked(f"{message}; {then}")
            if on_locked == "skip":
                print(f"{tool}: {message}: skipped", file=sys.stderr, flush=True)
                yield False
                return
            print(f"{tool}: {message}: waiting for it", file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
        yield True
    finally:
        os.close(fd)  # releases the lock


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def held_by(folder: Path | str, what: str) -> str | None:
    """Who holds ``folder``'s ``what`` lock now (``pid 123 on host``), or None when nobody does."""
    path = lock_path(folder, what)
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        if _try_lock(fd):
            return None
        return holder(path)
    finally:
        os.close(fd)
