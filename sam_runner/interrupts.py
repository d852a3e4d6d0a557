"""Ctrl-C and SIGTERM, one meaning for every command: stop, keep what is written whole, say so in
one line, exit 130 (Ctrl-C) or 143 (SIGTERM: what schedulers and ``docker stop`` send), 128 plus
the signal's number as the shell reports it. Standard library only: the console scripts
(``entry_points``) install this before Hydra, OmegaConf or torch load.
"""

from __future__ import annotations

import contextlib
import signal
import threading

TERMINATED: list[int] = []  # SIGTERM reached this process
# a Ctrl-C or SIGTERM not yet handled by a command: a library's bare ``except:`` can swallow the
# KeyboardInterrupt that the signal raised inside it (mpmath's ``import gmpy2`` while torch
# loads is one), and the command then went on as if nothing had come
PENDING: list[int] = []


def _on_sigint(signum, _frame) -> None:
    PENDING.append(signum)
    raise KeyboardInterrupt


def _on_sigterm(signum, _frame) -> None:
    """SIGTERM stops a command as Ctrl-C does: the same KeyboardInterrupt, so every command's
    Ctrl-C handling (the checkpoint kept, the jobs done so far kept) serves both."""
    TERMINATED.append(signum)
    PENDING.append(signum)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    raise KeyboardInterrupt


def catch_signals() -> None:
    """SIGTERM raises KeyboardInterrupt from now on, unless someone else handles it already, and
    Ctrl-C is recorded as well as raised (unless ignored, as in a script's background job)."""
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _on_sigterm)
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)


def _record(signum, _frame) -> None:
    if signum == signal.SIGTERM:
        TERMINATED.append(signum)
    PENDING.append(signum)


def defer_signals() -> None:
    """Ctrl-C and SIGTERM recorded, not raised, for a command of no lasting work (``sam-run
    --help``, ``--cfg``): raised inside a library, a KeyboardInterrupt can come out as that
    library's own error (Hydra printed a ConfigCompositionException's traceback);
    ``raise_pending()`` raises it once the command is done."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        if signal.getsignal(sig) in (_on_sigint, _on_sigterm, signal.default_int_handler):
            signal.signal(sig, _record)


def raise_pending() -> None:
    """At a command's safe points (each unit of its progress, each training step): a signal
    whose KeyboardInterrupt something swallowed is raised again, once."""
    if PENDING:
        PENDING.clear()
        raise KeyboardInterrupt


def stopping() -> None:
    """The interruption is being handled: a second Ctrl-C now ends the process at once (the
    shell's 130) rather than with a traceback from the middle of the one-line message."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def said(prog: str, what: str) -> str:
    """``prog``'s one line for an interruption: ``PROG: [SIGTERM: ]WHAT``."""
    return f"{prog}: {'SIGTERM: ' if TERMINATED else ''}{what}"


def exit_code() -> int:
    """The exit status of an interrupted command: 143 after SIGTERM, 130 after Ctrl-C."""
    return 143 if TERMINATED else 130


@contextlib.contextmanager
def deferred():
    """Ctrl-C and SIGTERM recorded, not raised, inside the block (a file being written whole:
    torch's zip writer raised its own error from a KeyboardInterrupt inside it, hiding the
    signal), then raised once the block is done. A no-op off the main thread, or where the
    command's handlers are not installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    ours = {signal.SIGINT: _on_sigint, signal.SIGTERM: _on_sigterm}
    swapped = [sig for sig, fn in ours.items() if signal.getsignal(sig) is fn]
    before = len(PENDING)
    for sig in swapped:
        signal.signal(sig, _record)
    try:
        yield
    finally:
        for sig in swapped:
            signal.signal(sig, ours[sig])
    if len(PENDING) > before:  # what came during the block, as its handler would have done
        if TERMINATED:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends at once
        raise KeyboardInterrupt
