"""Sharded training (trainer.strategy=fsdp, FSDP2 over gloo on the CPU, 2 real processes),
activation checkpointing, and curvature split across processes."""

from __future__ import annotations

import contextlib
import copy
import functools
import json

import pytest
import torch
import torch.nn.functional as F
from conftest import compose

from sam_runner import distributed
from sam_runner.errors import UserError
from sam_runner.models import MLP, blocks_of
from sam_runner.optim.build import build_optimizer
from sam_runner.registry import VARIANTS
from sam_runner.train import train
from sam_runner.training import strategy

CPU = torch.device("cpu")
STEPS = 3
# float32 sums over two shards and over the whole batch round differently in the last bits;
# three steps carry that to ~1e-7 here
TOLERANCE = 1e-5
# LookSAM's reuse steps add α‖g‖/‖g_v‖ g_v: a small g_v (the part of g_s orthogonal to g)
# magnifies the last-bit differences (6e-6 measured)
LOOSER = {"look_sam": 1e-4}

# the base optimizers and engine options checked with SAM beside the registry's variants
EXTRA = {
    "sam+adamw": ["optimizer=sam", "base_optimizer=adamw"],
    "sam+lion": ["optimizer=sam", "base_optimizer=lion"],
    "sam+lion_k_l2": ["optimizer=sam", "base_optimizer=lion_k", "base_optimizer.k=l2"],
    "sam+clip": ["optimizer=sam", "trainer.gradient_clip=0.05"],
    "sam+adaptive": ["optimizer=sam", "optimizer.perturb_schedule=adaptive"],
    "sam+rho_cosine": ["optimizer=sam", "optimizer.rho_schedule=cosine"],
    "sam+weight_decay": [
        "optimizer=sam",
        "optimizer.perturb_with_weight_decay=true",
        "base_optimizer.weight_decay=0.01",
    ],
    "sam+muon": ["optimizer=sam", "base_optimizer=muon"],
    "functional_sam+adam": [
        "optimizer=functional_sam",
        "optimizer.precondition=adam",
        "base_optimizer=adamw",
    ],
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
        out[name] = {
            "gaps": gaps,
            "moved": float((full[0] - _initial()[0]).abs().max()),
            "foreach": {g.get("foreach") for g in opt.param_groups},
        }
    return out


def _initial():
    torch.manual_seed(0)
    return list(MLP(8, 3, hidden=(16, 16)).parameters())


def test_every_variant_sharded_equals_one_process_on_the_whole_batch_or_is_refused():
    out = distributed.launch(_registry_probe, (cases(),), 2, CPU)
    refused = {name for name, r in out.items() if "refused" in r}
    assert refused == {"spectral_sam", "esam", "flat_lora", "sam+muon"}, refused
    for name in refused:
        (line,) = out[name]["refused"]
        assert "cannot shard" in line and "\n" not in line
    for name, r in out.items():
        if name in refused:
            continue
        assert max(r["gaps"]) < LOOSER.get(name, TOLERANCE), (name, r["gaps"])
        assert r["moved"] > 1e-4, name  # the step did something
    # torch's base optimizers take their multi-tensor step on the shards (DTensors)
    assert out["sam"]["foreach"] == out["sam+adamw"]["foreach"] == {True}


# ---------------------------------------------------------------- each process's own ε
OWN = "optimizer.sync_perturbation=false"
# refused sharded with each process's own ε (beside the variants refused sharded at all)
OWN_REFUSED = {
    "bsam", "eisam", "flatpo", "focal_sam", "fsam", "gear_sam", "look_sam", "precond_sam",
    "sam_sps",
}  # fmt: skip
OWN_CASES = {
    "wsam+coupled": ["optimizer=wsam", "optimizer.decouple=false"],
    "sam+accumulate": ["optimizer=sam", "trainer.accumulate=2"],
}


def _share(cfg, x, y):
    """This process's share of the global batch (SAMPa's two-process DDP form: a role's)."""
    from sam_runner.optim.build import training_share

    rank, size = training_share(cfg, distributed.current().rank, 2)
    part = slice(rank * len(y) // size, (rank + 1) * len(y) // size)
    return x[part], y[part]


def _accumulating_closure(opt, net, x, y, parts: int):
    """The closure of a run with trainer.accumulate=parts: in a synchronised pass only the last
    micro-batch's backward reduces."""
    from sam_runner.module_state import gradient_sync_paused

    def closure():
        opt.zero_grad(set_to_none=True)
        total = 0.0
        for i, (xm, ym) in enumerate(zip(x.tensor_split(parts), y.tensor_split(parts))):
            quiet = opt.pass_syncs and i < parts - 1
            with gradient_sync_paused(opt.model) if quiet else contextlib.nullcontext():
                out = net(xm)
                loss = opt.reduce_loss(F.cross_entropy(out, ym, reduction="none"), out, ym)
                (loss * len(ym) / len(y)).backward()
            total += loss.detach() * len(ym) / len(y)
        return total

    return closure


def _own_perturbation_run(cfg, net, model, opt, steps: int):
    """``steps`` steps of ``opt`` on this process's share of each batch; the whole parameters
    after each."""
    parts = int(cfg.trainer.get("accumulate", 1))
    out = []
    for step in range(steps):
        x, y = _share(cfg, *_batch(step))
        make = _closure if parts == 1 else functools.partial(_accumulating_closure, parts=parts)
        opt.step(make(opt, net, x, y))
        whole = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
        out.append([t.detach().clone() for t in whole])
    return out


def _own_perturbation_probe(cases: dict):
    """Per case, with each process's own ε (sync_perturbation=false): the largest gap between
    the sharded run's parameters and DDP's (each process the same share of the same batches,
    the same seeds) after each step, and for SAM the gap to DDP with a synchronised ε; or the
    refusal."""
    from torch.nn.parallel import DistributedDataParallel

    out = {}
    for name, overrides in cases.items():
        cfg = _fsdp_cfg([*overrides, OWN])
        refused = strategy.refusals(cfg)
        if refused:
            out[name] = {"refused": refused}
            continue
        runs = {}
        for form, sync in (("fsdp", "false"), ("ddp", "false"), ("ddp_sync", "true")):
            if form == "ddp_sync" and name != "sam":
                continue
            run_cfg = compose(*overrides, f"optimizer.sync_perturbation={sync}",
                              "trainer.devices=2", "trainer.device=cpu",
                              f"trainer.strategy={form.split('_')[0]}")  # fmt: skip
            torch.manual_seed(0)
            model = MLP(8, 3, hidden=(16, 16))
            if form == "fsdp":
                strategy.shard(model, blocks_of(model), distributed.current())
                net = model
            else:
                net = DistributedDataParallel(model)
            opt = _optimizer(run_cfg, model).bind(
                model=net, clip_grad_norm=run_cfg.trainer.get("gradient_clip")
            )
            runs[form] = _own_perturbation_run(run_cfg, net, model, opt, STEPS)
        gap = lambda a, b: [  # noqa: E731
            max(float((u - v).abs().max()) for u, v in zip(pa, pb)) for pa, pb in zip(a, b)
        ]
        out[name] = {
            "gaps": gap(runs["fsdp"], runs["ddp"]),
            "moved": float((runs["fsdp"][-1][0] - _initial()[0]).abs().max()),
        }
        if "ddp_sync" in runs:
            out[name]["to_synced"] = gap(runs["fsdp"], runs["ddp_sync"])[0]
    return out


def _perturbing_cases() -> dict:
    return {k: v for k, v in {**cases(), **OWN_CASES}.items() if k != "base"}  # base has no ε


def test_own_eps_is_refused_sharded_in_one_line_naming_the_variant_and_why():
    out = {name: strategy.refusals(_fsdp_cfg([*o, OWN])) for name, o in _perturbing_cases().items()}
    refused = {name for name, lines in out.items() if lines}
    assert refused == OWN_REFUSED | {"spectral_sam", "esam", "flat_lora", "sam+muon"}, refused
    for name in OWN_REFUSED:
        (line,) = out[name]
        assert (
            f"optimizer={name.split('+')[0]} optimizer.sync_perturbation=false cannot shard ("
            in line
        )
        assert "\n" not in line and "use trainer.strategy=ddp" in line
    for name in refused - OWN_REFUSED:  # refused sharded at all: that one line alone
        (line,) = out[name]
        assert "sync_perturbation" not in line


def _check_own_eps_equals_ddp(out: dict) -> None:
    for name, r in out.items():
        assert "refused" not in r, (name, r)
        assert max(r["gaps"]) < TOLERANCE, (name, r["gaps"])
        assert r["moved"] > 1e-4, name  # the steps did something


def test_sam_with_its_own_eps_sharded_equals_ddp():
    """sync_perturbation=false under fsdp: ε from each process's own gradient, as under DDP
    (three steps, the same share of the same batches a process), with trainer.accumulate too."""
    chosen = {k: _perturbing_cases()[k] for k in ("sam", "sam+accumulate")}
    out = distributed.launch(_own_perturbation_probe, (chosen,), 2, CPU)
    _check_own_eps_equals_ddp(out)
    # the ε is each process's own: a synchronised one moves the first step elsewhere
    assert out["sam"]["to_synced"] > 1e-4


@pytest.mark.slow  # 20-110 s on 2 shared cores: every variant and option, twice
def test_every_variant_with_its_own_eps_sharded_equals_ddp_unless_refused():
    perturbing = _perturbing_cases()
    chosen = {k: v for k, v in perturbing.items() if k not in ("sam", "sam+accumulate")}
    out = distributed.launch(_own_perturbation_probe, (chosen,), 2, CPU)
    _check_own_eps_equals_ddp({k: r for k, r in out.items() if "refused" not in r})
    assert {k for k, r in out.items() if "refused" not in r} == {
        "asam", "csam", "functional_sam", "gcsam", "gsam", "le_sam", "msam", "sampa", "sample",
        "tlc_sam", "wsam", "wsam+coupled", "sam+adamw", "sam+lion", "sam+lion_k_l2", "sam+clip",
        "sam+adaptive", "sam+rho_cosine", "sam+weight_decay", "functional_sam+adam",
    }  # fmt: skip


def test_fsdp_refusals_are_one_line_and_name_the_setting():
    for overrides, words in (
        (["optimizer=spectral_sam"], "optimizer=spectral_sam cannot shard"),
        (["optimizer=esam"], "optimizer=esam cannot shard"),
        (["base_optimizer=muon"], "base_optimizer=muon cannot shard"),
        (
            ["optimizer.sync_perturbation=false", "trainer.precision=bf16"],
            "sync_perturbation=false with bf16 passes cannot shard",
        ),
        (["trainer.precision=fp16"], "trainer.precision=fp16 cannot shard"),
        (["trainer.weight_averaging=ema"], "trainer.weight_averaging=ema cannot shard"),
        (["regularizer=jsd"], "regularizer=jsd regularizer.space=parameter cannot shard"),
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
        strategy.check_shardable(model)  # no scalar parameter: every family shards
    timm = pytest.importorskip("timm")
    from timm.models.vision_transformer import VisionTransformer

    assert len(blocks_of(VisionTransformer(img_size=32, patch_size=4, embed_dim=48, depth=3))) == 3
    assert len(blocks_of(timm.create_model("resnet18", num_classes=10))) == 4


def test_a_scalar_parameter_is_refused_sharded_in_one_line_naming_it():
    """FSDP2 shards along dim 0; a 0-dim parameter is named in a one-line error (FSDP2's own is an
    AssertionError about shard dims)."""
    model = MLP(40, 10, hidden=(8,))
    model.temperature = torch.nn.Parameter(torch.tensor(1.0))
    with pytest.raises(UserError, match="trainer.strategy=fsdp") as e:
        strategy.check_shardable(model)
    assert "'temperature'" in str(e.value) and "trainer.strategy=ddp" in str(e.value)
    assert "\n" not in str(e.value)
    model.temperature = torch.nn.Parameter(torch.ones(1))  # a 1-element tensor shards
    strategy.check_shardable(model)


def test_blocks_of_a_hugging_face_model_are_its_no_split_modules():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config(n_layer=3, n_embd=32, n_head=2, vocab_size=64, n_positions=16)
    model = transformers.GPT2LMHeadModel(config)
    blocks = blocks_of(model)
    assert len(blocks) == 3 and all(type(b).__name__ == "GPT2Block" for b in blocks)


# ---------------------------------------------------------------- gradient accumulation
def _accumulation_probe():
    """A sharded MLP's gradient over 3 micro-batches, reduce-scattered each micro-batch and with
    the synchronisation paused on all but the last; whether a paused micro-batch left a sharded
    gradient (a reduce-scatter ran)."""
    from sam_runner.module_state import gradient_sync_paused

    topo = distributed.current()
    torch.manual_seed(0)
    model = MLP(8, 3, hidden=(16, 16))
    strategy.shard(model, blocks_of(model), topo)
    x, y = _batch(topo.rank)
    out = {}
    for paused in (False, True):
        model.zero_grad(set_to_none=True)
        reduced_early = False
        for i, (xm, ym) in enumerate(zip(x.tensor_split(3), y.tensor_split(3))):
            quiet = paused and i < 2
            with gradient_sync_paused(model) if quiet else contextlib.nullcontext():
                (F.cross_entropy(model(xm), ym) * len(ym) / len(y)).backward()
            if i < 2:
                reduced_early |= any(p.grad is not None for p in model.parameters())
        out[paused] = {
            "grads": [p.grad.full_tensor() for p in model.parameters()],
            "reduced_early": reduced_early,
        }
    return {
        "gap": max(
            float((a - b).abs().max()) for a, b in zip(out[True]["grads"], out[False]["grads"])
        ),
        "reduced_early": {paused: r["reduced_early"] for paused, r in out.items()},
    }


def test_paused_micro_batches_reduce_scatter_once_with_the_same_gradient():
    out = distributed.launch(_accumulation_probe, (), 2, CPU)
    # each micro-batch reduce-scatters, unless paused: then only the last
    assert out["reduced_early"] == {False: True, True: False}
    assert out["gap"] < 1e-6


def test_a_sharded_run_with_accumulation_equals_ddp(tmp_path):
    """trainer.accumulate=3 under fsdp (one reduce-scatter a pass) and under ddp (one all-reduce
    a pass): the same metrics lines to float error."""
    cfg = [*COMMON, "trainer.epochs=1", "trainer.accumulate=3", "optimizer.sync_perturbation=true"]
    for name in ("ddp", "fsdp"):
        run = compose(*cfg, f"trainer.strategy={name}")
        distributed.launch(train, (run, str(tmp_path / name), ["x"]), 2, CPU)
    (a,), (b,) = _rows(tmp_path / "ddp"), _rows(tmp_path / "fsdp")
    for k, v in a.items():
        if isinstance(v, float):
            assert b[k] == pytest.approx(v, rel=1e-5, abs=1e-7), k


# ---------------------------------------------------------------- curvature across processes
def _curvature_probe():
    """λ_1, λ_2, Hutchinson's trace and the SLQ density's nodes, on one process's whole sample
    set and split between the two processes."""
    from sam_runner.metrics.hvp import HessianOperator
    from sam_runner.metrics.solvers import hessian_eigenpairs, hessian_trace, spectral_density

    topo = distributed.current()
    torch.manual_seed(0)
    model = MLP(8, 3, hidden=(16,))
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(100, 8, generator=g), torch.randint(0, 3, (100,), generator=g)
    batches = [(x[i : i + 32], y[i : i + 32]) for i in range(0, 100, 32)]
    out = {}
    for split in (False, True):
        dist = topo if split else None
        with HessianOperator(model, F.cross_entropy, batches, "double_backward", dist=dist) as op:
            eig = hessian_eigenpairs(model, None, batches, k=2, tol=1e-6, operator=op)
            trace = hessian_trace(op, 16, seed=0)[0]
            density = spectral_density(op, 2, 8, seed=0)
            out[split] = {
                "lambda": [float(v) for v in eig.values],
                "trace": float(trace),
                "nodes": [[float(n) for n in r] for r in density["nodes"]],
                "samples": sum(len(b[1]) for b in op.batches),
                "batches": len(op.batches),
            }
    return out


def test_curvature_split_across_processes_equals_one_process():
    out = distributed.launch(_curvature_probe, (), 2, CPU)
    whole, split = out[False], out[True]
    assert whole["samples"] == 100 and split["samples"] == 50  # each process half the samples
    assert whole["batches"] == split["batches"] == 4  # on a CPU, in as many batches as the whole
    assert split["lambda"] == pytest.approx(whole["lambda"], rel=1e-5)
    assert split["trace"] == pytest.approx(whole["trace"], rel=1e-5)
    for a, b in zip(split["nodes"], whole["nodes"]):
        assert a == pytest.approx(b, rel=1e-4, abs=1e-6)


# ---------------------------------------------------------------- activation checkpointing
def test_activation_checkpointing_changes_no_gradient_nor_batchnorm_statistics():
    """Bit for bit on these CPU kernels: the same gradients, and BatchNorm's running statistics
    move once a pass (the recompute restores them)."""
    from torch import nn

    torch.manual_seed(0)
    plain = nn.Sequential(
        nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Dropout(0.3), nn.Tanh()),
        nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.Tanh()),
        nn.Linear(16, 3),
    )
    recomputed = copy.deepcopy(plain)
    for block in list(recomputed)[:2]:
        strategy.checkpoint_activations(block)
    x, y = torch.randn(32, 8), torch.randint(0, 3, (32,))
    for model in (plain, recomputed):
        torch.manual_seed(1)  # the same dropout masks
        for _ in range(2):
            F.cross_entropy(model(x), y).backward()
    for a, b in zip(plain.parameters(), recomputed.parameters()):
        assert torch.equal(a.grad, b.grad)
    for a, b in zip(plain.buffers(), recomputed.buffers()):
        assert torch.equal(a, b)


def test_the_curvature_of_a_model_with_activation_checkpointing_is_its_curvature_without():
    """λ_max and the trace over cached graphs, each used by many HVPs: a checkpointed block
    recomputes once per backward, entering its recompute context again each time (the measurement
    of a run with activation checkpointing stopped at the second HVP: the context was a one-use
    generator)."""
    from torch import nn

    from sam_runner.metrics.hvp import HessianOperator
    from sam_runner.metrics.solvers import hessian_eigenpairs, hessian_trace

    torch.manual_seed(0)
    plain = nn.Sequential(
        nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Tanh()),
        nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.Tanh()),
        nn.Linear(16, 3),
    )
    recomputed = copy.deepcopy(plain)
    for block in list(recomputed)[:2]:
        strategy.checkpoint_activations(block)
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g)
    batches = [(x[:32], y[:32]), (x[32:], y[32:])]
    out = []
    for model in (plain, recomputed):
        model.train()  # BatchNorm on batch statistics (bn_mode=train)
        with HessianOperator(model, F.cross_entropy, batches, "double_backward") as op:
            assert op._cache_ok
            eig = hessian_eigenpairs(model, None, batches, tol=1e-6, operator=op)
            out.append((eig.values[0], hessian_trace(op, 4, seed=0)[0]))
    assert out[1] == pytest.approx(out[0], rel=1e-6)
    for a, b in zip(plain.buffers(), recomputed.buffers()):
        assert torch.equal(a, b)


