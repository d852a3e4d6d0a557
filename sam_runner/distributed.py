"""Process topology for data-parallel training.

One process by default. Three ways to get several:

* ``trainer.devices=N``: ``launch`` starts N worker processes itself (spawned, one
  per GPU with NCCL; or forked, N CPU processes with gloo on 127.0.0.1 and a free port,
  each with its share of the CPU threads);
* ``torchrun``: rank and world size come from ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``;
* SLURM tasks (``srun`` with several tasks, e.g. the submitit launcher with
  ``hydra.launcher.tasks_per_node=N``): from ``SLURM_PROCID``/``SLURM_NTASKS``/
  ``SLURM_LOCALID``; the rendezvous is ``MASTER_ADDR`` (default: the first node of the
  job) and ``MASTER_PORT`` (default: derived from the job id).

``train()`` only sees a ``Topology``: ``rank``, ``world``, ``device``, ``is_main``,
``wrap(model, cfg)`` (DDP, optional SyncBatchNorm), ``sum`` (all-reduce SUM) and
``gather`` (concatenate along dim 0, uneven sizes allowed). ``shutdown`` ends a
data-parallel process in the order that does not abort gloo at exit: barrier, drop
the DDP module, destroy the process group.

Our choices: each process evaluates a strided shard of the test set and ``gather``
reassembles it (every test example counted once); the train loss and accuracy of an
epoch are sums over all processes divided by the global count; CPU processes are forked
(seconds faster than re-importing torch); SyncBatchNorm is CUDA-only in PyTorch, so
``trainer.sync_batchnorm=true`` on the CPU is refused.
"""
from __future__ import annotations

import datetime
import gc
import os
import socket
import subprocess
import sys
import traceback
from dataclasses import dataclass, field

import torch

from .errors import UserError, require


@dataclass
class Topology:
    rank: int = 0
    world: int = 1
    device: torch.device | None = None   # set by the launcher of a data-parallel run
    local_rank: int = 0
    _ddp: object = field(default=None, repr=False)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def parallel(self) -> bool:
        return self.world > 1

    def wrap(self, model, cfg):
        """DDP around ``model`` when world > 1 (SyncBatchNorm first when trainer.sync_batchnorm)."""
        if not self.parallel:
            return model
        from torch.nn.parallel import DistributedDataParallel
        if cfg.trainer.get("sync_batchnorm", False):
            require(self.device is not None and self.device.type == "cuda",
                    "trainer.sync_batchnorm=true needs GPUs (PyTorch's SyncBatchNorm is CUDA-only); "
                    "use trainer.sync_batchnorm=false on the CPU")
            # replaces BatchNorm modules in place; the parameters (and so the optimizer) are kept
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        device_ids = [self.device] if self.device is not None and self.device.type == "cuda" else None
        self._ddp = DistributedDataParallel(model, device_ids=device_ids)
        return self._ddp

    def _all_reduce(self, value: torch.Tensor, op) -> torch.Tensor:
        if not self.parallel:
            return value
        out = value.clone()
        torch.distributed.all_reduce(out, op=op)
        return out

    def sum(self, value: torch.Tensor) -> torch.Tensor:
        """Sum a per-process tensor over processes (identity in one process)."""
        return self._all_reduce(value, torch.distributed.ReduceOp.SUM)

    def max(self, value: torch.Tensor) -> torch.Tensor:
        """Elementwise maximum over processes (identity in one process)."""
        return self._all_reduce(value, torch.distributed.ReduceOp.MAX)

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """Concatenate a per-process tensor along dim 0, rank order (sizes may differ)."""
        if not self.parallel:
            return tensor
        tdist = torch.distributed
        n = torch.tensor([tensor.shape[0]], device=tensor.device)
        sizes = [torch.zeros_like(n) for _ in range(self.world)]
        tdist.all_gather(sizes, n)
        sizes = [int(s) for s in sizes]  # evaluation only: a host sync is fine here
        padded = tensor.new_zeros((max(sizes),) + tuple(tensor.shape[1:]))
        padded[:tensor.shape[0]] = tensor
        parts = [torch.empty_like(padded) for _ in range(self.world)]
        tdist.all_gather(parts, padded)
        return torch.cat([p[:s] for p, s in zip(parts, sizes)])

    def barrier(self) -> None:
        if self.parallel and torch.distributed.is_initialized():
            torch.distributed.barrier()

    def shutdown(self) -> None:
        """Barrier, drop the DDP module, destroy the group (in that order: gloo aborts otherwise)."""
        if not torch.distributed.is_initialized():
            return
        try:
            torch.distributed.barrier()
        finally:
            self._ddp = None
            gc.collect()
            torch.distributed.destroy_process_group()


_current = Topology()


def current() -> Topology:
    return _current


def set_current(topology: Topology) -> None:
    global _current
    _current = topology


# ---------------------------------------------------------------------------- environment
def from_env(env=None) -> tuple[int, int, int] | None:
    """(rank, world, local_rank) when an outside launcher started several processes, else None."""
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env and int(env["WORLD_SIZE"]) > 1:  # torchrun
        return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0))
    # an srun step with several tasks (not the batch script itself, whose SLURM_NTASKS is the allocation's)
    if int(env.get("SLURM_STEP_NUM_TASKS", "1") or 1) > 1 and "SLURM_PROCID" in env:
        return int(env["SLURM_PROCID"]), int(env["SLURM_STEP_NUM_TASKS"]), int(env.get("SLURM_LOCALID", 0))
    return None


