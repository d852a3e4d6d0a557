"""Corruptions on image-folder test sets: generated on the device against the same corruption
of the decoded 8-bit tensors, and an ImageNet-C-style tree read back (real PNG/JPEG files)."""

from __future__ import annotations

import multiprocessing
import shutil

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
    assert C.folder_parameter("defocus_blur", 3, 32) == C.parameter("defocus_blur", 3)


# ImageNet-C's per-pixel parameters as its code publishes them (severity 1 to 5)
IMAGENET_C_PER_PIXEL = {
    "gaussian_noise": (0.08, 0.12, 0.18, 0.26, 0.38),
    "shot_noise": (60, 25, 12, 5, 3),
    "impulse_noise": (0.03, 0.06, 0.09, 0.17, 0.27),
    "speckle_noise": (0.15, 0.2, 0.35, 0.45, 0.6),
    "brightness": (0.1, 0.2, 0.3, 0.4, 0.5),
    "contrast": (0.4, 0.3, 0.2, 0.1, 0.05),
    "saturate": ((0.3, 0), (0.1, 0), (2, 0), (5, 0.1), (20, 0.2)),
}


@pytest.mark.parametrize("size", [32, 64, 224])
def test_folder_data_takes_imagenet_cs_per_pixel_severities_at_every_size(size):
    for name, published in IMAGENET_C_PER_PIXEL.items():
        assert tuple(C.folder_parameter(name, s, size) for s in C.SEVERITIES) == published, name


def test_a_generated_folder_corruption_is_drawn_at_imagenet_cs_parameter(tree):
    d = dataset(tree)
    data = build_data(d, CPU, seed=0)
    raw = torch.cat([x for x, _, _ in data.test_images])
    loader, _ = corrupted_loader(data, metrics(), d, 0, "contrast", 5)
    got = torch.cat([x for x, _, _ in loader])
    expect = C.corrupt_images("contrast", raw, 5, None, 0.05)  # CIFAR-10-C's would be 0.15
    assert torch.equal(got, data.prepare(expect, None))


def write_imagenet_c(tree, root, names=("gaussian_noise",), severities=(1, 5)):
    """The test images at the test transform's geometry (resize, centre crop), lossless, as
    ``<root>/<name>/<severity>/<class>/*.png``: a tree that holds the clean test set, except
    that severity s of the i-th name is darkened by 10·(i + s) levels (each copy its own
    accuracy)."""
    geometry = T.Compose([T.Resize(36), T.CenterCrop(32)])
    for i, name in enumerate(names):
        for severity in severities:
            darker = 0 if len(names) == 1 else 10 * (i + severity)
            for image in sorted((tree / "val").glob("*/*")):
                out = root / name / str(severity) / image.parent.name / f"{image.stem}.png"
                out.parent.mkdir(parents=True, exist_ok=True)
                clean = geometry(Image.open(image).convert("RGB"))
                clean.point(lambda v, d=darker: max(v - d, 0)).save(out)
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


def test_an_imagenet_c_tree_with_workers_leaves_no_workers_behind(tree, tmp_path, capfd):
    """Each corruption and severity is read by its own loader with the test set's workers:
    their workers end with each pass (they used to stay, piling up until the DataLoader broke
    or hung); the values are those read without workers."""
    names = ("gaussian_noise", "shot_noise", "defocus_blur")
    folder = write_imagenet_c(tree, tmp_path / "imagenet-c", names, (1, 3, 5))
    m = metrics(folder=str(folder), names="all", severities=[1, 3, 5])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, 3))
    values = {}
    for workers in (0, 2):
        d = dataset(tree)
        d.num_workers = workers
        data = build_data(d, CPU, seed=0)
        before = set(multiprocessing.active_children())
        values[workers], sources = corruption_values(model, data, m, d, 0)
        assert set(multiprocessing.active_children()) <= before  # no worker left running
    assert values[2] == values[0] and sources == ["files"]
    assert len({values[0][f"test_acc_c_{n}"] for n in names}) > 1  # the copies differ
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception ignored" not in err, err[-2000:]


def test_an_imagenet_c_tree_is_checked_before_anything_runs(tree, tmp_path):
    """Every corruption and severity asked for is a folder with the test set's class folders:
    checked with the settings, not after training."""
    folder = write_imagenet_c(tree, tmp_path / "imagenet-c", ("gaussian_noise", "fog"), (1, 2))
    d = dataset(tree)
    validate(metrics(folder=str(folder), names="all", severities=[1, 2]), d)
    with pytest.raises(UserError, match=r"no .*fog/3 \(expected <folder>/<corruption>/"):
        validate(metrics(folder=str(folder), names="all", severities=[2, 3]), d)
    shutil.rmtree(folder / "fog" / "2" / "bee")
    with pytest.raises(UserError) as e:
        validate(metrics(folder=str(folder), names="all", severities=[1, 2]), d)
    assert str(e.value) == (
        f"metrics.corruptions.folder: {folder / 'fog' / '2'} has other class folders than the "
        "test set (dataset.root's val/) (missing bee); labels are the positions of the sorted "
        "class names, so both need exactly the same class folders"
    )
