"""Image folders measured like tensor datasets: the measurement subset, the tree's checks, the
samplers and label options on folder data (on PNG/JPEG trees the tests write)."""

from __future__ import annotations

import multiprocessing
import re
import shutil

import pytest
import torch
from conftest import run_cli
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


def test_folder_cutout_is_the_tensor_paths_mean_colour_square_clipped_at_the_border(tree):
    data = build_data(cfg(root=str(tree), augment="cutout"), CPU, seed=0)
    x = torch.cat([b[0] for b in data.train])  # 120 normalised 32×32 images
    mask = (x == 0).all(dim=1)  # 0 after normalisation: the mean colour, as on tensor data
    rows, cols = mask.any(2).sum(1), mask.any(1).sum(1)
    assert torch.equal(mask.flatten(1).sum(1), rows * cols)  # one rectangle per image
    assert rows.min() >= 8 and rows.max() <= 16 and cols.min() >= 8 and cols.max() <= 16
    assert (rows * cols < 256).any()  # centred anywhere: clipped at the border


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


def empty_class(root):
    for split in ("train", "val"):
        (root / split / "dog").mkdir()


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda r: shutil.rmtree(r / "val"), r"missing folder .*val"),
        (empty_class, r"class folder .*train/dog holds no images"),
        # labels are sorted positions: without bee, val's cat would be scored as bee
        (
            lambda r: shutil.rmtree(r / "val" / "bee"),
            r"val/ has other class folders than train/ \(missing bee\); labels are",
        ),
        (
            lambda r: (r / "val" / "cat").rename(r / "val" / "cow"),
            r"val/ has other class folders than train/ \(missing cat; extra cow\)",
        ),
        (lambda r: (r / "train" / "bee").rename(r / "train" / "ape"), r"\(missing ape; extra bee"),
    ],
)
def test_bad_trees_are_one_line_errors(tmp_path, damage, words):
    root = write_tree(tmp_path / "t", per_class=2, val_per_class=1)
    damage(root)
    with pytest.raises(UserError, match=words) as e:
        build_data(cfg(root=str(root)), CPU, seed=0)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "args, words",
    [
        (["dataset.image_size=0"], "dataset.image_size=0 must be a positive integer"),
        (["dataset.image_size=abc"], "dataset.image_size='abc' must be a positive integer"),
        (["dataset.image_size=2.5"], "dataset.image_size=2.5 must be a positive integer"),
        (["dataset.num_workers=-1"], "dataset.num_workers=-1 must be an integer >= 0"),
        (["dataset.num_workers=true"], "dataset.num_workers=True must be an integer >= 0"),
        (["VAL_WITHOUT_BEE"], "val/ has other class folders than train/ (missing bee)"),
        # sweeps: a later job's value stops them before the first job runs
        (["-m", "dataset.image_size=16,0"], "dataset.image_size=0 must be a positive integer"),
        (["-m", "dataset.imbalance_ratio=1,0"], "dataset.imbalance_ratio=0 must be a number >= 1"),
        (["-m", "dataset.imbalance_ratio=2,x"], "dataset.imbalance_ratio='x' must be a number"),
    ],
)
def test_bad_folder_keys_stop_sam_run_before_any_folder(tmp_path, capsys, args, words):
    root = write_tree(tmp_path / "t", per_class=2, val_per_class=1)
    if args == ["VAL_WITHOUT_BEE"]:
        shutil.rmtree(root / "val" / "bee")
        args = []
    out = tmp_path / "out"
    sweep = args[:1] == ["-m"]
    argv = [
        *args[:sweep],
        "dataset=image_folder",
        f"dataset.root={root}",
        "dataset.batch_size=2",
        "model=cnn",
        "trainer.epochs=1",
        *args[sweep:],
        f"hydra.run.dir={out}",
        f"hydra.sweep.dir={out}",
    ]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("sam-run: error: ") and words in err
    assert not out.exists()


def test_an_unreadable_image_read_by_a_worker_is_one_line(tmp_path):
    """With workers the DataLoader re-raises a worker's error wrapped in the worker's traceback:
    the loaders give back the one line, for the test set and the measurement subset alike;
    the workers end as soon as the error and the data are let go."""
    root = write_tree(tmp_path / "t", per_class=4, val_per_class=2)
    before = set(multiprocessing.active_children())
    data = build_data(cfg(root=str(root), num_workers=2, batch_size=4), CPU, seed=0)
    for path, read in (
        (root / "val" / "bee" / "1.jpg", lambda d: list(d.test)),
        (root / "train" / "cat" / "2.png", lambda d: d.train_subset(12, 0)),
    ):
        path.write_bytes(b"not an image")
        with pytest.raises(UserError) as e:
            read(data)
        assert str(e.value) == (
            f"dataset.root: image {path} is unreadable (UnidentifiedImageError); replace or "
            "remove it"
        )
    del data, e  # no garbage collection needed: no reference cycle keeps them
    assert set(multiprocessing.active_children()) <= before


def test_a_subset_that_does_not_fit_names_num_samples(tree):
    data = build_data(cfg(root=str(tree), image_size=40000), CPU, seed=0)
    with pytest.raises(UserError, match=r"metrics.hessian.num_samples=4096: .* GiB") as e:
        data.train_subset(4096, 0)
    assert "\n" not in str(e.value)


def test_the_memory_check_counts_the_float_copy(tmp_path):
    """A measurement holds the subset as uint8 and, normalised, as float32 at once (5 bytes a
    value): a subset whose uint8 copy alone takes a quarter of the memory available is
    refused before anything is decoded (the images here cannot be: the check comes first)."""
    from sam_runner.data.folder import available_bytes, subset_bytes

    root = write_tree(tmp_path / "t", per_class=1, val_per_class=1)
    for image in (root / "train").glob("*/*"):
        image.write_bytes(b"never decoded")
    size = int((available_bytes() / 4 / 9) ** 0.5)  # 3 images × 3 channels × size² = 1/4
    data = build_data(cfg(root=str(root), image_size=size, batch_size=1), CPU, seed=0)
    with pytest.raises(UserError) as e:
        data.train_subset(3, 0)
    assert re.fullmatch(
        rf"metrics.hessian.num_samples=3: the measurement subset \(3 images at {size}²\) needs "
        r"[\d.]+ GiB at once on the host \(uint8 as decoded, float32 as measured\), over half "
        r"the [\d.]+ GiB available there; lower metrics.hessian.num_samples",
        str(e.value),
    )
    # on a CUDA device: the uint8 copy on the host, both copies on the device
    values = 4096 * 3 * 224 * 224
    host, gpu = torch.device("cpu"), torch.device("cuda:1")
    assert subset_bytes(4096, 224) == subset_bytes(4096, 224, host) == {host: 5 * values}
    assert subset_bytes(4096, 224, gpu) == {host: values, gpu: 5 * values}


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


def test_more_workers_than_cpus_are_capped_with_a_notice(tree, monkeypatch):
    from conftest import compose

    from sam_runner.data.sources import folder_workers
    from sam_runner.validate import warnings

    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "1")
    assert folder_workers(cfg(num_workers=4)) == 1 and folder_workers(cfg(num_workers=0)) == 0
    data = build_data(cfg(root=str(tree), num_workers=4), CPU, seed=0)
    assert data.train.kw["num_workers"] == 1
    run = compose("dataset=image_folder", f"dataset.root={tree}", "dataset.num_workers=3")
    assert (
        "dataset.num_workers=3 is more than the 1 CPU(s) allowed (SLURM_CPUS_PER_TASK) for 1 "
        "process(es): 1 worker(s) a loader"
    ) in warnings(run)
