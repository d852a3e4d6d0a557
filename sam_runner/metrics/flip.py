"""Perturbation stability (``metrics.flip``): the flip probability of Hendrycks & Dietterich
2019's CIFAR-10-P, on sequences of small perturbations generated here from the test inputs.

For each test sample and each kind, a sequence of T = ``frames`` inputs x₀ = x, x₁, …, x_{T−1},
each a little more perturbed; the flip probability of a sample is the share of the T − 1 frames
whose predicted class differs from the previous frame's (from the first frame's for ``noise``,
whose frames are not ordered: as H&D compare noise sequences). ``flip_prob_<kind>`` is its mean
over the first ``num_samples`` test samples and ``flip_prob`` the mean over the kinds.

The sequences (ours: H&D render theirs from the clean image with their own amplitudes; ours are
generated on the model inputs, i.e. after normalization, so one amplitude means the same to
every dataset, in units of the data's standard deviation; 1-D signals and images alike, along
the last axis or the last two):

- ``noise``: x + σz_t, σ = 0.1, z_t independent standard normal draws (seeded per run and frame);
- ``translate``: x shifted by t samples/pixels along every spatial axis, the edge repeated;
- ``brightness``: x + 0.05·t;
- ``scale``: x zoomed by 1 + 0.02·t about its centre (linear/bilinear resampling, the frame
  cropped back to its size).

Every frame is evaluated in eval mode, float32, like the test set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..module_state import modes_restored

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence

    from torch import nn

KINDS = ("noise", "translate", "brightness", "scale")
NOISE_SIGMA, BRIGHTNESS_STEP, SCALE_STEP = 0.1, 0.05, 0.02


def _translate(x: torch.Tensor, t: int) -> torch.Tensor:
    if t == 0:
        return x
    spatial = x.dim() - 2  # [B, C, L] or [B, C, H, W]
    pad = [t, 0] * spatial  # shift right/down by t: pad before, cut the end
    shifted = F.pad(x, pad, mode="replicate")
    return shifted[(..., *[slice(0, s) for s in x.shape[2:]])]


def _scale(x: torch.Tensor, t: int) -> torch.Tensor:
    if t == 0:
        return x
    size = x.shape[2:]
    factor = 1.0 + SCALE_STEP * t
    big = [max(s, round(s * factor)) for s in size]
    mode = "linear" if len(size) == 1 else "bilinear"
    up = F.interpolate(x, size=big, mode=mode, align_corners=False)
    starts = [(b - s) // 2 for b, s in zip(big, size)]
    return up[(..., *[slice(a, a + s) for a, s in zip(starts, size)])]


def frame(kind: str, x: torch.Tensor, t: int, g: torch.Generator) -> torch.Tensor:
    """Frame t of ``kind``'s sequence from the batch x (model inputs)."""
    if kind == "noise":
        if t == 0:
            return x
        z = torch.randn(x.shape, generator=g, dtype=torch.float32).to(x.device, x.dtype)
        return x + NOISE_SIGMA * z
    if kind == "translate":
        return _translate(x, t)
    if kind == "brightness":
        return x + BRIGHTNESS_STEP * t
    if kind == "scale":
        return _scale(x, t)
    raise ValueError(f"flip kind {kind!r} is unknown; choose from {', '.join(KINDS)}")


@torch.no_grad()
def flip_probabilities(
    model: nn.Module,
    batches: Iterable[tuple],
    frames: int = 10,
    num_samples: int | None = None,
    kinds: Sequence[str] = KINDS,
    seed: int = 0,
) -> dict[str, float]:
    """{flip_prob_<kind>: ..., flip_prob: mean over kinds} over the (x, y, …) ``batches``."""
    flips = {k: 0.0 for k in kinds}
    count = 0
    with modes_restored(model):
        model.eval()
        for batch in batches:
            x = batch[0]
            if num_samples is not None:
                x = x[: num_samples - count]
            if len(x) == 0:
                break
            x = x.float()
            for kind in kinds:
                g = torch.Generator().manual_seed(seed + 7919 * KINDS.index(kind) + count)
                first = prev = model(frame(kind, x, 0, g)).argmax(1)
                for t in range(1, frames):
                    pred = model(frame(kind, x, t, g)).argmax(1)
                    ref = first if kind == "noise" else prev
                    flips[kind] += float((pred != ref).double().sum()) / (frames - 1)
                    prev = pred
            count += len(x)
    # data parallel: each process holds a shard of the test set; the mean is over all of them
    from .. import distributed

    device = next(model.parameters()).device
    sums = distributed.current().sum(
        torch.tensor([*flips.values(), float(count)], dtype=torch.float64, device=device)
    )
    flips, count = dict(zip(flips, sums[:-1].tolist())), int(sums[-1])
    if count == 0:
        raise ValueError("flip_prob: no test sample to measure")
    out = {f"flip_prob_{k}": v / count for k, v in flips.items()}
    out["flip_prob"] = sum(out.values()) / len(kinds)
    return out