GPT = [
    "dataset=text",
    "dataset.block_size=16",
    "dataset.batch_size=8",
    "trainer.steps=4",
    "model=gpt",
    "model.n_layer=2",
    "model.n_head=2",
    "model.n_embd=16",
    "model.dropout=0.1",
    "trainer.threads=1",
    "trainer.progress=none",
    "trainer.device=cpu",
    "metrics=off",
]


def test_activation_checkpointing_trains_a_gpt_bit_for_bit(tmp_path):
    plain = train(compose(*GPT), tmp_path / "plain", ["x"])
    recomputed = train(
        compose(*GPT, "trainer.activation_checkpointing=true"), tmp_path / "ac", ["x"]
    )
    assert plain["status"] == recomputed["status"] == "completed"
    rows = [
        [{k: v for k, v in json.loads(line).items() if k != "time_s"} for line in open(d)]
        for d in (tmp_path / "plain" / "metrics.jsonl", tmp_path / "ac" / "metrics.jsonl")
    ]
    assert rows[0] == rows[1]
    a, b = (torch.load(tmp_path / d / "checkpoints" / "last.pt")["model"] for d in ("plain", "ac"))
    assert all(torch.equal(a[k], b[k]) for k in a)


# ---------------------------------------------------------------- a sharded run
COMMON = [
    "model=mlp",
    "model.hidden=[32,32]",
    "dataset.num_samples=600",
    "dataset.batch_size=48",  # divisible by 2 and 3 processes
    "trainer.device=cpu",
    "trainer.progress=none",
    "metrics=off",
    "scheduler=constant",
    "optimizer=gear_sam",
]


