"""Density estimation from the CLI: a circuit's run logs its log-likelihoods and exact trace,
resumes exactly, binarizes its data, and refuses what a circuit cannot take (one line, exit 2)."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import compose, run_cli, stopped_early_of

from sam_runner.circuits.circuit import ProbabilisticCircuit
from sam_runner.data import build_data
from sam_runner.metrics import pc_hessian_trace
from sam_runner.train import train

PC = [
    "model=pc",
    "model.depth=2",
    "model.sum_units=3",
    "model.repetitions=2",
    "dataset=digits",
    "dataset.binarize=true",
    "dataset.train_subset=120",
    "dataset.batch_size=40",
    "trainer.loss=nll",
    "metrics.hessian.max_iter=20",
    "trainer.progress=none",
]
EM = ["base_optimizer=em", "optimizer=base", "base_optimizer.lr=0.5"]


def lines(run_dir):
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_an_em_run_logs_log_likelihoods_and_the_exact_trace_of_its_weights(tmp_path):
    summary = train(compose(*PC, *EM, "regularizer=pc_adaptive", "trainer.epochs=2"), tmp_path)
    rows = lines(tmp_path)
    assert [r["epoch"] for r in rows] == [1, 2]
    last = rows[-1]
    assert "test_acc" not in last and "train_acc" not in last
    assert last["test_bpd"] == pytest.approx(-last["test_ll"] / (64 * 0.6931471805599453))
    assert last["test_ll"] > rows[0]["test_ll"] - 1.0 and last["train_ll"] < 0
    depth = [last["hessian_trace_depth_0"], last["hessian_trace_depth_1"]]
    assert sum(depth) == pytest.approx(last["hessian_trace_exact"], rel=1e-6)
    assert summary["status"] == "completed"
    assert summary["test_bpd"] == last["test_bpd"] and summary["lambda_max"] > 0
    # the logged trace is pc_hessian_trace of the saved weights on the training subset
    torch.manual_seed(0)
    pc = ProbabilisticCircuit(64, 2, 2, 3, 2)
    pc.load_state_dict(torch.load(tmp_path / "checkpoints/last.pt", weights_only=True)["model"])
    data = build_data(compose(*PC).dataset, torch.device("cpu"), 0)
    x = data.train_tensors[0]
    assert set(x.unique().tolist()) == {0.0, 1.0}  # binarized
    assert pc_hessian_trace(pc, [x]) == pytest.approx(last["hessian_trace_exact"], rel=1e-5)


def test_a_gradient_trained_circuit_with_sam_and_the_trace_regularizer_runs(tmp_path):
    cfg = compose(*PC, "optimizer=sam", "base_optimizer.lr=0.5", "regularizer=pc_trace",
                  "trainer.epochs=1")  # fmt: skip
    summary = train(cfg, tmp_path)
    assert summary["status"] == "completed" and summary["hessian_trace_exact"] < 0


def test_a_circuits_em_run_stopped_and_resumed_ends_like_an_uninterrupted_one(tmp_path):
    run = [*PC, *EM, "regularizer=pc_trace", "scheduler=constant", "metrics.hessian.enabled=false"]
    train(compose(*run, "trainer.epochs=3"), tmp_path / "whole", [])
    train(compose(*run, "trainer.epochs=2"), tmp_path / "split", [])
    stopped_early_of(tmp_path / "split", 3)
    train(compose(*run, "trainer.epochs=3"), tmp_path / "split", [])
    drop = ("time_s", "hessian_time_s")
    a, b = ([{k: v for k, v in r.items() if k not in drop} for r in lines(tmp_path / d)]
            for d in ("split", "whole"))  # fmt: skip
    assert a == b


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["model=pc", "trainer.loss=nll"], "model=pc needs discrete data and dataset=mnist1d "
         "is continuous (arrays are standardised too): set dataset.binarize=true"),
        (["base_optimizer=em", "optimizer=base"], "base_optimizer=em trains a probabilistic "
         "circuit's weights and model=auto is not one"),
        (["regularizer=pc_trace"], "regularizer=pc_trace regularizes a probabilistic circuit's "
         "Hessian trace and model=auto is not one"),
        (["model=pc", "trainer.loss=nll", "dataset.binarize=true", "model.depth=6"],
         "model.depth=6 must be an integer in [1, 5]"),
        (["model=pc", "trainer.loss=nll", "dataset.binarize=true", "model.sum_units=0"],
         "model.sum_units=0 must be an integer in [1, 256]"),
        (["model=pc", "trainer.loss=nll", "dataset.binarize=true", "model.repetitions=-1"],
         "model.repetitions=-1 must be"),
        (["model=pc", "dataset.binarize=true"], "model=pc is a density model: set "
         "trainer.loss=nll"),
        (["model=pc", "trainer.loss=nll", "dataset.binarize=true", "base_optimizer=em"],
         "base_optimizer=em takes optimizer=base, not optimizer=sam"),
        ([*PC[:9], "trainer.precision=bf16"], "trainer.precision=bf16 does not apply to "
         "model=pc"),
        ([*PC[:9], *EM, "trainer.devices=2"], "trainer.devices=2 does not apply to "
         "base_optimizer=em yet"),
        (["dataset=cifar10", "dataset.binarize=true"], "dataset.binarize is not a key of "
         "dataset=cifar10"),
        (["dataset=cifar10", "model=pc", "trainer.loss=nll"], "dataset=cifar10 is continuous "
         "(arrays are standardised too): use dataset.binarize=true on one of digits, mnist1d, "
         "arrays"),
    ],
)  # fmt: skip
def test_what_a_circuit_cannot_take_is_one_line_and_exit_2(tmp_path, capsys, overrides, message):
    run = tmp_path / "run"
    code, _, err = run_cli([*overrides, f"hydra.run.dir={run}"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert message in err
    assert not run.exists()


def test_sam_eval_and_sam_landscape_say_in_one_line_that_a_circuit_is_not_theirs(tmp_path, capsys):
    from sam_runner.evaluation.cli import main as eval_main
    from sam_runner.landscape.cli import main as landscape_main

    train(compose(*PC, *EM, "trainer.epochs=1", "metrics.hessian.enabled=false"), tmp_path)
    capsys.readouterr()
    assert landscape_main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "is a probabilistic circuit's run (model=pc)" in err
    assert not (tmp_path / "landscape").exists()
    eval_main([str(tmp_path)])
    err = capsys.readouterr().err
    assert "sam-eval measures classifiers" in err
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "completed"
