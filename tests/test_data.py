"""Datasets and loaders, on real on-disk formats the tests write."""

from __future__ import annotations

import hashlib
import re
import tarfile

import pytest
import torch
from cifar_files import install, write_cifar
from omegaconf import OmegaConf

from sam_runner.data import build_data
from sam_runner.data.labels import apply_label_noise, long_tail_indices
from sam_runner.data.loaders import TensorLoader, random_crop_flip
from sam_runner.errors import UserError


def cfg(**kw):
    base = dict(
        name="mnist1d",
        data_dir="",
        download=False,
        batch_size=64,
        label_noise=0.0,
        augment=True,
        sampler="uniform",
    )
    base.update(kw)
    return OmegaConf.create(base)


def test_mnist1d_is_generated_cached_and_shaped(tmp_path):
    d = build_data(cfg(data_dir=str(tmp_path), num_samples=1000), torch.device("cpu"), seed=0)
    assert d.input_shape == (1, 40) and d.num_classes == 10 and d.train_size == 800
    assert list(tmp_path.glob("mnist1d_1000.pkl")), "the generated set is cached under data_dir"
    x, y, idx = next(iter(d.train))
    assert x.shape == (64, 1, 40) and y.shape == (64,) and torch.equal(d.train_tensors[1][idx], y)


def test_digits_fixed_split(tmp_path):
    a = build_data(cfg(name="digits", data_dir=str(tmp_path)), torch.device("cpu"), seed=0)
    b = build_data(cfg(name="digits", data_dir=str(tmp_path)), torch.device("cpu"), seed=5)
    assert a.input_shape == (1, 8, 8) and a.train_size + len(a.test.y) == 1797
    assert torch.equal(a.test.y, b.test.y), "the test split must not depend on the run's seed"


@pytest.mark.parametrize("name,classes", [("cifar10", 10), ("cifar100", 100)])
def test_cifar_from_torchvision_files(name, classes, tmp_path, monkeypatch):
    install(monkeypatch, tmp_path, name)
    d = build_data(cfg(name=name, data_dir=str(tmp_path)), torch.device("cpu"), seed=0)
    assert d.num_classes == classes and d.input_shape == (3, 32, 32) and d.train_size == 500
    assert d.train_tensors[0].dtype == torch.uint8, "images stay uint8 in memory"
    x, y, _ = next(iter(d.train))
    assert x.dtype == torch.float32 and x.shape == (64, 3, 32, 32)
    xt, _, _ = next(iter(d.test))
    # the test transform normalises per channel: mean ≈ 0 over uniform noise, not augmented
    assert abs(float(xt.mean())) < 0.3


def test_cifar100_lt_profile(tmp_path, monkeypatch):
    install(monkeypatch, tmp_path, "cifar100", n_train=5000, n_test=200)
    d = build_data(
        cfg(name="cifar100_lt", data_dir=str(tmp_path), imbalance_ratio=10),
        torch.device("cpu"),
        seed=0,
    )
    counts = d.class_counts
    assert counts[0] == 50 and counts[-1] == 5  # n_max * ratio^(-c/99)
    assert all(a >= b for a, b in zip(counts, counts[1:]))
    assert len(d.test.y) == 200, "the test set is untouched"


def test_long_tail_indices_formula():
    y = torch.arange(10).repeat(100)
    keep = long_tail_indices(y, 10, 100.0)
    counts = torch.bincount(y[keep], minlength=10).tolist()
    assert counts == [int(100 * 100 ** (-c / 9)) for c in range(10)]


def test_missing_cifar_offline_names_the_files(tmp_path):
    with pytest.raises(UserError, match="cifar-10-python.tar.gz.*or set dataset.download=true"):
        build_data(
            cfg(name="cifar10", data_dir=str(tmp_path / "none")), torch.device("cpu"), seed=0
        )