def _rows(run_dir):
    return [
        {k: v for k, v in json.loads(line).items() if k not in ("time_s", "hessian_time_s")}
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
    ]


@pytest.mark.slow  # 25-80 s on 2 shared cores: four 2-process runs
def test_a_sharded_run_with_its_own_eps_equals_ddp_and_resumes_exactly(tmp_path):
    """sync_perturbation=false through sam-run's training loop (ASAM: whole ε and T buffers on
    each process): fsdp equals ddp to float error, and 1 epoch then a resume to 2 (a sharded
    checkpoint) equals 2 straight bit for bit."""
    from conftest import stopped_early_of

    cfg = [*COMMON, "optimizer=asam", OWN, "trainer.epochs=2"]
    runs = {name: tmp_path / name for name in ("ddp", "fsdp", "resumed")}
    for name in ("ddp", "fsdp"):
        run = compose(*cfg, f"trainer.strategy={name}")
        distributed.launch(train, (run, str(runs[name]), ["x"]), 2, CPU)
    first = compose(*cfg, "trainer.strategy=fsdp", "trainer.epochs=1")
    distributed.launch(train, (first, str(runs["resumed"]), ["x"]), 2, CPU)
    stopped_early_of(runs["resumed"], 2)
    again = compose(*cfg, "trainer.strategy=fsdp")
    distributed.launch(train, (again, str(runs["resumed"]), ["x"]), 2, CPU)
    assert _rows(runs["fsdp"]) == _rows(runs["resumed"])
    ddp, fsdp = _rows(runs["ddp"]), _rows(runs["fsdp"])
    assert [r["epoch"] for r in fsdp] == [1, 2]
    for a, b in zip(ddp, fsdp):
        for k, v in a.items():
            if isinstance(v, float):
                assert b[k] == pytest.approx(v, rel=1e-5, abs=1e-7), k


