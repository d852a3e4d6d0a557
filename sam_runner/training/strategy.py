"""How the processes of a run hold its model: ``trainer.strategy`` and
``trainer.activation_checkpointing``.

* ``ddp`` (the default): every process holds the whole model; gradients are all-reduced
  (``distributed.Topology.wrap``).
* ``fsdp``: PyTorch's FSDP2, ``fully_shard`` on the blocks of the model (``models.blocks_of``, one
  rule per family), consecutive blocks grouped into one unit until it holds ``trainer.fsdp_unit_mb``
  of parameters (``units``), and then on the root (with the blocks left over): each process holds
  1/N of the parameters, of their gradients, of the optimizer's state and of SAM's saved θ and ε.
  Parameters are all-gathered unit by unit for each forward and backward, gradients
  reduce-scattered. The mixed-precision policy follows ``trainer.precision`` (bf16: bf16 parameters
  in the passes, fp32 reductions and fp32 sharded weights; fp32: none). With ``trainer.accumulate``
  a pass reduce-scatters once, in its last micro-batch (``module_state.gradient_sync_paused`` on the
  others: each process sums its own unsharded gradient meanwhile).
* ``activation_checkpointing`` (both strategies; ``sam_runner.activation_checkpointing``): each
  block's activations are recomputed in the backward pass instead of kept
  (``torch.utils.checkpoint``, non-reentrant, the RNG state kept so dropout draws alike; BatchNorm
  running statistics are restored after the recompute so that they move once a pass). It changes no
  result: bit for bit on the CPU kernels we test.

``optimizer.sync_perturbation=false`` (each process's own ε, DDP's default; FSDP runs default
to ``true``) keeps its meaning sharded: the pass at θ runs with the gradient sync paused and
FSDP2 keeps the parameters it gathered (no reshard after backward), so each process holds its
whole parameters and its own whole gradient (their ``.grad``); the variant's rule runs on them
with local norms, as on one process under DDP, and ε_k is added to them in place. The descent
pass runs on θ + ε_k without gathering again (no reshard after forward or backward until it
ends), reduce-scatters the mean of ∇L_k(θ + ε_k), and the reshard after it drops the perturbed
copies: the shards still hold θ (``SharpnessAware._own_sharpness_step``). The cost is DDP's
memory for that window: the whole parameters on every process, and its whole gradient and ε
until ε is in them.

What cannot run sharded is refused in one line (``check``): one process (nothing to shard),
the variants whose rule needs whole matrices or per-process state (a variant's ``fsdp_refused``),
``base_optimizer=muon`` (whole-matrix orthogonalisation), ``sync_perturbation=false`` for the
variants whose rule or update keeps state on the shards or runs passes of its own (a variant's
``fsdp_own_perturbation_refused``) and with bf16 passes (FSDP2 keeps the unreduced gradient in an
accumulator of its own), ``trainer.precision=fp16`` (the loss scaler's inf check is per
process), ``trainer.weight_averaging`` and ``federated`` (both keep whole copies of the
weights), ``regularizer=jsd`` in parameter space (a ``functional_call`` at θ + δ) and
``trainer.sync_batchnorm``.
"""

from __future__ import annotations

import copy
import math

import torch

from ..activation_checkpointing import checkpoint_activations
from ..errors import number, require
from ..models import blocks_of
from .fast_path import resolved_precision

STRATEGIES = ("ddp", "fsdp")


def strategy_of(cfg) -> str:
    return str(cfg.trainer.get("strategy", "ddp"))


def processes(cfg) -> int:
    """The processes a run of ``cfg`` will have: torchrun's or SLURM's, else trainer.devices."""
    from ..distributed import current, from_env

    if current().parallel:
        return current().world
    env = from_env()
    return env[1] if env else int(cfg.trainer.get("devices", 1) or 1)


