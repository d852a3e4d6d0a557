"""Running the jobs to measure, with a progress bar over jobs.

- ``local`` launcher (the default), ``eval.workers`` = 1: one job after another in this process;
- ``eval.workers`` = N > 1: a pool of N processes (a forkserver on a CPU, with an equal share of
  the CPU threads each; spawned on a GPU), each ending with this one, however it ends;
- ``hydra/launcher=slurm``: one task of a SLURM job array per job folder, through submitit, with
  the parameters of conf/hydra/launcher/slurm.yaml (the preset training uses; its
  ``array_parallelism`` caps the tasks running at once); ``hydra/launcher=submitit_local`` runs
  the same array as local processes (for trying it without a cluster).

Whatever the launcher, each job writes its own eval.json when it ends, so a killed sam-eval
loses only the jobs in flight, and running it again measures those and the ones not started.
A job whose process died before writing one is recorded as failed by this process.
"""

from __future__ import annotations

import contextlib
import os
import sys

from ..errors import one_line
from ..rundir import eval_file
from ..runfiles import write_json
from .job import measure_job
from .plan import PlannedJob


class Progress:
    """A tqdm bar over jobs on a terminal (``bar``), else one line per finished job (``lines``)."""

    def __init__(self, mode: str, total: int) -> None:
        from ..progress import resolve_mode

        self.mode = resolve_mode(mode)
        self.total, self.done, self.bar = total, 0, None
        if self.mode == "bar":
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc="sam-eval", unit="job", file=sys.stderr)

    def finished(self, job: PlannedJob, record: dict) -> None:
        """One more job done: the bar moves on, or a line names it."""
        self.done += 1
        if self.bar is not None:
            self.bar.update(1)
            self.bar.set_postfix_str(f"{job.name} {record.get('status')}")
        elif self.mode == "lines":
            took = record.get("eval_time_s")
            took = f" in {took:.1f}s" if isinstance(took, (int, float)) else ""
            error = f": {record['error']}" if record.get("error") else ""
            print(
                f"[{self.done}/{self.total}] {job.name} {record.get('status')}{took}{error}",
                file=sys.stderr,
                flush=True,
            )

    def close(self) -> None:
        """The bar closed (nothing to do for lines)."""
        if self.bar is not None:
            self.bar.close()


def run_jobs(jobs: list[PlannedJob], settings: dict, launcher: str, launcher_params: dict) -> dict:
    """{job name: its eval.json record}, every job run by the chosen launcher."""
    progress = Progress(settings["trainer"]["progress"], len(jobs))
    try:
        if launcher in ("slurm", "submitit"):
            cluster = "slurm" if launcher == "slurm" else "local"
            return _array(jobs, settings, cluster, launcher_params, progress)
        if int(settings["eval"]["workers"]) > 1 and len(jobs) > 1:
            return _pool(jobs, settings, progress)
        out = {}
        for job in jobs:
            out[job.name] = _measured(job, settings)
            progress.finished(job, out[job.name])
        return out
    finally:
        progress.close()


def _measured(job: PlannedJob, settings: dict) -> dict:
    """One job's record: measured in this process, or by ``trainer.devices`` processes together
    (one large job: the curvature's samples split among them)."""
    devices = int(settings["trainer"].get("devices", 1) or 1)
    if devices == 1:
        return measure_job(job.path, settings)
    from .. import distributed

    device = distributed.check_devices(devices, str(settings["trainer"]["device"]))
    try:
        return distributed.launch(measure_job, (str(job.path), settings), devices, device)
    except Exception as e:  # a process died: this job fails, the others are measured
        return lost(job, settings, one_line(e))


def lost(job: PlannedJob, settings: dict, why: str) -> dict:
    """The record of a job whose process ended early: its eval.json if it wrote one with these
    settings, else a failure written now."""
    from ..runfiles import read_json

    target = job.path / eval_file(str(settings["eval"].get("weights", "last")))
    record = read_json(target) or {}
    if record.get("eval_settings") == settings["eval_settings"]:
        return record
    record = {"status": "failed", "error": why, "eval_settings": settings["eval_settings"]}
    write_json(target, record)
    return record


# ---------------------------------------------------------------------------- a local pool
def _worker_start(threads: int, sam_eval_pid: int) -> None:
    import torch

    from .. import distributed

    distributed._die_with_parent(None)  # PR_SET_PDEATHSIG: the forkserver's death ends it
    # a forkserver outlives a SIGKILLed sam-eval: the worker watches sam-eval itself
    _exit_with(sam_eval_pid)
    torch.set_num_threads(threads)


def _exit_with(pid: int) -> None:
    """End this process as soon as process ``pid`` ends, however it ends (a pidfd becomes
    readable then; where there is none, a poll every second)."""
    import os
    import select
    import threading
    import time

    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        os._exit(1)
    except (AttributeError, OSError):
        fd = None

    def watch():
        if fd is not None:
            select.select([fd], [], [])
        else:
            with contextlib.suppress(OSError):
                while True:
                    os.kill(pid, 0)
                    time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="sam-eval-watchdog", daemon=True).start()


def _pool(jobs: list[PlannedJob], settings: dict, progress: Progress) -> dict:
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    from .. import distributed

    workers = min(int(settings["eval"]["workers"]), len(jobs))
    device = distributed.resolve_device(str(settings["trainer"]["device"]))
    forkserver = device.type == "cpu" and "forkserver" in mp.get_all_start_methods()
    ctx = mp.get_context("forkserver" if forkserver else "spawn")
    if forkserver:
        ctx.set_forkserver_preload(["torch", "sam_runner.evaluation.job"])
    threads = distributed.cpu_threads(workers) if device.type == "cpu" else 1
    out = {}
    with ProcessPoolExecutor(
        workers, ctx, initializer=_worker_start, initargs=(threads, os.getpid())
    ) as pool:
        futures = {pool.submit(measure_job, j.path, settings): j for j in jobs}
        for future in as_completed(futures):
            job = futures[future]
            try:
                out[job.name] = future.result()
            except Exception as e:  # the worker died (killed, out of memory)
                out[job.name] = lost(job, settings, f"its worker process died ({one_line(e)})")
            progress.finished(job, out[job.name])
    return out


# ---------------------------------------------------------------------------- a submitit array
def _array(jobs, settings, cluster: str, params: dict, progress: Progress) -> dict:
    from ..jobarray import run_array

    out = {}

    def done(i: int, record, error) -> None:
        job = jobs[i]
        if error is not None:  # the task died or was cancelled before writing eval.json
            record = lost(job, settings, f"its task ended early ({one_line(error)})")
        out[job.name] = record
        progress.finished(job, record)

    run_array(measure_job, [(j.path, settings) for j in jobs], cluster, params, done, "sam-eval")
    return out
