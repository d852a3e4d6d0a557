"""The epoch loop as a long job meets it: progress lines in a log file within an epoch, and
checkpoints every N steps from which a run stopped mid-epoch resumes exactly."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY, compose, run_cli

from sam_runner.errors import Interrupted
from sam_runner.train import train
from sam_runner.training.batches import micro_batches
from sam_runner.training.loop import EpochLoop

QUICK = [*TINY, "trainer.threads=1", "metrics.hessian.num_samples=128"]


def _lines(run_dir):
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if not k.endswith("time_s")} for r in rows]


def _weights(run_dir):
    return torch.load(run_dir / "checkpoints" / "last.pt", weights_only=True)["model"]


def test_a_log_file_gets_progress_lines_within_an_epoch(tmp_path, capsys):
    """stderr is not a terminal here (pytest captures it), as in a SLURM log: ``auto`` writes
    lines, and within an epoch one every ``progress_every_s`` seconds with steps/s and the time
    left."""
    argv = [*TINY, "metrics=off", "trainer.epochs=1", "trainer.progress=auto"]
    argv = [a for a in argv if a != "trainer.progress=none"]
    code, _, err = run_cli([*argv, "trainer.progress_every_s=1e-9", f"hydra.run.dir={tmp_path}"],
                           capsys)  # fmt: skip
    assert code == 0, err
    within = [x for x in err.splitlines() if x.startswith("epoch 1/1: step ")]
    assert within, err
    assert "steps/s" in within[0] and "left" in within[0] and "train_loss" in within[0]
    code, _, err = run_cli([*argv, f"hydra.run.dir={tmp_path / 'quiet'}"], capsys)
    assert code == 0 and "epoch 1/1: step " not in err  # 30 s: a tiny epoch says nothing


@pytest.mark.parametrize("variant", ["optimizer=sam", "optimizer=esam"])
def test_a_run_stopped_mid_epoch_resumes_from_its_step_checkpoint_exactly(
    variant, tmp_path, monkeypatch
):
    steps = [*QUICK, variant, "trainer.epochs=2", "trainer.checkpoint_every_n_steps=2"]
    train(compose(*QUICK, variant, "trainer.epochs=2"), tmp_path / "whole", [])
    step = EpochLoop.optimizer_step

    def stopped(self, *args, **kwargs):
        if self.run.clock.step == 9:  # epoch 2's third step; the last checkpoint: step 8
            raise KeyboardInterrupt
        return step(self, *args, **kwargs)

    monkeypatch.setattr(EpochLoop, "optimizer_step", stopped)
    with pytest.raises(Interrupted) as stop:
        train(compose(*steps), tmp_path / "run", [])
    assert "the checkpoint holds epoch 2 (step 8)" in str(stop.value)
    saved = torch.load(tmp_path / "run" / "checkpoints" / "last.pt", weights_only=True)
    assert saved["clock"]["step"] == 8 and saved["epoch_progress"]["stats"]["batches"] == 2
    monkeypatch.setattr(EpochLoop, "optimizer_step", step)
    summary = train(compose(*steps), tmp_path / "run", [])
    assert summary["status"] == "completed"
    whole, run = _weights(tmp_path / "whole"), _weights(tmp_path / "run")
    assert all(torch.equal(whole[k], run[k]) for k in whole)
    a, b = _lines(tmp_path / "whole"), _lines(tmp_path / "run")
    assert [{k: (x[k], y.get(k)) for k in x if x[k] != y.get(k)} for x, y in zip(a, b)] == [{}] * 2
    assert a == b


def test_step_checkpoints_with_a_sampler_that_cannot_resume_mid_epoch_are_refused(tmp_path, capsys):
    run = tmp_path / "run"
    argv = ["dataset.sampler=sgs", "trainer.checkpoint_every_n_steps=5", f"hydra.run.dir={run}"]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and err.count("\n") == 1
    assert "trainer.checkpoint_every_n_steps=5 cannot resume dataset.sampler=sgs" in err
    assert not run.exists()


@pytest.mark.parametrize(
    "extra",
    [
        [],
        ["optimizer=esam", "trainer.accumulate=2", "dataset.mixup_alpha=0.2"],
        ["weight_decay=ouidecay", "trainer.weight_averaging=ema", "regularizer=jsd"],
    ],
)
def test_an_epoch_reads_no_config_object(extra, tmp_path, monkeypatch):
    """Everything a step reads is resolved to plain values at setup: an epoch (steps, parts'
    hooks, the scheduler's factor) makes no access to an OmegaConf node, counted on the real
    DictConfig's own methods."""
    from omegaconf import DictConfig

    from sam_runner.training.run import Run

    cfg = compose(*QUICK, "metrics=off", "trainer.epochs=3", *extra)
    run = Run(cfg, tmp_path / "run", [])
    run.setup()
    run.resume()
    reads = []
    for name in ("__getattr__", "__getitem__", "get"):
        real = getattr(DictConfig, name)

        def counted(self, *args, _real=real, _name=name, **kwargs):
            reads.append((_name, args[:1]))
            return _real(self, *args, **kwargs)

        monkeypatch.setattr(DictConfig, name, counted)
    assert run.loop.train_epoch()
    monkeypatch.undo()
    assert reads == []


@pytest.mark.parametrize("accumulate", [1, 3])
def test_the_closures_mean_backward_is_autograds_mean_bit_for_bit(accumulate, tmp_path):
    """Where the mean alone is backpropagated the closure hands backward the mean's gradient
    (``EpochLoop.mean_gradient``) instead of building the mean's graph: its loss and gradients
    are those of backward through ``per_sample.mean() × share`` itself, bit for bit, for 10 rows
    split unevenly (shares 4/10, 3/10, 3/10) as for a whole batch."""
    from sam_runner.training.run import Run

    cfg = compose(*QUICK, "metrics=off", f"trainer.accumulate={accumulate}",
                  "dataset.batch_size=12", "trainer.label_smoothing=0.1")  # fmt: skip
    run = Run(cfg, tmp_path / "run", [])
    run.setup()
    loop, model = run.loop, run.model
    x, y, idx = (t[:10] for t in next(iter(run.data.train)))
    micro = micro_batches(accumulate, x, y, y, idx)
    loss = loop.forward_backward(micro, {"targets": 0})
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    total = None
    for xm, tm, _, _ in micro:
        part = loop.criterion(model(xm), tm).mean() * (len(tm) / len(y))
        part.backward()
        total = part.detach() if total is None else total + part.detach()
    assert loop._mean_gradients  # the path under test was taken
    assert torch.equal(loss, total)
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters(), strict=True))
