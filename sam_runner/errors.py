"""User-facing errors: one line, naming the bad value and what would be accepted."""


class UserError(Exception):
    """Bad input (config, files, environment). The CLI prints it as one line and exits non-zero."""


def require(ok: bool, message: str) -> None:
    if not ok:
        raise UserError(message)
