"""Image folders measured like tensor datasets: the measurement subset, the tree's checks, the
samplers and label options on folder data (on PNG/JPEG trees the tests write)."""

from __future__ import annotations

import pytest
import torch
from folder_files import write_tree
from omegaconf import OmegaConf
from PIL import Image
from torchvision import transforms as T

from sam_runner.data import Arrays, build_data, tensor_data
from sam_runner.data.sources import IMAGENET_STATS
from sam_runner.errors import UserError
from sam_runner.samplers import SGSSampler, build_sampler

CPU = torch.device("cpu")


def cfg(**kw):
    base = dict(
        name="image_folder",
        data_dir="",
        download=False,
        batch_size=16,
        label_noise=0.0,
        augment=True,
        sampler="uniform",
        image_size=32,
        num_workers=0,
    )
    base.update(kw)
    return OmegaConf.create(base)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    return write_tree(tmp_path_factory.mktemp("tree"))


def old_subset(x, y, prepare, n, seed):
    """The measurement subset as it was drawn before image folders were measured."""
    g = torch.Generator().manual_seed(seed + 104729)
    idx = torch.randperm(len(y), generator=g)[: min(n, len(y))]
    return (prepare(x[idx], None) if prepare is not None else x[idx]), y[idx]


def test_tensor_subsets_are_bit_identical_to_the_old_rule(tmp_path):
    mnist = build_data(cfg(name="mnist1d", data_dir=str(tmp_path), batch_size=64), CPU, seed=3)
    g = torch.Generator().manual_seed(1)
    cifar = Arrays(
        torch.randint(0, 256, (300, 3, 32, 32), dtype=torch.uint8, generator=g),
        torch.arange(300) % 10,
        torch.randint(0, 256, (50, 3, 32, 32), dtype=torch.uint8, generator=g),
        torch.arange(50) % 10,
        10,
        ((0.5, 0.4, 0.3), (0.2, 0.25, 0.3)),
    )
    cifar = tensor_data(cifar, cfg(name="cifar10", batch_size=64), CPU, seed=3)
    for data in (mnist, cifar):
        x, y = data.train_subset(128, 3)
        ox, oy = old_subset(*data.train_tensors, data.prepare, 128, 3)
        assert torch.equal(x, ox) and torch.equal(y, oy)


def direct(paths, size=32):
    """The evaluation transform applied by hand to the files, as torchvision would."""
    head = [T.Resize(int(size * 8 / 7)), T.CenterCrop(size)]
    tf = T.Compose([*head, T.ToTensor(), T.Normalize(*IMAGENET_STATS)])
    return torch.stack([tf(Image.open(p).convert("RGB")) for p in paths])


def test_folder_subset_is_unaugmented_seeded_and_cached(tree, tmp_path):
    data = build_data(cfg(root=str(tree)), CPU, seed=0)
    x, y = data.train_subset(50, 0)
    again, _ = build_data(cfg(root=str(tree)), CPU, seed=0).train_subset(50, 0)
    assert torch.equal(x, again)  # augmentation on in training, not in the subset
    idx = old_subset(torch.arange(data.train_size), torch.arange(data.train_size), None, 50, 0)[1]
    samples = data.folder_subset.dataset.samples
    assert torch.allclose(x, direct([samples[i][0] for i in idx]), atol=1e-6)
    assert y.tolist() == [samples[i][1] for i in idx]
    other, _ = data.train_subset(50, 1)
    assert not torch.equal(x, other)
    # cached: written once, then read back (even when decoding would now fail)
    data.cache_dir = tmp_path / "cache"
    first, _ = data.train_subset(50, 0)
    assert torch.equal(first, x) and (tmp_path / "cache" / "measure_subset_n50_seed0.pt").is_file()
    path = samples[idx[0]][0]
    saved = open(path, "rb").read()
    try:
        open(path, "wb").write(b"not an image")
        reader = build_data(cfg(root=str(tree)), CPU, seed=0)
        reader.cache_dir, reader.cache_write = tmp_path / "cache", False
        assert torch.equal(reader.train_subset(50, 0)[0], x)
        reader.cache_dir = None
        with pytest.raises(UserError, match=r"image .*\.(png|jpg) is unreadable"):
            reader.train_subset(50, 0)
    finally:
        open(path, "wb").write(saved)


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda r: __import__("shutil").rmtree(r / "val"), r"missing folder .*val"),
        (lambda r: (r / "train" / "dog").mkdir(), r"class folder .*dog holds no images"),
    ],
)
def test_bad_trees_are_one_line_errors(tmp_path, damage, words):
    root = write_tree(tmp_path / "t", per_class=2, val_per_class=1)
    damage(root)
    with pytest.raises(UserError, match=words) as e:
        build_data(cfg(root=str(root)), CPU, seed=0)
    assert "\n" not in str(e.value)


