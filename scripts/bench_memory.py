"""Bench section: peak memory (python scripts/bench.py --only memory). Each figure is the peak
memory a piece of work adds, over a reference size, measured in a fresh process per sample
(median of the samples): on CUDA the peak allocated by torch, on a CPU the peak resident set
(the kernel's high-water mark, reset just before the work; /proc/self/clear_refs) of a process
whose allocator gives freed blocks back at once (MALLOC_MMAP_THRESHOLD_=65536: live memory, as
CUDA's allocator counts it, not what glibc keeps for reuse).

lanczos_peak_memory_over_params  a 100-step Lanczos run for λ_max (tol 1e-5, so that it does
                             not stop: the float32 basis of the default tolerance) on a
                             2,000,000-dimensional operator that allocates only its result (a
                             diagonal Hessian with a uniform spectrum, so that the figure is the
                             solver's own storage), over the bytes of 2,000,000 float32
                             parameters
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _status_bytes(key: str) -> int:
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{key}:\s+(\d+) kB", text).group(1)) * 1024


def peak_added(fn) -> int:
    """Bytes of memory ``fn()`` adds at its peak, over what was held before it."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return torch.cuda.max_memory_allocated() - before
    Path("/proc/self/clear_refs").write_text("5")  # the high-water mark back to the current set
    before = _status_bytes("VmRSS")
    fn()
    return _status_bytes("VmHWM") - before


def _lanczos_child() -> dict:
    from sam_runner.metrics.solvers import lanczos

    n = 2_000_000
    device = "cuda" if torch.cuda.is_available() else "cpu"
    spectrum = torch.linspace(0.0, 1.0, n, device=device)

    def matvec(v):
        return spectrum * v

    g = torch.Generator().manual_seed(0)
    steps = {}

    def run():
        steps["hvps"] = lanczos(matvec, n, 1, 1e-5, 100, generator=g, device=device).hvps

    added = peak_added(run)
    return {"ratio": added / (4 * n), "hvps": steps["hvps"]}


CHILDREN = {"lanczos": _lanczos_child}


def _in_child(name: str) -> dict:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run(
        [sys.executable, __file__, name], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def median_child(name: str, repeats: int) -> dict:
    samples = [_in_child(name) for _ in range(repeats)]
    return {k: statistics.median(s[k] for s in samples) for k in samples[0]}


def run(args) -> dict:
    repeats = 1 if args.quick else min(args.repeats, 3)
    lz = median_child("lanczos", repeats)
    return {"lanczos_peak_memory_over_params": lz["ratio"], "lanczos_bench_hvps": lz["hvps"]}


if __name__ == "__main__":
    torch.set_num_threads(1)
    print(json.dumps(CHILDREN[sys.argv[1]]()))
