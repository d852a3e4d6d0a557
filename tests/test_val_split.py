"""dataset.val_split: a seeded, stratified split held out of training before anything else."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from conftest import compose
from omegaconf import OmegaConf

from sam_runner.data import build_data
from sam_runner.data.labels import training_labels, validation_split
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


def labels(n_per_class=(50, 30, 20)):
    return torch.cat([torch.full((n,), c) for c, n in enumerate(n_per_class)])[torch.randperm(100)]


def test_split_is_disjoint_stratified_and_fixed_by_the_seed():
    y = labels()
    pool, val = validation_split(y, 3, 0.2, seed=3)
    assert len(val) == 20 and len(pool) == 80
    assert not set(pool.tolist()) & set(val.tolist())
    assert sorted(pool.tolist() + val.tolist()) == list(range(100))
    # each class its share of the split: 50/30/20 examples give 10/6/4
    assert torch.bincount(y[val], minlength=3).tolist() == [10, 6, 4]
    again = validation_split(y, 3, 0.2, seed=3)[1]
    assert torch.equal(val, again)
    assert not torch.equal(val, validation_split(y, 3, 0.2, seed=4)[1])
    assert len(validation_split(y, 3, 7, seed=3)[1]) == 7  # a count
    assert len(validation_split(y, 3, 0, seed=3)[1]) == 0  # off


def test_train_subset_long_tail_and_noise_draw_from_the_pool_only():
    y = torch.arange(180) % 3
    pool, val = validation_split(y, 3, 30, seed=0)
    for extra in ({}, {"train_subset": 60}, {"label_noise": 0.3}, {"imbalance_ratio": 4}):
        keep, _, _ = training_labels(cfg(batch_size=8, **extra), y, 3, 0, 1, pool)
        assert not set(keep.tolist()) & set(val.tolist()), extra
        # the split itself does not depend on what is done to the pool afterwards
        assert torch.equal(validation_split(y, 3, 30, seed=0)[1], val)


def test_tensor_dataset_holds_the_split_out_of_training(tmp_path):
    c = cfg(data_dir=str(tmp_path), num_samples=1000, val_split=0.25)
    d = build_data(c, torch.device("cpu"), seed=0)
    whole = build_data(cfg(data_dir=str(tmp_path), num_samples=1000), torch.device("cpu"), seed=0)
    xv = torch.cat([x for x, _, _ in d.val])
    assert d.train_size == 600 and len(xv) == 200 and whole.val is None
    # the held-out inputs are training inputs, and none of them is trained on
    rows = lambda t: {tuple(r.flatten().tolist()) for r in t}  # noqa: E731
    assert rows(xv) <= rows(whole.train_tensors[0])
    assert not rows(xv) & rows(d.train_tensors[0])


def test_image_folder_split_uses_the_test_transform(tmp_path):
    from PIL import Image

    for split in ("train", "val"):
        for c in ("cat", "dog"):
            (tmp_path / split / c).mkdir(parents=True)
            for i in range(5):
                Image.new("RGB", (20, 20), (i * 40, 100, 200)).save(
                    tmp_path / split / c / f"{i}.png"
                )
    c = cfg(
        name="image_folder",
        root=str(tmp_path),
        image_size=16,
        num_workers=0,
        batch_size=2,
        val_split=4,
    )
    d = build_data(c, torch.device("cpu"), seed=0)
    assert d.train_size == 6
    xv, yv = (torch.cat(t) for t in zip(*[(x, y) for x, y, _ in d.val]))
    assert sorted(yv.tolist()) == [0, 0, 1, 1]
    # no augmentation: evaluating the split twice sees the same tensors
    assert torch.equal(xv, torch.cat([x for x, _, _ in d.val]))


@pytest.mark.parametrize("value", [-0.1, 2.5, "x", 1000])
def test_bad_split_is_one_line(tmp_path, value):
    with pytest.raises(UserError, match=r"dataset.val_split=") as e:
        build_data(
            cfg(data_dir=str(tmp_path), num_samples=1000, val_split=value),
            torch.device("cpu"),
            seed=0,
        )
    assert "\n" not in str(e.value)


def test_val_acc_equals_a_direct_evaluation_and_summary_holds_the_best(tmp_path):
    from sam_runner import distributed
    from sam_runner.losses import per_example
    from sam_runner.metrics.evaluate import evaluate
    from sam_runner.models import build_model
    from sam_runner.train import train

    c = compose(
        *[
            "model=mlp",
            "dataset.num_samples=1000",
            "metrics.hessian.enabled=false",
            "trainer.device=cpu",
            "trainer.epochs=2",
            "trainer.progress=none",
            f"dataset.data_dir={tmp_path}",
            "dataset.val_split=0.2",
        ]
    )
    run = tmp_path / "run"
    summary = train(c, run, [])
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all({"val_loss", "val_acc", "val_ece", "val_nll"} <= set(x) for x in lines)
    best = max(lines, key=lambda x: x["val_acc"])
    assert summary["val_acc"] == lines[-1]["val_acc"]
    assert (summary["best_val_acc"], summary["best_val_epoch"]) == (best["val_acc"], best["epoch"])
    assert summary["objective"] == "val_acc" and summary["selected_on_test"] is False

    data = build_data(c.dataset, torch.device("cpu"), c.seed)
    model = build_model(c.model, data.input_shape, data.num_classes)
    model.load_state_dict(torch.load(run / "checkpoints" / "last.pt", weights_only=False)["model"])

    row = evaluate(
        model,
        data.val,
        per_example("cross_entropy", 0.0),
        contextlib.nullcontext(),
        distributed.current(),
        c.metrics,
    )
    assert row["test_acc"] == pytest.approx(summary["val_acc"], abs=1e-6)