def test_cifar_tarball_alone_is_unpacked_offline(tmp_path, monkeypatch):
    """download=false with only torchvision's archive in data_dir: unpacked, as download=true
    would."""
    from torchvision import datasets

    for attr, value in write_cifar(tmp_path / "src", "cifar10", 500, 100).items():
        monkeypatch.setattr(datasets.CIFAR10, attr, value)
    tarball = tmp_path / "data" / "cifar-10-python.tar.gz"
    tarball.parent.mkdir()
    with tarfile.open(tarball, "w:gz") as t:
        t.add(tmp_path / "src" / "cifar-10-batches-py", arcname="cifar-10-batches-py")
    monkeypatch.setattr(datasets.CIFAR10, "tgz_md5", hashlib.md5(tarball.read_bytes()).hexdigest())
    d = build_data(cfg(name="cifar10", data_dir=str(tarball.parent)), torch.device("cpu"), seed=0)
    assert d.train_size == 500 and len(d.test.y) == 100


def test_largest_ratio_keeps_one_example_and_a_larger_one_is_refused():
    y = torch.arange(10).repeat(49)  # 49 * 49^-1 is 0.999... in floating point
    assert int((y[long_tail_indices(y, 10, 49.0)] == 9).sum()) == 1
    with pytest.raises(UserError, match=r"dataset.imbalance_ratio=1000000.0 .*use at most 142"):
        # class 0: 142
        build_data(cfg(name="digits", imbalance_ratio=1e6), torch.device("cpu"), seed=0)


@pytest.mark.parametrize(
    "key,value,match",
    [
        ("label_noise", "abc", "dataset.label_noise='abc' must be a fraction in"),
        ("imbalance_ratio", "x", "dataset.imbalance_ratio='x' must be a number >= 1"),
        ("batch_size", True, "dataset.batch_size=True must be a positive integer"),
    ],
)
def test_bad_values_are_one_line_errors(key, value, match):
    with pytest.raises(UserError, match=match):
        build_data(cfg(name="digits", **{key: value}), torch.device("cpu"), seed=0)


@pytest.mark.parametrize("value", [-5, 5, "many", 1.5e3])
def test_mnist1d_sample_counts_it_cannot_make_are_one_line_errors(tmp_path, value):
    with pytest.raises(UserError, match=rf"dataset.num_samples={value!r} must be an integer >= 10"):
        build_data(cfg(data_dir=str(tmp_path), num_samples=value), torch.device("cpu"), seed=0)
    assert list(tmp_path.iterdir()) == []  # nothing generated or cached


def test_class_counts_are_of_the_clean_long_tailed_labels():
    """The many/medium/few split is by the long-tail profile, not by what label noise made of it."""
    clean = build_data(cfg(name="digits", imbalance_ratio=10), torch.device("cpu"), seed=0)
    noisy = build_data(
        cfg(name="digits", imbalance_ratio=10, label_noise=0.4), torch.device("cpu"), seed=0
    )
    assert noisy.class_counts == clean.class_counts
    assert torch.bincount(noisy.train_tensors[1], minlength=10).tolist() != clean.class_counts


def test_label_noise_exact_fraction_other_class_fixed_by_seed():
    y = torch.arange(10).repeat(100)
    a = apply_label_noise(y, 10, 0.3, seed=1)
    changed = a != y
    assert int(changed.sum()) == 300  # replaced by a different class, every time
    assert torch.equal(a, apply_label_noise(y, 10, 0.3, seed=1))
    assert not torch.equal(a, apply_label_noise(y, 10, 0.3, seed=2))


def test_label_noise_applies_to_every_dataset():
    clean = build_data(cfg(name="digits"), torch.device("cpu"), seed=0)
    noisy = build_data(cfg(name="digits", label_noise=0.5), torch.device("cpu"), seed=0)
    frac = float((clean.train_tensors[1] != noisy.train_tensors[1]).float().mean())
    assert frac == pytest.approx(0.5, abs=0.002)


