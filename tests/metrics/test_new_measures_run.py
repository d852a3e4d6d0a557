"""The new measures in a real run and in sam-eval: their keys on the last line and in eval.json,
θ⁰ kept in the run folder, and sam-eval's values equal to training's (same weights, same
subset)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY, compose

from sam_runner.errors import UserError
from sam_runner.rundir import INIT_WEIGHTS
from sam_runner.train import train

NEW = [
    "metrics.flip.enabled=true",
    "metrics.complexity.enabled=true",
    "metrics.quantization.enabled=true",
    "metrics.input_grad.enabled=true",
    "metrics.sharpness_dim.enabled=true",
    "metrics.sharpness_dim.max_dense=100000",  # the default MLP: exact
    "model=mlp",
    "model.hidden=[16]",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    train(compose(*TINY, *NEW), run_dir, [])
    return run_dir


def last_line(run_dir) -> dict:
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])


def test_every_key_on_the_last_line_and_theta0_kept(run):
    row = last_line(run)
    for key in (
        "param_norm",
        "dist_from_init",
        "path_norm",
        "spectral_norm_product",
        "quant_acc_8bit",
        "quant_drop_4bit",
        "quant_loss_rise_pred_4bit",
        "input_grad_norm",
        "sharpness_dim",
        "flip_prob",
        "flip_prob_scale",
    ):
        assert key in row, key
    assert row["sharpness_dim_dense"] is True
    assert abs(row["quant_drop_8bit"]) < 0.05 and row["quant_loss_rise_pred_4bit"] > 0
    initial = torch.load(run / INIT_WEIGHTS, weights_only=True)
    final = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["model"]
    dist = sum(
        float((final[k].double() - initial[k].double()).square().sum())
        for k in initial
        if k.endswith("weight")
    )
    assert row["dist_from_init"] == pytest.approx(dist, rel=1e-6)


def test_sam_eval_gives_the_same_values(run, capsys):
    from sam_runner.evaluation.cli import main

    code = main([str(run), *NEW[:6], "metrics.hessian.num_samples=256", "trainer.progress=none"])
    assert code == 0, capsys.readouterr().err
    measured = json.loads((run / "eval.json").read_text())
    row = last_line(run)
    for key in (
        "param_norm",
        "dist_from_init",
        "path_norm",
        "spectral_norm_product",
        "quant_acc_4bit",
        "input_grad_norm",
        "sharpness_dim",
        "flip_prob",
    ):
        assert measured[key] == pytest.approx(row[key], rel=1e-5), key


@pytest.mark.parametrize(
    "override, message",
    [
        ("metrics.quantization.bits=[1]", "metrics.quantization.bits=[1] must be a non-empty"),
        ("metrics.quantization.bits=[]", "metrics.quantization.bits=[] must be a non-empty"),
        ("metrics.sharpness_dim.max_dense=0", "metrics.sharpness_dim.max_dense=0 must be an"),
        ("metrics.sharpness_dim.lr=0", "metrics.sharpness_dim.lr=0 must be null or a finite"),
        ("metrics.flip.kinds=[blur]", "metrics.flip.kinds=['blur']: blur is not a kind; choose"),
        ("metrics.flip.frames=1", "metrics.flip.frames=1 must be an integer >= 2"),
    ],
)
def test_bad_options_are_refused_before_training(tmp_path, override, message):
    args = [*TINY, "metrics.sharpness_dim.enabled=true", override]
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("]", r"\]")):
        train(compose(*args), tmp_path / "run", [])
    assert not (tmp_path / "run" / "metrics.jsonl").exists()
