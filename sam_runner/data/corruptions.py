"""Corruptions of test inputs (``metrics.corruptions``), each registered in ``CORRUPTIONS`` with
the parameter of each of its five severities.

Images (``inputs="image"``): functions of a batch of images with values in [0, 1] (float, NCHW,
on any device), with the parameters of Hendrycks & Dietterich 2019 (CIFAR-10-C), re-implemented
here from their formulas as tensor operations (image folders take ImageNet-C's parameters
instead: ``IMAGENET_C``, ``folder_parameter``). ``corrupt_images`` clips the result to [0, 1] and
stores it in 8 bits by truncation, as the published arrays were stored. Only corruptions that are
exact on tensors are here: the noise family (Gaussian, shot, impulse, and the extra speckle),
defocus and Gaussian blur, brightness, contrast and the extra saturate. Not here: glass blur
(sequential pixel swaps), motion blur, snow, frost, fog, spatter, elastic, pixelate and JPEG
(they go through image libraries whose exact arithmetic a tensor version would not reproduce).

MNIST-1D (``inputs="1d"``): perturbations of the standardized signal the model sees (unit
standard deviation over the training set), of the kinds the MNIST-1D generator itself applies:
i.i.d. Gaussian noise, correlated noise (white noise smoothed by a Gaussian of 2 samples, as the
generator's), and circular translation. Their severities are ours.

A corruption is ``fn(x, parameter, generator) -> x``; every random draw comes from ``generator``
(on ``x``'s device), in the order its docstring states.
"""

from __future__ import annotations

import math
import zlib

import numpy as np
import torch
import torch.nn.functional as F

from ..registry import CORRUPTIONS

SEVERITIES = (1, 2, 3, 4, 5)


def _normal(x, g):
    return torch.randn(x.shape, generator=g, device=x.device, dtype=x.dtype)


def _uniform(x, g):
    return torch.rand(x.shape, generator=g, device=x.device, dtype=x.dtype)


# ---------------------------------------------------------------------------- noise
@CORRUPTIONS.register(
    "gaussian_noise",
    "x + N(0, c²) per pixel and channel",
    inputs="image",
    family="noise",
    severities=(0.04, 0.06, 0.08, 0.09, 0.10),
)
def gaussian_noise(x: torch.Tensor, c: float, g: torch.Generator) -> torch.Tensor:
    """Draws one standard normal per element."""
    return x + c * _normal(x, g)


@CORRUPTIONS.register(
    "shot_noise",
    "Poisson(c·x) / c per pixel and channel",
    inputs="image",
    family="noise",
    severities=(500, 250, 100, 75, 50),
)
def shot_noise(x: torch.Tensor, c: float, g: torch.Generator) -> torch.Tensor:
    """Draws one Poisson count per element."""
    return torch.poisson(x * c, generator=g) / c


@CORRUPTIONS.register(
    "impulse_noise",
    "salt and pepper: a fraction c of the pixel channels set to 0 or 1 (even odds)",
    inputs="image",
    family="noise",
    severities=(0.01, 0.02, 0.03, 0.05, 0.07),
)
def impulse_noise(x: torch.Tensor, c: float, g: torch.Generator) -> torch.Tensor:
    """Draws one uniform per element (flipped when < c), then another (salt when < 1/2)."""
    flipped = _uniform(x, g) < c
    salt = (_uniform(x, g) < 0.5).to(x.dtype)
    return torch.where(flipped, salt, x)


@CORRUPTIONS.register(
    "speckle_noise",
    "x + x·N(0, c²) per pixel and channel",
    inputs="image",
    family="noise",
    severities=(0.06, 0.10, 0.12, 0.16, 0.20),
)
def speckle_noise(x: torch.Tensor, c: float, g: torch.Generator) -> torch.Tensor:
    """Draws one standard normal per element."""
    return x + x * c * _normal(x, g)