def test_a_subset_that_does_not_fit_names_num_samples(tree):
    data = build_data(cfg(root=str(tree), image_size=40000), CPU, seed=0)
    with pytest.raises(UserError, match=r"metrics.hessian.num_samples=4096: .* GiB") as e:
        data.train_subset(4096, 0)
    assert "\n" not in str(e.value)


def test_long_tail_and_label_noise_hold_on_folders(tree):
    tail = build_data(cfg(root=str(tree), imbalance_ratio=4), CPU, seed=0)
    assert tail.class_counts[0] == 40 and tail.class_counts[-1] == 10
    noisy = build_data(cfg(root=str(tree), label_noise=0.25), CPU, seed=0)
    flipped = (noisy.train.y != noisy.clean_train_labels).float().mean()
    assert float(flipped) == pytest.approx(0.25, abs=0.01)
    _, y = noisy.train_subset(120, 0)  # the subset carries the labels training sees
    idx = old_subset(torch.arange(120), torch.arange(120), None, 120, 0)[1]
    assert torch.equal(y, noisy.train.y[idx])


def test_sgs_samples_folder_indices_by_its_weights(tree):
    data = build_data(cfg(root=str(tree), sampler="sgs", augment=False), CPU, seed=0)
    sampler = build_sampler(data_cfg := cfg(root=str(tree), sampler="sgs"), data)
    assert isinstance(sampler, SGSSampler) and data_cfg.sampler == "sgs"
    targets = torch.arange(48) % 3  # every class alike: only the sharpness tells them apart
    for step in range(3):  # class 2's loss rises under the perturbation: it is down-weighted
        loss = torch.ones(48)
        sampler.observe(0, None, targets, loss)
        sampler.observe(1, None, targets, loss + (targets == 2).float() * (step + 1))
    sampler.end_epoch(data.train)
    assert data.train.weights is not None and sampler.log_values()["sgs_weight_ratio"] > 1
    data.train.set_epoch(2)
    drawn = torch.cat([idx for _, _, idx in data.train])
    g = torch.Generator().manual_seed(0 * 100003 + 2)
    expect = torch.multinomial(data.train.weights, 120, replacement=True, generator=g)
    assert torch.equal(drawn, expect[: len(drawn)])
    labels = data.train.y[drawn]
    assert (labels == 2).sum() < (labels == 0).sum()


def test_full_batch_is_refused_with_what_to_use_instead(tree):
    with pytest.raises(UserError, match=r"batch_size=full .* metrics.hessian.every_n_steps"):
        build_data(cfg(root=str(tree), batch_size="full"), CPU, seed=0)


def test_folder_batches_do_not_depend_on_the_worker_count(tree):
    batches = []
    for workers in (0, 2):
        data = build_data(cfg(root=str(tree), num_workers=workers), CPU, seed=0)
        data.train.set_epoch(3)
        batches.append([(x, idx) for x, _, idx in data.train])
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(*batches))
    assert len(batches[0]) == 7  # 120 images in batches of 16, the last incomplete one dropped