@pytest.mark.slow  # 13-40 s on 2 shared cores: two 2-process runs
def test_a_sharded_gpt_with_its_own_eps_and_checkpointing_equals_ddp(tmp_path):
    """sync_perturbation=false on a GPT (its blocks sharded one by one, the embedding tied to the
    head) with activation checkpointing (the recompute reads the gathered θ + ε_k) and
    trainer.accumulate=2: fsdp's metrics are ddp's."""
    cfg = [*GPT, "optimizer=asam", OWN, "trainer.activation_checkpointing=true",
           "trainer.accumulate=2"]  # fmt: skip
    for name in ("ddp", "fsdp"):
        run = compose(*cfg, f"trainer.strategy={name}")
        distributed.launch(train, (run, str(tmp_path / name), ["x"]), 2, CPU)
    (a,), (b,) = _rows(tmp_path / "ddp"), _rows(tmp_path / "fsdp")
    assert a["grad_evals"] == b["grad_evals"] == 8  # four perturbed steps
    for k, v in a.items():
        if isinstance(v, float):
            assert b[k] == pytest.approx(v, rel=1e-5, abs=1e-7), k


def test_a_sharded_run_resumes_exactly_and_other_tools_read_its_weights(tmp_path):
    """2 processes, FSDP: 1 epoch then a resume to 2 equals 2 straight (the metrics lines bit for
    bit); the checkpoint is sharded (last.pt points at it) and reads back whole in one process
    (sam-eval, sam-landscape, model.init_from); resuming it with another number of processes is
    one line. sam-eval trainer.devices=2 measures the job with 2 processes (λ_max split)."""
    from conftest import stopped_early_of

    from sam_runner.rundir import RunDir

    cfg = [*COMMON, "trainer.strategy=fsdp"]
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    launch = distributed.launch
    launch(train, (compose(*cfg, "trainer.epochs=2"), str(straight), ["x"]), 2, CPU)
    launch(train, (compose(*cfg, "trainer.epochs=1"), str(resumed), ["x"]), 2, CPU)
    (shards,) = (resumed / "checkpoints").glob("last.shards-*")  # the older ones removed
    assert (shards / "rank1.pt").is_file() and (shards / ".metadata").is_file()
    stopped_early_of(resumed, 2)
    with pytest.raises(UserError, match=r"written by 2 data-parallel process\(es\)") as e:
        launch(train, (compose(*cfg, "trainer.epochs=2"), str(resumed), ["x"]), 3, CPU)
    assert "and this run has 3" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(UserError, match="trainer.strategy fsdp -> ddp") as e:  # 1 process
        train(compose(*COMMON, "trainer.epochs=2"), resumed, ["x"])
    assert "\n" not in str(e.value)
    launch(train, (compose(*cfg, "trainer.epochs=2"), str(resumed), ["x"]), 2, CPU)
    assert _rows(straight) == _rows(resumed)
    assert [r["epoch"] for r in _rows(resumed)] == [1, 2]
    whole = RunDir(straight).checkpoint()["model"]  # assembled from the shards, once
    again = RunDir(resumed).checkpoint()["model"]
    assert whole.keys() == {n for n, _ in MLP(40, 10, hidden=(32, 32)).named_parameters()}
    assert all(torch.equal(whole[k], again[k]) for k in whole)
    from sam_runner.models import initial_state  # model.init_from=<a sharded run>

    given, record = initial_state(compose(*COMMON, f"model.init_from={straight}").model)
    assert record["kind"] == "checkpoint" and all(torch.equal(given[k], whole[k]) for k in whole)
    # sam-eval of the same weights: one process, and 2 measuring the job together
    from sam_runner.evaluation.cli import main as sam_eval

    assert sam_eval([str(straight), "trainer.progress=none"]) == 0
    assert sam_eval([str(resumed), "trainer.devices=2", "trainer.progress=none"]) == 0
    one, two = (json.loads((d / "eval.json").read_text()) for d in (straight, resumed))
    assert one["status"] == two["status"] == "completed"
    assert two["lambda_max"] == pytest.approx(one["lambda_max"], rel=1e-5)
    assert two["test_acc"] == one["test_acc"]
    assert "optimizer" not in RunDir(straight).checkpoint()  # rank 0's shards are not the state