# ---------------------------------------------------------------------------- blur
def gaussian_kernel1d(sigma: float, truncate: float = 4.0) -> torch.Tensor:
    """The normalised Gaussian exp(−t²/2σ²) on t = −r..r, r = int(truncate·σ + 0.5) (float64),
    computed as SciPy's ``gaussian_filter1d`` computes it (in NumPy, the same expression), so that
    the weights are SciPy's to the bit."""
    radius = int(truncate * float(sigma) + 0.5)
    t = np.arange(-radius, radius + 1)
    k = np.exp(-0.5 / (float(sigma) * float(sigma)) * t**2)
    return torch.from_numpy(k / k.sum())


def _filter2d(x, kernel: torch.Tensor, mode: str):
    """Correlation of every channel with ``kernel`` (odd square), borders padded by ``mode``."""
    r = kernel.shape[-1] // 2
    c = x.shape[1]
    weight = kernel.to(x.device, x.dtype).expand(c, 1, *kernel.shape).contiguous()
    return F.conv2d(F.pad(x, (r, r, r, r), mode=mode), weight, groups=c)


def _gaussian_along(x, k: torch.Tensor, dim: int):
    """Correlation along ``dim`` with the symmetric ``k``, borders by the nearest pixel, summed in
    SciPy's order (``correlate1d``'s symmetric loop: centre·k₀, then + (left + right)·k_j from the
    outermost j inwards), so that the float64 result is SciPy's to the bit."""
    r = len(k) // 2
    n = x.shape[dim]
    xp = F.pad(x, (r, r, 0, 0) if dim == 3 else (0, 0, r, r), mode="replicate")  # NCHW: W or H
    k = k.tolist()
    out = xp.narrow(dim, r, n) * k[r]
    for j in range(r, 0, -1):
        out = out + (xp.narrow(dim, r - j, n) + xp.narrow(dim, r + j, n)) * k[r + j]
    return out


@CORRUPTIONS.register(
    "gaussian_blur",
    "Gaussian filter of standard deviation c pixels (truncated at 4c; borders: nearest pixel)",
    inputs="image",
    family="blur",
    severities=(0.4, 0.6, 0.7, 0.8, 1.0),
)
def gaussian_blur(x: torch.Tensor, c: float, _g: torch.Generator) -> torch.Tensor:
    """As SciPy's ``gaussian_filter`` (what the published code calls): rows, then columns."""
    k = gaussian_kernel1d(c)
    return _gaussian_along(_gaussian_along(x, k, 2), k, 3)


def disk_kernel(radius: float, alias_blur: float) -> torch.Tensor:
    """The defocus kernel: the indicator of the disk x² + y² ≤ radius² on the grid −8..8
    (−L..L, L = ⌈radius⌉, for a radius over 8: ImageNet-C's largest), normalised to sum 1, then
    smoothed by a 3×3 Gaussian (5×5 for a radius over 8, as ImageNet-C's code) of standard
    deviation ``alias_blur`` (its weights exp(−t²/2σ²) on t = −1, 0, 1, normalised) with the
    grid's borders mirrored without repeating the edge (reflect-101, OpenCV's default, as
    ``cv2.GaussianBlur`` in ImageNet-C's code: a disk that reaches the grid's edge keeps its mass,
    so the kernel sums to a little over 1 there); the all-zero border is trimmed (it contributes
    nothing). Computed in float32, as the published kernel was."""
    half = max(8, math.ceil(radius))
    t = torch.arange(-half, half + 1, dtype=torch.float32)
    disk = ((t[:, None] ** 2 + t[None, :] ** 2) <= radius**2).to(torch.float32)
    disk /= disk.sum()
    a = 1 if radius <= 8 else 2
    w = torch.exp(-0.5 * torch.arange(-a, a + 1, dtype=torch.float32) ** 2 / alias_blur**2)
    w = (w / w.sum()).to(torch.float32)
    padded = F.pad(disk[None, None], (a, a, a, a), mode="reflect")  # torch's reflect is 101
    smooth = F.conv2d(padded, (w[:, None] * w[None, :])[None, None])[0, 0]
    keep = smooth.abs().sum(0).nonzero().flatten()
    r = int(max(half - int(keep.min()), int(keep.max()) - half))
    return smooth[half - r : half + 1 + r, half - r : half + 1 + r]


