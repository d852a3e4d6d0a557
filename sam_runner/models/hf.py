"""``model=hf``: a Hugging Face ``transformers`` model by hub id or local folder (``model.name``),
or built fresh from a config mapping (``model.config``, no download) — docs/language_models.md.

The Auto class comes from ``model.task``: ``causal_lm`` (``AutoModelForCausalLM``: ``[B, T]``
token ids in, ``[B, T, V]`` logits out, as ``model=gpt``, so the text data, per-token ECE,
perplexity and bits per byte apply unchanged), ``sequence_classification``
(``AutoModelForSequenceClassification``: ``[B, T]`` ids of ``dataset=table``, ``[B, C]``
logits) and ``image_classification`` (``AutoModelForImageClassification``: images in,
``[B, C]`` logits).

Offline first: weights are read from a local folder or the Hugging Face cache only, unless
``model.download=true``; absent, the run stops before it writes anything, with one line naming
the id and how to provide it. The attention implementation is ``eager`` by default
(``model.attention``): its plain matrix products have second derivatives, which the Hessian's
vector products need (fused kernels such as flash attention have none).

Nothing here imports ``transformers`` until a model is built: the registry imports this module.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from torch import nn

from ..errors import UserError, one_line, require
from ..part import Part
from ..paths import folder_or_hub_id
from ..registry import MODELS

INSTALL = "pip install -e '.[hf]'"
TASKS = {
    "causal_lm": "AutoModelForCausalLM",
    "sequence_classification": "AutoModelForSequenceClassification",
    "image_classification": "AutoModelForImageClassification",
}
TASK_INPUTS = {"causal_lm": 1, "sequence_classification": 1, "image_classification": 3}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")  # fmt: skip


def transformers():
    """The ``transformers`` module, or one line naming the extra that installs it."""
    try:
        import transformers as tf
    except ImportError:
        raise UserError(
            f"model=hf needs the transformers library; install it with {INSTALL}"
        ) from None
    return tf


def task(model_cfg) -> str:
    value = str(model_cfg.get("task", "causal_lm"))
    require(value in TASKS, f"model.task={value!r} is unknown; choose one of {', '.join(TASKS)}")
    return value


def dtype(model_cfg) -> torch.dtype:
    value = str(model_cfg.get("dtype", "fp32"))
    require(value in DTYPES, f"model.dtype={value!r} is unknown; choose fp32 or bf16")
    return DTYPES[value]


def _plain(value):
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(value, (DictConfig, ListConfig)):
        return OmegaConf.to_container(value, resolve=True)
    return value


def _name(model_cfg) -> str | None:
    name = model_cfg.get("name")
    return None if name in (None, "", "???") else str(name)


def _offline(model_cfg) -> bool:
    return not bool(model_cfg.get("download", False)) or os.environ.get("HF_HUB_OFFLINE") == "1"


def _where(name: str) -> str:
    return "the folder" if Path(name).expanduser().is_dir() else "the Hugging Face cache"


def _how_to_provide(name: str) -> str:
    return (
        f"download it once with model.download=true (or `huggingface-cli download {name}`), "
        "or give a local folder a save_pretrained model was written to: model.name=DIR"
    )


def resolve_config(model_cfg, input_shape, num_classes):
    """The ``transformers`` config the run builds: ``model.config`` (fresh; ``model_type`` names
    the architecture; the vocabulary, label count and image size taken from the data when it
    leaves them out), else ``model.name``'s own config (read locally unless
    ``model.download``)."""
    tf = transformers()
    chosen = task(model_cfg)
    given = _plain(model_cfg.get("config"))
    if given not in (None, {}):
        config = _fresh_config(tf, given, chosen, input_shape, num_classes)
    else:
        config = _named_config(tf, model_cfg)
    if chosen != "causal_lm":
        config.num_labels = int(num_classes)
    return config


def _fresh_config(tf, given, chosen: str, input_shape, num_classes):
    """``model.config``'s mapping as a ``transformers`` config, completed from the data."""
    require(
        isinstance(given, dict) and "model_type" in given,
        "model.config must be a mapping with model_type (the architecture, e.g. llama, "
        "gpt2, bert, vit) and that architecture's keys",
    )
    given = dict(given)
    kind = given.pop("model_type")
    if chosen == "causal_lm":
        given.setdefault("vocab_size", num_classes)
    elif chosen == "sequence_classification":
        given.setdefault("vocab_size", 256)
    if chosen == "image_classification":
        given.setdefault("image_size", int(input_shape[-1]))
        given.setdefault("num_channels", int(input_shape[0]))
    try:
        defaults = tf.AutoConfig.for_model(kind)
        vocab = given.get("vocab_size")
        for key in ("bos_token_id", "eos_token_id", "pad_token_id"):  # the architecture's
            value = getattr(defaults, key, None)  # ids beyond a small vocabulary: none
            if key not in given and isinstance(value, int) and vocab and value >= vocab:
                given[key] = None
        return tf.AutoConfig.for_model(kind, **given)
    except (ValueError, KeyError, TypeError) as e:
        raise UserError(f"model.config (model_type={kind}): {one_line(e)}") from None