def test_bad_strategy_input_is_one_line_exit_2_and_writes_nothing(capsys, tmp_path):
    from conftest import run_cli

    for argv, message in (
        (["trainer.strategy=fsdp"], "trainer.strategy=fsdp on 1 process: nothing to shard"),
        (
            ["trainer.strategy=fsdp", "trainer.devices=2", "optimizer=spectral_sam"],
            "optimizer=spectral_sam cannot shard",
        ),
        (
            ["trainer.strategy=fsdp", "trainer.devices=2", "optimizer=fsam", OWN],
            "optimizer=fsam optimizer.sync_perturbation=false cannot shard (its momentum",
        ),
        (
            ["model=cnn1d", "trainer.activation_checkpointing=true"],
            "model=cnn1d declares no blocks",
        ),
        (["trainer.strategy=zero"], "trainer.strategy='zero' is unknown"),
    ):
        run = tmp_path / "run"
        code, _, err = run_cli([*argv, "trainer.device=cpu", f"hydra.run.dir={run}"], capsys)
        assert code == 2, err
        assert message in err and err.count("\n") == 1, err
        assert not run.exists()


# ---------------------------------------------------------------- two "nodes" on one machine
@pytest.mark.slow
@pytest.mark.parametrize("strategy_name", ["ddp", "fsdp"])
def test_two_nodes_on_localhost_equal_one_node(strategy_name, tmp_path):
    """torchrun --nnodes=2 --node-rank=0/1 (one process each, gloo over localhost) against the
    same 2 processes on one node: the same metrics lines (λ_max measured split and, under fsdp,
    on the shards)."""
    import subprocess
    import sys

    args = [
        *COMMON[:-2],  # metrics on: λ_max at the end
        "metrics.hessian.num_samples=128",
        "metrics.hessian.max_iter=20",
        "optimizer.sync_perturbation=true",
        "trainer.epochs=1",
        f"trainer.strategy={strategy_name}",
    ]
    args = [a for a in args if a != "metrics=off"]
    one = tmp_path / "one"
    distributed.launch(train, (compose(*args), str(one), ["x"]), 2, CPU)
    port, two = distributed.free_port(), tmp_path / "two"
    nodes = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes=2",
                f"--node-rank={r}",
                "--nproc-per-node=1",
                "--master-addr=127.0.0.1",
                f"--master-port={port}",
                "-m",
                "sam_runner.cli",
                *args,
                f"hydra.run.dir={two}",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        for r in (0, 1)
    ]
    for node in nodes:
        _, err = node.communicate(timeout=600)
        assert node.returncode == 0, err[-3000:]
    assert json.loads((two / "summary.json").read_text())["status"] == "completed"
    rows_one, rows_two = _rows(one), _rows(two)
    assert len(rows_one) == len(rows_two) == 1
    for k, v in rows_one[0].items():
        if isinstance(v, float):
            assert rows_two[0][k] == pytest.approx(v, rel=1e-6), k
    assert rows_one[0]["lambda_max"] > 0


