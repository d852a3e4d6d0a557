"""Corruptions: every one named and parameterised exactly (Hendrycks & Dietterich 2019 for the
images), the tensor path equal to a straightforward NumPy reference on a few images, 8-bit
storage by truncation, and the published arrays read in the test set's order."""

from __future__ import annotations

import colorsys

import numpy as np
import pytest
import scipy.ndimage as ndi
import torch

from sam_runner.data import corruptions as C
from sam_runner.errors import UserError
from sam_runner.registry import CORRUPTIONS

# the published CIFAR-10-C parameters, severity 1 to 5
PUBLISHED = {
    "gaussian_noise": (0.04, 0.06, 0.08, 0.09, 0.10),
    "shot_noise": (500, 250, 100, 75, 50),
    "impulse_noise": (0.01, 0.02, 0.03, 0.05, 0.07),
    "speckle_noise": (0.06, 0.10, 0.12, 0.16, 0.20),
    "gaussian_blur": (0.4, 0.6, 0.7, 0.8, 1.0),
    "defocus_blur": ((0.3, 0.4), (0.4, 0.5), (0.5, 0.6), (1.0, 0.2), (1.5, 0.1)),
    "brightness": (0.05, 0.1, 0.15, 0.2, 0.3),
    "contrast": (0.75, 0.5, 0.4, 0.3, 0.15),
    "saturate": ((0.3, 0.0), (0.1, 0.0), (1.5, 0.0), (2.0, 0.1), (2.5, 0.2)),
}


