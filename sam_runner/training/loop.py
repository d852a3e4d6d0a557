"""The epoch loop: train an epoch step by step, evaluate and checkpoint when due, stop when
asked. It names no feature: every feature is a part of the run (``sam_runner.part``), reached
through the hooks of ``run.parts``."""

from __future__ import annotations

import contextlib
import math
import sys
import time
from typing import NamedTuple

import torch

from ..losses import per_example, token_pairs
from ..part import PassInputs
from .checkpoint import rank_seed
from .evaluation import EpochStats, TestSet, ValSet

# the autocast type of each of settings.PRECISIONS
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def autocast_for(device, precision: str):
    dtype = DTYPES[precision]
    return contextlib.nullcontext() if dtype is None else torch.autocast(device.type, dtype=dtype)


class Lengths(NamedTuple):
    """A run's length: scheduler steps (an epoch's, the run's) and optimizer steps (the run's,
    an epoch's)."""

    steps_per_epoch: int
    total_steps: int
    optimizer_steps: int
    optimizer_steps_per_epoch: int


class EpochLoop:
    """Runs a built run's epochs. Everything a step reads is resolved here, once."""

    def __init__(self, run, steps_per_epoch: int):
        t = run.cfg.trainer
        self.run, self.steps_per_epoch = run, steps_per_epoch
        self.accumulate = int(t.accumulate)
        self.eval_every_steps = int(t.get("eval_every_n_steps") or 0)
        self.eval_every_epochs = int(t.get("eval_every_n_epochs", 1))
        self.criterion = per_example(t.get("loss", "cross_entropy"), float(t.label_smoothing))
        self.autocast = autocast_for(run.device, t.precision)
        self.scaler = torch.amp.GradScaler(run.device.type, enabled=t.precision == "fp16")
        self.test_set = self.val_set = None  # once the model is wrapped (``evaluating``)

    @staticmethod
    def lengths(cfg, data) -> Lengths:
        t, per_epoch = cfg.trainer, len(data.train)
        total = int(t.steps) if t.get("steps") else per_epoch * t.epochs
        return Lengths(per_epoch, total, total, per_epoch)

    def say_notes(self) -> None:
        """``trainer.eval_every_n_steps`` at most an epoch's steps: evaluations are made at epoch
        ends, so every epoch is evaluated, as without it (one line; rank 0)."""
        r, n = self.run, self.eval_every_steps
        if n and n <= self.steps_per_epoch and r.clock.epochs > 1 and r.dist.is_main:
            print(
                f"sam-run: warning: trainer.eval_every_n_steps={n} is at most the "
                f"{self.steps_per_epoch} steps of an epoch, and a run evaluates at epoch ends: "
                "every epoch is evaluated, as without it",
                file=sys.stderr,
                flush=True,
            )

    def evaluating(self, net) -> None:
        r = self.run
        args = (net, r.data, self.criterion, self.autocast, r.dist, r.cfg.metrics)
        self.test_set, self.val_set = TestSet(*args), ValSet(*args)

    def run_epochs(self) -> None:
        clock = self.run.clock
        while clock.epoch < clock.epochs:
            if not self.train_epoch():
                break  # diverged
            self.end_epoch()
            if self.stop_requested():
                break

    def begin_epoch(self) -> float:
        r = self.run
        r.clock.epoch += 1
        r.clock.within_epoch = True
        # each process its own dropout masks; from (seed, epoch, rank): a resume draws alike
        if r.dist.parallel:
            torch.manual_seed(rank_seed(r.cfg.seed, r.clock.epoch, r.dist.rank))
        r.model.train()
        return time.perf_counter()

    def train_epoch(self) -> bool:
        """One pass over the training set; False when the loss became non-finite."""
        r, clock = self.run, self.run.clock
        started = self.begin_epoch()
        r.data.train.set_epoch(clock.epoch)
        stats = EpochStats(r.device, r.dist)
        bar = r.record.progress.epoch_bar(clock.epoch)
        for x, y, idx in r.data.train:
            loss = self.optimizer_step(x, y, idx, stats)
            r.parts.call("after_step", clock.step)
            bar.update(stats.loss_sum, stats.correct, stats.seen)
            measured = r.parts.merged("measure_values")
            if measured:
                clock.train_time -= measured.get("hessian_time_s", 0.0)  # measuring: not training
                r.record.line({**measured, "epoch": clock.epoch, "step": clock.step,
                               "step_loss": float(loss)})  # fmt: skip
            if clock.step % 50 == 0 and stats.diverged_at() is not None:
                break  # all processes stop together
            if clock.step >= clock.total_steps:  # the step budget is spent
                break
        bar.close()
        return self.end_training_pass(stats, started)

    def optimizer_step(self, x, y, idx, stats: EpochStats, schedule: bool = True):
        """One optimizer step on a batch, counted on the clock and in ``stats``; returns its loss
        (``schedule=False``: the learning rate's schedule is stepped by the caller)."""
        r = self.run
        x, target = r.parts.batch(x, y, r.clock.step)
        parts = (v.tensor_split(self.accumulate) for v in (x, target, y, idx))
        micro = [m for m in zip(*parts) if len(m[2])]
        counts = {"correct": 0, "targets": 0}
        r.parts.call("begin_step", micro)
        loss = r.optimizer.step(lambda: self.forward_backward(micro, counts))
        if schedule:  # before the clock moves: the SWA cycle reads the step it scheduled
            r.scheduler.step()
        self.scaler.update()
        r.clock.step += 1
        stats.add(loss, counts["correct"], counts["targets"], r.clock.step)
        return loss

    def forward_backward(self, micro, counts: dict):
        """The optimizer's closure: zero the gradients, forward and backward over the step's
        micro-batches (the rows the pass keeps); returns the step's loss."""
        r, opt, parts = self.run, self.run.optimizer, self.run.parts
        opt.zero_grad(set_to_none=True)
        total = torch.zeros((), device=r.device)
        kept = self.selected_rows(micro)
        batch = sum(len(m[2]) for _, m, _ in kept)
        for i, (j, (xm, tm, ym, im), rows) in enumerate(kept):
            # under DDP a synced pass all-reduces once, on its last micro-batch
            quiet = opt.pass_syncs and i < len(kept) - 1 and hasattr(r.net, "no_sync")
            with r.net.no_sync() if quiet else contextlib.nullcontext(), self.autocast:
                with parts.forward_context(opt.pass_index):
                    out = r.net(xm)
            per_sample = self.criterion(out, tm)  # tm: ym, or its mixed soft targets
            share = len(ym) / batch  # weighted by size: the step's mean even when uneven
            loss = opt.reduce_loss(per_sample, out, ym) * share
            objective = parts.loss(loss, PassInputs(r.model, xm, out, j, share, rows))
            self.scaler.scale(objective).backward()  # the logged loss stays the task's
            total += loss.detach()
            parts.call("observe", opt.pass_index, im, ym, per_sample.detach())
            if opt.pass_index == 0:  # per predicted token for a sequence model
                pred, ym = token_pairs(out.detach(), ym)
                counts["correct"] = counts["correct"] + (pred.argmax(1) == ym).sum()
                counts["targets"] += len(ym)
        return total

    def selected_rows(self, micro) -> list:
        """(the micro-batch's place in the step, its kept tensors, the kept rows or None for
        all) for the micro-batches with a row left in this pass (ESAM's descent pass)."""
        out = []
        for j, m in enumerate(micro):
            ys = m[2]
            *kept, rows = self.run.optimizer.select_rows(
                *m, torch.arange(len(ys), device=ys.device)
            )
            if len(rows):
                out.append((j, tuple(kept), None if len(rows) == len(ys) else rows))
        return out

    def end_training_pass(self, stats: EpochStats, started: float) -> bool:
        """The pass's loss and accuracy; False, the run diverged, when a loss was not finite."""
        r, clock = self.run, self.run.clock
        clock.within_epoch = False
        clock.train_time += time.perf_counter() - started
        self.stats = stats.log_values()
        bad = stats.diverged_at()
        if bad is not None or not math.isfinite(self.stats["train_loss"]):
            at = bad if bad is not None else clock.step
            r.record.fail("diverged", f"loss became non-finite at epoch {clock.epoch}, step {at}")
            return False
        r.parts.call("end_epoch")
        return True

    def evaluation_due(self) -> bool:
        """The last epoch, and every ``eval_every_n_epochs``-th; or, with
        ``eval_every_n_steps``, the first epoch end that many steps after the last evaluation."""
        clock = self.run.clock
        if clock.final:
            return True
        if self.eval_every_steps:
            return clock.step - self.run.record.saved[1] >= self.eval_every_steps
        return clock.epoch % self.eval_every_epochs == 0

    def end_epoch(self) -> None:
        """Evaluate and checkpoint when due; otherwise log only a measurement due now."""
        r, clock = self.run, self.run.clock
        at = {"epoch": clock.epoch, "step": clock.step}
        if not self.evaluation_due():
            measured = r.parts.merged("measure_values")
            if measured:
                r.record.line({**at, **self.epoch_keys(), **measured})
            return
        row = {**at, **self.stats, **self.test_set.log_values(), **self.val_set.log_values(),
               "lr": r.optimizer.param_groups[0]["lr"], **r.optimizer.cost_values(),
               **r.optimizer.log_values(), **r.parts.merged("log_values")}  # fmt: skip
        r.record.line(row)
        r.record.last = row
        r.save()
        r.record.progress.epoch_line(row)

    def epoch_keys(self) -> dict:
        """Keys that say where a line stands beside epoch and step (a round, in a sibling)."""
        return {}

    def stop_requested(self) -> bool:
        """Whether a part stops training after this evaluation (every process stops together)."""
        r, clock = self.run, self.run.clock
        evaluated = r.record.last.get("epoch") == clock.epoch
        stop = evaluated and r.parts.any("stop_requested", clock.epoch, r.record.last, clock.final)
        if r.dist.parallel:
            stop = bool(r.dist.max(torch.tensor(int(stop), device=r.device)))
        if stop:
            r.record.status = "stopped"  # the stopping part's summary says why
        return stop
