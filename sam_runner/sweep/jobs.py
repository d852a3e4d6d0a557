"""Running one job of a run or a sweep, and recording a job that failed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import RunFolderConflict, first_line, one_line
from ..rundir import SUMMARY, RunDir
from ..runfiles import read_json, write_json

if TYPE_CHECKING:
    from omegaconf import DictConfig


def run_parallel(cfg: DictConfig, run_dir: Path | str, overrides: list[str]) -> dict:
    """Train one job: joins an outside launcher's group (torchrun, srun), starts
    ``trainer.devices`` processes itself, or trains in this process."""
    from .. import distributed
    from ..train import train
    from .trial import TrialLink

    trial = TrialLink.from_env()  # a pruned search's job reports to its trial
    if distributed.from_env() is not None:
        topo = distributed.init_from_env(str(cfg.trainer.device))
        try:
            summary = train(cfg, run_dir, overrides, trial)
        except BaseException as e:
            if not topo.is_main and not isinstance(e, INTERRUPTIONS):
                # rank 0 records its own failure; the launcher (srun --kill-on-bad-exit) ends the
                # others, so
                # a failing peer says what happened here: its log, and summary.json unless rank 0
                # wrote one
                msg = f"process {topo.rank} of {topo.world} failed: {one_line(e)}"
                print(f"sam-run: {msg}", file=sys.stderr, flush=True)
                if not isinstance(e, RunFolderConflict):
                    record_failure(run_dir, overrides, msg)
            raise
        topo.shutdown()  # only on success: after a failure the launcher ends the peers
        return summary
    devices = cfg.trainer.get("devices", 1)
    device = distributed.check_devices(devices, str(cfg.trainer.device))
    done = RunDir(run_dir).summary
    if devices == 1 or (done and done.get("status") in ("completed", "pruned")):
        return train(cfg, run_dir, overrides, trial)
    try:
        args = (cfg, str(run_dir), list(overrides), trial)  # the trial opens where it is used
        return distributed.launch(train, args, devices, device)
    except BaseException as e:
        # the launcher's error is the earliest failure of any process: it replaces what rank 0 wrote
        # (its peer's "Connection reset"); a Ctrl-C or requeue is no failure (the same command
        # resumes),
        # nor is a folder of another run
        if not isinstance(e, (*INTERRUPTIONS, RunFolderConflict)):
            record_failure(run_dir, overrides, first_line(str(e)) or type(e).__name__, replace=True)
        raise


# a Ctrl-C, or submitit's requeue (SIGUSR2, then sys.exit): the run resumes from its checkpoint
INTERRUPTIONS = (KeyboardInterrupt, SystemExit)


def record_failure(
    run_dir: Path | str, overrides: list[str], message: str, replace: bool = False
) -> dict:
    """summary.json with status failed and the one-line error (kept when train() already wrote one,
    unless ``replace``)."""
    path = Path(run_dir) / SUMMARY
    summary = read_json(path)
    if replace or not summary or summary.get("status") != "failed":
        summary = {
            "status": "failed",
            "error": first_line(message) or "failed",
            "overrides": list(overrides),
        }
        try:
            write_json(path, summary)
        except OSError:
            pass
    return summary