def test_crop_flip_is_a_shifted_window():
    x = torch.arange(2 * 3 * 6 * 6, dtype=torch.float32).view(2, 3, 6, 6)
    g = torch.Generator().manual_seed(0)
    out = random_crop_flip(x, 2, g)
    assert out.shape == x.shape
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    for i in range(2):
        found = any(
            torch.equal(out[i], w) or torch.equal(out[i], w.flip(2))
            for oy in range(5)
            for ox in range(5)
            for w in [padded[i, :, oy : oy + 6, ox : ox + 6]]
        )
        assert found


def test_loader_batches_depend_on_seed_and_epoch_only():
    x, y = torch.arange(100).float()[:, None], torch.arange(100)
    a = TensorLoader(x, y, 10, shuffle=True, seed=3, drop_last=True)
    b = TensorLoader(x, y, 10, shuffle=True, seed=3, drop_last=True)
    a.set_epoch(2), b.set_epoch(2)
    assert [t[2].tolist() for t in a] == [t[2].tolist() for t in b]
    b.set_epoch(3)
    assert [t[2].tolist() for t in a] != [t[2].tolist() for t in b]


def test_loader_ranks_split_each_global_batch():
    x, y = torch.arange(40).float()[:, None], torch.arange(40)
    whole = [t[2] for t in TensorLoader(x, y, 8, shuffle=True, seed=0, drop_last=True)]
    parts = [
        [t[2] for t in TensorLoader(x, y, 8, shuffle=True, seed=0, drop_last=True, rank=r, world=2)]
        for r in (0, 1)
    ]
    for i, batch in enumerate(whole):
        a, b = parts[0][i], parts[1][i]
        assert len(a) == len(b) == 4 and not set(a.tolist()) & set(b.tolist())
        assert sorted(torch.cat([a, b]).tolist()) == sorted(batch.tolist())


def test_ranks_together_see_the_augmentations_of_one_process():
    """Crops and flips are drawn for the global batch and each process keeps its share: the union
    of 2 processes' augmented batches is the 1-process augmented batch, draw for draw."""
    from sam_runner.data.loaders import Normalize

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (48, 3, 8, 8), generator=g, dtype=torch.uint8)
    y = torch.arange(48)
    tf = Normalize((0.5,) * 3, (0.25,) * 3, augment=True, pad=2)

    def epoch(rank=0, world=1):
        loader = TensorLoader(
            x, y, 16, shuffle=True, seed=0, drop_last=True, transform=tf, rank=rank, world=world
        )
        loader.set_epoch(1)
        return list(loader)

    whole, parts = epoch(), [epoch(r, 2) for r in (0, 1)]
    assert len(whole) == len(parts[0]) == len(parts[1]) == 3
    for (xw, _, iw), (x0, _, i0), (x1, _, i1) in zip(whole, *parts):
        assert torch.equal(i0, iw[0::2]) and torch.equal(i1, iw[1::2])
        assert torch.equal(x0, xw[0::2]) and torch.equal(x1, xw[1::2])
    # and the augmentation did draw per sample: the same image is cropped differently somewhere
    assert not torch.equal(whole[0][0], tf(x[whole[0][2]], None))


def test_image_folder_processes_draw_their_own_augmentation_seeds():
    from sam_runner.data.loaders import EpochOrder, FolderLoader

    ds = list(range(8))
    seeds = [list(EpochOrder(FolderLoader(ds, 4, True, 0, 0, True, rank, 2))) for rank in (0, 1)]
    assert {s for _, s in seeds[0]}.isdisjoint(s for _, s in seeds[1])
    again = list(EpochOrder(FolderLoader(ds, 4, True, 0, 0, True, 1, 2)))
    assert again == seeds[1]  # fixed by (seed, epoch, rank): a resumed epoch draws alike


def _image_tree(root, per_class=4):
    from PIL import Image

    for split in ("train", "val"):
        for c in ("cat", "dog"):
            (root / split / c).mkdir(parents=True)
            for i in range(per_class):
                Image.new("RGB", (20, 20), (i * 40, 100, 200)).save(root / split / c / f"{i}.png")
    return cfg(name="image_folder", root=str(root), image_size=16, num_workers=0, batch_size=4)


