"""``model.peft`` on ``model=hf``: adapters through the ``peft`` library (docs/fine_tuning.md).

One adapter path per model kind: ``model=hf`` goes through ``peft`` (``lora``, ``dora``, ``ia3``,
``prompt``, ``prefix``, with ``peft``'s own config keys in ``model.peft_config``); the runner's own
models keep our LoRA layers (lora.py), which adapt dilated convolutions where ``peft`` refuses.

``peft`` freezes every pretrained tensor and makes the adapters (and ``modules_to_save``: a
classifier's new head) trainable; the optimizer sees those alone, so every SAM variant perturbs
the adapters. The run's adapters are written with ``save_pretrained`` into the run folder's
``adapter/`` at every checkpoint, so that ``peft.PeftModel.from_pretrained(base, RUN/adapter)``
loads them; the checkpoint keeps the whole model (the pretrained tensors unchanged) for exact
resume, sam-eval and sam-landscape.
"""

from __future__ import annotations

import copy
from pathlib import Path

from torch import nn

from ..errors import UserError, one_line, require
from ..part import Part
from ..rundir import ADAPTER

INSTALL = "pip install -e '.[hf]'"
# model.peft -> (peft's config class, the keyword that turns it on where it is a LoRA option)
CONFIGS = {
    "lora": "LoraConfig",
    "dora": "LoraConfig",
    "ia3": "IA3Config",
    "prompt": "PromptTuningConfig",
    "prefix": "PrefixTuningConfig",
}
TASK_TYPES = {"causal_lm": "CAUSAL_LM", "sequence_classification": "SEQ_CLS"}
VIRTUAL = ("prompt", "prefix")  # methods that add virtual tokens (a causal LM or a classifier)
SHOWN = 12


def peft_module():
    try:
        import peft
    except ImportError:
        raise UserError(f"model.peft on model=hf needs the peft library; {INSTALL}") from None
    return peft


def _plain(value) -> dict:
    from omegaconf import DictConfig, OmegaConf

    if isinstance(value, DictConfig):
        value = OmegaConf.to_container(value, resolve=True)
    return {k: v for k, v in dict(value or {}).items() if v is not None}  # null: peft's default


def layer_names(model: nn.Module) -> list[str]:
    """The distinct last names of the model's Linear-like layers (what ``target_modules`` may
    name): ``q_proj``, ``c_attn``, ``query``, ..."""
    names = []
    for n, m in model.named_modules():
        kind = type(m).__name__
        if n and (isinstance(m, (nn.Linear, nn.Conv2d, nn.Embedding)) or kind == "Conv1D"):
            last = n.rsplit(".", 1)[-1]
            if last not in names:
                names.append(last)
    return names


def peft_config(model_cfg, chosen: str, task: str, base: nn.Module):
    """``peft``'s config object for ``model.peft`` with ``model.peft_config``'s keys."""
    peft = peft_module()
    options = _plain(model_cfg.get("peft_config"))
    if chosen == "dora":
        options["use_dora"] = True
    if chosen in VIRTUAL:
        options.setdefault("num_virtual_tokens", 8)
    task_type = TASK_TYPES.get(task)
    if task_type is not None:
        options.setdefault("task_type", task_type)
    else:
        require(
            chosen not in VIRTUAL,
            f"model.peft={chosen} adds virtual tokens, for token inputs; model.task={task} takes "
            "images: use model.peft=lora, dora or ia3",
        )
        head = _head_name(base)
        if head is not None:
            options.setdefault("modules_to_save", [head])
    if chosen == "ia3" and "target_modules" in options and "feedforward_modules" not in options:
        options["feedforward_modules"] = []
    cls = getattr(peft, CONFIGS[chosen])
    try:
        return cls(**options)
    except TypeError as e:
        raise UserError(f"model.peft_config for model.peft={chosen}: {one_line(e)}") from None


def _head_name(base: nn.Module) -> str | None:
    """An image classifier's head (trained in full beside the adapters: it starts afresh)."""
    for name in ("classifier", "score", "head"):
        if isinstance(getattr(base, name, None), nn.Module):
            return name
    return None


