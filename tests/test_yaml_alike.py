"""yaml_alike.load: the value PyYAML's SafeLoader gives, for texts built from a template and
for every text that differs from one in more than a plain scalar."""

from __future__ import annotations

import random

import pytest
import yaml

from sam_runner import yaml_alike

BASE = """\
dataset:
  name: mnist1d
  batch_size: 128
  data_dir: ${oc.env:SAM_RUNNER_DATA,${oc.env:HOME,.}/.cache/sam-runner}
  sgs:
    alpha: 0.5
model:
  targets:
  - '*'
  - head
  train_also: []
optimizer:
  rho: 0.05
  name: sam
seed: 0
"""
# what a value may become: plain scalars of every kind, and what is no plain scalar at all
VALUES = (
    "7", "-3", "0.1", "1.0e-05", "1e5", ".inf", "-.inf", ".nan", "null", "~", "true", "yes",
    "Off", "0x1F", "0o17", "1_000", "2020-01-01", "/tmp/data", "sam_v2", "a.b-c", "'quoted'",
    '"dq"', "a b", "x: y", "[1, 2]", "{a: 1}", "&anchor 1", "!!str 5", "- 1", "...", "-",
    "1 # note", "|", "", "*alias",
)  # fmt: skip


def reference(text: str):
    try:
        return repr(yaml.load(text, Loader=yaml.SafeLoader))
    except yaml.YAMLError:
        return "error"


def alike(text: str):
    try:
        return repr(yaml_alike.load(text))
    except yaml.YAMLError:
        return "error"


def variant(rng: random.Random) -> str:
    """BASE with a few of its scalar values (and sometimes a key) replaced."""
    lines = BASE.split("\n")
    for _ in range(rng.randint(1, 3)):
        i = rng.choice([i for i, line in enumerate(lines) if line.rstrip().endswith(
            tuple("0123456789md*"))])  # fmt: skip
        head, sep, _ = lines[i].rpartition(": " if ": " in lines[i] else "- ")
        lines[i] = head + sep + rng.choice(VALUES)
    if rng.random() < 0.1:
        lines[1] = "  title: mnist1d"
    return "\n".join(lines)


def test_the_values_are_safeloaders():
    yaml_alike.load(BASE)  # a template to build from
    rng = random.Random(0)
    for _ in range(600):
        text = variant(rng)
        assert alike(text) == reference(text), text


def test_a_scalar_apart_is_built_from_the_template():
    yaml_alike._TEMPLATES.clear()
    first = yaml_alike.load(BASE)
    second = yaml_alike.load(BASE.replace("seed: 0", "seed: 12").replace("rho: 0.05", "rho: 1"))
    assert (second["seed"], second["optimizer"]["rho"], first["seed"]) == (12, 1, 0)
    assert len(yaml_alike._TEMPLATES[BASE.count("\n") + 1]) == 1  # not parsed whole again
    second["dataset"]["sgs"]["alpha"] = 9  # each value is the caller's own
    assert yaml_alike.load(BASE)["dataset"]["sgs"]["alpha"] == 0.5


@pytest.mark.parametrize(
    "text",
    [
        "a: &x 1\nb: *x\n",  # an alias: one node in two places
        "base: &b {k: 1}\nuse:\n  <<: *b\n  j: 2\n",  # a merge key
        "a: 1\na: 2\n",  # a repeated key
        "a: !!str 5\n",  # a tag
        "a: 1\r\nb: 2\r\n",  # other line breaks
        "a: plain\n  continued\nb: 2\n",  # a multi-line scalar
    ],
)
def test_texts_unlike_a_template(text):
    for changed in (text, text.replace("1", "4").replace("2", "3")):
        assert alike(changed) == reference(changed)