def test_image_folder(tmp_path):
    d = build_data(_image_tree(tmp_path), torch.device("cpu"), seed=0)
    assert d.num_classes == 2 and d.input_shape == (3, 16, 16)
    x, y, idx = next(iter(d.train))
    assert x.shape == (4, 3, 16, 16) and set(y.tolist()) <= {0, 1}


def test_image_folder_long_tail_and_batch_per_process(tmp_path):
    c = _image_tree(tmp_path)
    d = build_data(
        OmegaConf.merge(c, {"imbalance_ratio": 4, "batch_size": 2}), torch.device("cpu"), seed=0
    )
    assert d.class_counts == [4, 1] and d.train_size == 5 and len(d.test.ds) == 8
    with pytest.raises(
        UserError, match=r"dataset.batch_size=3 .* divisible by the number of processes \(2\)"
    ):
        build_data(
            OmegaConf.merge(c, {"batch_size": 3}), torch.device("cpu"), seed=0, rank=0, world=2
        )


def test_image_folder_missing_split_is_one_line(tmp_path):
    with pytest.raises(UserError, match="val"):
        (tmp_path / "train").mkdir()
        build_data(cfg(name="image_folder", root=str(tmp_path)), torch.device("cpu"), seed=0)


def test_batch_larger_than_training_set():
    with pytest.raises(UserError, match="dataset.batch_size=5000"):
        build_data(cfg(name="digits", batch_size=5000), torch.device("cpu"), seed=0)


def test_train_subset_is_class_balanced_fixed_by_the_seed_and_full_is_one_batch():
    a = build_data(
        cfg(name="digits", train_subset=105, batch_size="full"), torch.device("cpu"), seed=0
    )
    counts = torch.bincount(a.train_tensors[1], minlength=10).tolist()
    assert sum(counts) == 105 and counts == [11] * 5 + [10] * 5  # the first 105 % 10 one more
    again = build_data(
        cfg(name="digits", train_subset=105, batch_size="full"), torch.device("cpu"), seed=0
    )
    other = build_data(
        cfg(name="digits", train_subset=105, batch_size="full"), torch.device("cpu"), seed=1
    )
    assert torch.equal(a.train_tensors[0], again.train_tensors[0])
    assert not torch.equal(a.train_tensors[0], other.train_tensors[0])
    batches = list(a.train)
    assert len(a.train) == 1 and len(batches) == 1 and torch.equal(batches[0][2], torch.arange(105))
    assert a.full_batch and torch.equal(a.train_subset(7, 0)[1], a.train_tensors[1])  # all of it


@pytest.mark.parametrize(
    "kw, message",
    [
        (
            dict(train_subset=5),
            "dataset.train_subset=5 must be an integer >= the number of classes",
        ),
        (dict(train_subset=100000), "dataset.train_subset=100000 needs 10000 examples of class 0"),
        (dict(batch_size="half"), "dataset.batch_size='half' must be a positive integer or full"),
    ],
)
def test_bad_subset_or_batch_is_one_line(kw, message):
    with pytest.raises(UserError, match=re.escape(message)) as e:
        build_data(cfg(name="digits", **kw), torch.device("cpu"), seed=0)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("policy", ["trivialaugment", "cutout"])
def test_image_folder_policy_in_the_workers_and_an_unaugmented_training_pass(tmp_path, policy):
    c = OmegaConf.merge(_image_tree(tmp_path), {"augment": policy, "num_workers": 1})
    d = build_data(c, torch.device("cpu"), seed=0)
    d.train.set_epoch(1)
    first = [x for x, _, _ in d.train]
    d.train.set_epoch(1)
    assert all(torch.equal(a, b) for a, b in zip(first, (x for x, _, _ in d.train)))
    plain = torch.cat([x for x, _, _ in d.train_plain])  # every training image, in order
    assert plain.shape == (8, 3, 16, 16) and torch.equal(
        plain, torch.cat([x for x, _, _ in d.train_plain])
    )