@CORRUPTIONS.register(
    "defocus_blur",
    "correlation with an anti-aliased disk (radius, anti-alias σ); borders mirrored",
    inputs="image",
    family="blur",
    severities=((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1.0, 0.2), (1.5, 0.1)),
)
def defocus_blur(x: torch.Tensor, c: tuple[float, float], _g: torch.Generator) -> torch.Tensor:
    """Convolution with an anti-aliased disk of radius ``c[0]`` (blurred by ``c[1]``), reflected
    at the edges."""
    return _filter2d(x, disk_kernel(*c).double(), "reflect")


# ---------------------------------------------------------------------------- colour (HSV)
def rgb_to_hsv(x: torch.Tensor) -> torch.Tensor:
    """HSV of RGB images in [0, 1] (channel dim 1): V = max, S = (max − min)/max (0 where
    max = min), H in [0, 1) from the channel that holds the max (blue, then green, then red
    taking precedence on ties; tied maxima give the same hue either way)."""
    r, g, b = x.unbind(1)
    v, _ = x.max(1)
    delta = v - x.min(1).values
    safe = torch.where(delta > 0, delta, torch.ones_like(delta))
    h = torch.where(r == v, (g - b) / safe, torch.zeros_like(v))
    h = torch.where(g == v, 2.0 + (b - r) / safe, h)
    h = torch.where(b == v, 4.0 + (r - g) / safe, h)
    h = torch.where(delta > 0, torch.remainder(h / 6.0, 1.0), torch.zeros_like(h))
    s = torch.where(
        delta > 0, delta / torch.where(v > 0, v, torch.ones_like(v)), torch.zeros_like(v)
    )
    return torch.stack([h, s, v], 1)


def hsv_to_rgb(hsv: torch.Tensor) -> torch.Tensor:
    """RGB of HSV images (channel dim 1): sector i = floor(6H) mod 6, f = 6H − floor(6H),
    p = V(1 − S), q = V(1 − fS), t = V(1 − (1 − f)S), and (R, G, B) = (V, t, p), (q, V, p),
    (p, V, t), (p, q, V), (t, p, V), (V, p, q) in sectors 0 to 5."""
    h, s, v = hsv.unbind(1)
    sector = torch.floor(h * 6.0)
    f = h * 6.0 - sector
    i = torch.remainder(sector, 6)
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)

    def pick(v_in, t_in, q_in):  # the channel is V in sectors v_in, t in t_in, q in q_in, else p
        out = torch.where(i == t_in, t, p)
        out = torch.where(i == q_in, q, out)
        return torch.where((i == v_in[0]) | (i == v_in[1]), v, out)

    return torch.stack([pick((0, 5), 4, 1), pick((1, 2), 0, 3), pick((3, 4), 2, 5)], 1)


@CORRUPTIONS.register(
    "brightness",
    "V ← clip(V + c, 0, 1) in HSV",
    inputs="image",
    family="weather",
    severities=(0.05, 0.1, 0.15, 0.2, 0.3),
)
def brightness(x: torch.Tensor, c: float, _g: torch.Generator) -> torch.Tensor:
    """``c`` added to the value channel in HSV, clipped to [0, 1]."""
    hsv = rgb_to_hsv(x)
    hsv[:, 2] = (hsv[:, 2] + c).clamp(0, 1)
    return hsv_to_rgb(hsv)


@CORRUPTIONS.register(
    "saturate",
    "S ← clip(S·a + b, 0, 1) in HSV; (a, b) desaturates at severities 1–2, saturates at 3–5",
    inputs="image",
    family="digital",
    severities=((0.3, 0.0), (0.1, 0.0), (1.5, 0.0), (2.0, 0.1), (2.5, 0.2)),
    # two directions: 1 → 2 desaturates further, 3 → 5 saturates further, and severity 3 (×1.5)
    # is milder than 2 (×0.1): the severities are graded within each direction only
    monotone=((1, 2), (3, 4, 5)),
)
def saturate(x: torch.Tensor, c: tuple[float, float], _g: torch.Generator) -> torch.Tensor:
    """The saturation channel in HSV scaled by ``c[0]`` and shifted by ``c[1]``, clipped to [0,
    1]."""
    hsv = rgb_to_hsv(x)
    hsv[:, 1] = (hsv[:, 1] * c[0] + c[1]).clamp(0, 1)
    return hsv_to_rgb(hsv)


