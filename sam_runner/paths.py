"""Where the Hydra config tree is: inside the package in a wheel, top-level conf/ in a checkout."""

from __future__ import annotations

from pathlib import Path

from .errors import require

PACKAGE_DIR = Path(__file__).resolve().parent


def config_dir() -> str:
    """The folder of the package's Hydra configs (shipped inside it, or the repository's
    ``conf``)."""
    shipped = PACKAGE_DIR / "conf"
    return str(shipped if shipped.is_dir() else PACKAGE_DIR.parent / "conf")


def folder_or_hub_id(key: str, name: str, give: str) -> tuple[str, bool]:
    """(what ``from_pretrained`` reads, whether it is a local folder) for ``key=name``: a name
    that starts with ``.``, ``/`` or ``~``, or that exists, is a local path (expanded), which
    must be a folder (else one line: ``give`` says what to pass); any other name is a hub id."""
    path = Path(name).expanduser()
    if not (name.startswith((".", "/", "~")) or path.exists()):
        return name, False
    require(path.is_dir(), f"{key}={name}: no such folder; give {give}")
    return str(path), True