def test_cifar_policy_batches_and_the_plain_training_pass(tmp_path, monkeypatch):
    install(monkeypatch, tmp_path, "cifar10", n_train=50, n_test=20)
    c = cfg(
        name="cifar10", data_dir=str(tmp_path), download=False, augment="randaugment", batch_size=10
    )
    d = build_data(c, torch.device("cpu"), seed=0)
    x, _, idx = next(iter(d.train))
    assert x.shape == (10, 3, 32, 32) and x.dtype == torch.float32
    plain = next(iter(d.train_plain))[0]
    assert torch.equal(plain, d.prepare(d.train_tensors[0][:50], None))  # un-augmented, in order


def test_crop_flip_equals_padding_slicing_and_flipping_each_sample():
    """The row-copy crop (a padded buffer kept between batches) against the definition, sample by
    sample, on uint8 and float images, odd sizes, and the same buffer used again."""
    from sam_runner.data.loaders import crop_flip

    g = torch.Generator().manual_seed(0)
    for dtype, shape, pad in ((torch.uint8, (6, 3, 7, 5), 2), (torch.float32, (4, 1, 8, 8), 3)):
        for _ in range(3):
            x = torch.randint(0, 256, shape, generator=g).to(dtype)
            n, _, h, w = shape
            draws = torch.stack(
                [
                    torch.randint(0, 2 * pad + 1, (n,), generator=g),
                    torch.randint(0, 2 * pad + 1, (n,), generator=g),
                    torch.randint(0, 2, (n,), generator=g),
                ]
            )
            padded = torch.nn.functional.pad(x, (pad,) * 4)
            for i, (oy, ox, flip) in enumerate(draws.T.tolist()):
                want = padded[i, :, oy : oy + h, ox : ox + w]
                want = want.flip(2) if flip else want
                assert torch.equal(crop_flip(x, pad, draws)[i], want)


def test_an_epochs_draws_made_at_once_are_the_batch_by_batch_draws():
    """The loader draws an epoch's crops, flips and policy seeds before its first batch: the
    batches are, bit for bit, those of drawing from the same generator batch by batch after the
    shuffle (as the loader did before), for one process and for each of two."""
    from sam_runner.data.augment import tensor_policy
    from sam_runner.data.loaders import Normalize

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (40, 3, 10, 10), generator=g, dtype=torch.uint8)
    y = torch.arange(40) % 10
    for policy in ("basic", "cutout"):
        crop, op = tensor_policy(policy, 10)
        tf = Normalize((0.5, 0.4, 0.3), (0.2, 0.25, 0.3), augment=crop, policy=op)
        for rank, world in ((0, 1), (0, 2), (1, 2)):
            ld = TensorLoader(x, y, 16, shuffle=True, seed=5, drop_last=False, transform=tf,
                              rank=rank, world=world)  # fmt: skip
            ld.set_epoch(2)
            gen = ld.generator()
            order = torch.randperm(40, generator=gen)
            batches = list(ld)
            assert len(batches) == 3
            for i, (xb, yb, ib) in enumerate(batches):
                idx = order[i * 16 : (i + 1) * 16]
                share = (len(idx), slice(rank, None, world))
                want = tf(x[idx[share[1]]], gen, share if world > 1 else None)
                assert torch.equal(ib, idx[share[1]]) and torch.equal(yb, y[ib])
                assert torch.equal(xb, want)


def _padded_crop(x, pad, idx, draws):
    """The definition: each image ``idx`` zero-padded, cropped at its offsets, flipped if drawn."""
    h, w = x.shape[-2:]
    padded = torch.nn.functional.pad(x, (pad,) * 4)
    out = [
        padded[i, :, oy : oy + h, ox : ox + w]
        for i, oy, ox in zip(idx.tolist(), *draws[:2].tolist())
    ]
    return torch.stack([o.flip(2) if f else o for o, f in zip(out, draws[2].tolist())])