@CORRUPTIONS.register(
    "contrast",
    "(x − m)·c + m, m the image's mean per channel",
    inputs="image",
    family="digital",
    severities=(0.75, 0.5, 0.4, 0.3, 0.15),
)
def contrast(x: torch.Tensor, c: float, _g: torch.Generator) -> torch.Tensor:
    """m summed pixel after pixel in row-major order (a cumulative sum), as NumPy's mean over the
    image axes of an H×W×C array sums, then divided by the pixel count."""
    n, ch, h, w = x.shape
    m = (x.reshape(n, ch, h * w).cumsum(-1)[..., -1:] / (h * w)).reshape(n, ch, 1, 1)
    return (x - m) * c + m


# ---------------------------------------------------------------------------- MNIST-1D
@CORRUPTIONS.register(
    "mnist1d_iid_noise",
    "x + N(0, σ²) per sample point (standardized units)",
    inputs="1d",
    family="noise",
    severities=(0.1, 0.2, 0.3, 0.5, 0.8),
)
def mnist1d_iid_noise(x: torch.Tensor, sigma: float, g: torch.Generator) -> torch.Tensor:
    """Draws one standard normal per element."""
    return x + sigma * _normal(x, g)


CORRELATION_SIGMA = 2.0  # samples: the MNIST-1D generator smooths its correlated noise so


@CORRUPTIONS.register(
    "mnist1d_corr_noise",
    "x + white noise smoothed by a Gaussian of 2 samples, scaled to standard deviation a",
    inputs="1d",
    family="noise",
    severities=(0.1, 0.2, 0.3, 0.5, 0.8),
)
def mnist1d_corr_noise(x: torch.Tensor, a: float, g: torch.Generator) -> torch.Tensor:
    """Draws length + 2r standard normals per signal (r = 8, the kernel's radius), smoothed with
    no padding: stationary noise whose standard deviation is exactly ``a``."""
    k = gaussian_kernel1d(CORRELATION_SIGMA).to(x.device, x.dtype)
    r = len(k) // 2
    n, ch, length = x.shape
    white = torch.randn(n * ch, 1, length + 2 * r, generator=g, device=x.device, dtype=x.dtype)
    noise = F.conv1d(white, k.view(1, 1, -1)).view(n, ch, length)
    return x + (a / k.norm()) * noise


@CORRUPTIONS.register(
    "mnist1d_shift",
    "circular translation by k samples, left or right at random (as the generator translates)",
    inputs="1d",
    family="shift",
    severities=(1, 2, 4, 6, 8),
)
def mnist1d_shift(x: torch.Tensor, k: int, g: torch.Generator) -> torch.Tensor:
    """Draws one uniform per signal (shift right when < 1/2)."""
    n, _, length = x.shape
    u = torch.rand(n, generator=g, device=x.device)
    shift = torch.where(u < 0.5, k, -k).long()
    idx = (torch.arange(length, device=x.device)[None, :] - shift[:, None]) % length
    return x.gather(2, idx[:, None, :].expand_as(x))


# ---------------------------------------------------------------------------- applying them
def parameter(name: str, severity: int) -> float | tuple[float, ...]:
    """The parameter of ``name`` at ``severity`` (1..5)."""
    return CORRUPTIONS.entry(name).severities[severity - 1]


def generator(
    device: torch.device | str, seed: int, name: str, severity: int, rank: int = 0
) -> torch.Generator:
    """The generator of one corrupted copy: fixed by the run's seed, the corruption's name, the
    severity (and the data-parallel rank: each process draws for its own shard)."""
    g = torch.Generator(device=device)
    g.manual_seed(
        ((int(seed) * 1_000_003 + zlib.crc32(name.encode())) * 11 + severity) * 101 + rank
    )
    return g