def _slurm_rendezvous(env) -> None:
    """MASTER_ADDR/MASTER_PORT for SLURM tasks: the job's first node and a port from the job id."""
    if "MASTER_ADDR" not in env:
        nodes = env.get("SLURM_STEP_NODELIST", env.get("SLURM_JOB_NODELIST", ""))
        try:
            first = subprocess.run(["scontrol", "show", "hostnames", nodes], capture_output=True,
                                   text=True, check=True).stdout.split()[0]
        except (OSError, subprocess.CalledProcessError, IndexError):
            first = "127.0.0.1"
        env["MASTER_ADDR"] = first
    if "MASTER_PORT" not in env:
        env["MASTER_PORT"] = str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000)


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def pick_device(name: str, local_rank: int) -> torch.device:
    """The device of one data-parallel process: cuda:<local rank> or the CPU."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    require(torch.cuda.is_available(), f"trainer.device={name} but CUDA is not available here; "
                                       "use trainer.device=cpu or auto")
    return torch.device("cuda", local_rank % torch.cuda.device_count())


def init_from_env(device_name: str) -> Topology:
    """Join the process group an outside launcher (torchrun, srun) set up; returns the topology."""
    rank, world, local = from_env()
    env = os.environ
    if "SLURM_PROCID" in env and "RANK" not in env:
        _slurm_rendezvous(env)
    device = pick_device(device_name, local)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.distributed.init_process_group(backend_for(device), init_method="env://", rank=rank, world_size=world,
                                         timeout=datetime.timedelta(minutes=30))
    topo = Topology(rank, world, device, local)
    set_current(topo)
    return topo


# ---------------------------------------------------------------------------- trainer.devices=N
def check_devices(devices, device_name: str) -> torch.device:
    """Validate trainer.devices against the machine; returns the device type to use."""
    require(isinstance(devices, int) and devices >= 1, f"trainer.devices={devices} must be an integer >= 1")
    if device_name == "auto":
        device_name = "cuda" if torch.cuda.is_available() else "cpu"
    if device_name == "cpu":
        return torch.device("cpu")
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    require(have > 0, f"trainer.device={device_name} but CUDA is not available here; use trainer.device=cpu")
    require(devices <= have, f"trainer.devices={devices} but this machine has {have} GPU(s); "
                             f"use trainer.devices<={have} (or trainer.device=cpu for gloo processes)")
    return torch.device("cuda")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, device_type, port, fn, args, results):
    """One spawned process: join the group, run ``fn(*args)``, report, shut down cleanly."""
    device = torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cpu":  # share the cores: N processes with all threads each oversubscribe
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.distributed.init_process_group(backend_for(device), init_method=f"tcp://127.0.0.1:{port}",
                                         rank=rank, world_size=world, timeout=datetime.timedelta(minutes=30))
    topo = Topology(rank, world, device, rank)
    set_current(topo)
    try:
        out = fn(*args)
        topo.shutdown()
        results.put((rank, "ok", out if rank == 0 else None))
    except BaseException as e:  # reported to the parent, which ends the others
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        kind = "user" if isinstance(e, UserError) else "error"
        if kind == "error":
            msg = f"{type(e).__name__}: {msg}"
            traceback.print_exc(file=sys.stderr)
        results.put((rank, kind, msg))
        sys.stderr.flush()
        os._exit(1)  # skip destroy_process_group: peers may be stuck in a collective


def launch(fn, args: tuple, world: int, device: torch.device, grace_s: float = 10.0, start_method=None):
    """Run ``fn(*args)`` in ``world`` spawned processes, each a rank of one process group.

    Returns rank 0's return value. When a process fails, the others are ended after
    ``grace_s`` seconds and the first failure is raised (a ``UserError`` stays one).
    """
    import multiprocessing as mp
    import time
    # CPU (gloo) processes are forked: seconds faster than importing torch again, and safe because
    # each child resets its thread pool before any work; CUDA cannot survive a fork, so GPUs spawn
    fork_ok = device.type == "cpu" and not torch.cuda.is_initialized()
    ctx = mp.get_context(start_method or ("fork" if fork_ok else "spawn"))
    results = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, device.type, port, fn, args, results), daemon=False)
             for r in range(world)]
    for p in procs:
        p.start()
    reports, failed_at = {}, None
    try:
        while len(reports) < world:
            while not results.empty():
                rank, kind, value = results.get()
                reports[rank] = (kind, value)
                if kind != "ok" and failed_at is None:
                    failed_at = time.monotonic()
            dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in reports]
            if dead and failed_at is None:
                failed_at = time.monotonic()
                for r in dead:
                    reports.setdefault(r, ("error", f"process {r} died (exit code {procs[r].exitcode})"))
            if failed_at is not None and time.monotonic() - failed_at > grace_s:
                break
            if all(p.exitcode is not None for p in procs) and results.empty():
                for r, p in enumerate(procs):
                    reports.setdefault(r, ("error", f"process {r} exited ({p.exitcode}) without a result"))
                break
            time.sleep(0.02)
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
    failures = sorted((r, kind, v) for r, (kind, v) in reports.items() if kind != "ok")
    if failures:
        # a user error on any rank beats "peer died" noise from the others
        rank, kind, msg = next((f for f in failures if f[1] == "user"), failures[0])
        if kind == "user":
            raise UserError(msg)
        raise RuntimeError(f"data-parallel process {rank} failed: {msg}")
    return reports[0][1]
