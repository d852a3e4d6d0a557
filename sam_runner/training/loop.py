"""The epoch loop: train an epoch step by step, evaluate and checkpoint when due, stop when
asked. It names no feature: every feature is a part of the run (``sam_runner.part``), reached
through the hooks of ``run.parts``."""

from __future__ import annotations

import contextlib
import functools
import itertools
import math
import time

import torch
import torch.autograd.graph

from ..losses import per_example
from ..module_state import gradient_sync_paused
from ..optim.engine import SharpnessAware
from ..part import PassInputs
from .batches import micro_batches, selected_rows
from .checkpoint import rank_seed
from .compile import ForwardLoss
from .evaluation import EpochStats, TestSet, ValSet, count_correct
from .lengths import autocast_for, epoch_lengths
from .warnings import say_if_every_epoch_is_evaluated

NO_CONTEXT = contextlib.nullcontext()  # reusable: entering it changes nothing

# torch's private backward entry (what Tensor.backward ends in) and its functorch check: a
# release without them takes Tensor.backward (the same bits, ~30 µs of Python more a pass)
_ENGINE_BACKWARD = getattr(torch.autograd.graph, "_engine_run_backward", None)
_TRANSFORMS_ACTIVE = getattr(torch._C, "_are_functorch_transforms_active", None)
_DIRECT_BACKWARD = _ENGINE_BACKWARD is not None and _TRANSFORMS_ACTIVE is not None