def _named_config(tf, model_cfg):
    """``model.name``'s own config: a folder's ``config.json``, or a hub id's (the cache's)."""
    name = _name(model_cfg)
    require(
        name is not None,
        "model=hf needs model.name (a hub id or a local folder) or model.config (a mapping "
        "with model_type: a fresh model, no download)",
    )
    ref, looks_local = folder_or_hub_id(
        "model.name", name, "a folder a save_pretrained model was written to, or a hub id"
    )
    try:
        return tf.AutoConfig.from_pretrained(
            ref,
            revision=model_cfg.get("revision") or None,
            local_files_only=_offline(model_cfg),
        )
    except (OSError, ValueError) as e:
        if looks_local:
            raise UserError(
                f"model.name={name}: the folder holds no transformers model ({one_line(e)})"
            ) from None
        raise UserError(
            f"model.name={name}: not found in {_where(name)} (offline: model.download=false); "
            + _how_to_provide(name)
        ) from None


def _weights_present(name: str, model_cfg) -> bool:
    path = Path(name).expanduser()
    if path.is_dir():
        return any((path / f).is_file() for f in WEIGHT_FILES)
    from huggingface_hub import try_to_load_from_cache

    revision = model_cfg.get("revision") or None
    return any(
        isinstance(try_to_load_from_cache(name, f, revision=revision), str) for f in WEIGHT_FILES
    )


def check_weights(model_cfg) -> None:
    """``model.pretrained`` weights of ``model.name`` are on this machine (or may be downloaded):
    one line naming the id and how to provide them, before anything is written."""
    name = _name(model_cfg)
    if name is None or model_cfg.get("config") not in (None, {}):
        return
    if not model_cfg.get("pretrained", True) or not _offline(model_cfg):
        return
    require(
        _weights_present(name, model_cfg),
        f"model.name={name}: its weights are not in {_where(name)} (offline: "
        f"model.download=false); {_how_to_provide(name)}",
    )


class HFModel(nn.Module):
    """A ``transformers`` model under the runner's calling convention: ``forward(x)`` returns
    logits alone (``[B, T, V]`` for a causal LM, ``[B, C]`` for a classifier). The wrapped model
    is ``self.hf`` (a ``peft`` model once adapters are attached). Sequence classification masks
    the padding (``pad_token_id``, the token ``dataset=table`` pads with)."""

    def __init__(self, hf_model: nn.Module, task_name: str, pad_token_id: int | None = None):
        super().__init__()
        self.hf, self.task, self.pad_token_id = hf_model, task_name, pad_token_id

    def forward(self, x):
        if self.task == "image_classification":
            return self.hf(pixel_values=x).logits
        if self.task == "sequence_classification":
            mask = None if self.pad_token_id is None else (x != self.pad_token_id).long()
            return self.hf(input_ids=x, attention_mask=mask).logits
        logits = self.hf(input_ids=x, use_cache=False).logits
        return logits[:, -x.shape[1] :]  # a peft prompt's virtual tokens give no logits

    def parameter_blocks(self) -> dict[int, str]:
        """``id(parameter) -> block``, the functional blocks the optimizers read (GEAR-SAM's
        blocks, per-block λ_max, parameter groups): ``embed`` (the input embeddings), ``layer1``..
        (the transformer's repeated layers, adapters inside them included), ``head`` (the rest of
        the model: final norm, output layer or classifier, position embeddings) and ``adapter``
        (what ``peft`` holds outside the model: a prompt's or prefix's vectors)."""
        base = self.base_model
        owner: dict[int, str] = {}
        embed = base.get_input_embeddings() if hasattr(base, "get_input_embeddings") else None
        for p in embed.parameters() if embed is not None else ():
            owner[id(p)] = "embed"
        for i, layer in enumerate(_repeated_layers(base), 1):
            for p in layer.parameters():
                owner.setdefault(id(p), f"layer{i}")
        for p in base.parameters():
            owner.setdefault(id(p), "head")
        for p in self.parameters():
            owner.setdefault(id(p), "adapter")
        return owner

    @property
    def base_model(self) -> nn.Module:
        """The ``transformers`` model itself (under a ``peft`` wrapper, the one it wraps)."""
        inner = self.hf
        get = getattr(inner, "get_base_model", None)
        return get() if get is not None else inner


def _repeated_layers(model: nn.Module) -> list:
    """The transformer's layers: the longest ModuleList of one module class."""
    lists = [
        m
        for m in model.modules()
        if isinstance(m, nn.ModuleList) and len(m) and len({type(x) for x in m}) == 1
    ]
    return list(max(lists, key=len)) if lists else []


