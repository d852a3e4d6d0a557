"""Parameter-efficient fine-tuning (``model.peft``) of the weights ``model.init_from`` gives.

``model.peft=lora`` adds low-rank adapters (lora.py) to the Linear/Conv layers whose names match
``model.lora.targets`` and freezes everything else: the pretrained weights and buffers stay as
they were loaded (BatchNorm layers among them normalise with their pretrained running statistics,
whatever the model's mode, so that nothing of the pretrained model changes; our choice), and are
saved unchanged in the checkpoint beside the adapters. Trained in full beside the adapters: the
classifier when ``model.reset_head=true`` (it starts afresh) and the modules matching
``model.lora.train_also``. The optimizer sees the trainable parameters only, so every SAM variant
perturbs them alone (ρ's norm is over them).

``model.peft=prompt`` (prompt.py) prepends ``model.prompt.length`` learned vectors to a GPT's
token embeddings and freezes every other tensor; the prompt's positions are left out of the
output, so the loss and metrics are the real tokens'.

Our own code: the ``peft`` library needs transformers and accelerate, more than a few adapters
are worth; tests/test_lora.py checks our layers against it where it is installed.
"""

from __future__ import annotations

import contextlib
import fnmatch
import math
from typing import TYPE_CHECKING

from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from ..errors import UserError, integer, number, require
from .lora import ADAPTABLE, LoRA, adaptable, add_lora, max_rank
from .prompt import SoftPrompt, add_prompt

if TYPE_CHECKING:
    from omegaconf import DictConfig

METHODS = ("none", "lora", "prompt")  # on the runner's own models
HF_METHODS = ("none", "lora", "dora", "ia3", "prompt", "prefix")  # model=hf, through peft
SHOWN = 12  # layer names an error lists at most


def method(model_cfg: DictConfig) -> str:
    """``model.peft``, checked: none, lora or prompt (model=hf: also dora, ia3, prefix)."""
    value = model_cfg.get("peft", "none") or "none"
    hf = str(model_cfg.get("arch")) == "hf"
    choices = HF_METHODS if hf else METHODS
    if not hf and value in HF_METHODS and value not in METHODS:
        raise UserError(
            f"model.peft={value} goes through the peft library, on model=hf; the runner's own "
            f"models take {', '.join(METHODS)}"
        )
    require(
        value in choices, f"model.peft={value!r} is unknown; choose one of {', '.join(choices)}"
    )
    return str(value)


def trainable_parameters(model: nn.Module) -> int:
    """How many scalars of the model are trained (``requires_grad``)."""
    return int(sum(p.numel() for p in model.parameters() if p.requires_grad))


def _matches(name: str, patterns) -> bool:
    """Whether a glob of ``patterns`` matches ``name`` or one of its parents' names (``stage1``
    matches ``stage1.0``; ``*`` matches every name)."""
    parts = name.split(".")
    names = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return any(fnmatch.fnmatchcase(n, p) for n in names for p in patterns)


def _patterns(key: str, value) -> list[str]:
    value = [value] if isinstance(value, str) else list(value or [])
    require(
        all(isinstance(p, str) and p for p in value),
        f"{key}={value!r} must be a list of layer-name patterns, e.g. ['*'] or [stem, 'stage*']",
    )
    return value


def _listed(names: list[str]) -> str:
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    return ", ".join(names[:SHOWN]) + more