class EpochLoop:
    """Runs a built run's epochs. Everything a step reads is resolved here, once."""

    def __init__(self, run, steps_per_epoch: int):
        t = run.cfg.trainer
        self.run, self.steps_per_epoch = run, steps_per_epoch
        self.accumulate = int(t.accumulate)
        self.eval_every_steps = int(t.get("eval_every_n_steps") or 0)
        self.eval_every_epochs = int(t.get("eval_every_n_epochs", 1))
        self.checkpoint_every = int(t.get("checkpoint_every_n_steps") or 0)
        self.resume_point: dict | None = None  # a checkpoint's place within an epoch
        self.criterion = per_example(t.get("loss", "cross_entropy"), float(t.label_smoothing))
        self.autocast = autocast_for(run.device, t.precision)
        self.scaler = torch.amp.GradScaler(run.device.type, enabled=t.precision == "fp16")
        # the pass's logits and loss; Run compiles it whole under trainer.compile
        self.forward_loss = ForwardLoss(run.net, self.criterion, run.device, str(t.precision))
        self.test_set = self.val_set = None  # once the model is wrapped (``evaluating``)
        self._mean_gradients: dict = {}  # mean_gradient's, by (shape, dtype, device, share)

    lengths = staticmethod(epoch_lengths)

    def say_notes(self) -> None:
        if self.run.dist.is_main:
            say_if_every_epoch_is_evaluated(
                self.eval_every_steps, self.steps_per_epoch, self.run.clock
            )

    def evaluating(self, net) -> None:
        r = self.run
        args = (net, r.data, self.criterion, self.autocast, r.dist, r.cfg.metrics)
        self.test_set, self.val_set = TestSet(*args), ValSet(*args)

    def run_epochs(self) -> None:
        clock = self.run.clock
        while clock.epoch < clock.epochs or self.resume_point is not None:
            if not self.train_epoch():
                break  # diverged
            self.end_epoch()
            if self.stop_requested():
                break

    def begin_epoch(self, fresh: bool = True) -> float:
        """An epoch starts (``fresh``), or goes on from a checkpoint within it."""
        r = self.run
        if fresh:
            r.clock.epoch += 1
            # each process its own dropout masks; from (seed, epoch, rank): a resume draws alike
            if r.dist.parallel:
                torch.manual_seed(rank_seed(r.cfg.seed, r.clock.epoch, r.dist.rank))
        r.clock.within_epoch = True
        r.model.train()
        return time.perf_counter()

    def train_epoch(self) -> bool:
        """One pass over the training set; False when the loss became non-finite."""
        r, clock = self.run, self.run.clock
        at, self.resume_point = self.resume_point, None
        started = self.begin_epoch(fresh=at is None)
        r.data.train.set_epoch(clock.epoch)
        stats = EpochStats(r.device, r.dist)
        if at is not None:  # the epoch's batches up to the checkpoint are drawn, not trained
            stats.load_state_dict(at["stats"])
            clock.train_time = at["train_time"]
        bar = r.record.progress.epoch_bar(clock.epoch, stats.batches)
        for x, y, idx in itertools.islice(r.data.train, stats.batches, None):
            if self.train_step(x, y, idx, stats, bar, started):
                break
        bar.close()
        return self.end_training_pass(stats, started)

    def train_step(self, x, y, idx, stats: EpochStats, bar, started: float) -> bool:
        """One step of ``train_epoch`` (the optimizer step, the parts' hooks, a measurement or
        checkpoint when due); True when the epoch stops here (diverged, or the budget spent)."""
        r, clock = self.run, self.run.clock
        loss = self.optimizer_step(x, y, idx, stats)
        r.parts.call("after_step", clock.step)
        bar.update(stats)  # read only when shown
        measured = r.parts.merged("measure_values")
        if measured:
            clock.train_time -= measured.get("hessian_time_s", 0.0)  # measuring: not training
            r.record.line({**measured, "epoch": clock.epoch, "step": clock.step,
                           "step_loss": float(loss)})  # fmt: skip
        if clock.step % 50 == 0 and stats.diverged_at() is not None:
            return True  # all processes stop together
        if self.checkpoint_every and clock.step % self.checkpoint_every == 0:
            train_time = clock.train_time + time.perf_counter() - started
            r.save({"stats": stats.state_dict(), "train_time": train_time,
                    "evaluated_step": r.record.evaluated_step})  # fmt: skip
        return clock.step >= clock.total_steps  # the step budget is spent

    def optimizer_step(self, x, y, idx, stats: EpochStats, schedule: bool = True):
        """One optimizer step, counted in ``stats``; its loss (``schedule``: step the lr too)."""
        r = self.run
        x, target = r.parts.batch(x, y, r.clock.step)
        micro = micro_batches(self.accumulate, x, target, y, idx)
        counts = {"predicted": [], "targets": 0}
        r.parts.call("begin_step", micro)
        # a partial, not a lambda: one Python frame fewer each pass
        loss = r.optimizer.step(functools.partial(self.forward_backward, micro, counts))
        if schedule:  # before the clock moves: the SWA cycle reads the step it scheduled
            r.scheduler.step()
        self.scaler.update()
        r.clock.step += 1
        stats.add(loss, counts["predicted"], counts["targets"], r.clock.step)
        return loss

    def forward_backward(self, micro, counts: dict):
        """The closure: zero the grads, forward and backward over the micro-batches' kept rows."""
        r, opt, parts = self.run, self.run.optimizer, self.run.parts
        opt.zero_grad(set_to_none=True)
        kept = selected_rows(opt, micro)
        batch = sum(m[2].shape[0] for _, m, _ in kept) if len(kept) > 1 else None
        # the mean alone is backpropagated: its gradient handed to backward (no graph for it)
        plain = (type(opt).reduce_loss is SharpnessAware.reduce_loss and not parts.loss_hooks
                 and not self.scaler.is_enabled())  # fmt: skip
        total = None  # the pass's loss: the first micro-batch's, then sums (0 + x is x)
        for i, (j, (xm, tm, ym, im), rows) in enumerate(kept):
            # a synced pass reduces the gradients once, in its last micro-batch's backward
            quiet = opt.pass_syncs and i < len(kept) - 1
            with gradient_sync_paused(r.net) if quiet else NO_CONTEXT:
                with parts.forward_context(opt.pass_index):  # tm: ym, or its mixed soft targets
                    out, per_sample = self.forward_loss(xm, tm)
                # weighted by size: the step's mean even when uneven (one micro-batch: all of it)
                share = ym.shape[0] / batch if batch is not None else 1.0
                if plain:
                    loss = self.mean_backward(per_sample, share)
                else:
                    inputs = PassInputs(r.model, xm, out, j, share, rows)
                    loss = self.objective_backward(per_sample, ym, inputs)
            loss = loss.detach() if loss.requires_grad else loss  # (a detach is an op)
            total = loss if total is None else total + loss
            if parts.observe_hooks:
                parts.call("observe", opt.pass_index, im, ym, per_sample.detach())
            if opt.pass_index == 0:  # the count (argmax, ==, sum) records no graph: no detach
                self.count(out, ym, counts)
        return total if total is not None else torch.zeros((), device=r.device)

    def objective_backward(self, per_sample, labels, inputs: PassInputs) -> torch.Tensor:
        """Backward through the optimizer's loss (× the micro-batch's share) and the parts' loss
        terms, fp16-scaled; the task's loss (the logged one) with its graph."""
        loss = self.run.optimizer.reduce_loss(per_sample, inputs.logits, labels)
        if inputs.share != 1.0:  # × 1 changes no bit of the loss or its gradient
            loss = loss * inputs.share
        objective = loss
        if self.run.parts.loss_hooks:
            objective = self.run.parts.loss(loss, inputs)
        self.scaler.scale(objective).backward()
        return loss

    def mean_backward(self, per_sample: torch.Tensor, share: float) -> torch.Tensor:
        """``objective_backward`` where the objective is the mean (× ``share``) alone: the mean
        taken without a graph, and backward from the per-sample losses with the mean's gradient
        (``mean_gradient``): the same bits, without the mean's backward or the ones it starts
        from, each pass."""
        loss = per_sample.detach().mean()
        if share != 1.0:
            loss = loss * share
        grad = self.mean_gradient(per_sample, share)
        if _DIRECT_BACKWARD and type(per_sample) is torch.Tensor and not _TRANSFORMS_ACTIVE():
            # what Tensor.backward ends in: its checks of the gradient's shape and kind hold
            # by construction, and cost ~30 µs of Python a pass
            _ENGINE_BACKWARD((per_sample,), (grad,), False, False, (),
                             allow_unreachable=True, accumulate_grad=True)  # fmt: skip
        else:  # a tensor subclass, or under a torch.func transform: torch's own way
            per_sample.backward(grad)
        return loss

    def mean_gradient(self, per_sample: torch.Tensor, share: float) -> torch.Tensor:
        """d(mean(per_sample) × share)/d per_sample as autograd computes it (it does so here,
        once per shape, dtype, device and share; kept)."""
        key = (per_sample.shape, per_sample.dtype, per_sample.device, share)
        grad = self._mean_gradients.get(key)
        if grad is None:
            leaf = torch.zeros_like(per_sample, requires_grad=True)
            with torch.enable_grad():
                loss = leaf.mean()
                (loss * share if share != 1.0 else loss).backward()
            grad = self._mean_gradients[key] = leaf.grad
        return grad

    def count(self, out, labels, counts: dict) -> None:
        """The first pass's right predictions and targets (a density loop counts none)."""
        count_correct(out, labels, counts)

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
        """The last epoch and every ``eval_every_n_epochs``-th, or the first epoch end
        ``eval_every_n_steps`` after the last evaluation."""
        clock = self.run.clock
        if clock.final:
            return True
        if self.eval_every_steps:
            return clock.step - self.run.record.evaluated_step >= self.eval_every_steps
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

    def epoch_keys(self) -> dict:  # where a line stands beside epoch and step (a round)
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
