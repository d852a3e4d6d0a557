"""Process topology for data-parallel training.

One process by default. Three ways to get several:

* ``trainer.devices=N``: ``launch`` starts N worker processes itself (spawned, one
  per GPU with NCCL; or N CPU processes with gloo on 127.0.0.1 and a free port, each
  with its share of the CPU threads, forked by a forkserver);
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
epoch are sums over all processes divided by the global count; SyncBatchNorm is
CUDA-only in PyTorch, so ``trainer.sync_batchnorm=true`` on the CPU is refused.

How ``launch`` starts and ends its processes (ours):

* CPU processes come from a forkserver that has imported torch and ``sam_runner.train``
  once (the first launch of a process pays that import, later ones fork in a fraction of
  a second). Not a plain fork: a process that already ran OpenMP work (a job trained in
  this process) forks children whose OpenMP pool hangs. Each process gets the launching
  process's environment as it is at launch time. As with any spawn-like start, ``fn``
  and ``args`` must be picklable and a script that calls ``launch`` needs an
  ``if __name__ == "__main__":`` guard.
* The processes die with the launching one: a watchdog thread ends a process when the
  launcher goes away (even after SIGKILL), and a SIGTERM to the launcher (where nobody
  else handles SIGTERM) ends its processes before it exits. SIGTERM is the default
  action in the processes and SIGUSR2 (submitit's requeue signal) is ignored there: the
  launching process alone requeues.
* A failure is reported by its earliest occurrence in time (a ``UserError`` on any
  process first): a process that fails makes its peers fail too ("Connection reset by
  peer"), and that noise comes later.
"""

from __future__ import annotations

import datetime
import gc
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field

import torch

from .errors import UserError, integer, one_line, require


@dataclass
class Topology:
    rank: int = 0
    world: int = 1
    device: torch.device | None = None  # set by the launcher of a data-parallel run
    local_rank: int = 0
    sharded: bool = False  # trainer.strategy=fsdp: the model's parameters are sharded (FSDP2)
    unsharded: object = field(default=None, repr=False)  # fsdp: the model's structure (meta)
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
            require(
                self.device is not None and self.device.type == "cuda",
                "trainer.sync_batchnorm=true needs GPUs (PyTorch's SyncBatchNorm is CUDA-only); "
                "use trainer.sync_batchnorm=false on the CPU",
            )
            # replaces BatchNorm modules in place; the parameters (and so the optimizer) are kept
            model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        device_ids = (
            [self.device] if self.device is not None and self.device.type == "cuda" else None
        )
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
        padded[: tensor.shape[0]] = tensor
        parts = [torch.empty_like(padded) for _ in range(self.world)]
        tdist.all_gather(parts, padded)
        return torch.cat([p[:s] for p, s in zip(parts, sizes)])

    def barrier(self) -> None:
        if self.parallel and torch.distributed.is_initialized():
            torch.distributed.barrier()

    def shutdown(self) -> None:
        """Barrier, drop the DDP module, destroy the group (in that order: gloo aborts
        otherwise)."""
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
    # an srun step with several tasks (not the batch script itself, whose SLURM_NTASKS is the
    # allocation's)
    if int(env.get("SLURM_STEP_NUM_TASKS", "1") or 1) > 1 and "SLURM_PROCID" in env:
        return (
            int(env["SLURM_PROCID"]),
            int(env["SLURM_STEP_NUM_TASKS"]),
            int(env.get("SLURM_LOCALID", 0)),
        )
    return None


def _slurm_rendezvous(env) -> None:
    """MASTER_ADDR/MASTER_PORT for SLURM tasks: the job's first node and a port from the job id."""
    if "MASTER_ADDR" not in env:
        nodes = env.get("SLURM_STEP_NODELIST", env.get("SLURM_JOB_NODELIST", ""))
        try:
            first = subprocess.run(
                ["scontrol", "show", "hostnames", nodes], capture_output=True, text=True, check=True
            ).stdout.split()[0]
        except (OSError, subprocess.CalledProcessError, IndexError):
            first = "127.0.0.1"
        env["MASTER_ADDR"] = first
    if "MASTER_PORT" not in env:
        env["MASTER_PORT"] = str(20000 + int(env.get("SLURM_JOB_ID", "0")) % 20000)


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """The device ``trainer.device`` names for one process: ``auto`` is CUDA when there is a GPU,
    ``cuda`` is the process's GPU (``cuda:<local rank>``), ``cuda:N`` that GPU; one-line errors."""
    from .cli_words import check_device

    name = check_device(name)
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    require(
        torch.cuda.is_available(),
        f"trainer.device={name} but CUDA is not available here; use trainer.device=cpu or auto",
    )
    return (
        torch.device(name)
        if ":" in name
        else torch.device("cuda", local_rank % torch.cuda.device_count())
    )


def join_group(rank: int, world: int, device, local_rank: int, init_method: str) -> Topology:
    """Join the process group (NCCL on GPUs, gloo on CPUs); this process's topology is current."""
    torch.distributed.init_process_group(
        backend_for(device),
        init_method=init_method,
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(minutes=30),
    )
    topo = Topology(rank, world, device, local_rank)
    set_current(topo)
    return topo


