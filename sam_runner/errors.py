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
