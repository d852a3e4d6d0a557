"""FSDP units (``trainer.fsdp_unit_mb``): consecutive blocks sharded together until a unit holds
that many MB, the rest left to the root; the step is the same whatever the units (2 real gloo
processes on the CPU)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import compose

from sam_runner import distributed
from sam_runner.errors import UserError
from sam_runner.models import GPT, blocks_of
from sam_runner.optim import SAM
from sam_runner.training import strategy

CPU = torch.device("cpu")


def _gpt():
    torch.manual_seed(0)
    return GPT(32, 8, n_layer=4, n_head=2, n_embd=16)


def _block_bytes(model) -> int:
    return sum(p.numel() * p.element_size() for p in blocks_of(model)[0].parameters())


def test_units_group_consecutive_blocks_until_the_size_and_leave_the_rest_to_the_root():
    blocks = blocks_of(_gpt())
    one = _block_bytes(_gpt())
    assert strategy.units(blocks, 0) == [[b] for b in blocks]  # one unit per block
    assert strategy.units(blocks, 2 * one) == [blocks[:2], blocks[2:]]
    assert strategy.units(blocks, 3 * one) == [blocks[:3]]  # the fourth: the root's
    assert strategy.units(blocks, 5 * one) == []  # a model under the size: one unit, the root


def _units_probe(unit_blocks: list[int]) -> dict:
    """Per unit size (in blocks' bytes): the FSDP states of the blocks (as indices of distinct
    states, -1: the root's), whether the parameters after two SAM steps equal those of the first
    size's bit for bit, and how far the steps moved them."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    topo = distributed.current()
    out = {}
    for n in unit_blocks:
        model = _gpt()
        strategy.shard(model, blocks_of(model), topo, unit_bytes=n * _block_bytes(model))
        # a block of a unit is an FSDPModule with the unit's state; one left to the root is not
        states = [
            fully_shard.state(b) if isinstance(b, FSDPModule) else None for b in blocks_of(model)
        ]
        distinct = list(dict.fromkeys(id(s) for s in states if s is not None))
        layout = [-1 if s is None else distinct.index(id(s)) for s in states]
        opt = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.1, momentum=0.9,
                  sync_perturbation=True).bind(model=model)  # fmt: skip
        g = torch.Generator().manual_seed(topo.rank)
        for _ in range(2):
            x, y = torch.randint(0, 32, (2, 4, 8), generator=g)

            def closure(x=x, y=y):
                opt.zero_grad(set_to_none=True)
                loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
                loss.backward()
                return loss.detach()

            opt.step(closure)
        params = [p.full_tensor().detach() for p in model.parameters()]
        first = out[unit_blocks[0]]["params"] if out else params
        same = all(torch.equal(a, b) for a, b in zip(params, first))
        moved = max(float((a - b).abs().max()) for a, b in zip(params, _gpt().parameters()))
        out[n] = {"layout": layout, "params": params, "same": same, "moved": moved}
    return {n: {k: v for k, v in r.items() if k != "params"} for n, r in out.items()}


def test_a_step_is_the_same_bit_for_bit_whatever_the_units():
    out = distributed.launch(_units_probe, ([0, 2, 5],), 2, CPU)
    assert out[0]["layout"] == [0, 1, 2, 3]  # each block its own unit
    assert out[2]["layout"] == [0, 0, 1, 1]  # two units of two blocks
    assert out[5]["layout"] == [-1, -1, -1, -1]  # all in the root's unit
    # 2 processes: each reduction adds the same two numbers, whatever the buffers they travel in
    assert out[2]["same"] and out[5]["same"]
    assert out[0]["moved"] > 1e-3  # the steps did something


@pytest.mark.parametrize("bad", ["-1", "abc", "true"])
def test_a_bad_unit_size_is_one_line(bad):
    cfg = compose("trainer.strategy=fsdp", "trainer.devices=2", f"trainer.fsdp_unit_mb={bad}")
    with pytest.raises(UserError, match="trainer.fsdp_unit_mb=") as e:
        strategy.check(cfg, world=2)
    assert "\n" not in str(e.value) and ">= 0" in str(e.value)


def test_the_unit_size_leaves_the_run_folder_name_alone():
    from sam_runner.settings import run_only

    assert run_only("trainer.fsdp_unit_mb")
    assert copy.copy(compose()).trainer.fsdp_unit_mb == 25