def init_from_env(device_name: str) -> Topology:
    """Join the process group an outside launcher (torchrun, srun) set up; returns the topology."""
    rank, world, local = from_env()
    env = os.environ
    if "SLURM_PROCID" in env and "RANK" not in env:
        _slurm_rendezvous(env)
    device = resolve_device(device_name, local)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return join_group(rank, world, device, local, "env://")


# ---------------------------------------------------------------------------- trainer.devices=N
def check_devices(devices, device_name: str) -> torch.device:
    """Validate trainer.devices against the machine; returns the device type to use."""
    require(
        isinstance(devices, int) and not isinstance(devices, bool) and devices >= 1,
        f"trainer.devices={devices!r} must be an integer >= 1",
    )
    device = resolve_device(device_name)
    if device.type == "cuda":
        have = torch.cuda.device_count()
        require(
            devices <= have,
            f"trainer.devices={devices} but this machine has {have} GPU(s); use "
            f"trainer.devices<={have} (or trainer.device=cpu for gloo processes)",
        )
    return torch.device(device.type)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# modules the forkserver imports once, so that each forked process starts in a fraction of a second
FORKSERVER_PRELOAD = ("torch", "sam_runner.train")


def allowed_cpus() -> tuple[int, str]:
    """(the CPUs this process may use, where that number comes from): its affinity (cgroups,
    taskset, SLURM's binding), no more than ``SLURM_CPUS_PER_TASK`` or ``OMP_NUM_THREADS``
    where set (a
    task allocated 4 CPUs of a 64-core node that does not bind them must not start 64
    threads)."""
    try:
        cpus, source = len(os.sched_getaffinity(0)), "CPU affinity"
    except (AttributeError, OSError):  # not on Linux
        cpus, source = os.cpu_count() or 1, "CPU count"
    # SLURM's allocation, and a user's own OMP_NUM_THREADS, cap it
    for var in ("SLURM_CPUS_PER_TASK", "OMP_NUM_THREADS"):
        value = os.environ.get(var, "")
        if value.isdigit() and 0 < int(value) < cpus:
            cpus, source = int(value), var
    return cpus, source


def check_threads(threads) -> None:
    """``trainer.threads``: null (the rule of ``cpu_threads``) or an integer >= 1."""
    if threads is not None:
        integer(
            "trainer.threads",
            threads,
            "null (from the allowed CPUs) or an integer >= 1",
            lambda n: n >= 1,
        )