def attach(model_cfg, model: nn.Module, input_shape=None) -> dict:
    """Wrap ``model.hf`` (``models.hf.HFModel``) with ``peft``; returns the summary record."""
    peft = peft_module()
    from ..models.hf import task as hf_task

    chosen = str(model_cfg.get("peft"))
    task = hf_task(model_cfg)
    base = model.hf
    config = peft_config(model_cfg, chosen, task, base)
    if chosen in VIRTUAL and input_shape is not None and task == "causal_lm":
        limit = getattr(base.config, "max_position_embeddings", None)
        total = int(input_shape[0]) + int(config.num_virtual_tokens)
        require(
            limit is None or total <= limit,
            f"model.peft_config.num_virtual_tokens={config.num_virtual_tokens} + "
            f"dataset.block_size={input_shape[0]} = {total} is more than the model's context "
            f"{limit}",
        )
    model.hf = _wrapped(peft, base, config, chosen)
    _dry_run(model, chosen, task)
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    require(trainable, f"model.peft={chosen} left no trainable parameter in this model")
    shown = {k: v for k, v in _plain(model_cfg.get("peft_config")).items()}
    return {"method": chosen, "library": "peft", "peft_version": peft.__version__,
            "config": shown, "adapter_dir": ADAPTER}  # fmt: skip


# the attention projections LoRA adapts by default, by naming convention, where peft's table of
# defaults does not know the architecture (or knows older names: ViT's query/value)
DEFAULT_TARGETS = (("q_proj", "v_proj"), ("query", "value"), ("c_attn",), ("qkv",))


def _wrapped(peft, base: nn.Module, config, chosen: str) -> nn.Module:
    """``peft.get_peft_model``; target modules that match nothing are one line naming the model's
    layers (left unset, the attention projections by name are tried first)."""
    given = getattr(config, "target_modules", None)
    names = layer_names(base)
    try:
        return peft.get_peft_model(base, config)
    except ValueError as e:
        text = str(e)
        if "target_modules" not in text and "not found in the base model" not in text:
            raise UserError(f"model.peft={chosen}: {one_line(e)}") from None
    fallback = next((t for t in DEFAULT_TARGETS if all(n in names for n in t)), None)
    if given is None and fallback is not None and hasattr(config, "target_modules"):
        config.target_modules = set(fallback)
        if hasattr(config, "feedforward_modules"):
            config.feedforward_modules = set()
        return peft.get_peft_model(base, config)
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    what = (
        f"model.peft_config.target_modules={sorted(given)} matches no layer of this model"
        if given is not None
        else "peft has no default target_modules for this architecture; set "
        "model.peft_config.target_modules"
    )
    raise UserError(f"{what}; its layers: {', '.join(names[:SHOWN])}{more}")


def _dry_run(model: nn.Module, chosen: str, task: str) -> None:
    """One forward of two tokens (on the meta device in the preflight check): what ``peft``
    refuses only when it runs (prefix tuning on a model without a key-value cache) is one line
    before anything is written."""
    if task == "image_classification":
        return
    device = next(model.parameters()).device
    import torch

    training = model.training
    model.eval()  # no dropout: the run's random numbers stay as they were
    try:
        with torch.no_grad():
            model(torch.zeros(1, 2, dtype=torch.long, device=device))
    except ValueError as e:
        raise UserError(f"model.peft={chosen} on this model: {one_line(e)}") from None
    except Exception:  # anything else shows when the run starts, with its own message
        pass
    finally:
        model.train(training)


def save_adapter(model: nn.Module, run_dir: Path) -> Path:
    """The adapters written with ``save_pretrained`` into ``run_dir/adapter`` (atomically: a
    fresh folder renamed over the old one)."""
    import shutil

    target = Path(run_dir) / ADAPTER
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.hf.save_pretrained(str(tmp))
    old = target.with_name(target.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if target.exists():
        target.rename(old)
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    return target


class PeftPart(Part):
    """``model.peft`` on ``model=hf``: the summary record, and ``adapter/`` beside each
    checkpoint."""

    def __init__(self, model: nn.Module, record: dict):
        self.model, self.record = model, record

    def summary_values(self, last: dict) -> dict:  # noqa: ARG002 (the hook's signature)
        return {"peft": self.record}

    def save_files(self, run_dir) -> None:
        save_adapter(self.model, run_dir)


def merged_copy(model: nn.Module) -> nn.Module:
    """A copy of an hf model whose LoRA adapters are merged into the weights (a test's
    reference, and a deployable model)."""
    out = copy.deepcopy(model)
    out.hf = out.hf.merge_and_unload()
    return out
