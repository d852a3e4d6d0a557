"""Two data-parallel processes sharing one GPU train as one process does at the same global
batch: DDP on CUDA, the evaluation's gather, the divergence check's all-reduce. NCCL refuses
two ranks on one device in most versions; where it does, that case skips with NCCL's words,
and gloo (which takes CUDA tensors) runs the same test."""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import queue

import pytest
import torch
from conftest import compose

from sam_runner import distributed
from sam_runner.train import train

pytestmark = pytest.mark.cuda

TIMEOUT_S = 300


def _join(backend: str, port: int, rank: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    torch.distributed.init_process_group(backend, rank=rank, world_size=2)
    distributed.set_current(distributed.Topology(rank, 2, device, 0))


def _all_reduce(rank, backend, port, results):
    try:
        _join(backend, port, rank)
        t = torch.full((4,), rank + 1.0, device="cuda")
        torch.distributed.all_reduce(t)
        torch.cuda.synchronize()
        results.put((rank, "ok" if t.tolist() == [3.0] * 4 else f"wrong sum {t.tolist()}"))
        torch.distributed.destroy_process_group()
    except Exception as e:
        results.put((rank, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"))


def _train(rank, backend, port, results, cfg, run_dir):
    try:
        _join(backend, port, rank)
        summary = train(cfg, run_dir, ["x"])
        distributed.current().shutdown()
        results.put((rank, summary["status"]))
    except Exception as e:
        results.put((rank, f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"))


def _two_processes(fn, *args, timeout=TIMEOUT_S) -> dict:
    """Rank -> what ``fn`` reported, from 2 spawned processes (ended after ``timeout`` s)."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = distributed.free_port()
    procs = [ctx.Process(target=fn, args=(r, args[0], port, results, *args[1:])) for r in (0, 1)]
    for p in procs:
        p.start()
    out = {}
    try:
        while len(out) < 2:
            rank, what = results.get(timeout=timeout)
            out[rank] = what
    except queue.Empty:
        out = {**{0: "no answer", 1: "no answer"}, **out}
    finally:
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    return out


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("backend", ["nccl", "gloo"])
def test_two_processes_on_one_gpu_match_one_process(backend, tmp_path):
    if backend == "nccl":
        probe = _two_processes(_all_reduce, "nccl", timeout=60)  # a refusal, or a hang
        if probe != {0: "ok", 1: "ok"}:
            pytest.skip(f"NCCL with two ranks on one GPU: {probe}")
    cfg = compose(
        "dataset=digits",
        "model=mlp",
        "dataset.batch_size=64",
        "trainer.epochs=2",
        "trainer.device=cuda",
        "trainer.progress=none",
        "metrics.hessian.enabled=false",
        "optimizer.sync_perturbation=true",
    )
    one, two = tmp_path / "one", tmp_path / "two"
    assert train(cfg, one, ["x"])["status"] == "completed"
    assert _two_processes(_train, backend, cfg, str(two)) == {0: "completed", 1: "completed"}
    rows1, rows2 = _rows(one), _rows(two)
    assert [r["epoch"] for r in rows2] == [r["epoch"] for r in rows1] == [1, 2]
    for r1, r2 in zip(rows1, rows2):
        for key in ("step", "train_loss", "train_acc", "test_loss", "test_acc", "test_ece"):
            assert r2[key] == pytest.approx(r1[key], abs=1e-5), key
    m1, m2 = (
        torch.load(d / "checkpoints" / "last.pt", weights_only=True)["model"] for d in (one, two)
    )
    for key, value in m1.items():
        torch.testing.assert_close(m2[key], value, rtol=1e-4, atol=1e-5, msg=key)
