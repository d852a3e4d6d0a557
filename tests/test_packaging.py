"""The wheel carries the config tree: `sam-run --cfg job` works from a non-editable install."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from conftest import ROOT


def test_wheel_ships_configs_and_runs(tmp_path):
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert build.returncode == 0, build.stderr[-2000:]
    wheel = next(dist.glob("sam_runner-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    assert "sam_runner/conf/config.yaml" in names and "sam_runner/conf/optimizer/sam.yaml" in names
    assert "hydra_plugins/sam_runner_sweeper/sweeper.py" in names  # the sweeper Hydra loads
    # a fresh venv that sees this interpreter's installed dependencies (whether it is a virtualenv
    # or not: a .pth line adds its site-packages, whose own .pth files, the editable install of
    # sam_runner among them, are not run) but gets sam_runner from the wheel only
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = subprocess.run(
        [
            venv / "bin" / "python",
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(site) / "parent.pth").write_text("\n".join(sorted(ours)) + "\n")
    pip = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            venv / "bin" / "python",
            "install",
            "-q",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        capture_output=True,
        text=True,
    )
    assert pip.returncode == 0, pip.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = subprocess.run(
        [venv / "bin" / "sam-run", "--cfg", "job", "optimizer.rho=0.2"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    assert "rho: 0.2" in out.stdout and "name: mnist1d" in out.stdout
    where = subprocess.run(
        [venv / "bin" / "python", "-c", "import sam_runner.paths as p; print(p.config_dir())"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
    )
    assert str(venv) in where.stdout, where.stdout
