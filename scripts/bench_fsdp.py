"""Sharded training and curvature across processes (CPU, gloo, 2 processes; ratios):

- ``fsdp_over_ddp_step``: a SAM step of a GPT (4 blocks, 128 wide, context 64) under
  ``trainer.strategy=fsdp`` (its units as ``trainer.fsdp_unit_mb``'s default makes them: the
  0.9M-parameter model is one unit) over the same step under ``ddp`` (target <= 1.3);
  ``fsdp_per_block_over_ddp_step``: the same with one unit per block (``fsdp_unit_mb=0``: 4
  blocks and the root, 9 all-gathers and 5 reduce-scatters a pass, what a model whose blocks
  each hold 25 MB or more pays);
- ``fsdp_over_ddp_state_memory``: the bytes one process holds between steps for the parameters,
  their gradients, the optimizer's state and SAM's saved θ, fsdp over ddp (target <= 0.6 with 2
  processes; the transient all-gathered block of a pass is not counted);
- ``fsdp_accumulate4_paused_over_synced``: the fsdp SAM step (one unit per block) over 4
  micro-batches with the gradient synchronisation paused on all but the last (one
  reduce-scatter a pass, as training does) over the same step reduce-scattering every
  micro-batch (below 1: the saving);
- ``lanczos_2proc_speedup``: seconds of one λ_max measurement (the same Lanczos iterations) in
  one process over the same measurement split between two (target >= 1.6); each process has
  the thread share the launcher gives it (one process alone: the same share);
  ``lanczos_2proc_cpu_share``: rank 0's CPU seconds over the one process's (0.5: the work split
  evenly).

    python scripts/bench.py --only fsdp [--quick]
    python scripts/bench_fsdp.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CPU = torch.device("cpu")
ACCUMULATE = 4  # micro-batches a pass in the accumulation figures (2 sequences each)


def _gpt():
    from sam_runner.models import GPT

    torch.manual_seed(0)
    return GPT(256, 64, n_layer=4, n_head=4, n_embd=128)


def _held_bytes(opt, model) -> int:
    """Bytes of this process's parameters, gradients, optimizer state and SAM buffers (local
    shards under fsdp)."""

    def local(t):
        return t.to_local() if hasattr(t, "to_local") else t

    tensors = [local(p) for p in model.parameters()]
    tensors += [local(p.grad) for p in model.parameters() if p.grad is not None]
    for state in opt.base_optimizer.state.values():
        tensors += [local(v) for v in state.values() if torch.is_tensor(v)]
    tensors += [t for k in ("theta", "eps") for t in opt._cache.get(k, [])]
    return sum(t.numel() * t.element_size() for t in tensors)


def default_unit_bytes() -> float:
    """``trainer.fsdp_unit_mb``'s default, in bytes."""
    from omegaconf import OmegaConf

    trainer = OmegaConf.load(Path(__file__).resolve().parents[1] / "conf/trainer/default.yaml")
    return float(trainer.fsdp_unit_mb) * 2**20


def _step_probe(
    strategy_name: str, steps: int, accumulate: int = 1, paused: bool = True, unit_bytes=None
):
    """(median seconds of a SAM step, held bytes, peak bytes on a GPU else None) of the GPT in
    this process of 2; each pass over ``accumulate`` micro-batches, the gradient synchronisation
    ``paused`` on all but the last (as the training loop does) or not; fsdp's units of
    ``unit_bytes`` (None: the default's)."""
    from sam_runner import distributed
    from sam_runner.models import blocks_of
    from sam_runner.module_state import gradient_sync_paused
    from sam_runner.optim import SAM
    from sam_runner.training import strategy

    topo = distributed.current()
    device = topo.device or CPU
    model = _gpt().to(device)
    if strategy_name == "fsdp":
        unit_bytes = default_unit_bytes() if unit_bytes is None else unit_bytes
        strategy.shard(model, blocks_of(model), topo, unit_bytes=unit_bytes)
        net = model
    else:
        from omegaconf import OmegaConf

        net = topo.wrap(model, OmegaConf.create({"trainer": {"sync_batchnorm": False}}))
    opt = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.01, momentum=0.9,
              sync_perturbation=True).bind(model=net)  # fmt: skip
    g = torch.Generator().manual_seed(topo.rank)
    x = torch.randint(0, 256, (8, 64), generator=g).to(device)
    y = torch.randint(0, 256, (8, 64), generator=g).to(device)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)

    def closure():
        opt.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)
        for i, (xm, ym) in enumerate(zip(x.tensor_split(accumulate), y.tensor_split(accumulate))):
            quiet = paused and opt.pass_syncs and i < accumulate - 1
            with gradient_sync_paused(net) if quiet else contextlib.nullcontext():
                loss = F.cross_entropy(net(xm).flatten(0, 1), ym.flatten()) / accumulate
                loss.backward()
            total += loss.detach()
        return total

    times = []
    for i in range(steps + 2):  # two warm-up steps
        t0 = time.perf_counter()
        opt.step(closure)
        if cuda:
            torch.cuda.synchronize(device)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated(device) if cuda else None
    return statistics.median(times), _held_bytes(opt, model), peak