def images(n=3, seed=0):
    """A few 32x32 colour images in [0, 1] with structure (gradients, a square, noise)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.linspace(0, 1, 32)
    x = torch.stack(
        [t[None, :].expand(32, 32), t[:, None].expand(32, 32), 0.5 * torch.ones(32, 32)]
    )
    x = x[None].repeat(n, 1, 1, 1) * torch.rand(n, 3, 1, 1, generator=g)
    x[:, :, 8:20, 10:22] = torch.rand(n, 3, 1, 1, generator=g)
    return (x + 0.05 * torch.rand(x.shape, generator=g)).clamp(0, 1).double()


def hwc(x):  # one image as the reference code holds it: H x W x C, float64
    return x.permute(1, 2, 0).numpy()


def test_registry_names_every_corruption_with_its_five_published_severities():
    assert set(C.names_for("image")) == set(PUBLISHED)
    for name, params in PUBLISHED.items():
        assert CORRUPTIONS.entry(name).severities == params, name
    assert set(C.names_for("1d")) == {"mnist1d_iid_noise", "mnist1d_corr_noise", "mnist1d_shift"}
    for e in CORRUPTIONS.entries():
        assert len(e.severities) == 5 and e.description and e.family


@pytest.mark.parametrize("name", ["gaussian_noise", "speckle_noise", "impulse_noise"])
def test_noise_equals_the_numpy_formula_on_the_same_draws(name):
    x = images()
    for severity in C.SEVERITIES:
        c = C.parameter(name, severity)
        out = C.corrupt(name, x, severity, torch.Generator().manual_seed(7)).numpy()
        g = torch.Generator().manual_seed(7)  # the same draws, in the order the docstring states
        if name == "impulse_noise":
            u1 = torch.rand(x.shape, generator=g, dtype=x.dtype).numpy()
            u2 = torch.rand(x.shape, generator=g, dtype=x.dtype).numpy()
            ref = np.where(u1 < c, (u2 < 0.5).astype(float), x.numpy())
        else:
            z = torch.randn(x.shape, generator=g, dtype=x.dtype).numpy()
            ref = x.numpy() + (x.numpy() if name == "speckle_noise" else 1.0) * c * z
        np.testing.assert_allclose(out, np.clip(ref, 0, 1), atol=1e-12)


def test_shot_noise_is_poisson_counts_over_c():
    x = torch.full((4, 3, 64, 64), 0.3, dtype=torch.float64)
    for severity in C.SEVERITIES:
        c = C.parameter("shot_noise", severity)
        out = C.corrupt("shot_noise", x, severity, torch.Generator().manual_seed(1))
        counts = out * c
        assert torch.allclose(counts, counts.round(), atol=1e-9)  # integer counts
        # Poisson(0.3 c)/c: mean 0.3, variance 0.3/c (49,152 draws: 5 standard errors)
        assert abs(float(out.mean()) - 0.3) < 5 * (0.3 / c / out.numel()) ** 0.5
        assert float(out.var()) == pytest.approx(0.3 / c, rel=0.05)


def test_gaussian_blur_equals_scipys_filter_with_nearest_borders():
    x = images()
    for severity in C.SEVERITIES:
        c = C.parameter("gaussian_blur", severity)
        out = C.corrupt("gaussian_blur", x, severity, None)
        for i in range(len(x)):
            ref = ndi.gaussian_filter(hwc(x[i]), sigma=(c, c, 0), mode="nearest", truncate=4.0)
            np.testing.assert_allclose(hwc(out[i]), np.clip(ref, 0, 1), atol=1e-12)


def disk_reference(radius, alias_blur):
    """The published defocus kernel, step by step in NumPy: the aliased disk on −8..8, then a
    3x3 Gaussian (borders mirrored; the disk never reaches them)."""
    t = np.arange(-8, 9)
    X, Y = np.meshgrid(t, t)
    disk = ((X**2 + Y**2) <= radius**2).astype(np.float32)
    disk /= disk.sum()
    w = np.exp(-0.5 * np.arange(-1, 2) ** 2 / alias_blur**2)
    w /= w.sum()
    return ndi.correlate(disk.astype(np.float64), np.outer(w, w), mode="mirror")


def test_defocus_blur_equals_the_disk_kernel_applied_with_mirrored_borders():
    x = images()
    for severity in C.SEVERITIES:
        radius, alias = C.parameter("defocus_blur", severity)
        kernel = disk_reference(radius, alias)
        assert abs(kernel.sum() - 1) < 1e-6
        out = C.corrupt("defocus_blur", x, severity, None)
        for i in range(len(x)):
            ref = np.stack(
                [ndi.correlate(hwc(x[i])[:, :, d], kernel, mode="mirror") for d in range(3)], -1
            )
            np.testing.assert_allclose(hwc(out[i]), np.clip(ref, 0, 1), atol=2e-7)


def imagenet_c():
    """Hendrycks' ImageNet-C code (the ``imagecorruptions`` package, 1.1.2; a test-only
    dependency). It imports ``pkg_resources``, which newer setuptools no longer ship: a stand-in
    with the one function it uses is put in first when the real one is missing."""
    import importlib.util
    import os
    import sys
    import types

    if "pkg_resources" not in sys.modules and importlib.util.find_spec("pkg_resources") is None:
        shim = types.ModuleType("pkg_resources")
        shim.resource_filename = lambda pkg, name: os.path.join(
            os.path.dirname(importlib.util.find_spec(pkg).origin), name
        )
        sys.modules["pkg_resources"] = shim
    return pytest.importorskip("imagecorruptions.corruptions")


@pytest.mark.parametrize("size", [32, 64, 224])
def test_defocus_blur_is_imagenet_cs_within_one_level_at_every_severity(size):
    """ImageNet-C's parameters through our kernel and ImageNet-C's own code (cv2, borders
    reflect-101 both for the kernel's smoothing and the filtering), on two random images."""
    ic = imagenet_c()
    x = np.random.default_rng(size).integers(0, 256, (2, size, size, 3)).astype(np.uint8)
    for severity in C.SEVERITIES:
        c = C.IMAGENET_C["defocus_blur"][severity - 1]
        ref = np.stack([np.uint8(ic.defocus_blur(img, severity)) for img in x]).astype(int)
        t = torch.from_numpy(x).permute(0, 3, 1, 2)
        ours = C.corrupt_images("defocus_blur", t, severity, None, c).permute(0, 2, 3, 1)
        diff = np.abs(ours.numpy().astype(int) - ref)
        assert diff.max() <= 1 and (diff == 0).mean() >= 0.99, (size, severity)
        k = ic.disk(int(c[0]), c[1])
        assert abs(float(C.disk_kernel(*c).sum()) - float(k.sum())) < 1e-6, severity


def hsv_reference(img, change):
    """Per pixel through the standard library's HSV conversion."""
    out = np.empty_like(img)
    for i in range(img.shape[0]):
        for j in range(img.shape[1]):
            h, s, v = colorsys.rgb_to_hsv(*img[i, j])
            out[i, j] = colorsys.hsv_to_rgb(*change(h, s, v))
    return np.clip(out, 0, 1)


@pytest.mark.parametrize("name", ["brightness", "saturate", "contrast"])
def test_colour_corruptions_equal_the_per_pixel_reference(name):
    x = images(n=2)
    x[0, :, :4, :4] = 0.5  # grey pixels: no hue, no saturation
    for severity in C.SEVERITIES:
        c = C.parameter(name, severity)
        out = C.corrupt(name, x, severity, None)
        for i in range(len(x)):
            img = hwc(x[i])
            if name == "brightness":
                ref = hsv_reference(img, lambda h, s, v: (h, s, min(max(v + c, 0), 1)))
            elif name == "saturate":
                ref = hsv_reference(img, lambda h, s, v: (h, min(max(s * c[0] + c[1], 0), 1), v))
            else:
                m = img.mean(axis=(0, 1), keepdims=True)
                ref = np.clip((img - m) * c + m, 0, 1)
            np.testing.assert_allclose(hwc(out[i]), ref, atol=1e-12)


def test_images_are_stored_in_8_bits_by_truncation():
    x8 = (images() * 255).round().to(torch.uint8)
    out = C.corrupt_images("contrast", x8, 3, None)
    x = x8.double() / 255
    m = x.mean(dim=(2, 3), keepdim=True)
    ref = torch.floor(((x - m) * 0.4 + m).clamp(0, 1) * 255).to(torch.uint8)
    assert out.dtype == torch.uint8 and torch.equal(out, ref) and ref.shape == x8.shape


def images8(n=4, seed=0):
    """8-bit images as a photograph has them: flat areas (black, white, grey, one colour), smooth
    ramps and texture."""
    g = np.random.default_rng(seed)
    x = g.integers(0, 256, (n, 32, 32, 3)).astype(np.uint8)
    x[:, :10, :10] = 255
    x[:, 22:, :10] = 0
    x[:, :10, 22:] = 128
    x[:, 12:20, 12:20] = g.integers(0, 256, (n, 1, 1, 3))
    x[:, 22:, 22:] = np.arange(10, dtype=np.uint8)[None, :, None, None] * 25
    return x  # N x H x W x C, as the published code holds images


def rgb2hsv_reference(arr):
    """scikit-image's ``rgb2hsv`` (the published code's), step by step in NumPy."""
    out = np.empty_like(arr)
    v = arr.max(-1)
    delta = np.ptp(arr, -1)
    with np.errstate(invalid="ignore", divide="ignore"):
        s = delta / v
        s[delta == 0.0] = 0.0
        for channel, offset, (a, b) in ((0, 0.0, (1, 2)), (1, 2.0, (2, 0)), (2, 4.0, (0, 1))):
            idx = arr[..., channel] == v
            out[idx, 0] = offset + (arr[idx, a] - arr[idx, b]) / delta[idx]
    h = (out[..., 0] / 6.0) % 1.0
    h[delta == 0.0] = 0.0
    return np.stack([h, s, v], -1)


def hsv2rgb_reference(hsv):
    """scikit-image's ``hsv2rgb``, step by step in NumPy."""
    h, s, v = hsv[..., 0], hsv[..., 1], hsv[..., 2]
    hi = np.floor(h * 6)
    f = h * 6 - hi
    p, q, t = v * (1 - s), v * (1 - f * s), v * (1 - (1 - f) * s)
    hi = np.stack([hi, hi, hi], -1).astype(np.uint8) % 6
    choices = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)]
    return np.choose(hi, np.stack([np.stack(c, -1) for c in choices]))


