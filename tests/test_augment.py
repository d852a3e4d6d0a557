"""dataset.augment policies (per sample, seeded, resumable) and MixUp/CutMix soft targets."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from sam_runner.data.augment import AUGMENTS, Mixing, folder_transform, policy_name, tensor_policy
from sam_runner.data.augment import validate as validate_augment
from sam_runner.data.loaders import Normalize, TensorLoader
from sam_runner.errors import UserError
from sam_runner.losses import per_example

POLICIES = ["none", "basic", "cutout", "autoaugment", "randaugment", "trivialaugment"]
RANDOM_OPS = ["cutout", "autoaugment", "randaugment", "trivialaugment"]


def images(n=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g)


def loader(policy, x, seed=0, rank=0, world=1, batch_size=8):
    crop_flip, op = tensor_policy(policy, 32)
    # mean 0, std 1: the loader's output is the image in [0, 1]
    tf = Normalize((0.0, 0.0, 0.0), (1.0, 1.0, 1.0), augment=crop_flip, policy=op)
    y = torch.arange(len(x)) % 10
    return TensorLoader(
        x, y, batch_size, shuffle=True, seed=seed, drop_last=True, transform=tf, rank=rank,
        world=world,
    )  # fmt: skip


def epoch_batches(ld, epoch):
    ld.set_epoch(epoch)
    return [b[0] for b in ld]


def test_every_policy_is_registered_and_legacy_booleans_still_work():
    assert sorted(AUGMENTS) == sorted(POLICIES)
    assert policy_name(True) == "basic" and policy_name(False) == "none"


@pytest.mark.parametrize("policy", POLICIES)
def test_policy_is_seeded_in_range_and_a_resumed_epoch_repeats_its_batches(policy):
    x = images()
    first = epoch_batches(loader(policy, x), 3)
    again = epoch_batches(loader(policy, x), 3)  # a fresh loader: as a resumed run builds it
    assert all(torch.equal(a, b) for a, b in zip(first, again)) and len(first) == 2
    for b in first:
        assert b.dtype == torch.float32 and b.min() >= 0 and b.max() <= 1
    if policy != "none":
        other = epoch_batches(loader(policy, x, seed=1), 3)
        assert not all(torch.equal(a, b) for a, b in zip(first, other))
        assert not torch.equal(first[0], epoch_batches(loader(policy, x), 4)[0])


@pytest.mark.parametrize("policy", RANDOM_OPS)
def test_two_samples_of_one_batch_get_their_own_operation(policy):
    """Eight copies of one image in one batch, no crop and flip: the policy alone draws."""
    _, op = tensor_policy(policy, 32)
    same = images(1).expand(8, -1, -1, -1).contiguous()
    out = op(same, torch.Generator().manual_seed(0))
    assert out.dtype == torch.uint8 and out.shape == same.shape
    distinct = {bytes(o.flatten().numpy()) for o in out}
    assert len(distinct) >= 4, f"{policy}: {len(distinct)} distinct results of 8"


def holes(x):
    """(rows, cols) of each image's hole: the pixels 0 in every channel, checked to be one
    rectangle (a square clipped at the border)."""
    mask = (x == 0).all(dim=1)
    rows, cols = mask.any(2).sum(1), mask.any(1).sum(1)
    assert torch.equal(mask.flatten(1).sum(1), rows * cols)  # one filled rectangle
    return rows, cols


def test_cutout_fills_the_mean_colour_in_a_square_centred_anywhere_and_clipped():
    from sam_runner.data.sources import CIFAR_STATS

    mean, std = CIFAR_STATS["cifar10"]
    _, op = tensor_policy("cutout", 32)
    white = torch.full((512, 3, 32, 32), 255, dtype=torch.uint8)
    out = Normalize(mean, std, policy=op)(white, torch.Generator().manual_seed(0))
    rows, cols = holes(out)  # 0 after normalisation: the dataset's mean colour
    assert rows.min() >= 8 and rows.max() <= 16 and cols.min() >= 8 and cols.max() <= 16
    area = (rows * cols).float()
    assert (area == 256).any() and (area < 256).any()  # whole inside, or clipped at the border
    assert 186 < area.mean() < 206  # DeVries & Taylor's placement: 196 px on average
    rest = (1 - torch.tensor(mean)) / torch.tensor(std)
    untouched = out.permute(1, 0, 2, 3)[:, ~(out == 0).all(dim=1)]
    assert torch.allclose(untouched, rest.view(3, 1).expand_as(untouched))


def test_data_parallel_shares_are_the_one_process_batch_sliced():
    x = images()
    whole = epoch_batches(loader("autoaugment", x, batch_size=8), 1)
    shares = [
        epoch_batches(loader("autoaugment", x, rank=r, world=2, batch_size=8), 1) for r in (0, 1)
    ]
    for i, b in enumerate(whole):
        assert torch.equal(b[0::2], shares[0][i]) and torch.equal(b[1::2], shares[1][i])


@pytest.mark.parametrize("policy", POLICIES)
def test_folder_transform_of_each_policy_gives_a_normalised_tensor(policy):
    from PIL import Image

    img = Image.fromarray(images(1)[0].permute(1, 2, 0).numpy())
    out = folder_transform(policy, 24, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5))(img)
    assert out.shape == (3, 24, 24) and out.dtype == torch.float32
    assert out.min() >= -1 and out.max() <= 1


@pytest.mark.parametrize(
    "key,value,message",
    [
        ("augment", "autoaugmnet", "dataset.augment='autoaugmnet' is unknown (did you mean "
         "autoaugment?)"),
        ("mixup_alpha", -0.2, "dataset.mixup_alpha=-0.2 must be a number >= 0 (0 = off)"),
        ("cutmix_alpha", -1, "dataset.cutmix_alpha=-1 must be a number >= 0 (0 = off)"),
    ],
)  # fmt: skip
def test_bad_recipe_keys_are_one_line_errors(key, value, message):
    with pytest.raises(UserError) as e:
        validate_augment(OmegaConf.create({key: value}))
    assert str(e.value).startswith(message) and "\n" not in str(e.value)


def mixed(kind, alpha=1.0, step=5, n=8, classes=10):
    cfg = OmegaConf.create({f"{kind}_alpha": alpha})
    x = torch.randn(n, 3, 8, 8, generator=torch.Generator().manual_seed(0))
    y = torch.arange(n) % classes  # distinct neighbours: λ reads off the targets
    mx, t = Mixing(cfg, classes, seed=0)(x, y, step)
    return x, y, mx, t


@pytest.mark.parametrize("kind", ["mixup", "cutmix"])
def test_mixed_targets_sum_to_one_are_seeded_by_step_and_the_loss_is_the_mixed_loss(kind):
    x, y, mx, t = mixed(kind)
    assert t.shape == (8, 10) and torch.allclose(t.sum(1), torch.ones(8))
    _, _, mx2, t2 = mixed(kind)
    assert torch.equal(mx, mx2) and torch.equal(t, t2)
    assert not torch.equal(t, mixed(kind, step=6)[3])
    lam = float(t[0, y[0]])
    assert 0 < lam < 1
    other = y.roll(1)
    if kind == "mixup":
        assert torch.allclose(mx, lam * x + (1 - lam) * x.roll(1, 0), atol=1e-6)
    logits = torch.randn(8, 10, generator=torch.Generator().manual_seed(1))
    ce = per_example("cross_entropy")
    direct = lam * ce(logits, y) + (1 - lam) * ce(logits, other)
    assert torch.allclose(ce(logits, t), direct, atol=1e-5)
    smoothed = per_example("cross_entropy", 0.1)
    assert torch.allclose(
        smoothed(logits, t), lam * smoothed(logits, y) + (1 - lam) * smoothed(logits, other),
        atol=1e-5,
    )  # fmt: skip
    target = lam * F.one_hot(y, 10) + (1 - lam) * F.one_hot(other, 10)
    mse_direct = 0.5 * (logits - target).square().sum(1)
    assert torch.allclose(per_example("mse")(logits, t), mse_direct, atol=1e-5)


def test_mixup_of_1d_signals_and_no_mixing_passes_through():
    cfg = OmegaConf.create({"mixup_alpha": 0.4})
    x, y = torch.randn(6, 1, 40), torch.arange(6)
    mx, t = Mixing(cfg, 10, 0, (1, 40))(x, y, 0)
    assert mx.shape == x.shape and t.shape == (6, 10)
    off = Mixing(OmegaConf.create({}), 10, 0)
    assert off(x, y, 0) == (x, y)
    with pytest.raises(UserError, match="cutmix_alpha=1 needs images"):
        Mixing(OmegaConf.create({"cutmix_alpha": 1.0}), 10, 0, (1, 40))
