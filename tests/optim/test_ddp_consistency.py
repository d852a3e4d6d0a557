"""Under real DDP (gloo, 2 processes, per-process perturbations): every variant whose update
uses per-process quantities (CSAM's weights, GSAM's g, SAM-SPS's step, TLC-SAM's τ) keeps
the processes' parameters identical."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

NAMES = ["csam", "gsam", "sam_sps", "tlc_sam", "eisam"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from sam_runner.optim import VARIANTS

    try:
        g = torch.Generator().manual_seed(100 + rank)  # each process its own data
        x, y = torch.randn(16, 6, generator=g), torch.randint(0, 3, (16,), generator=g)
        result = {}
        for name in NAMES:
            torch.manual_seed(0)
            model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))
            net = nn.parallel.DistributedDataParallel(model)
            opt = VARIANTS[name](model.parameters(), torch.optim.SGD, lr=0.1).bind(model=net)

            def closure():
                opt.zero_grad(set_to_none=True)
                out = net(x)
                loss = opt.reduce_loss(F.cross_entropy(out, y, reduction="none"), out, y)
                loss.backward()
                return loss.detach()

            for _ in range(3):
                opt.step(closure)
            result[name] = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        out[rank] = result
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # CI's time (~19 s; DDP equality stays in scale/test_distributed)
def test_processes_stay_identical_under_ddp():
    out = mp.Manager().dict()
    mp.spawn(_worker, args=(_free_port(), out), nprocs=2, join=True)
    for name in NAMES:
        assert torch.equal(out[0][name], out[1][name]), name