def check(cfg, world: int | None = None) -> None:
    """One-line UserErrors for a strategy the run cannot use (``world``: its processes, where
    known)."""
    t = cfg.trainer
    strategy = strategy_of(cfg)
    require(
        strategy in STRATEGIES,
        f"trainer.strategy={strategy!r} is unknown; choose {' or '.join(STRATEGIES)}",
    )
    checkpointing = t.get("activation_checkpointing", False)
    require(
        isinstance(checkpointing, bool),
        f"trainer.activation_checkpointing={checkpointing!r} must be true or false",
    )
    number("trainer.fsdp_unit_mb", t.get("fsdp_unit_mb", 0), "a number of MB >= 0 (0: one unit "
           "per block)", lambda mb: mb >= 0 and math.isfinite(mb))  # fmt: skip
    if strategy != "fsdp":
        return
    world = processes(cfg) if world is None else world
    require(
        world > 1,
        "trainer.strategy=fsdp on 1 process: nothing to shard; use trainer.devices=N (or "
        "torchrun, SLURM tasks) with N >= 2, or trainer.strategy=ddp",
    )
    for problem in refusals(cfg):
        require(False, f"trainer.strategy=fsdp: {problem}")


def refusals(cfg) -> list[str]:
    """Why ``cfg`` cannot train sharded (empty: it can)."""
    from ..registry import VARIANTS

    t, out = cfg.trainer, []
    name = str(cfg.optimizer.name)
    try:
        why = getattr(VARIANTS.entry(name).target, "fsdp_refused", None)
    except Exception:  # an unknown name is the optimizer's own check's to report
        why = None
    if why:
        out.append(f"optimizer={name} cannot shard ({why}); use trainer.strategy=ddp")
    if str(cfg.base_optimizer.name) == "muon":
        out.append(
            "base_optimizer=muon cannot shard (its Newton-Schulz step orthogonalises whole "
            "matrices, which no process holds); use trainer.strategy=ddp"
        )
    if name != "base" and cfg.optimizer.get("sync_perturbation") is False:
        out += own_perturbation_refusals(cfg, name)
    if t.precision == "fp16":
        out.append(
            "trainer.precision=fp16 cannot shard (the loss scaler's overflow check is per "
            "process); use trainer.precision=bf16 or fp32"
        )
    if str(t.get("weight_averaging", "none")) != "none":
        out.append(
            f"trainer.weight_averaging={t.weight_averaging} cannot shard (it keeps a whole copy "
            "of the weights); use trainer.weight_averaging=none or trainer.strategy=ddp"
        )
    reg = cfg.get("regularizer") or {}
    if str(reg.get("name", "none")) == "jsd" and str(reg.get("space", "parameter")) == "parameter":
        out.append(
            "regularizer=jsd regularizer.space=parameter cannot shard (its second forward swaps "
            "in θ + δ through functional_call, which sharded parameters do not take); use "
            "regularizer.space=input or trainer.strategy=ddp"
        )
    if t.get("sync_batchnorm", False):
        out.append(
            "trainer.sync_batchnorm=true is DDP's (SyncBatchNorm); under fsdp BatchNorm "
            "normalises each process's batch: leave it false or use trainer.strategy=ddp"
        )
    fed = cfg.get("federated") or {}
    if str(fed.get("name", "none")) != "none":
        out.append(
            f"federated={fed.name} cannot shard (its clients hold whole models); use "
            "trainer.strategy=ddp"
        )
    return out


def own_perturbation_refusals(cfg, name: str) -> list[str]:
    """Why ``optimizer.sync_perturbation=false`` (each process's own ε) cannot run sharded."""
    from ..registry import VARIANTS

    try:
        why = getattr(VARIANTS.entry(name).target, "fsdp_own_perturbation_refused", None)
    except Exception:  # an unknown name is the optimizer's own check's to report
        why = None
    out = []
    if why:
        out.append(
            f"optimizer={name} optimizer.sync_perturbation=false cannot shard ({why}); leave it "
            "unset (true under fsdp) or use trainer.strategy=ddp"
        )
    if str(cfg.trainer.precision) == "bf16":
        out.append(OWN_PERTURBATION_BF16)
    return out


OWN_PERTURBATION_BF16 = (
    "optimizer.sync_perturbation=false with bf16 passes cannot shard (FSDP2 keeps a process's "
    "own gradient of bf16 passes in an fp32 accumulator of its own, which ε is not built from); "
    "use trainer.precision=fp32, sync_perturbation=true or trainer.strategy=ddp"
)