# ---------------------------------------------------------------- curvature in bf16
def test_hessian_precision_is_checked_and_bf16_is_close_to_fp32(monkeypatch):
    from sam_runner.metrics import tracker
    from sam_runner.metrics.hvp import HessianOperator, cpu_has_bf16
    from sam_runner.metrics.solvers import hessian_eigenpairs

    with pytest.raises(UserError, match="metrics.hessian.precision='fp16' is unknown"):
        tracker.validate(compose("metrics.hessian.precision=fp16").metrics)
    monkeypatch.setattr(tracker, "cpu_has_bf16", lambda: False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(UserError, match="this CPU has no bf16 arithmetic") as e:
        tracker.validate(compose("metrics.hessian.precision=bf16").metrics)
    assert "\n" not in str(e.value)
    monkeypatch.undo()
    if not cpu_has_bf16():
        pytest.skip("this CPU has no bf16 arithmetic")
    torch.manual_seed(0)
    model = MLP(8, 3, hidden=(32,))
    g = torch.Generator().manual_seed(5)
    batches = [(torch.randn(64, 8, generator=g), torch.randint(0, 3, (64,), generator=g))]
    values = {}
    for precision in ("fp32", "bf16"):
        op = HessianOperator(
            model, F.cross_entropy, batches, "double_backward", precision=precision
        )
        with op:
            eig = hessian_eigenpairs(model, None, batches, tol=1e-5, max_iter=40, operator=op)
        values[precision] = float(eig.values[0])
    assert values["bf16"] == pytest.approx(values["fp32"], rel=0.05)
    assert values["bf16"] != values["fp32"]  # it did compute in bf16


@pytest.mark.slow
@pytest.mark.parametrize("strategy_name", ["ddp", "fsdp"])
def test_a_bf16_gpt_with_activation_checkpointing_trains_under_either_strategy(
    strategy_name, tmp_path
):
    """bf16 (fsdp: MixedPrecisionPolicy, bf16 passes, fp32 reductions and sharded weights) with
    activation checkpointing, 2 processes, against one process's bf16 run: close (the casts
    round differently), not equal."""
    args = [*GPT, "trainer.precision=bf16", "trainer.activation_checkpointing=true"]
    one = train(compose(*args), tmp_path / "one", ["x"])
    two = distributed.launch(
        train,
        (compose(*args, f"trainer.strategy={strategy_name}"), str(tmp_path / "two"), ["x"]),
        2,
        CPU,
    )
    assert one["status"] == two["status"] == "completed"
    a, b = _rows(tmp_path / "one")[-1], _rows(tmp_path / "two")[-1]
    assert b["train_loss"] == pytest.approx(a["train_loss"], rel=5e-3)  # bf16: ~3 digits
    assert b["test_loss"] == pytest.approx(a["test_loss"], rel=5e-3)


@pytest.mark.slow
def test_a_hugging_face_llama_sharded_by_its_decoder_layers_equals_one_process(tmp_path):
    """model=hf (a tiny Llama from its config): fully_shard on each LlamaDecoderLayer (its
    _no_split_modules), activation checkpointing on them, 2 processes against 1."""
    pytest.importorskip("transformers")
    args = [
        "dataset=text",
        "dataset.block_size=16",
        "dataset.batch_size=8",
        "dataset.steps_per_epoch=3",
        "trainer.epochs=2",
        "model=hf",
        "model.config={model_type: llama, hidden_size: 32, intermediate_size: 64, "
        "num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, "
        "max_position_embeddings: 64}",
        "base_optimizer=adamw",
        "base_optimizer.lr=3e-3",
        "scheduler=constant",
        "metrics=off",
        "trainer.progress=none",
        "trainer.device=cpu",
        "trainer.activation_checkpointing=true",
    ]
    train(compose(*args), tmp_path / "one", ["x"])
    two = compose(*args, "trainer.strategy=fsdp")
    distributed.launch(train, (two, str(tmp_path / "two"), ["x"]), 2, CPU)
    for a, b in zip(_rows(tmp_path / "one"), _rows(tmp_path / "two")):
        for k in ("train_loss", "test_loss", "test_acc"):
            assert b[k] == pytest.approx(a[k], rel=1e-5), k


def _train_stopped_at(cfg, run_dir, step: int):
    """train() in a started process, Ctrl-C'd as it begins optimizer step ``step``."""
    from sam_runner.training.loop import EpochLoop

    real = EpochLoop.optimizer_step

    def stopped(self, *args, **kwargs):
        if self.run.clock.step == step:
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    EpochLoop.optimizer_step = stopped
    try:
        return train(cfg, run_dir, ["x"])
    finally:
        EpochLoop.optimizer_step = real


@pytest.mark.slow
def test_a_sharded_run_stopped_mid_epoch_resumes_from_its_step_checkpoint_exactly(tmp_path):
    """trainer.checkpoint_every_n_steps under fsdp: each process's epoch sums and RNG are its
    own (rank<r>.pt), the shards the model's; the resumed run equals the unbroken one."""
    cfg = [*COMMON, "trainer.strategy=fsdp", "trainer.epochs=2"]  # 10 steps an epoch
    every = [*cfg, "trainer.checkpoint_every_n_steps=2"]
    whole, run = tmp_path / "whole", tmp_path / "run"
    distributed.launch(train, (compose(*cfg), str(whole), ["x"]), 2, CPU)
    with pytest.raises(Exception, match="step 12"):
        distributed.launch(_train_stopped_at, (compose(*every), str(run), 13), 2, CPU)
    pointer = torch.load(run / "checkpoints" / "last.pt", weights_only=True)
    assert pointer["clock"]["step"] == 12 and pointer["sharded"] == "last.shards-12"
    distributed.launch(train, (compose(*every), str(run), ["x"]), 2, CPU)
    assert _rows(whole) == _rows(run)
    from sam_runner.rundir import RunDir

    a, b = RunDir(whole).checkpoint()["model"], RunDir(run).checkpoint()["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)