def _version(text: str) -> tuple:
    return tuple(int(p) for p in text.split(".")[:2] if p.isdigit())


def _meta() -> bool:
    return torch.empty(0).device.type == "meta"


@MODELS.register(
    "hf",
    "a Hugging Face transformers model (model.name: hub id or folder; model.config: fresh; "
    "model.task)",
    inputs="any",
)
def hf(cfg, input_shape, num_classes):
    tf = transformers()
    chosen = task(cfg)
    want = TASK_INPUTS[chosen]
    require(
        len(input_shape) == want,
        f"model=hf model.task={chosen} needs "
        + ("token sequences (dataset=text or dataset=table)" if want == 1 else "images")
        + f", got inputs of shape {tuple(input_shape)}",
    )
    config = resolve_config(cfg, input_shape, num_classes)
    if chosen == "causal_lm":
        vocab = int(getattr(config, "vocab_size", 0) or 0)
        require(
            vocab >= num_classes,
            f"the data has {num_classes} token ids and model=hf's vocabulary {vocab}; set "
            f"model.config.vocab_size >= {num_classes} or a dataset.tokenizer that fits the model",
        )
    attention = str(cfg.get("attention", "eager"))
    auto = getattr(tf, TASKS[chosen])
    name = _name(cfg)
    pretrained = (
        name is not None and cfg.get("config") in (None, {}) and cfg.get("pretrained", True)
    )
    # transformers 4.56 renamed torch_dtype to dtype
    dtype_key = "dtype" if _version(tf.__version__) >= (4, 56) else "torch_dtype"
    options = {"attn_implementation": attention, dtype_key: dtype(cfg)}
    try:
        if pretrained and not _meta():
            check_weights(cfg)
            model = auto.from_pretrained(
                name,
                config=config,
                revision=cfg.get("revision") or None,
                local_files_only=_offline(cfg),
                ignore_mismatched_sizes=chosen != "causal_lm",  # a new head of another size
                **options,
            )
        else:
            if pretrained:
                check_weights(cfg)
            model = auto.from_config(config, **options)
    except ValueError as e:
        if "Unrecognized configuration class" in str(e):
            kind = getattr(config, "model_type", "?")
            raise UserError(
                f"model=hf: a {kind} model has no {chosen} head ({TASKS[chosen]} does not "
                "know it); choose another model.task or architecture"
            ) from None
        raise UserError(f"model=hf: {one_line(e)}") from None
    except OSError as e:
        raise UserError(f"model=hf model.name={name}: {one_line(e)}") from None
    if chosen == "causal_lm" and hasattr(model.config, "use_cache"):
        model.config.use_cache = False
    return HFModel(model, chosen, _padding(cfg, chosen, model))


def _padding(cfg, chosen: str, model: nn.Module) -> int | None:
    """The id a classifier masks, set in its config too: the id the data is padded with (the
    data's tokenizer's pad token, else 0), whatever the checkpoint's config says, since the
    mask and the classifier's last-token pooling find each row's end by it."""
    if chosen != "sequence_classification":
        return getattr(model.config, "pad_token_id", None)
    from ..data.tokenized import pad_id, tokenizer_name

    model.config.pad_token_id = pad_id(tokenizer_name(cfg))
    return model.config.pad_token_id


def describe(model_cfg, model: nn.Module | None = None) -> dict:
    """What summary.json and the logger record of an hf model: its id or folder, revision,
    task, dtype, architecture, and the commit the weights came from (where known)."""
    out = {
        "name": _name(model_cfg) or "(model.config)",
        "revision": model_cfg.get("revision") or None,
        "task": task(model_cfg),
        "dtype": str(model_cfg.get("dtype", "fp32")),
        "attention": str(model_cfg.get("attention", "eager")),
    }
    base = getattr(model, "base_model", None) if model is not None else None
    if base is not None:
        out["model_type"] = getattr(base.config, "model_type", None)
        commit = getattr(base.config, "_commit_hash", None)
        if commit:
            out["commit"] = commit
    return out


class ModelRecord(Part):
    """The run part of ``model=hf``: summary.json's ``hf_model`` (id, revision, task, dtype,
    attention, architecture, the weights' commit)."""

    def __init__(self, record: dict):
        self.record = record

    def summary_values(self, last: dict) -> dict:  # noqa: ARG002 (the hook's signature)
        return {"hf_model": self.record}


def build_part(run):
    """``model=hf``'s record (None for the runner's own models)."""
    if str(run.cfg.model.get("arch")) != "hf":
        return None
    return ModelRecord(describe(run.cfg.model, run.model))


def check(cfg, where=None) -> None:  # noqa: ARG001 (every check's signature)
    """``model=hf``: the extra is installed, and ``model.name``'s weights are here (or may be
    downloaded), before anything is written."""
    if str(cfg.model.get("arch")) != "hf":
        return
    transformers()
    task(cfg.model)
    dtype(cfg.model)
    check_weights(cfg.model)