def cpu_threads(world: int, threads=None) -> int:
    """Threads per process: this process's allowed CPUs shared by ``world`` processes
    (``trainer.devices``, ``eval.workers``); ``threads`` (``trainer.threads``) where set, capped
    there (more threads than cores share them, which is slower: ``validate.warnings`` says so)."""
    share = max(1, allowed_cpus()[0] // world)
    return min(int(threads), share) if threads is not None else share


def set_cpu_threads(world: int, threads=None) -> int:
    """torch's intra-op threads set by ``cpu_threads``: one rule for training, a curvature
    subset of one batch or many, and evaluation; returns them."""
    n = cpu_threads(world, threads)
    torch.set_num_threads(n)
    return n


def threads_note(n: int, world: int, threads=None) -> str:
    """The line that says the threads chosen, and why."""
    cpus, source = allowed_cpus()
    why = "trainer.threads" if threads is not None else f"{cpus} CPU(s) by {source}"
    return f"{n} CPU thread(s) per process ({why}, {world} process(es))"


def _die_with_parent(parent_alive) -> None:
    """End this process when the launching one ends, however it ends (SIGKILL included).

    ``parent_alive`` is the read end of a pipe whose write end only the launcher holds: it
    reads EOF when the launcher exits. On Linux PR_SET_PDEATHSIG also kills a process whose
    own parent dies (a spawned process's parent is the launcher; a forkserver's process's
    parent is the forkserver, which exits with the launcher)."""
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if parent_alive is None:
        return

    def watch():
        try:
            parent_alive.poll(None)  # returns at EOF: the launcher is gone
        except OSError:
            pass
        os._exit(1)

    threading.Thread(target=watch, name="parent-watchdog", daemon=True).start()


def _worker(rank, world, device_type, port, fn, args, results, env=None, parent_alive=None):
    """One started process: join the group, run ``fn(*args)``, report, shut down cleanly."""
    _die_with_parent(parent_alive)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # submitit's requeue signal: the launching process acts on it alone
    if hasattr(signal, "SIGUSR2"):
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    if env is not None:  # the launcher's environment now, not the forkserver's when it started
        os.environ.clear()
        os.environ.update(env)
    device = torch.device("cuda", rank) if device_type == "cuda" else torch.device("cpu")
    if device.type == "cpu":  # share the cores: N processes with all threads each oversubscribe
        torch.set_num_threads(cpu_threads(world))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    topo = join_group(rank, world, device, rank, f"tcp://127.0.0.1:{port}")
    try:
        out = fn(*args)
        topo.shutdown()
        results.put((rank, "ok", out if rank == 0 else None, time.time()))
    except BaseException as e:  # reported to the parent, which ends the others
        failed_at = time.time()  # the earliest failure is the cause; later ones are its echo
        kind = "user" if isinstance(e, UserError) else "error"
        msg = one_line(e)
        if kind == "error":
            traceback.print_exc(file=sys.stderr)
        results.put((rank, kind, msg, failed_at))
        sys.stderr.flush()
        os._exit(1)  # skip destroy_process_group: peers may be stuck in a collective


def _context(device: torch.device, start_method=None):
    import multiprocessing as mp

    if start_method is None:
        # a forkserver for CPU processes (see the module docstring); CUDA cannot be forked: spawn
        start_method = (
            "forkserver"
            if device.type == "cpu" and "forkserver" in mp.get_all_start_methods()
            else "spawn"
        )
    ctx = mp.get_context(start_method)
    if start_method == "forkserver":
        ctx.set_forkserver_preload(list(FORKSERVER_PRELOAD))
    return ctx


class _Terminated(BaseException):
    """SIGTERM reached the launching process."""


def _on_sigterm(_signum, _frame):
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the launcher at once
    raise _Terminated()


def launch(
    fn, args: tuple, world: int, device: torch.device, grace_s: float = 10.0, start_method=None
):
    """Run ``fn(*args)`` in ``world`` started processes, each a rank of one process group.

    Returns rank 0's return value. When a process fails, the others are ended after
    ``grace_s`` seconds and the earliest failure is raised (a ``UserError`` on any process
    first, and it stays one). A SIGTERM to this process ends the processes, then this one.
    """
    ctx = _context(device, start_method)
    results = ctx.SimpleQueue()
    port = free_port()
    # the watchdog's pipe: a forked child would inherit the write end too, so fork relies on
    # PDEATHSIG
    parent_alive, alive = (
        ctx.Pipe(duplex=False) if ctx.get_start_method() != "fork" else (None, None)
    )
    procs = [
        ctx.Process(
            target=_worker,
            daemon=False,
            args=(r, world, device.type, port, fn, args, results, dict(os.environ), parent_alive),
        )
        for r in range(world)
    ]
    # leave a handler someone else set (submitit's)
    on_term = (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    )
    if on_term:
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        for p in procs:
            p.start()
        reports = _collect(procs, results, world, grace_s)
    except _Terminated:
        _end(procs)
        # the default action now: exit as a SIGTERM'd process does
        os.kill(os.getpid(), signal.SIGTERM)
        raise
    finally:
        _end(procs)
        if on_term and signal.getsignal(signal.SIGTERM) is _on_sigterm:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        for end in (parent_alive, alive):
            if end is not None:
                end.close()
    failures = [(t, r, kind, v) for r, (kind, v, t) in reports.items() if kind != "ok"]
    if failures:
        # a user error on any rank beats the others; else the earliest: later ones are its echo
        # ("Connection reset by peer" of the processes it left in a collective)
        _, rank, kind, msg = min(failures, key=lambda f: (f[2] != "user", f[0], f[1]))
        if kind == "user":
            raise UserError(msg)
        raise RuntimeError(f"data-parallel process {rank} failed: {msg}")
    return reports[0][1]


def _collect(procs, results, world: int, grace_s: float) -> dict:
    """{rank: (kind, value, time)} of every process, or of those that reported within ``grace_s``
    seconds of the first failure. A process that died without a report is timed at the last
    poll that saw it alive: before its death, so before the errors of the peers it left."""
    reports, failed_at, seen_alive_at = {}, None, time.time()
    while len(reports) < world:
        while not results.empty():
            rank, kind, value, at = results.get()
            reports[rank] = (kind, value, at)
            if kind != "ok" and failed_at is None:
                failed_at = time.monotonic()
        now = time.time()
        dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in reports]
        if not results.empty():  # a report may be on its way from a process that just exited
            continue
        for r in dead:
            reports[r] = (
                "error",
                f"process {r} died ({_exit_reason(procs[r].exitcode)})",
                seen_alive_at,
            )
            failed_at = failed_at or time.monotonic()
        seen_alive_at = now
        if failed_at is not None and time.monotonic() - failed_at > grace_s:
            break
        if all(p.exitcode is not None for p in procs) and results.empty():
            for r, p in enumerate(procs):
                reports.setdefault(
                    r,
                    (
                        "error",
                        f"process {r} exited ({_exit_reason(p.exitcode)}) without a result",
                        time.time(),
                    ),
                )
            break
        time.sleep(0.02)
    return reports


def _exit_reason(code) -> str:
    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            pass
    return f"exit code {code}"


def _end(procs) -> None:
    """Terminate the processes still running; kill those that do not end within 5 s."""
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        if p.pid is None:  # never started
            continue
        p.join(5)
        if p.is_alive():
            p.kill()
            p.join()