def test_held_images_crop_any_image_as_the_definition():
    """The padded and mirrored images held once: any image, any offset, either flip, in the order
    asked (repeats too), against padding, slicing and flipping, on uint8 and float images."""
    from sam_runner.data.loaders import Held

    g = torch.Generator().manual_seed(1)
    for dtype, shape, pad in ((torch.uint8, (9, 3, 7, 5), 2), (torch.float32, (5, 2, 6, 6), 4)):
        x = torch.randint(1, 256, shape, generator=g).to(dtype)  # no zero: padding shows
        held = Held(x, pad)
        # every offset and flip at least once, over every image
        oy, ox, flip = torch.meshgrid(
            *[torch.arange(2 * pad + 1)] * 2, torch.arange(2), indexing="ij"
        )
        draws = torch.stack([oy.flatten(), ox.flatten(), flip.flatten()])
        idx = torch.randint(0, shape[0], (draws.shape[1],), generator=g)
        assert torch.equal(held.crop(held.starts(idx, draws)), _padded_crop(x, pad, idx, draws))


def test_loader_crops_its_images_as_they_are_now():
    """The loader pads and mirrors its images once and keeps them across epochs; images changed
    in place, or replaced, are padded again: its batches always crop the images it has."""
    from sam_runner.data.loaders import Normalize

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 200, (32, 3, 6, 6), generator=g, dtype=torch.uint8)
    tf = Normalize((0.5,) * 3, (0.25,) * 3, augment=True, pad=2)
    ld = TensorLoader(x, torch.arange(32), 8, shuffle=True, seed=0, drop_last=True, transform=tf)

    def epoch_is_definition(images):
        gen = ld.generator()
        order = torch.randperm(32, generator=gen)
        for i, (xb, _, idx) in enumerate(ld):
            want = tf(images[order[i * 8 : (i + 1) * 8]], gen)
            assert torch.equal(idx, order[i * 8 : (i + 1) * 8]) and torch.equal(xb, want)

    epoch_is_definition(x)
    held = ld._held
    ld.set_epoch(1)
    epoch_is_definition(x)
    assert ld._held is held  # not padded again
    x.add_(50)
    epoch_is_definition(x)
    ld.x = x.flip(2).contiguous()
    epoch_is_definition(ld.x)


class _Transfers(torch.overrides.TorchFunctionMode):
    """Counts the calls that move a tensor between devices or read it on the host: ``.to`` given
    a device, ``.cuda``, ``.cpu``, ``.pin_memory``, ``.item``, ``.tolist``, ``bool()``."""

    READS = {"cuda", "cpu", "pin_memory", "item", "tolist", "__bool__"}

    def __init__(self):
        super().__init__()
        self.calls = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        to_device = name == "to" and (
            "device" in kwargs or any(isinstance(a, (torch.device, str)) for a in args[1:])
        )
        if to_device or name in self.READS:
            self.calls.append(name)
        return func(*args, **kwargs)


def test_a_cifar_batch_makes_no_device_copy_nor_host_read():
    """Crops, flips and the normalisation constants reach the batch's device once per epoch (a
    non-blocking copy from pinned memory on CUDA), not per batch: the loader made five such
    copies a batch, each a stream synchronisation on CUDA."""
    from sam_runner.data.loaders import Normalize

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (64, 3, 8, 8), generator=g, dtype=torch.uint8)
    tf = Normalize((0.5,) * 3, (0.25,) * 3, augment=True, pad=2)
    ld = TensorLoader(x, torch.arange(64), 16, shuffle=True, seed=0, drop_last=True, transform=tf)
    list(ld)  # the constants' one copy
    batches = iter(ld)
    next(batches)  # the epoch's draws, made with its first batch
    with _Transfers() as counter:
        rest = list(batches)
    assert len(rest) == 3 and counter.calls == []
