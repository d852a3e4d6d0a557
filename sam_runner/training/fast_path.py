"""The GPU fast path: ``trainer.precision``, ``trainer.channels_last``,
``trainer.cudnn_benchmark`` and ``trainer.compile`` may each be ``auto``, resolved once at setup
from the device and the model (never per step) and recorded in summary.json's ``fast_path``.

``auto`` on CUDA: bf16 autocast where the GPU computes in bf16 (fp32 where it does not),
channels_last for a convolutional model on images, ``cudnn.benchmark`` and ``torch.compile``.
``auto`` on a CPU: fp32, contiguous, eager, exactly as the explicit ``fp32``/``false`` values,
which stay the opt-out everywhere (docs/running.md, "The GPU fast path")."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
from torch import nn

from ..errors import require
from ..settings import PRECISIONS

if TYPE_CHECKING:
    from omegaconf import DictConfig

AUTO = "auto"
TRAINER_PRECISIONS = (AUTO, *PRECISIONS)
SWITCHES = ("channels_last", "cudnn_benchmark", "compile")  # each auto, true or false


class FastPath(NamedTuple):
    """A run's resolved fast-path settings: what ran, whatever the config said."""

    precision: str  # fp32 | bf16 | fp16
    channels_last: bool
    cudnn_benchmark: bool
    compile: bool


def validate_fast_path(t: DictConfig) -> None:
    """One-line UserErrors for ``trainer.precision`` and the three switches' values.

    Args:
        t: the ``trainer`` group.
    """
    precision = t.get("precision", "fp32")
    require(
        precision in TRAINER_PRECISIONS,
        f"trainer.precision={precision!r} is unknown; choose {', '.join(TRAINER_PRECISIONS)}",
    )
    for key in SWITCHES:
        value = t.get(key, False)
        require(
            isinstance(value, bool) or value == AUTO,
            f"trainer.{key}={value!r} is unknown; choose auto, true or false",
        )


def resolved_precision(
    precision: str, device: torch.device | str, bf16_supported: bool | None = None
) -> str:
    """``trainer.precision`` on ``device``: ``auto`` is bf16 on a CUDA device that computes in
    bf16, fp32 elsewhere; any other value is itself.

    Args:
        precision: ``trainer.precision``.
        device: the run's device.
        bf16_supported: whether the CUDA device computes in bf16 (None: ask torch).
    """
    if precision != AUTO:
        return precision
    if torch.device(device).type != "cuda":
        return "fp32"
    if bf16_supported is None:
        bf16_supported = torch.cuda.is_bf16_supported()
    return "bf16" if bf16_supported else "fp32"


def resolve(
    t: DictConfig,
    device_type: str,
    bf16_supported: bool = False,
    convolutional: bool = False,
    images: bool = False,
) -> FastPath:
    """The fast path ``t`` asks for on a device of ``device_type`` (a pure function of its
    arguments: the tests resolve for CUDA on a CPU).

    Args:
        t: the ``trainer`` group.
        device_type: ``cuda`` or ``cpu``.
        bf16_supported: whether that CUDA device computes in bf16.
        convolutional: whether the model has convolutions (channels_last helps only them).
        images: whether the inputs are images (C, H, W): channels_last is a 4-d layout.
    """
    cuda = device_type == "cuda"

    def switch(key: str, when_auto: bool) -> bool:
        value = t.get(key, False)
        return when_auto if value == AUTO else bool(value)

    precision = resolved_precision(str(t.get("precision", "fp32")), device_type, bf16_supported)
    return FastPath(
        precision=precision,
        # an explicit true too: a CUDA layout, for 4-d inputs only
        channels_last=switch("channels_last", convolutional) and cuda and images,
        cudnn_benchmark=switch("cudnn_benchmark", cuda),
        compile=switch("compile", cuda),
    )


def for_run(t: DictConfig, device: torch.device, model: nn.Module, input_shape) -> FastPath:
    """The fast path of a run on ``device`` with ``model``, resolved once at setup.

    Args:
        t: the ``trainer`` group.
        device: the run's device.
        model: the built model (its convolutions decide ``channels_last: auto``).
        input_shape: one example's shape ((C, H, W) for images).
    """
    cuda = device.type == "cuda"
    conv = any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules())
    bf16 = cuda and torch.cuda.is_bf16_supported()
    return resolve(t, device.type, bf16, conv, len(tuple(input_shape)) == 3)


def apply(fast: FastPath, model: nn.Module) -> None:
    """The settings that are set once, before training: cuDNN's autotuner (process-wide, so set
    either way: a local sweep's earlier job does not leak it) and the model's memory layout.

    Args:
        fast: the resolved fast path.
        model: the model, moved to channels_last when asked.
    """
    torch.backends.cudnn.benchmark = fast.cudnn_benchmark
    if fast.channels_last:
        model.to(memory_format=torch.channels_last)


def describe(fast: FastPath) -> str:
    """One line of what the fast path turned on, e.g. ``bf16 autocast, channels_last,
    cudnn.benchmark, compile``; ``fp32 eager`` when nothing."""
    on = [f"{fast.precision} autocast"] if fast.precision != "fp32" else []
    on += [name for name, flag in (("channels_last", fast.channels_last),
                                   ("cudnn.benchmark", fast.cudnn_benchmark),
                                   ("compile", fast.compile)) if flag]  # fmt: skip
    return ", ".join(on) or "fp32 eager"
