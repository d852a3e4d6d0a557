"""``sam-run --help``: the config groups and their options, read from the registries (the groups
that choose a Python object) and from the config tree (the others: presets and settings)."""

from __future__ import annotations

from pathlib import Path

from .paths import config_dir
from .registry import ALL, SAMPLERS

# groups of the config tree that are settings or presets, not registries
CONFIG_GROUPS = ("trainer", "metrics", "experiment", "hydra/launcher")


def _defaults() -> dict:
    """The default option of each group, from conf/config.yaml's defaults list."""
    import yaml

    tree = yaml.safe_load((Path(config_dir()) / "config.yaml").read_text())
    out = {}
    for item in tree.get("defaults", []):
        if isinstance(item, dict):
            out.update({str(k): v for k, v in item.items()})
    return out


def _first_comment(path: Path) -> str:
    """A yaml's description: its first comment line that is not a Hydra directive."""
    for line in path.read_text().splitlines():
        if line.startswith("#") and not line.startswith("# @package"):
            return line.lstrip("# ").strip()
    return ""


def _lines(options: list[tuple[str, str]], default) -> list[str]:
    width = max((len(n) for n, _ in options), default=0) + 1
    return [
        f"  {name + ('*' if name == default else ''):<{width}}  {text}".rstrip()
        for name, text in options
    ]


def config_groups() -> str:
    """The groups with their options (the default marked *), one line each."""
    defaults = _defaults()
    out = []
    for key, registry in ALL.items():
        if key == SAMPLERS.key:
            continue
        out += [
            f"{key}:",
            *_lines([(e.name, e.description) for e in registry.entries()], defaults.get(key)),
        ]
    out += [
        f"{SAMPLERS.key} (a key of every dataset):",
        *_lines([(e.name, e.description) for e in SAMPLERS.entries()], "uniform"),
    ]
    root = Path(config_dir())
    for group in CONFIG_GROUPS:
        files = sorted((root / group).glob("*.yaml"))
        out += [
            f"{group}:",
            *_lines([(f.stem, _first_comment(f)) for f in files], defaults.get(group)),
        ]
    return "\n".join(out)


def markdown_options() -> str:
    """The README's option table (between its ``options`` markers; a test keeps them equal): one
    row per registry, the default in bold. ``sam-run --help`` describes each option."""
    defaults = _defaults()
    rows = ["| group | options (**default**) |", "|---|---|"]
    for key, registry in ALL.items():
        default = "uniform" if key == SAMPLERS.key else defaults.get(key)
        names = [f"**`{n}`**" if n == default else f"`{n}`" for n in registry]
        rows.append(f"| `{key}` | {', '.join(names)} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_options())