def _fully_trained(model_cfg: DictConfig, model: nn.Module) -> list[str]:
    """Names of the modules trained in full: the classifier under ``model.reset_head`` and
    those ``model.lora.train_also`` names."""
    from ..models import classifier_name

    lora = model_cfg.get("lora") or {}
    patterns = _patterns("model.lora.train_also", lora.get("train_also", []))
    every = [n for n, _ in model.named_modules() if n]
    names = [n for n in every if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    for p in patterns:
        require(
            any(fnmatch.fnmatchcase(n, p) for n in every),
            f"model.lora.train_also: {p!r} matches no module of this model; its top-level "
            f"modules are {_listed([n for n, _ in model.named_children()])}",
        )
    head = classifier_name(model) if model_cfg.get("reset_head", False) else None
    return names + ([head] if head else [])


def lora_options(model_cfg: DictConfig) -> tuple[int, float, float, list[str]]:
    """(rank, alpha, dropout, targets) of ``model.lora``, checked."""
    lora = model_cfg.get("lora") or {}
    rank = integer("model.lora.rank", lora.get("rank", 4), "an integer >= 1", lambda r: r >= 1)
    alpha = number(
        "model.lora.alpha", lora.get("alpha", 8), "a finite number > 0", lambda a: 0 < a < math.inf
    )
    dropout = number(
        "model.lora.dropout",
        lora.get("dropout", 0.0),
        "a probability in [0, 1)",
        lambda p: 0 <= p < 1,
    )
    return rank, alpha, dropout, _patterns("model.lora.targets", lora.get("targets", ["*"]))


def _freeze_norm_statistics(module: _BatchNorm, _args) -> None:
    """A frozen BatchNorm normalises with its pretrained running statistics, in any mode (a
    forward pre-hook: ``model.train()`` sets the flag back, the hook clears it before each
    call)."""
    module.training = False


def prompt_length(model_cfg: DictConfig) -> int:
    """``model.prompt.length``, checked."""
    given = (model_cfg.get("prompt") or {}).get("length", 8)
    return integer("model.prompt.length", given, "an integer >= 1", lambda n: n >= 1)


def _attach_prompt(model_cfg, model: nn.Module, input_shape) -> dict:
    """``model.peft=prompt``: a soft prompt on the GPT, every other tensor frozen."""
    length = prompt_length(model_cfg)
    if input_shape is not None:  # the data's windows; a rebuilt run was checked when it ran
        tokens, context = int(input_shape[0]), int(model.context)
        require(
            length + tokens <= context,
            f"model.prompt.length={length} + dataset.block_size={tokens} = {length + tokens} is "
            f"more than the model's context model.block_size={context}; shorten the prompt or "
            f"the windows (the pretrained model's context is fixed by its position embeddings)",
        )
    model.requires_grad_(False)
    add_prompt(model, length)
    return {"method": "prompt", "length": length, "layers": ["embed.prompt"]}


def attach_adapters(model_cfg: DictConfig, model: nn.Module, input_shape=None) -> dict | None:
    """Apply ``model.peft`` to ``model`` (its pretrained weights already loaded, or about to be
    loaded over it, as a rebuilt run's are): adapters added, everything else frozen. Returns a
    record for summary.json, or None with ``model.peft=none``. ``input_shape`` (the data's):
    a soft prompt and the data's windows must fit the GPT's context together."""
    chosen = method(model_cfg)
    if chosen == "none":
        return None
    if str(model_cfg.get("arch")) == "hf":  # one adapter path per model kind: peft for hf
        from .hf_peft import attach

        return attach(model_cfg, model, input_shape)
    require(
        model_cfg.get("init_from") not in (None, ""),
        f"model.peft={chosen} fine-tunes given weights: set model.init_from (a run folder, a "
        "checkpoint file or a state_dict file)",
    )
    arch = str(model_cfg.get("arch"))
    if chosen == "prompt":
        if arch != "gpt":
            raise UserError(
                f"model.peft=prompt prepends learned vectors to a GPT's input, and model={arch} "
                "is not one: use model=gpt, or model.peft=lora"
            )
        return _attach_prompt(model_cfg, model, input_shape)
    rank, alpha, dropout, targets = lora_options(model_cfg)
    full = _fully_trained(model_cfg, model)
    in_full = lambda name: any(name == f or name.startswith(f"{f}.") for f in full)
    candidates = [n for n, m in model.named_modules() if adaptable(m) and not in_full(n)]
    for p in targets:
        require(
            any(_matches(n, [p]) for n in candidates),
            f"model.lora.targets: {p!r} matches no Linear/Conv layer; the layers it could match: "
            f"{_listed(candidates)}",
        )
    chosen_layers = [n for n in candidates if _matches(n, targets)]
    modules = dict(model.named_modules())
    for n in chosen_layers:
        most = max_rank(modules[n])
        require(
            rank <= most,
            f"model.lora.rank={rank} is larger than layer {n} allows (min(d_in, d_out) = {most}); "
            "lower the rank or leave the layer out of model.lora.targets",
        )
    model.requires_grad_(False)
    for n in full:
        modules[n].requires_grad_(True)
    for n in chosen_layers:
        add_lora(modules[n], rank, alpha, dropout)
    for n, m in model.named_modules():
        if isinstance(m, _BatchNorm) and not in_full(n):
            m.register_forward_pre_hook(_freeze_norm_statistics)
    return {
        "method": "lora",
        "rank": rank,
        "alpha": alpha,
        "dropout": dropout,
        "layers": chosen_layers,
        "trained_in_full": full,
    }


def adapter_names(model: nn.Module) -> list[str]:
    """The state-dict names of the adapters' tensors (LoRA's and a soft prompt's)."""
    tensors = lambda m: ("lora_A", "lora_B") if isinstance(m, LoRA) else ("vectors",)
    return [
        f"{n}.{k}"
        for n, m in model.named_modules()
        if isinstance(m, (LoRA, SoftPrompt))
        for k in tensors(m)
    ]


@contextlib.contextmanager
def every_parameter_trainable(model: nn.Module):
    """Every parameter requires a gradient until the context closes (a curvature measurement
    over all of a PEFT run's parameters: ``metrics.hessian.params=all``)."""
    frozen = [p for p in model.parameters() if not p.requires_grad]
    for p in frozen:
        p.requires_grad_(True)
    try:
        yield
    finally:
        for p in frozen:
            p.requires_grad_(False)


__all__ = [
    "ADAPTABLE",
    "HF_METHODS",
    "METHODS",
    "adapter_names",
    "attach_adapters",
    "every_parameter_trainable",
    "method",
    "prompt_length",
    "trainable_parameters",
]