def published(name, img, c):
    """One H x W x C uint8 image through the published float64 formula, stored as published."""
    x = img / 255.0
    if name == "gaussian_blur":  # scikit-image's gaussian calls SciPy's filter so
        x = ndi.gaussian_filter(x, sigma=(c, c, 0), mode="nearest", truncate=4.0)
    elif name == "defocus_blur":
        k = C.disk_kernel(*c).double().numpy()
        x = np.stack([ndi.correlate(x[..., d], k, mode="mirror") for d in range(3)], -1)
    elif name == "contrast":
        m = np.mean(x, axis=(0, 1), keepdims=True)
        x = (x - m) * c + m
    else:
        hsv = rgb2hsv_reference(x)
        if name == "brightness":
            hsv[..., 2] = np.clip(hsv[..., 2] + c, 0, 1)
        else:
            hsv[..., 1] = np.clip(hsv[..., 1] * c[0] + c[1], 0, 1)
        x = hsv2rgb_reference(hsv)
    return np.uint8(np.clip(x, 0, 1) * 255)


@pytest.mark.parametrize(
    "name", ["gaussian_blur", "defocus_blur", "brightness", "saturate", "contrast"]
)
def test_deterministic_corruptions_are_bit_equal_to_the_float64_reference_on_8_bit_images(name):
    """Every stored 8-bit value equal to the published float64 computation's (in float32, 0.2–15%
    of these values came out one level lower, for all but contrast)."""
    x8 = images8()
    batch = torch.from_numpy(x8).permute(0, 3, 1, 2).contiguous()
    for severity in C.SEVERITIES:
        c = C.parameter(name, severity)
        out = C.corrupt_images(name, batch, severity, None).permute(0, 2, 3, 1).numpy()
        ref = np.stack([published(name, img, c) for img in x8])
        assert out.dtype == np.uint8
        differ = int((out != ref).sum())
        assert differ == 0, f"{name} severity {severity}: {differ} of {ref.size} values differ"


