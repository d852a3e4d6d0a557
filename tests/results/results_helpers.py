"""Helpers for the results tests: one real sweep shared by the test files, and a reader
for W&B's offline run files (``run-<id>.wandb``).

The reader: W&B 0.31 no longer ships its Python datastore reader (wandb-core, in Go,
reads and writes the file now), so the framing is read here and each record is decoded
with W&B's own protobuf schema (``wandb.proto.wandb_internal_pb2.Record``). The framing is
LevelDB's log format behind a 7-byte file header (":W&B", a 2-byte magic, a version):
32 KiB blocks of records, each with a 7-byte header (crc32c, little-endian length, type
FULL=1/FIRST=2/MIDDLE=3/LAST=4); a block's last < 7 bytes are padding. The crc is not
checked (a corrupt file would fail to parse as protobuf anyway).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import shutil
import struct
import subprocess
import tempfile
import time
from pathlib import Path

BLOCK = 32 * 1024
FILE_HEADER = 7
SWEEP_NAME = "study_a"
SWEEP_ENV = "SAM_RUNNER_TEST_SHARED_SWEEP"  # the shared sweep's folder, for this session
# 2 variants × 2 seeds, tiny budget, W&B offline: a whole sweep in miniature
SWEEP_ARGS = [
    "-m",
    "optimizer=base,sam",
    "seed=0,1",
    "trainer.epochs=1",
    "dataset.num_samples=1000",
    "metrics.hessian.num_samples=256",
    "metrics.hessian.max_iter=20",
    "trainer.progress=none",
    "logger=wandb",
    "logger.mode=offline",
]


def wandb_records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    records, pos, pending = [], FILE_HEADER, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # block trailer padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:  # zero fill up to the block's end
            pos += left
            continue
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 1:
            pending = chunk
        elif kind == 2:
            pending = chunk
            continue
        elif kind == 3:
            pending += chunk
            continue
        else:
            pending += chunk
        rec = pb.Record()
        rec.ParseFromString(pending)
        records.append(rec)
        pending = b""
    return records


def wandb_run_files(run_dir: Path) -> list[Path]:
    """The offline run files under a run folder, oldest first (a resumed job adds one)."""
    return sorted(
        Path(run_dir).glob("wandb/offline-run-*/run-*.wandb"), key=lambda p: p.parent.name
    )


def wandb_content(run_dir: Path) -> dict:
    """What the run folder's W&B files hold: history rows by step, summary, run info, config, exit
    codes."""
    out = {
        "history": {},
        "summary": {},
        "runs": [],
        "config": {},
        "exit_codes": [],
        "preempting": False,
    }
    for f in wandb_run_files(run_dir):
        for rec in wandb_records(f):
            kind = rec.WhichOneof("record_type")
            if kind == "history":
                items = {
                    (i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                    for i in rec.history.item
                }
                out["history"].setdefault(items["_step"], {}).update(items)
            elif kind == "summary":
                for i in rec.summary.update:
                    out["summary"][i.key or "/".join(i.nested_key)] = json.loads(i.value_json)
            elif kind == "run":
                out["runs"].append(rec.run)
                out["config"].update(
                    {i.key: json.loads(i.value_json) for i in rec.run.config.update}
                )
            elif kind == "config":
                out["config"].update({i.key: json.loads(i.value_json) for i in rec.config.update})
            elif kind == "exit":
                out["exit_codes"].append(rec.exit.exit_code)
            elif kind == "preempting":
                out["preempting"] = True
    return out


def finished_wandb_content(run_dir: Path, tries: int = 50) -> dict:
    """wandb_content once the file holds the run's exit record: after finish(), wandb-core may still
    be writing the last records (seen under load as a missing history step or a cut record)."""
    from google.protobuf.message import DecodeError

    for _ in range(tries):
        try:
            content = wandb_content(run_dir)
            if content["exit_codes"]:
                return content
        except DecodeError:
            pass
        time.sleep(0.2)
    return wandb_content(run_dir)


@functools.lru_cache(maxsize=None)
def shared_sweep() -> Path:
    """The test sweep, run once per test session (real `sam-run -m`, in a subprocess). This
    module is imported under two names (``results_helpers`` by the tests beside it,
    ``results.results_helpers`` from elsewhere), each with its own cache: the environment
    holds the folder, so the second one finds the first one's sweep."""
    known = os.environ.get(SWEEP_ENV)
    if known and (Path(known) / "0" / "summary.json").is_file():
        return Path(known)
    root = Path(tempfile.mkdtemp(prefix="sam-results-"))
    atexit.register(shutil.rmtree, root, True)
    sweep = root / SWEEP_NAME
    proc = subprocess.run(
        ["sam-run", *SWEEP_ARGS, f"hydra.sweep.dir={sweep}"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    os.environ[SWEEP_ENV] = str(sweep)
    return sweep


def copy_sweep(dst: Path) -> Path:
    """A copy of the shared sweep without its W&B files, to alter (a running or failed job)."""
    return Path(
        shutil.copytree(shared_sweep(), dst, ignore=shutil.ignore_patterns("wandb", "checkpoints"))
    )


def train_sweep_job(folder: Path, overrides: list[str], base: list[str] = ()) -> None:
    """One job of a sweep folder as `sam-run -m` leaves it: trained in process (real Hydra
    composition, real training) with its ``.hydra`` files, ``overrides`` being what the job
    varies (its label in the report) and ``base`` the settings every job shares."""
    from conftest import compose
    from omegaconf import OmegaConf

    from sam_runner.train import train

    cfg = compose(*base, *overrides)
    hydra = Path(folder) / ".hydra"
    hydra.mkdir(parents=True)
    OmegaConf.save(cfg, hydra / "config.yaml")
    OmegaConf.save(OmegaConf.create(list(overrides)), hydra / "overrides.yaml")
    train(cfg, Path(folder), list(overrides))


def living_children() -> set[int]:
    """The pids of this process's children that have not ended (from /proc; zombies left out)."""
    mine = str(os.getpid())
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # it ended meanwhile
            continue
        state, parent = stat.rsplit(")", 1)[1].split()[:2]
        if parent == mine and state != "Z":
            found.add(int(entry.name))
    return found
