"""What a run was: the model actually built, the versions, the device, the code's git commit."""

from __future__ import annotations

import functools
import platform
import subprocess
from typing import TYPE_CHECKING

import torch

from . import __version__
from .adapters import trainable_parameters
from .models import auto_arch
from .paths import PACKAGE_DIR

if TYPE_CHECKING:
    from collections.abc import Sequence

    from omegaconf import DictConfig
    from torch import nn


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The commit of the checkout sam_runner runs from (``+dirty`` with uncommitted changes);
    None when it is installed from a wheel or git is absent."""

    def git(*args):
        return subprocess.run(
            ["git", "-C", str(PACKAGE_DIR), *args], capture_output=True, text=True, timeout=10
        )

    try:
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None
        dirty = git("status", "--porcelain", "--untracked-files=no").stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty else "")


def built_model(model_cfg: DictConfig, input_shape: Sequence[int]) -> str:
    """The architecture ``model`` built: ``auto`` resolved, a timm model by its name."""
    arch = str(model_cfg.arch)
    if arch == "auto":
        return auto_arch(tuple(input_shape))
    if arch == "hf":
        return f"hf:{model_cfg.get('name') or (model_cfg.get('config') or {}).get('model_type')}"
    return f"timm:{model_cfg.get('name')}" if arch == "timm" else arch


def describe_device(device: torch.device) -> str:
    """The device with its name (a GPU's model; the CPU's processor and threads)."""
    if device.type == "cuda":
        return f"{device} ({torch.cuda.get_device_name(device)})"
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def provenance(
    model: nn.Module, model_cfg: DictConfig, input_shape: Sequence[int], device: torch.device
) -> dict:
    """What the run's summary records of how it ran: the model built, its parameter counts, the
    device, the versions."""
    out = {
        "model_built": built_model(model_cfg, input_shape),
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "trainable_parameters": trainable_parameters(model),  # the adapters' alone under PEFT
        "versions": {
            "sam_runner": __version__,
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "device": describe_device(device),
    }
    commit = git_commit()
    if commit:
        out["git_commit"] = commit
    return out