def test_mnist1d_perturbations_equal_their_numpy_definitions():
    x = torch.randn(6, 1, 40, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    k = C.gaussian_kernel1d(C.CORRELATION_SIGMA).numpy()
    r = len(k) // 2
    for severity in C.SEVERITIES:
        p = {n: C.parameter(n, severity) for n in C.names_for("1d")}
        out = {n: C.corrupt(n, x, severity, torch.Generator().manual_seed(5)).numpy() for n in p}
        g = lambda: torch.Generator().manual_seed(5)  # noqa: E731
        z = torch.randn(x.shape, generator=g(), dtype=x.dtype).numpy()
        np.testing.assert_allclose(out["mnist1d_iid_noise"], x.numpy() + p["mnist1d_iid_noise"] * z)
        white = torch.randn(6, 1, 40 + 2 * r, generator=g(), dtype=x.dtype).numpy()
        smooth = np.stack([np.convolve(w[0], k[::-1], "valid") for w in white])[:, None]
        a = p["mnist1d_corr_noise"]
        np.testing.assert_allclose(
            out["mnist1d_corr_noise"], x.numpy() + a / np.linalg.norm(k) * smooth, atol=1e-12
        )
        right = torch.rand(6, generator=g()).numpy() < 0.5
        kk = p["mnist1d_shift"]
        ref = np.stack([np.roll(s, kk if rt else -kk, axis=-1) for s, rt in zip(x.numpy(), right)])
        np.testing.assert_array_equal(out["mnist1d_shift"], ref)


def test_correlated_noise_has_the_stated_standard_deviation():
    x = torch.zeros(2000, 1, 40, dtype=torch.float64)
    out = C.corrupt("mnist1d_corr_noise", x, 5, torch.Generator().manual_seed(0))
    assert float(out.std()) == pytest.approx(C.parameter("mnist1d_corr_noise", 5), rel=0.02)


def test_an_unknown_or_misplaced_corruption_is_one_line():
    from omegaconf import OmegaConf

    from sam_runner.metrics.robustness import validate

    m = lambda **c: OmegaConf.create({"corruptions": {"enabled": True, **c}})  # noqa: E731
    ds = OmegaConf.create({"name": "mnist1d", "data_dir": "."})
    with pytest.raises(UserError, match="unknown .*did you mean gaussian_noise"):
        validate(m(names=["gausian_noise"]), ds)
    with pytest.raises(UserError, match="brightness is not a corruption of dataset=mnist1d"):
        validate(m(names=["brightness"]), ds)
    with pytest.raises(UserError, match=r"severities=\[6\] must be"):
        validate(m(severities=[6]), ds)
    with pytest.raises(UserError, match="not dataset=digits"):
        validate(m(), OmegaConf.create({"name": "digits"}))
