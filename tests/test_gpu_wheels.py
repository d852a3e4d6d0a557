"""scripts/fetch_gpu_wheels.sh carries what the lent GPU machine lacks, and only that: every
runtime dependency in pyproject.toml, and theirs (markers read for that machine: CPython 3.12 on
Linux x86-64), is either downloaded by the script or on the machine's package list
(scripts/device_packages.txt); nothing on that list travels again; each pin meets every
requirement on it. A pin other than the version installed here is a warning, not a failure: a
fresh install takes the registry's newest release, and CI must not break the day a transitive
dependency publishes one (update the pin then). No network: the dependencies are read from the
installed distributions' metadata."""

from __future__ import annotations

import importlib.metadata as md
import re
import warnings

import pytest
from conftest import ROOT
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11+")

SCRIPT = ROOT / "scripts" / "fetch_gpu_wheels.sh"
DEVICE = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
}


def pins() -> dict:
    """name -> version of the script's WHEELS and SDISTS arrays."""
    text = SCRIPT.read_text()
    arrays = re.findall(r"^(?:WHEELS|SDISTS)=\(\n(.*?)^\)", text, re.S | re.M)
    found = re.findall(r"^\s+([A-Za-z0-9._-]+)==(\S+)\s*$", "".join(arrays), re.M)
    return {canonicalize_name(name): version for name, version in found}


def device_packages() -> set:
    lines = (ROOT / "scripts" / "device_packages.txt").read_text().splitlines()
    return {canonicalize_name(line) for line in lines if line.strip() and not line.startswith("#")}


def applies(req: Requirement, extras) -> bool:
    return req.marker is None or any(
        req.marker.evaluate({**DEVICE, "extra": e}) for e in ("", *extras)
    )


def needed(device: set) -> dict:
    """Every distribution the runtime dependencies need on the device, with the requirements on
    it; the needs of a distribution the device has are its own business."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo = [(Requirement(r), ()) for r in project["dependencies"]]
    seen, needs = set(), {}
    while todo:
        req, extras = todo.pop()
        if not applies(req, extras):
            continue
        name = canonicalize_name(req.name)
        needs.setdefault(name, []).append(req)
        if name in device or (name, tuple(sorted(req.extras))) in seen:
            continue
        seen.add((name, tuple(sorted(req.extras))))
        for line in md.distribution(name).requires or []:
            todo.append((Requirement(line), tuple(req.extras)))
    return needs


def test_the_wheel_set_is_what_the_device_lacks_of_the_runtime_dependencies():
    device, carried = device_packages(), pins()
    assert len(device) > 150 and {"torch", "torchvision", "numpy"} <= device
    assert len(carried) >= 5 and {"hydra-core", "omegaconf", "wandb"} <= set(carried)
    needs = needed(device)
    assert [n for n in needs if n not in device and n not in carried] == [], "neither"
    assert [n for n in carried if n in device] == [], "already on the device"
    assert [n for n in carried if n not in needs] == [], "not needed"
    for name, version in carried.items():
        here = md.version(name)
        if Version(here) != Version(version):
            warnings.warn(f"{SCRIPT.name}: {name} pinned {version}, installed here {here}")
        for req in needs[name]:
            assert req.specifier.contains(version, prereleases=True), f"{name} {version}: {req}"


def test_the_script_downloads_for_python_3_12_x86_64_into_the_ignored_wheel_folder():
    text = SCRIPT.read_text()
    download = text[text.index("pip download") :]
    for flag in ("--only-binary=:all:", "--no-deps", "--python-version 3.12", '-d "$DEST"'):
        assert flag in download, flag
    assert "--platform manylinux_2_28_x86_64" in download and "DEST=.whl" in text
    assert "/.whl/" in (ROOT / ".gitignore").read_text().splitlines()