def _lanczos_probe(split: bool, iterations: int, device=None) -> tuple[float, float]:
    """(wall, CPU) seconds of a λ_max measurement of fixed length (no early stop) on 2048
    samples, in this process."""
    from sam_runner import distributed
    from sam_runner.metrics.hvp import HessianOperator
    from sam_runner.metrics.solvers import hessian_eigenpairs
    from sam_runner.models import SmallCNN

    device = distributed.current().device or device or CPU
    torch.manual_seed(0)
    model = SmallCNN(2, 1, 10, channels=16).to(device)
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(2048, 1, 16, 16, generator=g), torch.randint(0, 10, (2048,), generator=g)
    x, y = x.to(device), y.to(device)
    batches = [(x[i : i + 256], y[i : i + 256]) for i in range(0, 2048, 256)]
    model.eval()
    dist = distributed.current() if split else None

    def measure(batches, iterations):
        with HessianOperator(model, F.cross_entropy, batches, "double_backward", dist=dist) as op:
            hessian_eigenpairs(model, None, batches, tol=1e-12, max_iter=iterations, operator=op)

    # a warm-up on 8 samples: the first calls' costs (kernel setup) out of both arms alike, a
    # started process being as warm as the launcher that already measured
    measure([(x[:8], y[:8])], 2)
    t0, c0 = time.perf_counter(), time.process_time()
    measure(batches, iterations)
    return time.perf_counter() - t0, time.process_time() - c0


def _alone(fn, *args):
    """``fn(*args)`` in this process with the thread share one of 2 launched processes has."""
    from sam_runner import distributed

    threads = torch.get_num_threads()
    torch.set_num_threads(distributed.cpu_threads(2))
    try:
        return fn(*args)
    finally:
        torch.set_num_threads(threads)


def run(args, device=CPU) -> dict:
    """The figures with 2 processes on ``device`` (the CPU, gloo; or 2 GPUs, NCCL: then also
    ``fsdp_over_ddp_peak_memory``, the peak of allocated GPU memory over a step with one unit
    per block: a model that needs sharding; the default's one unit gathers this small model
    whole in each pass)."""
    from sam_runner import distributed

    repeats = 1 if args.quick else 3
    steps, iterations = (3, 10) if args.quick else (8, 30)
    ddp, fsdp, per_block, ones, twos, paused, synced = [], [], [], [], [], [], []
    for _ in range(repeats):  # alternated, so that load on the machine hits both alike
        ddp.append(distributed.launch(_step_probe, ("ddp", steps), 2, device))
        fsdp.append(distributed.launch(_step_probe, ("fsdp", steps), 2, device))
        per_block.append(distributed.launch(_step_probe, ("fsdp", steps, 1, True, 0), 2, device))
        args_4 = ("fsdp", steps, ACCUMULATE, True, 0)  # the blocks' own units, as a large model
        paused.append(distributed.launch(_step_probe, args_4, 2, device)[0])
        synced.append(distributed.launch(_step_probe, (*args_4[:3], False, 0), 2, device)[0])
        twos.append(distributed.launch(_lanczos_probe, (True, iterations), 2, device))
        ones.append(_alone(_lanczos_probe, False, iterations, device))
    gpu = fsdp[0][2] is not None
    peak = {"fsdp_over_ddp_peak_memory": per_block[0][2] / ddp[0][2]} if gpu else {}
    return {
        **peak,
        "ddp_gpt_sam_step_s": statistics.median(d[0] for d in ddp),
        "fsdp_gpt_sam_step_s": statistics.median(f[0] for f in fsdp),
        "fsdp_over_ddp_step": statistics.median(f[0] / d[0] for f, d in zip(fsdp, ddp)),
        "fsdp_per_block_over_ddp_step": statistics.median(
            f[0] / d[0] for f, d in zip(per_block, ddp)
        ),
        "fsdp_over_ddp_state_memory": fsdp[0][1] / ddp[0][1],
        "fsdp_accumulate4_paused_s": statistics.median(paused),
        "fsdp_accumulate4_synced_s": statistics.median(synced),
        "fsdp_accumulate4_paused_over_synced": statistics.median(
            p / s for p, s in zip(paused, synced)
        ),
        "lanczos_1proc_s": statistics.median(o[0] for o in ones),
        "lanczos_2proc_s": statistics.median(t[0] for t in twos),
        "lanczos_2proc_speedup": statistics.median(o[0] / t[0] for o, t in zip(ones, twos)),
        # the work each process does (its CPU seconds), two over one: 0.5 is a perfect split; on
        # a machine whose cores are busy with other jobs the wall-clock speedup cannot show it
        "lanczos_2proc_cpu_share": statistics.median(t[1] / o[1] for o, t in zip(ones, twos)),
    }


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true")
    for k, v in run(ap.parse_args()).items():
        print(f"{k:<28} {v:.4g}")
