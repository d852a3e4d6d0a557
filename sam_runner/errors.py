"""User-facing errors: one line, naming the bad value and what would be accepted."""


class UserError(Exception):
    """Bad input (config, files, environment). The CLI prints it as one line and exits non-zero."""


class RunFolderConflict(UserError):
    """The run folder holds a run made with other settings. Nothing in it is written: it is another run's."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during ``train()``. The last checkpoint is kept, so the same call resumes from it."""

    def __init__(self, epoch: int = 0, step: int = 0):
        super().__init__(f"interrupted at epoch {epoch} (step {step})" if epoch else "interrupted before training")
        self.epoch, self.step = epoch, step


def require(ok: bool, message: str) -> None:
    if not ok:
        raise UserError(message)


def number(key: str, value, accepted: str, ok) -> float:
    """``value`` as a float if it is a number (not a bool) that passes ``ok``; else a one-line error."""
    try:
        x = None if isinstance(value, bool) else float(value)
    except (TypeError, ValueError):
        x = None
    require(x is not None and ok(x), f"{key}={value!r} must be {accepted}")
    return x


def one_line(e: BaseException) -> str:
    """An exception as one line: a UserError's message, else ``Type: first line``."""
    msg = str(e).splitlines()[0] if str(e) else ""
    if isinstance(e, UserError):
        return msg or type(e).__name__
    return f"{type(e).__name__}: {msg}" if msg else type(e).__name__
