"""Where the Hydra config tree is: inside the package in a wheel, top-level conf/ in a checkout."""

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def config_dir() -> str:
    shipped = PACKAGE_DIR / "conf"
    return str(shipped if shipped.is_dir() else PACKAGE_DIR.parent / "conf")
