"""``sam-run --help``: the config groups and their options, read from the registries (the groups
that choose a Python object) and from the config tree (the others: presets and settings)."""

from __future__ import annotations

import re
from pathlib import Path

from .paths import config_dir
from .registry import ALL

# groups of the config tree that are settings or presets, not registries
CONFIG_GROUPS = ("trainer", "metrics", "experiment", "hparams_search", "hydra/launcher")


def _yaml(path: Path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text()) or {}


def _defaults() -> dict:
    """The default of every registry's key: a group's option from conf/config.yaml's defaults
    list (``optimizer``: sam), a key inside a group from that group's default option and the
    shared files it starts from (``dataset.sampler``: uniform)."""
    root = Path(config_dir())
    out = {}
    for item in _yaml(root / "config.yaml").get("defaults", []):
        if isinstance(item, dict):
            out.update({str(k): v for k, v in item.items()})
    for key in ALL:
        if "." in key:
            group, leaf = key.split(".", 1)
            out[key] = _value(root, root / group / f"{out.get(group)}.yaml", leaf)
    return out


def _value(root: Path, path: Path, key: str):
    """``key`` in a group's yaml, else in the shared yaml its defaults list starts from."""
    tree = _yaml(path) if path.exists() else {}
    if key in tree:
        return tree[key]
    for item in tree.get("defaults", []):
        if isinstance(item, str) and item.startswith("/"):
            found = _value(root, root / (item[1:].split("@")[0] + ".yaml"), key)
            if found is not None:
                return found
    return None


def _first_comment(path: Path, width: int = 96) -> str:
    """A yaml's description: the first sentence of its leading comment block (Hydra directives
    skipped), cut at a word to ``width`` characters."""
    words = []
    for line in path.read_text().splitlines():
        if line.startswith("# @package"):
            continue
        if not line.startswith("#"):
            break
        words += line.lstrip("# ").split()
    text = " ".join(words)
    end = re.search(r"(?<! al)\.(\s|$)", text)  # a full stop, not "et al."
    text = text[: end.start() + 1] if end else text
    if len(text) > width:
        text = text[: width - 1].rsplit(" ", 1)[0] + "…"
    return text


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
        title = f"{key} (a key of {key.split('.')[0]}):" if "." in key else f"{key}:"
        out += [
            title,
            *_lines([(e.name, e.description) for e in registry.entries()], defaults.get(key)),
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
        names = [f"**`{n}`**" if n == defaults.get(key) else f"`{n}`" for n in registry]
        rows.append(f"| `{key}` | {', '.join(names)} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(markdown_options())
