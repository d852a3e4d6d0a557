"""``sam-run --help``: the config groups and their options, read from the registries (the groups
that choose a Python object) and from the config tree (the others: presets and settings); and
the composed config with a line on each key, from the comments beside the keys in ``conf/``
(one source: the yaml that sets a key says what it is)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from .paths import config_dir
from .registry import ALL

if TYPE_CHECKING:
    from omegaconf import DictConfig

# groups of the config tree that are settings or presets, not registries
CONFIG_GROUPS = (
    *("trainer", "metrics", "experiment", "cheaper", "hparams_search", "hydra/launcher"),
    "fed_method",
)


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


# ------------------------------------------------------------------------ the keys, described
# where a group's keys start from: its shared file (conf/common/<file>.yaml), else none
SHARED = {"dataset": "dataset", "model": "model", "optimizer": "engine", "federated": "federated"}
KEY_LINE = re.compile(r"^(\s*)([A-Za-z_][\w]*):(.*)$")


def yaml_comments(path: Path, prefix: str = "") -> dict[str, str]:
    """``{dotted key: its trailing comment}`` of a yaml file (block style, as conf/ is
    written); a key's comment may also say what the keys of its flow mapping are."""
    out, stack = {}, []  # stack: (indent, key) of the enclosing block keys
    for line in path.read_text().splitlines():
        m = KEY_LINE.match(line)
        if m is None or line.lstrip().startswith("#"):
            continue
        indent, key, rest = len(m.group(1)), m.group(2), m.group(3)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        dotted = prefix + ".".join([k for _, k in stack] + [key])
        if " #" in rest or rest.startswith("#"):
            out[dotted] = rest.split("#", 1)[1].strip()
        stack.append((indent, key))
    return out


def _group_files(root: Path, group: str, chosen) -> list[Path]:
    """The files a group's keys may be described in: the chosen option's first, then the
    group's shared file, then its other options."""
    files = sorted((root / group).glob("*.yaml"), key=lambda f: (f.stem != "default", f.stem))
    first = [f for f in files if f.stem == str(chosen)]
    shared = [root / "common" / f"{SHARED[group]}.yaml"] if group in SHARED else []
    return first + shared + [f for f in files if f not in first]


KEYED_GROUPS = ("dataset", "model", "base_optimizer", "optimizer", "scheduler", "trainer")
OPTION_KEYS = {"model": "arch"}  # the key that records a group's chosen option (else name)


def key_descriptions(choices: dict | None = None) -> dict[str, str]:
    """Every key's description from conf/ (``choices``: the option chosen in each group)."""
    root = Path(config_dir())
    choices = choices or _defaults()
    out = {}
    for group in (*KEYED_GROUPS, "logger", "metrics", "regularizer", "weight_decay", "federated"):
        out[f"{group}.{OPTION_KEYS.get(group, 'name')}"] = f"the option chosen with {group}="
        for f in reversed(_group_files(root, group, choices.get(group))):
            # a preset of package _global_ names its keys in full (optimizer.rho)
            own = f.read_text().startswith("# @package _global_")
            out.update(yaml_comments(f, "" if own else f"{group}."))  # the first file wins
    out.update(yaml_comments(root / "config.yaml"))
    return out


def described_config(cfg: DictConfig, choices: dict | None = None, width: int = 40) -> str:
    """The composed config as yaml, each key that has a description followed by it."""
    from omegaconf import OmegaConf

    tree = {k: v for k, v in OmegaConf.to_container(cfg).items() if k != "hydra"}
    text = OmegaConf.to_yaml(OmegaConf.create(tree))
    notes = key_descriptions(choices)
    out, stack = [], []
    for line in text.splitlines():
        m = KEY_LINE.match(line)
        if m is None:
            out.append(line)
            continue
        indent = len(m.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, m.group(2)))
        note = notes.get(".".join(k for _, k in stack))
        out.append(f"{line:<{width}}  # {note}" if note else line)
    return "\n".join(out)


def help_config(*, _root_: DictConfig) -> str:
    """The help template's config: the composed one (``_root_``, with the command's overrides),
    its keys described; ``$`` doubled (Hydra's help template is a string.Template)."""
    from hydra.core.hydra_config import HydraConfig

    choices = dict(HydraConfig.get().runtime.choices) if HydraConfig.initialized() else None
    return described_config(_root_, choices).replace("$", "$$")


if __name__ == "__main__":
    print(markdown_options())
