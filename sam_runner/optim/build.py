"""From config to optimizer: parameter groups, the base optimizer, the variant.

The runner builds as few parameter groups as there are distinct hyperparameters: Muon's hidden
2-D matrices (``use_muon``) and the rest, each in model order, so that a foreach or fused base
optimizer launches its kernels once or twice a step. What the variants, Muon and the measures
read of a parameter's structure rides beside ``params``, one entry per parameter
(``engine.PER_PARAMETER``): ``blocks`` (the model's top-level child that owns it; normalisation
layers sit in their layer's block), ``kinds`` (``weight``: conv, linear and normalisation
weights; or ``bias``) and ``hidden_flags`` (a Linear/Conv weight other than the first layer's
and the head's; see blocks.py). Weight decay applies to every group, as in the SAM paper.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..errors import UserError, integer, number, require
from ..part import Part
from ..registry import BASE_OPTIMIZERS, VARIANTS
from .blocks import hidden_weights, is_bias, top_level_blocks
from .engine import PER_PARAMETER

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from ..part import Run
    from .engine import SharpnessAware


def parameter_groups(model: nn.Module) -> list[dict]:
    """The model's trainable parameters in groups: Muon's hidden matrices, then the rest (either
    left out when empty), each in model order with its per-parameter ``blocks``, ``kinds`` and
    ``hidden_flags``."""
    hidden = hidden_weights(model)
    owner = top_level_blocks(model)
    groups = {m: dict(params=[], blocks=[], kinds=[], hidden_flags=[]) for m in (True, False)}
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        h = id(p) in hidden
        g = groups[h and p.ndim == 2]
        g["params"].append(p)
        g["blocks"].append(owner[id(p)])
        g["kinds"].append("bias" if is_bias(n, p) else "weight")
        g["hidden_flags"].append(h)
    return [dict(g, use_muon=m) for m, g in groups.items() if g["params"]]


def subgroup(group: dict, keep: list[int], **keys: object) -> dict:
    """``group`` with only its parameters at the indices ``keep`` (their per-parameter entries
    alike), and ``keys`` set: a part that gives some parameters other hyperparameters splits
    the runner's groups with it.

    Args:
        group: a parameter group (the runner's, or one a part made).
        keep: indices into its ``params``, in the order wanted.
        keys: group keys to set or change (``weight_decay``, a name, ...).
    """
    out = {**group, **keys, "params": [group["params"][i] for i in keep]}
    for listed in PER_PARAMETER.values():
        if listed in group:
            out[listed] = [group[listed][i] for i in keep]
    return out


def variant_kwargs(cfg: DictConfig) -> tuple[type, dict]:
    """(variant class, its keyword arguments from the ``optimizer`` group), checked."""
    opt_cfg = dict(cfg.optimizer)
    entry = VARIANTS.entry(opt_cfg.pop("name"))
    rho = opt_cfg.get("rho")
    if entry.rho_refused:
        # no fixed radius (le_sam): a swept optimizer.rho would silently mean nothing for these jobs
        require(
            rho is None, f"optimizer.rho={rho} does not apply to {entry.name}; {entry.rho_refused}"
        )
        opt_cfg.pop("rho", None)
    if rho is not None:
        number("optimizer.rho", rho, "a finite number >= 0", lambda r: 0 <= r < math.inf)
    integer("optimizer.interval", opt_cfg.get("interval", 1), "an integer >= 1", lambda n: n >= 1)
    return entry.target, opt_cfg


def training_share(cfg: DictConfig, rank: int, world: int) -> tuple[int, int]:
    """The share of every global training batch this process takes, as (rank, world) among the
    processes that split it: plain data parallelism splits it over all of them; a variant whose
    processes take roles (``process_roles``: SAMPa's two gradients) over each role's.

    Args:
        cfg: the run's composed config (its ``optimizer`` and ``trainer.strategy``).
        rank: this process's rank in the job.
        world: the job's number of processes.
    """
    cls, kwargs = variant_kwargs(cfg)
    sharded = cfg.trainer.get("strategy", "ddp") == "fsdp"
    try:
        roles = cls.process_roles(world, sharded, kwargs)
    except ValueError as e:
        raise UserError(f"optimizer={cfg.optimizer.name}: {e}") from None
    size = world // roles
    return rank % size, size


def build_optimizer(
    cfg: DictConfig,
    params: nn.Module | list[dict],
    total_steps: int,
    steps_per_epoch: int | None = None,
) -> SharpnessAware:
    """The SAM variant named by ``cfg.optimizer.name`` around the configured base optimizer.

    Args:
        cfg: the run's composed config (its ``optimizer`` and ``base_optimizer`` groups).
        params: the parameter groups (a training part may have split them per layer), or a
            model, whose ``parameter_groups`` are taken.
        total_steps: the run's optimizer steps (the variants' schedules).
        steps_per_epoch: the optimizer steps of an epoch (``perturb_from`` as an epoch).

    Returns:
        The variant, its base optimizer built on the same groups.
    """
    cls, kwargs = variant_kwargs(cfg)
    base_cls, base_kwargs = BASE_OPTIMIZERS.build(cfg.base_optimizer.name, cfg.base_optimizer)
    groups = parameter_groups(params) if isinstance(params, nn.Module) else params
    base_kwargs = {**multi_tensor_kernels(base_cls, groups), **base_kwargs}
    try:
        return cls(
            groups, base_cls, total_steps=total_steps, steps_per_epoch=steps_per_epoch,
            **kwargs, **base_kwargs,
        )  # fmt: skip
    except (ValueError, TypeError) as e:
        raise UserError(f"optimizer={cfg.optimizer.name}: {e}") from None


FUSABLE = (torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW)


def multi_tensor_kernels(base_cls: type, groups: list[dict]) -> dict:
    """The keyword that makes a torch base optimizer update a group's tensors together:
    ``fused=True`` on CUDA (one kernel per group), ``foreach=True`` elsewhere and on sharded
    parameters (FSDP2's DTensors); none for other optimizers. torch's own default on a CPU is a
    loop over tensors, one dispatch per operation and tensor: an SGD step of the fsdp bench's
    GPT (52 DTensors, 2 processes) took 7.8 ms so, 1.8 ms with foreach.

    Args:
        base_cls: the base optimizer's class.
        groups: the parameter groups it will hold.
    """
    first = next((p for g in groups for p in g["params"]), None)
    if base_cls not in FUSABLE or first is None:
        return {}
    if first.device.type == "cuda" and not hasattr(first, "device_mesh"):
        return {"fused": True}
    return {"foreach": True}


def bind_dataset(optimizer: SharpnessAware, data: object) -> None:
    """What a variant needs of the training set and its config left unset: Focal-SAM's class
    counts, bSAM's number of examples N."""
    if getattr(optimizer, "class_counts", 0) is None and data.class_counts:
        optimizer.set_class_counts(data.class_counts)
    if getattr(optimizer, "num_data", 0) is None and data.train_size:
        optimizer.set_num_data(data.train_size)


class DatasetFacts(Part):
    """A variant's facts from the training set (``bind_dataset``), once everything is built."""

    def attach(self, run: Run) -> None:
        """Give the variant the training set's class counts and size."""
        bind_dataset(run.optimizer, run.data)


def build_part(run: Run) -> Part | None:
    """The part for variants that read the training set (Focal-SAM, bSAM), else nothing."""
    cls = VARIANTS.entry(run.cfg.optimizer.name).target
    needs = hasattr(cls, "set_class_counts") or hasattr(cls, "set_num_data")
    return DatasetFacts() if needs else None
