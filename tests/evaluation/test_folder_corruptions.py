"""Corruptions on image-folder test sets: generated on the device against the same corruption
of the decoded 8-bit tensors, and an ImageNet-C-style tree read back (real PNG/JPEG files)."""

from __future__ import annotations

import pytest
import torch
from folder_files import write_tree
from omegaconf import OmegaConf
from PIL import Image
from torchvision import transforms as T

from sam_runner.data import build_data
from sam_runner.data import corruptions as C
from sam_runner.errors import UserError
from sam_runner.metrics.evaluate import predict
from sam_runner.metrics.robustness import corrupted_loader, corruption_values, validate

CPU = torch.device("cpu")


def dataset(root):
    return OmegaConf.create(
        dict(
            name="image_folder",
            root=str(root),
            data_dir="",
            download=False,
            batch_size=32,
            label_noise=0.0,
            augment=True,
            sampler="uniform",
            image_size=32,
            num_workers=0,
        )
    )


def metrics(**kw):
    section = dict(enabled=True, names=["gaussian_noise", "defocus_blur"], severities=[1, 5])
    return OmegaConf.create({"ece_bins": 15, "corruptions": {**section, **kw}})


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return write_tree(tmp_path_factory.mktemp("tree"), per_class=12, val_per_class=10)


def test_generated_corruptions_are_those_of_the_decoded_tensors(tree):
    d = dataset(tree)
    data = build_data(d, CPU, seed=0)
    raw = torch.cat([x for x, _, _ in data.test_images])  # 30 images: one batch
    assert raw.dtype == torch.uint8 and raw.shape == (30, 3, 32, 32)
    for name in ("gaussian_noise", "defocus_blur", "gaussian_blur"):
        for severity in (1, 5):
            loader, source = corrupted_loader(data, metrics(), d, 0, name, severity)
            got = torch.cat([x for x, _, _ in loader])
            g = C.generator(CPU, 0, name, severity)
            value = C.folder_parameter(name, severity, 32)
            expect = data.prepare(C.corrupt_images(name, raw, severity, g, value), None)
            assert source == "generated" and torch.equal(got, expect)
            assert not torch.equal(got, data.prepare(raw, None))
    # the size-dependent ones at ImageNet-C's parameters (at 224² exactly), the others as listed
    assert C.folder_parameter("defocus_blur", 5, 224) == (10.0, 0.5)
    assert C.folder_parameter("gaussian_blur", 2, 112) == 1.0
    assert C.folder_parameter("gaussian_noise", 3, 224) == C.parameter("gaussian_noise", 3)
    assert C.folder_parameter("defocus_blur", 3, 32) == C.parameter("defocus_blur", 3)


def write_imagenet_c(tree, root):
    """The test images at the test transform's geometry (resize, centre crop), lossless, as
    ``<root>/gaussian_noise/<severity>/<class>/*.png``: a tree that holds the clean test set."""
    geometry = T.Compose([T.Resize(36), T.CenterCrop(32)])
    for severity in (1, 5):
        for image in sorted((tree / "val").glob("*/*")):
            out = root / "gaussian_noise" / str(severity) / image.parent.name / f"{image.stem}.png"
            out.parent.mkdir(parents=True, exist_ok=True)
            geometry(Image.open(image).convert("RGB")).save(out)
    return root


def test_an_imagenet_c_tree_is_read_back(tree, tmp_path):
    d = dataset(tree)
    data = build_data(d, CPU, seed=0)
    folder = write_imagenet_c(tree, tmp_path / "imagenet-c")
    m = metrics(folder=str(folder), names="all")
    validate(m, d)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 3))
    values, sources = corruption_values(model, data, m, d, 0)
    assert sources == ["files"] and set(values) == {
        "test_acc_c_gaussian_noise",
        "test_acc_c",
        "test_ece_c",
    }
    logits, labels = predict(model, data.test, torch.autocast("cpu", enabled=False), _One())
    clean = float((logits.argmax(1) == labels).float().mean())
    assert values["test_acc_c"] == pytest.approx(clean, abs=1e-6)  # the same images, read back
    with pytest.raises(UserError, match="metrics.corruptions.folder=.* is not a folder"):
        validate(metrics(folder=str(tmp_path / "absent")), d)


class _One:
    def gather(self, t):
        return t
