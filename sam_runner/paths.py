"""Where the Hydra config tree is: inside the package in a wheel, top-level conf/ in a checkout."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def config_dir() -> str:
    """The folder of the package's Hydra configs (shipped inside it, or the repository's
    ``conf``)."""
    shipped = PACKAGE_DIR / "conf"
    return str(shipped if shipped.is_dir() else PACKAGE_DIR.parent / "conf")
