"""Periodic settings that never act within a run's length are a one-line notice (#58 item 2)."""

from __future__ import annotations

import pytest
from conftest import TINY, compose

from sam_runner.preflight import check_jobs
from sam_runner.sweep.hydra_api import args_parser
from sam_runner.train import train

SHORT = ["trainer.epochs=2", "dataset.num_samples=1000"]  # digits: 6 steps an epoch, 12 in all


def notes_of(*argv: str) -> list[str]:
    message, notes = check_jobs(args_parser().parse_args(list(argv)))
    assert message is None, message
    return notes


@pytest.mark.parametrize(
    "argv, note",
    [
        (["weight_decay=ouidecay"], "weight_decay=ouidecay rescales every 256 steps "
         "(weight_decay.every_n_steps) and this run trains 12: no layer's weight decay is ever "
         "rescaled, every layer keeps base_optimizer.weight_decay; set "
         "weight_decay.every_n_steps below 12"),
        (["metrics.hessian.every_n_steps=13"], "metrics.hessian.every_n_steps=13 is more than "
         "this run's 12 steps: no step-level measurement is made (lambda_max is measured at "
         "epoch ends only)"),
        (["metrics.hessian.every_n_epochs=3"], "metrics.hessian.every_n_epochs=3 is more than "
         "trainer.epochs=2: lambda_max is measured at the run's end only"),
        (["trainer.eval_every_n_steps=13"], "trainer.eval_every_n_steps=13 is more than this "
         "run's 12 steps: only the last epoch is evaluated (and checkpointed)"),
        (["trainer.checkpoint_every_n_steps=12"], "trainer.checkpoint_every_n_steps=12 is at "
         "least this run's 12 steps: no checkpoint is written within an epoch, only those of its "
         "evaluations"),
        (["trainer.checkpoint_every_n_steps=11"], None),
        (["trainer.weight_averaging=ema", "trainer.ema_decay=0.5"], None),
        (["trainer.weight_averaging=ema"], "trainer.ema_decay=0.999 is never reached: with "
         "trainer.ema_warmup the t-th update uses (1 + t)/(10 + t), which reaches 0.999 at update "
         "8990, and this run makes 11; set trainer.ema_warmup=false or a lower "
         "trainer.ema_decay"),
        (["optimizer.perturb_schedule=late", "optimizer.perturb_from=1.0"], "optimizer."
         "perturb_from=1.0 with optimizer.perturb_schedule=late starts at the end of training: no "
         "step is perturbed, and the run trains as optimizer=base"),
        (["weight_decay=ouidecay", "weight_decay.every_n_steps=12"], None),
        (["metrics.hessian.every_n_steps=12", "trainer.eval_every_n_steps=12"], None),
        (["optimizer.perturb_schedule=late", "optimizer.perturb_from=0.9"], None),
    ],
)  # fmt: skip
def test_a_period_longer_than_the_run_is_a_notice_and_one_within_it_is_none(argv, note):
    notes = [n for n in notes_of(*SHORT, *argv) if "every" in n or "never" in n or "late" in n]
    assert notes == ([note] if note else [])


def test_the_ema_warm_up_reaches_its_decay_where_the_notice_says():
    from sam_runner.averaging import ema_decay_at
    from sam_runner.idle_periods import ema_reached_at

    for decay in (0.5, 0.9, 0.99, 0.999):
        at = ema_reached_at(decay)
        assert ema_decay_at(decay, True, at) == decay > ema_decay_at(decay, True, at - 1)


@pytest.mark.parametrize("every, rescaled", [(12, True), (13, False)])
def test_ouidecay_rescales_exactly_when_no_notice_says_it_never_will(every, rescaled, tmp_path):
    argv = [*SHORT, "weight_decay=ouidecay", f"weight_decay.every_n_steps={every}"]
    said = any("weight_decay=ouidecay rescales" in n for n in notes_of(*argv))
    cfg = compose(*TINY, *argv, "model=mlp", "trainer.device=cpu", f"dataset.data_dir={tmp_path}",
                  "metrics.hessian.enabled=false")  # fmt: skip
    layers = train(cfg, tmp_path / "run", [])["weight_decay_layers"]
    base = float(cfg.base_optimizer.weight_decay)
    assert said is not rescaled
    assert any(v != pytest.approx(base) for v in layers.values()) is rescaled
