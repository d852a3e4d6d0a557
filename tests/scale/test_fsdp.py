"""Sharded training (trainer.strategy=fsdp, FSDP2 over gloo on the CPU, 2 real processes),
activation checkpointing, and curvature split across processes."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import compose

from sam_runner import distributed
from sam_runner.errors import UserError
from sam_runner.models import MLP, blocks_of
from sam_runner.optim.build import build_optimizer
from sam_runner.registry import VARIANTS
from sam_runner.training import strategy

CPU = torch.device("cpu")
STEPS = 3
# float32 sums over two shards and over the whole batch round differently in the last bits;
# three steps carry that to ~1e-7 here
TOLERANCE = 1e-5

# the base optimizers and engine options checked with SAM beside the registry's variants
EXTRA = {
    "sam+adamw": ["optimizer=sam", "base_optimizer=adamw"],
    "sam+lion": ["optimizer=sam", "base_optimizer=lion"],
    "sam+clip": ["optimizer=sam", "trainer.gradient_clip=0.05"],
    "sam+adaptive": ["optimizer=sam", "optimizer.perturb_schedule=adaptive"],
    "sam+rho_cosine": ["optimizer=sam", "optimizer.rho_schedule=cosine"],
    "sam+weight_decay": [
        "optimizer=sam",
        "optimizer.perturb_with_weight_decay=true",
        "base_optimizer.weight_decay=0.01",
    ],
    "sam+muon": ["optimizer=sam", "base_optimizer=muon"],
}


def cases() -> dict:
    out = {e.name: [f"optimizer={e.name}"] for e in VARIANTS.entries()}
    return {**out, **EXTRA}


def _fsdp_cfg(overrides):
    return compose(*overrides, "trainer.strategy=fsdp", "trainer.devices=2", "trainer.device=cpu")


def _batch(step: int):
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(16, 8, generator=g), torch.randint(0, 3, (16,), generator=g)


def _closure(opt, net, x, y):
    def closure():
        opt.zero_grad(set_to_none=True)
        out = net(x)
        loss = opt.reduce_loss(F.cross_entropy(out, y, reduction="none"), out, y)
        loss.backward()
        return loss.detach()

    return closure


def _optimizer(cfg, model):
    opt = build_optimizer(cfg, model, STEPS, STEPS)
    if getattr(opt, "class_counts", 0) is None:
        opt.set_class_counts([40, 30, 30])
    if getattr(opt, "num_data", 0) is None:
        opt.set_num_data(100)
    return opt.bind(model=model, clip_grad_norm=cfg.trainer.get("gradient_clip"))


def _registry_probe(cases: dict):
    """Per case: the largest gap between the sharded run's parameters (2 processes, half a batch
    each) and one process's on the whole batch, after each step; or the refusal."""
    topo = distributed.current()
    out = {}
    for name, overrides in cases.items():
        cfg = _fsdp_cfg(overrides)
        refused = strategy.refusals(cfg)
        if refused:
            out[name] = {"refused": refused}
            continue
        torch.manual_seed(0)
        whole = MLP(8, 3, hidden=(16, 16))
        sharded = copy.deepcopy(whole)
        strategy.shard(sharded, blocks_of(sharded), topo)
        ref_opt, opt = _optimizer(cfg, whole), _optimizer(cfg, sharded)
        gaps = []
        for step in range(STEPS):
            x, y = _batch(step)
            ref_opt.step(_closure(ref_opt, whole, x, y))
            half = slice(topo.rank * 8, topo.rank * 8 + 8)
            opt.step(_closure(opt, sharded, x[half], y[half]))
            full = [p.full_tensor() for p in sharded.parameters()]
            gaps.append(max(float((a - b).abs().max()) for a, b in zip(full, whole.parameters())))
        out[name] = {"gaps": gaps, "moved": float((full[0] - _initial()[0]).abs().max())}
    return out


def _initial():
    torch.manual_seed(0)
    return list(MLP(8, 3, hidden=(16, 16)).parameters())


def test_every_variant_sharded_equals_one_process_on_the_whole_batch_or_is_refused():
    out = distributed.launch(_registry_probe, (cases(),), 2, CPU)
    refused = {name for name, r in out.items() if "refused" in r}
    assert refused == {"spectral_sam", "esam", "sam+muon"}, refused
    for name in refused:
        (line,) = out[name]["refused"]
        assert "cannot shard" in line and "\n" not in line
    for name, r in out.items():
        if name in refused:
            continue
        assert max(r["gaps"]) < TOLERANCE, (name, r["gaps"])
        assert r["moved"] > 1e-4, name  # the step did something


def test_fsdp_refusals_are_one_line_and_name_the_setting():
    for overrides, words in (
        (["optimizer=spectral_sam"], "optimizer=spectral_sam cannot shard"),
        (["optimizer=esam"], "optimizer=esam cannot shard"),
        (["base_optimizer=muon"], "base_optimizer=muon cannot shard"),
        (["optimizer.sync_perturbation=false"], "sync_perturbation=false"),
        (["trainer.precision=fp16"], "trainer.precision=fp16 cannot shard"),
        (["trainer.weight_averaging=ema"], "trainer.weight_averaging=ema cannot shard"),
    ):
        with pytest.raises(UserError, match="trainer.strategy=fsdp") as e:
            strategy.check(_fsdp_cfg(overrides))
        assert words in str(e.value) and "\n" not in str(e.value)
    strategy.check(_fsdp_cfg([]))  # the defaults shard


def test_sync_perturbation_defaults_to_true_under_fsdp_and_false_under_ddp():
    assert compose().optimizer.sync_perturbation is False
    assert _fsdp_cfg([]).optimizer.sync_perturbation is True
    assert compose("optimizer.sync_perturbation=true").optimizer.sync_perturbation is True


def test_blocks_of_each_model_family():
    from sam_runner.models import build_model

    cfg = compose("model=gpt", "model.n_layer=3")
    assert len(blocks_of(build_model(cfg.model, (16,), 50))) == 3
    for arch, shape, n in (
        ("resnet18", (3, 32, 32), 4),
        ("wrn16_8", (3, 32, 32), 3),
        ("vgg16_bn", (3, 32, 32), 5),
        ("mlp", (1, 40), 2),
        ("cnn", (1, 8, 8), 0),
        ("cnn1d", (1, 40), 0),
    ):
        with torch.device("meta"):
            model = build_model(compose(f"model={arch}").model, shape, 10)
        assert len(blocks_of(model)) == n, arch
