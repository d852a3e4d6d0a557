"""``train(cfg)``: one run, in phases that read top to bottom.

``Run`` puts the collaborators in order (data, models, optim, metrics, runfiles, loggers):
``setup`` builds every part, ``resume`` restores them from the checkpoint, ``train_epoch`` runs
one epoch (the closure is ``forward_backward``), ``end_epoch`` evaluates and checkpoints,
``finish`` writes the summary. Every stateful part is saved and restored through one mapping
(``parts``), and every part that adds keys to a metrics line does so through ``log_values()``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import sys
import time
from pathlib import Path

import torch

from . import distributed
from .adapters import attach_adapters
from .averaging import build_averaging
from .clock import Clock
from .data import build_data
from .data.augment import Mixing
from .distill import build_distiller, check_teacher
from .errors import Interrupted, RunFolderConflict, UserError, one_line, require
from .federated import build_federation
from .federated.rounds import run_rounds
from .lock import held_by, job_lock
from .loggers import NullLogger, build_logger
from .losses import mean_loss, per_example, token_pairs
from .metrics.evaluate import evaluate, token_values
from .metrics.robustness import Robustness
from .metrics.sharpness_dim import step_for
from .metrics.tracker import CurvatureTracker
from .models import build_model, load_initial_weights
from .optim.build import bind_dataset, build_optimizer
from .plots.run import write_run_plots
from .progress import Progress, print_final
from .provenance import provenance
from .regularizers import build_regularizer
from .rundir import CACHE, CHECKPOINT, INIT_WEIGHTS, METRICS, SUMMARY
from .runfiles import (
    Checkpoint,
    InitialWeights,
    MetricsLog,
    json_problem,
    read_json,
    writable,
    write_json,
)
from .samplers import build_sampler
from .schedulers import build_scheduler
from .settings import (
    objective_key,
    objective_keys,
    plot_format,
    require_same_config,
    result_config,
)
from .validate import validate_trainer
from .weight_decay import build_weight_decay

THREADS_SAID: list[str] = []  # the thread lines this process printed (a local sweep's jobs)
# the autocast type of each of settings.PRECISIONS
DTYPES = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def fingerprint(cfg, model, world: int = 1) -> dict:
    """What a checkpoint must match to be resumed by this run: its structure, its settings and
    its number of data-parallel processes (per-process batches, ε and dropout depend on it)."""
    return {
        "model": str(cfg.model.arch),
        "dataset": str(cfg.dataset.name),
        "optimizer": str(cfg.optimizer.name),
        "base_optimizer": str(cfg.base_optimizer.name),
        "parameters": int(sum(p.numel() for p in model.parameters())),
        "world_size": int(world),
        "config": result_config(cfg),
    }


def require_resumable(saved: dict, now: dict, path: Path, run_dir: Path) -> None:
    require_same_config(saved.get("config"), now["config"], f"checkpoint {path}", run_dir)
    # checkpoints from before it was recorded: accepted
    world = saved.get("world_size", now["world_size"])
    if world != now["world_size"]:
        raise RunFolderConflict(
            f"checkpoint {path} was written by {world} data-parallel process(es) and this run has "
            f"{now['world_size']}: resume with {world} (trainer.devices, torchrun or SLURM tasks), "
            "or use another run folder"
        )
    structure = {k: v for k, v in now.items() if k not in ("config", "world_size")}
    if {k: saved.get(k) for k in structure} != structure:
        raise RunFolderConflict(
            f"checkpoint {path} belongs to a different run ({saved}); this run is {structure}: use "
            "another run folder or delete the checkpoint"
        )


def train(cfg, run_dir: str | Path = ".", overrides: list[str] | tuple = (), trial=None) -> dict:
    """Train one run in ``run_dir``; returns its summary (also written to summary.json).
    ``trial``: a search's trial to report the objective to after each evaluation, whose
    ``should_stop(epoch, value)`` may stop the run as pruned (sweep/trial.py)."""
    run_dir = Path(run_dir)
    if distributed.current().rank != 0:  # rank 0 holds the job's lock for all its processes
        return _train(cfg, run_dir, overrides)  # and reports to the trial
    on_locked = str(cfg.trainer.get("on_locked", "skip"))
    with job_lock(run_dir, "train", on_locked, "sam-run", "trainer.on_locked") as held:
        if not held:  # another process trains this job: its summary.json will say how it ended
            return {"status": "skipped", "error": f"trained by {held_by(run_dir, 'train')}"}
        return _train(cfg, run_dir, overrides, trial)


def _train(cfg, run_dir: Path, overrides, trial=None) -> dict:
    done = read_summary(run_dir)
    # a trial the search's pruner stopped is a result too: run again (a sweeper killed before
    # it told the study), it says so rather than train on
    if done and done.get("status") in ("completed", "pruned"):
        require_same_config(
            done.get("config"), result_config(cfg), f"the completed run in {run_dir}", run_dir
        )
        print_final(done, run_dir, already=True)
        return done
    run = Run(cfg, run_dir, list(overrides), trial)
    with run.stopping_cleanly():
        run.setup()
        run.resume()
        if run.federation.enabled:  # the rounds take the epochs' place (federated/rounds.py)
            run_rounds(run)
            return run.finish()
        while run.clock.epoch < run.clock.epochs:
            if not run.train_epoch():
                break  # diverged
            run.end_epoch()
            if run.pruned():
                break
        return run.finish()


def read_summary(run_dir: Path) -> dict | None:
    """summary.json, or None. A corrupt one is named in one line and rebuilt by this run from
    its checkpoint and metrics lines (``Run.resume``); without a checkpoint the job fails with
    that reason rather than train again over a result it cannot read."""
    path = run_dir / SUMMARY
    done = read_json(path)
    problem = None if done is not None else json_problem(path)
    if problem is None or problem == "missing":
        return done
    if not (run_dir / CHECKPOINT).exists():
        raise UserError(
            f"{path} is {problem} and there is no checkpoint to rebuild it from; restore it, or "
            "delete it to train the job again"
        )
    print(
        f"sam-run: {path} is {problem}; rebuilding it from {CHECKPOINT} and {METRICS}",
        file=sys.stderr,
    )
    return None


class RNGState:
    """The global RNG states a resumed run must continue from (dropout, and anything else
    drawing)."""

    def __init__(self, device):
        self.device = device

    def state_dict(self) -> dict:
        cuda = self.device.type == "cuda"
        return {
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state(self.device) if cuda else None,
        }

    def load_state_dict(self, state: dict) -> None:
        torch.set_rng_state(state["torch"])
        if self.device.type == "cuda" and state.get("cuda") is not None:
            torch.cuda.set_rng_state(state["cuda"], self.device)


class EpochStats:
    """The training loss and accuracy of one epoch, summed on the device (no host sync per step),
    and the first step whose loss was not finite."""

    def __init__(self, device, dist):
        self.dist = dist
        self.loss_sum = torch.zeros((), device=device)
        self.correct = torch.zeros((), device=device)
        self.seen = 0
        self.first_bad = torch.full((), -1, dtype=torch.long, device=device)

    def add(self, loss, correct, n: int, step: int) -> None:
        self.first_bad = torch.where(
            (self.first_bad < 0) & ~torch.isfinite(loss), step, self.first_bad
        )
        self.loss_sum += loss.detach() * n
        self.correct += correct
        self.seen += n

    def diverged_at(self) -> int | None:
        """The first non-finite step of any process, or None (an all-reduce: every process
        agrees)."""
        bad = int(self.dist.max(self.first_bad))
        return bad if bad >= 0 else None

    def log_values(self) -> dict:
        seen = self.seen * self.dist.world  # every process saw an equal share of each global batch
        return {
            "train_loss": float(self.dist.sum(self.loss_sum) / seen),
            "train_acc": float(self.dist.sum(self.correct) / seen),
        }


class TestSet:
    """The test-set keys of an evaluated metrics line (and the reliability bins, for
    summary.json)."""

    def __init__(self, run: Run):
        self.run, self.reliability = run, None

    def log_values(self) -> dict:
        r = self.run
        row = evaluate(
            r.net, r.data.test, r.criterion, r.autocast, r.dist, r.cfg.metrics, r.data.class_counts
        )
        self.reliability = row.pop("reliability", None)  # diagram bins go to summary.json only
        if len(r.data.input_shape) == 1:  # token sequences: perplexity and bits per token
            row.update(token_values(row["test_loss"]))
        return row

    def measure(self, model) -> dict:
        """The test-set keys of another model (the averaged weights)."""
        r = self.run
        return evaluate(model, r.data.test, r.criterion, r.autocast, r.dist, r.cfg.metrics)


class ValSet:
    """The validation-split keys of an evaluated metrics line (none without ``dataset.val_split``)
    and, for summary.json, the final and the best validation accuracy with its epoch."""

    KEYS = ("loss", "acc", "ece", "nll")

    def __init__(self, run: Run):
        self.run = run

    def log_values(self) -> dict:
        r = self.run
        if r.data.val is None:
            return {}
        row = evaluate(r.net, r.data.val, r.criterion, r.autocast, r.dist, r.cfg.metrics)
        out = {f"val_{k}": row[f"test_{k}"] for k in self.KEYS}
        if len(r.data.input_shape) == 1:
            out.update(token_values(row["test_loss"], "val"))
        return out

    def summary_values(self) -> dict:
        keys, out = objective_keys(self.run.cfg), {}
        if keys:  # a model chosen on test data is no held-out result: say so
            on_test = any(k.startswith("test_") for k in keys)
            out.update(objective=keys[0] if len(keys) == 1 else keys, selected_on_test=on_test)
        path = self.run.run_dir / METRICS  # every evaluation, resumed runs' included
        lines = [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []
        lines = [x for x in lines if isinstance(x.get("val_acc"), (int, float))]
        if lines:
            best = max(lines, key=lambda x: x["val_acc"])  # the first of equals: the earliest
            out.update(
                val_acc=lines[-1]["val_acc"],
                best_val_acc=best["val_acc"],
                best_val_epoch=best["epoch"],
            )
        return out


class Run:
    def __init__(self, cfg, run_dir: Path, overrides: list[str], trial=None):
        self.cfg, self.run_dir, self.overrides = cfg, run_dir, overrides
        self.dist = distributed.current()
        self.clock = Clock(epochs=cfg.trainer.epochs)
        self.logger = NullLogger()  # until setup: a run that fails before it still finishes one
        self.saved = (0, 0)  # (epoch, step) the checkpoint holds
        self.status, self.error, self.last = "completed", None, {}
        self.trial, self.pruned_at = trial, None  # a pruned search's trial (sweep/trial.py)

    # ------------------------------------------------------------------ phases
    def setup(self) -> None:
        """Build data, model, optimizer, scheduler, scaler, sampler, tracker and logger."""
        cfg, t = self.cfg, self.cfg.trainer
        validate_trainer(cfg)
        check_teacher(cfg, self.run_dir)  # before the run folder is made
        self.device = device = self.dist.device or distributed.resolve_device(t.device)
        self.threads = self._cpu_threads(device)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        require(
            writable(self.run_dir),
            f"run folder {self.run_dir} is not writable; choose another with hydra.run.dir=...",
        )
        torch.manual_seed(cfg.seed)
        dist = self.dist
        self.data = data = build_data(cfg.dataset, device, cfg.seed, dist.rank, dist.world)
        data.cache_dir, data.cache_write = self.run_dir / CACHE, self.dist.is_main  # folders
        torch.manual_seed(cfg.seed)  # the model's initialisation depends on the seed alone
        self.model = model = build_model(cfg.model, data.input_shape, data.num_classes).to(device)
        self.init_from = load_initial_weights(cfg.model, model)  # given weights, if any
        self.peft = attach_adapters(cfg.model, model, data.input_shape)  # model.peft (adapters)
        if t.channels_last and device.type == "cuda" and len(data.input_shape) == 3:
            model.to(memory_format=torch.channels_last)
        self.federation = build_federation(cfg, data)
        total_steps, optimizer_steps = self._lengths(data)
        self.build_optimization(model, total_steps, optimizer_steps)
        if self.federation.enabled:
            self.federation.attach(self.optimizer)
        self.scaler = torch.amp.GradScaler(device.type, enabled=t.precision == "fp16")
        self.net = self.dist.wrap(model, cfg)  # DDP when world > 1, then torch.compile when asked
        if t.compile and device.type == "cuda":
            self.net = torch.compile(self.net)
        self.optimizer.bind(
            model=self.net, grad_scaler=self.scaler, clip_grad_norm=t.get("gradient_clip")
        )
        loss = t.get("loss", "cross_entropy")
        self.criterion = per_example(loss, float(t.label_smoothing))
        self.autocast = _autocast(device, t.precision)
        self.regularizer = build_regularizer(cfg.get("regularizer"), self.autocast)
        self.distill = build_distiller(cfg, model, data, device, self.autocast, self.run_dir)
        self.sampler = build_sampler(cfg.dataset, data)
        self.tracker = CurvatureTracker(
            cfg.metrics, model, data, self.optimizer, cfg.seed, self.clock, mean_loss(loss)
        )
        self.test_set = TestSet(self)
        self.build_recipe(model, data)
        self.val_set = ValSet(self)
        self.robustness = Robustness(cfg, data, self.net, self.autocast, self.dist, self.clock)
        if self.dist.is_main:
            self.logger = build_logger(cfg.logger, self.run_dir, cfg)
        self.rng = RNGState(device)
        self.fingerprint = fingerprint(cfg, model, self.dist.world)
        self.checkpoint = Checkpoint(self.run_dir / CHECKPOINT)
        self.log = MetricsLog(self.run_dir / METRICS)
        self.progress = Progress(
            t.get("progress", "auto"),
            self.clock.epochs,
            self.steps_per_epoch,
            enabled=self.dist.is_main,
        )
        self._say_notes()

    def _say_notes(self) -> None:
        self._say_threads()
        self._say_if_every_epoch_is_evaluated()

    def _say_if_every_epoch_is_evaluated(self) -> None:
        """``trainer.eval_every_n_steps`` at most an epoch's steps: evaluations are made at epoch
        ends, so every epoch is evaluated, as without it (one line; rank 0)."""
        n = self.cfg.trainer.get("eval_every_n_steps")
        if not n or self.federation.enabled or not self.dist.is_main:
            return
        if int(n) <= self.steps_per_epoch and self.clock.epochs > 1:
            print(
                f"sam-run: warning: trainer.eval_every_n_steps={n} is at most the "
                f"{self.steps_per_epoch} steps of an epoch, and a run evaluates at epoch ends: "
                "every epoch is evaluated, as without it",
                file=sys.stderr,
                flush=True,
            )

    def _lengths(self, data) -> tuple[int, int]:
        """The run's length in scheduler steps (set on the clock, with the epochs it takes)
        and in optimizer steps. A federated run's epoch is a round: its schedule steps once a
        round, its optimizer ``local_steps`` times per sampled client."""
        t, f = self.cfg.trainer, self.federation
        self.steps_per_epoch = len(data.train)
        total_steps = int(t.steps) if t.get("steps") else self.steps_per_epoch * t.epochs
        optimizer_steps = total_steps
        if f.enabled:
            self.steps_per_epoch, total_steps = 1, f.rounds
            self.clock.rounds = True  # the tracker's period: metrics.hessian.every_n_rounds
            optimizer_steps = f.rounds * f.per_round * f.local_steps
        self.clock.total_steps = total_steps  # a step budget ends the last epoch early
        self.clock.epochs = -(-total_steps // self.steps_per_epoch)
        return total_steps, optimizer_steps

    def build_optimization(self, model, total_steps: int, optimizer_steps: int) -> None:
        """The weight decay's rule (it may split the groups per layer), the optimizer (its
        schedules over ``optimizer_steps``) and the learning rate's schedule."""
        cfg = self.cfg
        self.weight_decay = build_weight_decay(cfg)
        # an epoch's optimizer steps (a federated round's: every sampled client's local steps)
        per_epoch = optimizer_steps // total_steps if self.federation.enabled else None
        self.optimizer = build_optimizer(
            cfg, model, optimizer_steps, self.weight_decay, per_epoch or self.steps_per_epoch
        )
        bind_dataset(self.optimizer, self.data)  # Focal-SAM's class counts, bSAM's N
        self.weight_decay.bind(
            model, self.optimizer, self.dist, cfg.seed, self.clock, self.steps_per_epoch
        )
        self.scheduler = build_scheduler(
            cfg.scheduler, self.optimizer, self.steps_per_epoch, total_steps
        )

    def _say_threads(self) -> None:
        """The thread line, once a process (a local sweep's jobs share one), with the progress
        lines (rank 0)."""
        if self.threads not in (None, *THREADS_SAID):
            THREADS_SAID.append(self.threads)
            self.progress.note(f"sam-run: {self.threads}")

    def _cpu_threads(self, device) -> str | None:
        """On a CPU, torch's threads by the runner's rule (the allowed CPUs shared by the
        processes, or trainer.threads); the line that says so."""
        if device.type != "cpu":
            return None
        given = self.cfg.trainer.get("threads")
        n = distributed.set_cpu_threads(self.dist.world, given)
        return distributed.threads_note(n, self.dist.world, given)

    def build_recipe(self, model, data) -> None:
        """MixUp/CutMix of the training batches, and the weight averaging (SWA also takes over
        the learning rate's schedule from trainer.swa_start)."""
        cfg = self.cfg
        self.mixing = Mixing(cfg.dataset, data.num_classes, cfg.seed, data.input_shape)
        self.averaging = build_averaging(
            cfg, model, self.optimizer, self.clock, data.train_plain, self.test_set.measure
        )
        self.scheduler = self.averaging.schedule(self.scheduler, self.steps_per_epoch)

    def parts(self) -> dict:
        """Every stateful part of the run, by its name in the checkpoint."""
        return {
            "model": self.model,
            "optimizer": self.optimizer,
            "scheduler": self.scheduler,
            "scaler": self.scaler,
            "sampler": self.sampler,
            "curvature": self.tracker,
            "rng": self.rng,
            "clock": self.clock,
            "logger": self.logger,
            **({"averaging": self.averaging} if self.averaging.enabled else {}),
            **({"weight_decay": self.weight_decay} if self.weight_decay.enabled else {}),
            **({"federated": self.federation} if self.federation.enabled else {}),
        }

    def resume(self) -> None:
        """Continue from the checkpoint, if there is one; then start the logger and the wall
        clock."""
        state = self.checkpoint.load()
        if state is not None:
            require_resumable(
                state.get("fingerprint") or {}, self.fingerprint, self.checkpoint.path, self.run_dir
            )
            for name, part in self.parts().items():
                try:
                    part.load_state_dict(state[name])
                except (RuntimeError, KeyError, ValueError) as e:
                    raise UserError(
                        f"checkpoint {self.checkpoint.path} does not fit this run's {name} "
                        f"({type(e).__name__}); use another run folder or delete it"
                    ) from None
            self.saved = (self.clock.epoch, self.clock.step)
            # the checkpoint's evaluation line: a run resumed at its end finishes from it
            lines = [r for r in self.log.rows() if r.get("step") == self.clock.step]
            self.last = next((r for r in reversed(lines) if "test_acc" in r), {})
        if self.dist.is_main:
            # lines past the checkpoint are redone, never repeated
            self.log.truncate_after(self.clock.step)
        self.logger.start()
        self._measurement_references(state)  # after the logger: its failure is logged too
        if state is not None and self.dist.is_main:
            print(
                f"resuming {self.run_dir} from epoch {self.clock.epoch} (step {self.clock.step})",
                file=sys.stderr,
            )
        self.start = time.perf_counter() - self.clock.elapsed

    def _measurement_references(self, state) -> None:
        """What the generalization measures compare the weights with: the SGD step
        (sharpness_dim) and θ⁰ (dist_from_init: kept from a fresh start, else read back)."""
        self.tracker.step = step_for(self.cfg.metrics, self.cfg)
        initial = InitialWeights(self.run_dir / INIT_WEIGHTS)
        if state is None:
            start = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
            if self.dist.is_main:
                initial.save(start)
        else:
            start = initial.load()
        self.tracker.init_state = start if self.tracker.enabled else None

    def train_epoch(self) -> bool:
        """One pass over the training set; False when the loss became non-finite (the run
        diverged)."""
        clock = self.clock
        clock.epoch += 1
        clock.within_epoch = True
        epoch_start = time.perf_counter()
        # each process its own dropout masks; from (seed, epoch, rank): a resume draws alike
        if self.dist.parallel:
            torch.manual_seed(rank_seed(self.cfg.seed, clock.epoch, self.dist.rank))
        self.model.train()
        self.data.train.set_epoch(clock.epoch)
        stats = self.epoch_stats()
        bar = self.progress.epoch_bar(clock.epoch)
        for x, y, idx in self.data.train:
            loss = self.optimizer_step(x, y, idx, stats)
            self.weight_decay.after_step(clock.step)
            self.averaging.after_step()
            bar.update(stats.loss_sum, stats.correct, stats.seen)
            curvature = self.tracker.log_values()
            if curvature:
                # measuring is not training
                clock.train_time -= curvature.get("hessian_time_s", 0.0)
                row = {**curvature, "epoch": clock.epoch, "step": clock.step}
                self.log_line({**row, "step_loss": float(loss)})  # the loss this step descended
            # all processes stop together
            if clock.step % 50 == 0 and stats.diverged_at() is not None:
                break
            if clock.step >= clock.total_steps:  # the step budget is spent
                break
        bar.close()
        clock.within_epoch = False
        clock.train_time += time.perf_counter() - epoch_start
        if not self.end_of_training_pass(stats):
            return False
        self.sampler.end_epoch(self.data.train)
        self.averaging.end_epoch()
        return True

    def epoch_stats(self) -> EpochStats:
        return EpochStats(self.device, self.dist)

    def optimizer_step(self, x, y, idx, stats: EpochStats, schedule: bool = True):
        """One step of the optimizer on a batch (the closure is ``forward_backward``), counted
        on the clock and in ``stats``; returns its loss. An epoch's step and a federated
        client's local step alike (``schedule=False``: a federation's schedule counts rounds)."""
        clock, t = self.clock, self.cfg.trainer
        x, target = self.mixing(x, y, clock.step)  # soft targets under MixUp/CutMix
        parts = (v.tensor_split(t.accumulate) for v in (x, target, y, idx))
        micro = [m for m in zip(*parts) if len(m[2])]
        counts = {"correct": 0, "targets": 0}
        taught = self.distill.teach(micro)  # the teacher's forward: once a step, every pass's
        closure = functools.partial(self.forward_backward, micro, counts, taught)
        loss = self.optimizer.step(closure)
        if schedule:  # before the clock moves: the SWA cycle reads the step it scheduled
            self.scheduler.step()
        self.scaler.update()
        clock.step += 1
        stats.add(loss, counts["correct"], counts["targets"], clock.step)
        return loss

    def end_of_training_pass(self, stats: EpochStats) -> bool:
        """The epoch's (or round's) training loss and accuracy; False, with the run diverged,
        when a loss was not finite."""
        clock = self.clock
        self.stats = stats.log_values()
        bad = stats.diverged_at()
        if bad is not None or not math.isfinite(self.stats["train_loss"]):
            self.status = "diverged"
            at = bad if bad is not None else clock.step
            self.error = f"loss became non-finite at epoch {clock.epoch}, step {at}"
            return False
        return True

    def forward_backward(self, micro, counts: dict, taught=None):
        """The optimizer's closure: zero the gradients, then forward and backward over the step's
        micro-batches; returns the step's loss. On the first pass, counts the right predictions.
        ``taught``: the teacher's outputs for the micro-batches (distillation)."""
        optimizer, net = self.optimizer, self.net
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), device=self.device)
        micro = self.selected_rows(micro)
        batch = sum(len(ym) for _, (_, _, ym, _), _ in micro)
        for i, (j, (xm, tm, ym, im), rows) in enumerate(micro):
            # under DDP a synced pass all-reduces once, on its last micro-batch
            quiet = optimizer.pass_syncs and i < len(micro) - 1 and hasattr(net, "no_sync")
            watch = self.weight_decay.watching(optimizer.pass_index == 0)  # OUI's hooks
            with net.no_sync() if quiet else contextlib.nullcontext(), self.autocast, watch:
                with self.distill.capturing():  # the student's features, for the alignment
                    out = net(xm)
            per_sample = self.criterion(out, tm)  # tm: ym, or its mixed soft targets
            # weighted by size: the step's mean loss even when the batch does not split evenly
            share = len(ym) / batch
            loss = optimizer.reduce_loss(per_sample, out, ym) * share
            objective = self.distill.add(loss, out, taught, j, share, rows)
            objective = self.regularizer.add(objective, self.model, xm, out, share)
            self.scaler.scale(objective).backward()  # the logged loss stays the task's
            total += loss.detach()
            self.sampler.observe(optimizer.pass_index, im, ym, per_sample.detach())
            if optimizer.pass_index == 0:  # per predicted token for a sequence model
                pred, ym = token_pairs(out.detach(), ym)
                counts["correct"] = counts["correct"] + (pred.argmax(1) == ym).sum()
                counts["targets"] = counts.get("targets", 0) + len(ym)
        return total

    def selected_rows(self, micro) -> list:
        """The rows this pass runs on (all, except in ESAM's descent pass): (the micro-batch's
        place in the step, its kept tensors, the kept rows' positions or None for all), for the
        micro-batches with a row left (the teacher's outputs are per micro-batch of the step)."""
        out = []
        for j, m in enumerate(micro):
            ys = m[2]
            *kept, rows = self.optimizer.select_rows(*m, torch.arange(len(ys), device=ys.device))
            if len(rows):
                out.append((j, tuple(kept), None if len(rows) == len(m[2]) else rows))
        return out

    def evaluation_due(self) -> bool:
        """The last epoch, and every ``eval_every_n_epochs``-th epoch; or, with
        ``eval_every_n_steps``, the first epoch end that many steps after the last evaluation."""
        clock, t = self.clock, self.cfg.trainer
        if clock.final:
            return True
        if self.federation.enabled:
            return self.federation.evaluation_due(clock.epoch)
        if t.get("eval_every_n_steps"):
            return clock.step - self.saved[1] >= int(t.eval_every_n_steps)
        return clock.epoch % int(t.get("eval_every_n_epochs", 1)) == 0

    def end_epoch(self) -> None:
        """Evaluate and checkpoint when an evaluation is due (``evaluation_due``); otherwise only
        a due curvature measurement is logged."""
        clock = self.clock
        if not self.evaluation_due():
            curvature = self.tracker.log_values()  # a curvature epoch measures all the same
            if curvature:
                at = {"round": clock.epoch} if clock.rounds else {}
                self.log_line({"epoch": clock.epoch, "step": clock.step, **at, **curvature})
            return
        if clock.final and self.tracker.enabled:  # the last measurement can take a while: say so
            n = self.tracker.num_samples()
            self.progress.note(
                f"measuring the Hessian's top eigenvalue(s) on {n} training "
                "samples (metrics.hessian.*) ..."
            )
        row = {
            "epoch": clock.epoch,
            "step": clock.step,
            **self.stats,
            **self.test_set.log_values(),
            **self.val_set.log_values(),
            "lr": self.optimizer.param_groups[0]["lr"],
            **self.optimizer.cost_values(),
        }
        parts = (self.optimizer, self.sampler, self.tracker, self.robustness, self.averaging)
        federation = (self.federation,) if self.federation.enabled else ()
        for part in (*parts, self.weight_decay, *federation):
            row.update(part.log_values())
        self.log_line(row)
        self.last = row
        self.save()
        self.progress.epoch_line(row)

    def pruned(self) -> bool:
        """Whether the search's pruner stops this trial after the evaluation just made (rank 0
        reports ``trainer.objective`` to the trial and asks; every process stops together). The
        checkpoint of that evaluation stays; the summary says ``pruned``, with where."""
        evaluated = self.last.get("epoch") == self.clock.epoch
        key, stop = objective_key(self.cfg), False
        if self.trial is not None and evaluated:
            stop = self.trial.should_stop(self.clock.epoch, self.last.get(key), self.clock.final)
        if self.dist.parallel:
            stop = bool(self.dist.max(torch.tensor(int(stop), device=self.device)))
        if stop:
            self.status = "pruned"
            self.pruned_at = {"pruned_epoch": self.clock.epoch, "pruned_value": self.last.get(key)}
        return stop

    def save(self) -> None:
        self.clock.elapsed = self.last["time_s"]
        if self.dist.is_main:
            state = {name: part.state_dict() for name, part in self.parts().items()}
            self.checkpoint.save({**state, "fingerprint": self.fingerprint})
            self.averaging.save(self.run_dir)
        self.saved = (self.clock.epoch, self.clock.step)

    def log_line(self, row: dict) -> None:
        """A metrics.jsonl line (and the logger's), timed from the run's start."""
        row["time_s"] = time.perf_counter() - self.start
        if self.dist.is_main:
            self.log.append(row)
            self.logger.log(row)

    def finish(self) -> dict:
        """summary.json, the run's plots, the logger's summary, and the closing line."""
        last, clock = self.last, self.clock
        require(
            bool(last) or self.status != "completed",
            f"{METRICS} in {self.run_dir} lacks the evaluation line of the checkpoint's step "
            f"{clock.step}, so the run's results cannot be rebuilt; delete the run folder to "
            "train it again",
        )
        summary = {
            "status": self.status,
            "test_acc": last.get("test_acc"),
            "test_ece": last.get("test_ece"),
            "test_nll": last.get("test_nll"),
            "lambda_max": last.get("lambda_max"),
            "epochs": clock.epoch,
            "step": clock.step,
            "train_time_s": clock.train_time,
            "overrides": self.overrides,
            "config": self.fingerprint["config"],
            **provenance(self.model, self.cfg.model, self.data.input_shape, self.device),
        }
        summary.update(self.optimizer.summary_values())
        summary.update(self.weight_decay.summary_values())
        summary.update(self.distill.summary_values())
        summary.update(self.tracker.summary_extras())
        summary.update(self.data.corpus or {})  # token corpora: corpus_bytes, corpus_sha256
        summary.update(self.averaging.summary_values(last, self.lambda_max_of))
        if self.federation.enabled:
            summary.update(self.federation.summary_values())
        if self.init_from is not None:
            summary["init_from"] = self.init_from
        if self.peft is not None:
            summary["peft"] = self.peft
        if self.test_set.reliability is None and self.status == "completed":
            self.test_set.log_values()  # a summary rebuilt from the checkpoint: its diagram too
        if self.test_set.reliability is not None:
            summary["reliability"] = self.test_set.reliability
        summary.update(
            {k: v for k, v in last.items() if k.startswith("test_") and k not in summary}
        )
        if self.error:
            summary["error"] = self.error
        if self.pruned_at is not None:
            summary.update(self.pruned_at, planned_epochs=self.clock.epochs)
        if self.dist.is_main:
            summary.update(self.val_set.summary_values())
            write_json(self.run_dir / SUMMARY, summary)
            _write_plots(self.run_dir, plot_format(self.cfg))
            self.logger.summary(summary)
            self.logger.finish(self.status)
            print_final(summary, self.run_dir)
        return summary

    def lambda_max_of(self, model):
        """The run's curvature measurement (its settings, samples and loss) on other weights."""
        if not self.tracker.enabled:
            return None
        loss = mean_loss(self.cfg.trainer.get("loss", "cross_entropy"))
        other = CurvatureTracker(
            self.cfg.metrics, model, self.data, self.optimizer, self.cfg.seed, self.clock, loss
        )
        return other.measure(final=True).get("lambda_max")

    # ------------------------------------------------------------------ stopping early
    @contextlib.contextmanager
    def stopping_cleanly(self):
        """A run that stops early: Ctrl-C keeps the last checkpoint (the same call resumes), a
        requeue (SystemExit) likewise, and any other error is recorded as a failed summary."""
        try:
            yield
        except KeyboardInterrupt as e:
            self._close_logger(e)
            raise Interrupted(*self.saved, self.clock.epoch) from e
        # submitit requeues on SIGUSR2, then sys.exit()s; the requeued job resumes
        except SystemExit as e:
            self._close_logger(e)
            raise
        except BaseException as e:
            # another run's folder stays as it is
            if self.dist.is_main and not isinstance(e, RunFolderConflict):
                _write_failure(
                    self.run_dir,
                    {"status": "failed", "error": one_line(e), "overrides": self.overrides},
                )
            self._close_logger(e)
            raise

    def _close_logger(self, error: BaseException) -> None:
        """Finish the logger of a run that stops early: ``interrupted`` (Ctrl-C), ``preempted``
        (SystemExit: submitit's requeue), else ``failed`` with the error."""
        if isinstance(error, (KeyboardInterrupt, SystemExit)):
            status = "interrupted" if isinstance(error, KeyboardInterrupt) else "preempted"
            summary = {"status": status}
        else:
            status, summary = "failed", {"status": "failed", "error": one_line(error)}
        try:
            self.logger.summary(summary)
            self.logger.finish(status)
        except Exception as e:  # the run's own error is the one to report
            print(f"sam-run: warning: logger not finished ({one_line(e)})", file=sys.stderr)


def _write_failure(run_dir: Path, summary: dict) -> None:
    try:
        write_json(run_dir / SUMMARY, summary)
    except OSError:
        pass  # an unwritable run folder is reported by the error that got us here


def _write_plots(run_dir: Path, fmt: str = "png") -> None:
    try:
        write_run_plots(run_dir, fmt)
    # plots are a view of the run's files: never fail a finished run over them
    except Exception as e:
        print(f"sam-run: warning: run plots not written ({one_line(e)})", file=sys.stderr)


def rank_seed(seed: int, epoch: int, rank: int) -> int:
    """The global RNG's seed of one data-parallel process for one epoch (one process: never
    reseeded).
    """
    return ((int(seed) * 1_000_003 + int(epoch)) * 10_007 + int(rank) + 1) % (2**63)


def _autocast(device, precision):
    dtype = DTYPES[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