def check_blocks(cfg, model) -> None:
    """activation_checkpointing needs blocks: a model whose family declares none is refused."""
    if cfg.trainer.get("activation_checkpointing", False):
        require(
            bool(blocks_of(model)),
            f"trainer.activation_checkpointing=true but model={cfg.model.arch} declares no "
            "blocks to recompute (cnn, cnn1d and pc have none; docs/running.md lists the rule of "
            "each family); use trainer.activation_checkpointing=false",
        )


def check_shardable(model) -> None:
    """FSDP2 shards every parameter along its dim 0: a model with a scalar (0-dim) parameter is
    refused, naming it (FSDP2's own error is an assertion about shard dims)."""
    scalars = [name for name, p in model.named_parameters() if p.ndim == 0]
    if scalars:
        require(
            False,
            f"trainer.strategy=fsdp cannot shard the scalar parameter {scalars[0]!r} "
            f"({len(scalars)} scalar parameter(s) in all; FSDP2 shards each along its dim 0): "
            "use trainer.strategy=ddp, or make it a 1-element tensor",
        )


def wrap(model, cfg, dist):
    """The model as the run trains it: activation checkpointing on its blocks when asked, then
    FSDP2 (``fsdp`` over several processes: the same module, its parameters now sharded
    DTensors) or DDP (``distributed.Topology.wrap``)."""
    check_blocks(cfg, model)
    blocks = blocks_of(model)
    if cfg.trainer.get("activation_checkpointing", False):
        for block in blocks:
            checkpoint_activations(block)
    if strategy_of(cfg) == "fsdp" and dist.parallel:
        check_shardable(model)
        if cfg.get("metrics", {}).get("hessian", {}).get("enabled", False):
            # the curvature measurement's unsharded model: its structure alone (meta), filled
            # with the gathered weights while it measures
            dist.unsharded = copy.deepcopy(model).to_empty(device="meta")
        precision = resolved_precision(str(cfg.trainer.precision), dist.device or "cpu")
        own = str(cfg.optimizer.name) != "base" and cfg.optimizer.get("sync_perturbation") is False
        # trainer.precision=auto is known to be bf16 only here, on the device
        require(
            not (own and precision == "bf16"), f"trainer.strategy=fsdp: {OWN_PERTURBATION_BF16}"
        )
        unit_bytes = float(cfg.trainer.get("fsdp_unit_mb", 0)) * 2**20
        shard(model, blocks, dist, precision, unit_bytes)
        dist.sharded = True
        return model
    return dist.wrap(model, cfg)


def mixed_precision(precision: str):
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "bf16":  # bf16 passes, fp32 reductions; the sharded weights stay fp32
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    return MixedPrecisionPolicy()


def units(blocks, unit_bytes: float = 0) -> list[list[torch.nn.Module]]:
    """The FSDP units ``blocks`` form: consecutive blocks in one unit until it holds at least
    ``unit_bytes`` of parameters; a last unit still short of it is left to the root (empty
    list). ``unit_bytes`` 0: one unit per block. Each unit costs an all-gather in the forward,
    another in the backward and a reduce-scatter, whatever its size: small blocks share theirs
    (a collective's fixed latency dominates below some MB), and a gathered unit stays below
    ``unit_bytes`` plus one block.

    Args:
        blocks: the model's blocks in order (``models.blocks_of``).
        unit_bytes: the parameter bytes from which a unit is closed.
    """
    out, unit, held = [], [], 0
    for block in blocks:
        unit.append(block)
        held += sum(p.numel() * p.element_size() for p in block.parameters())
        if held >= unit_bytes:
            out.append(unit)
            unit, held = [], 0
    return out


def shard(model, blocks, dist, precision: str = "fp32", unit_bytes: float = 0) -> None:
    """``fully_shard`` on each unit of ``blocks`` (``units``), then on the root, over all of
    the run's processes."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(dist.device.type if dist.device else "cpu", (dist.world,))
    policy = mixed_precision(precision)
    for unit in units(blocks, unit_bytes):
        fully_shard(unit if len(unit) > 1 else unit[0], mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)


def is_sharded(model) -> bool:
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in model.parameters())