# ImageNet-C's parameters (Hendrycks & Dietterich's ImageNet-C code, for 224² images), the
# table image folders use: the per-pixel ones as published at every size, the blurs' pixel
# lengths scaled by image_size / 224 (folder_parameter)
IMAGENET_C = {
    "gaussian_noise": (0.08, 0.12, 0.18, 0.26, 0.38),
    "shot_noise": (60, 25, 12, 5, 3),
    "impulse_noise": (0.03, 0.06, 0.09, 0.17, 0.27),
    "speckle_noise": (0.15, 0.2, 0.35, 0.45, 0.6),
    "gaussian_blur": (1.0, 2.0, 3.0, 4.0, 6.0),
    "defocus_blur": ((3.0, 0.1), (4.0, 0.5), (6.0, 0.5), (8.0, 0.5), (10.0, 0.5)),
    "brightness": (0.1, 0.2, 0.3, 0.4, 0.5),
    "contrast": (0.4, 0.3, 0.2, 0.1, 0.05),
    "saturate": ((0.3, 0.0), (0.1, 0.0), (2.0, 0.0), (5.0, 0.1), (20.0, 0.2)),
}
SIZED = ("gaussian_blur", "defocus_blur")  # a length in pixels: scaled with the image


def folder_parameter(name: str, severity: int, image_size: int) -> float | tuple[float, ...]:
    """The parameter of ``name`` on image-folder images of ``image_size``: ImageNet-C's for the
    per-pixel corruptions (noise, brightness, contrast, saturate: no length in them), at every
    size; for the two blurs over 64², ImageNet-C's pixel lengths scaled by image_size / 224 (the
    blur σ, the defocus radius; its anti-alias σ as published); for the blurs at 64² or less,
    the registry's (CIFAR-10-C's, made for 32²: ImageNet-C's scaled down that far blur less
    than CIFAR-10-C's, its severity 1 not at all)."""
    if name not in IMAGENET_C or (name in SIZED and image_size <= 64):
        return parameter(name, severity)
    c = IMAGENET_C[name][severity - 1]
    if name not in SIZED:
        return c
    scale = image_size / 224
    return (c[0] * scale, c[1]) if isinstance(c, tuple) else c * scale


def corrupt(
    name: str,
    x: torch.Tensor,
    severity: int,
    g: torch.Generator,
    value: float | tuple[float, ...] | None = None,
) -> torch.Tensor:
    """``x`` corrupted (at ``value`` when given, else the severity's registered parameter):
    images in [0, 1] come back clipped to [0, 1]; signals as they are."""
    entry = CORRUPTIONS.entry(name)
    out = entry.target(x, parameter(name, severity) if value is None else value, g)
    return out.clamp(0.0, 1.0) if entry.inputs == "image" else out


def corrupt_images(
    name: str,
    images_uint8: torch.Tensor,
    severity: int,
    g: torch.Generator,
    value: float | tuple[float, ...] | None = None,
) -> torch.Tensor:
    """8-bit images corrupted and stored in 8 bits again by truncation (⌊255·x⌋ of the clipped
    result), as the published CIFAR-10-C arrays were stored. In float64, as the published code
    computes (NumPy on x/255.): in float32 a value that lands on an 8-bit level in float64 can
    land just below it and be truncated one level lower."""
    x = images_uint8.double() / 255.0
    return torch.floor(corrupt(name, x, severity, g, value) * 255.0).to(torch.uint8)


def names_for(inputs: str) -> list[str]:
    """The registered corruptions of one input kind (``image`` or ``1d``), in registry order."""
    return CORRUPTIONS.names_where(inputs=inputs)


def monotone_runs(name: str) -> tuple:
    """The runs of severities along which the corruption grows (all five for most)."""
    return CORRUPTIONS.entry(name).meta.get("monotone") or (SEVERITIES,)
