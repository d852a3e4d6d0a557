"""From config to optimizer: parameter groups, the base optimizer, the variant.

The runner builds one parameter group per (functional block, kind): the block is the
model's top-level child that owns the parameter (normalisation layers sit in their
layer's block), the kind is ``weight`` (conv, linear and normalisation weights) or
``bias``, split further by ``hidden`` (a Linear/Conv weight other than the first layer's and
the head's; see blocks.py) and ``use_muon`` (hidden 2-D matrices). Variants and the Muon base
optimizer read these keys; weight decay applies to every group, as in the SAM paper.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from torch import nn

from ..errors import UserError, integer, number, require
from ..part import Part
from ..registry import BASE_OPTIMIZERS, VARIANTS
from .blocks import hidden_weights, is_bias, top_level_blocks

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from ..part import Run
    from .engine import SharpnessAware


def parameter_groups(model: nn.Module) -> list[dict]:
    """The model's trainable parameters in groups, one per (block, kind, hidden, use_muon), in
    model order: the groups every variant and base optimizer reads."""
    hidden = hidden_weights(model)
    owner = top_level_blocks(model)
    by_key: dict[tuple, list] = {}  # (block, kind, hidden, use_muon) -> params, in model order
    for n, p in model.named_parameters():
        if not p.requires_grad:
            continue
        kind = "bias" if is_bias(n, p) else "weight"
        h = id(p) in hidden
        by_key.setdefault((owner[id(p)], kind, h, h and p.ndim == 2), []).append(p)
    # blocks in model order; within a block weights before biases, Muon matrices first
    blocks = list(dict.fromkeys(owner[id(p)] for p in model.parameters()))
    order = sorted(by_key, key=lambda k: (blocks.index(k[0]), k[1] == "bias", not k[3], not k[2]))
    return [
        dict(params=by_key[k], block=k[0], kind=k[1], hidden=k[2], use_muon=k[3]) for k in order
    ]


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
    try:
        return cls(
            groups, base_cls, total_steps=total_steps, steps_per_epoch=steps_per_epoch,
            **kwargs, **base_kwargs,
        )  # fmt: skip
    except (ValueError, TypeError) as e:
        raise UserError(f"optimizer={cfg.optimizer.name}: {e}") from None


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
