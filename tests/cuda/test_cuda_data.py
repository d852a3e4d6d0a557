"""Data on the GPU: CIFAR (torchvision's on-disk format) is held there as uint8 tensors, and the
batches (shuffle, crop, flip and normalisation, drawn from the loader's CPU generator) are the
CPU run's, sample for sample."""

from __future__ import annotations

import pytest
import torch
from cifar_files import install
from conftest import compose

from sam_runner.train import Run

pytestmark = pytest.mark.cuda


def _setup(tmp_path, device):
    cfg = compose(
        "dataset=cifar10",
        f"dataset.data_dir={tmp_path / 'data'}",
        "dataset.download=false",
        "dataset.batch_size=32",
        "model=cnn",
        f"trainer.device={device}",
        "trainer.progress=none",
        "trainer.epochs=1",
    )
    run = Run(cfg, tmp_path / device, [])
    run.setup()
    return run


def test_cifar_lives_on_the_gpu_and_its_batches_are_the_cpu_ones(tmp_path, monkeypatch):
    install(monkeypatch, tmp_path / "data", "cifar10", n_train=200, n_test=64)
    cpu, gpu = _setup(tmp_path, "cpu"), _setup(tmp_path, "cuda")
    x, y = gpu.data.train_tensors
    assert (x.device.type, y.device.type, x.dtype) == ("cuda", "cuda", torch.uint8)
    assert next(gpu.model.parameters()).device.type == "cuda"
    for split in ("train", "test"):
        a, b = getattr(cpu.data, split), getattr(gpu.data, split)
        a.set_epoch(3)
        b.set_epoch(3)
        batches = list(zip(a, b, strict=True))
        assert batches
        for (xa, ya, ia), (xb, yb, ib) in batches:
            assert {xb.device.type, yb.device.type, ib.device.type} == {"cuda"}
            assert torch.equal(ib.cpu(), ia) and torch.equal(yb.cpu(), ya)
            torch.testing.assert_close(xb.cpu(), xa, rtol=0, atol=1e-6)
    xs, ys = gpu.data.train_subset(64, 0)  # the curvature subset: the same samples
    xc, yc = cpu.data.train_subset(64, 0)
    assert xs.device.type == "cuda" and torch.equal(ys.cpu(), yc)
    torch.testing.assert_close(xs.cpu(), xc, rtol=0, atol=1e-6)


def test_cifar_batches_never_synchronise_the_host(tmp_path, monkeypatch):
    """After the epoch's first batch (its draws moved once, non-blocking from pinned memory), no
    batch makes a synchronising CUDA call: torch's sync debug mode raises on any."""
    install(monkeypatch, tmp_path / "data", "cifar10", n_train=200, n_test=64)
    loader = _setup(tmp_path, "cuda").data.train
    loader.set_epoch(1)
    batches = iter(loader)
    next(batches)
    torch.cuda.set_sync_debug_mode("error")
    try:
        rest = list(batches)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert len(rest) == len(loader) - 1 > 0
