"""``train(cfg)``: one run. ``Run`` builds the data, the model, the parts (``parts.FEATURES``), the
optimizer and the loop; ``resume`` restores them from the checkpoint; the loop trains
(``loop.EpochLoop``, or the loop a part names); ``finish`` writes the summary. The checkpoint,
the metrics line and the summary are each made from the one list of parts."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch

from .. import distributed
from ..clock import Clock
from ..data import build_data
from ..errors import Interrupted, RunFolderConflict, UserError, one_line, require
from ..lock import held_by, job_lock
from ..loggers import build_logger
from ..models import build_model
from ..optim.build import build_optimizer, parameter_groups, training_share
from ..part import Parts
from ..plots.run import write_run_plots
from ..progress import Progress, print_final
from ..provenance import provenance
from ..rundir import CACHE, METRICS, SUMMARY
from ..runfiles import writable, write_json
from ..schedulers import build_scheduler
from ..settings import plot_format, require_same_config, result_config
from . import fast_path, strategy
from .checkpoint import (
    RNGState,
    fingerprint,
    load_sharded,
    read_summary,
    require_resumable,
    save_sharded,
    write_failure,
)
from .compile import compiled, compiled_forward_loss
from .loop import EpochLoop
from .parts import build_parts
from .record import RunRecord
from .validate import validate_run

THREADS_SAID: list[str] = []  # the thread lines this process printed (a local sweep's jobs)


def train(cfg, run_dir: str | Path = ".", overrides: list[str] | tuple = (), trial=None) -> dict:
    """Train one run in ``run_dir``; returns its summary (also written to summary.json).

    Args:
        cfg: the composed config.
        run_dir: the run folder.
        overrides: the command line's overrides (recorded in the summary).
        trial: a search's trial to report the objective to after each evaluation, whose
            ``should_stop(epoch, value, last)`` may stop the run as pruned (sweep/trial.py).
    """
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
        where = f"the completed run in {run_dir}"
        require_same_config(done.get("config"), result_config(cfg), where, run_dir)
        print_final(done, run_dir, already=True)
        return done
    run = Run(cfg, run_dir, list(overrides), trial)
    with run.stopping_cleanly():
        run.setup()
        run.resume()
        run.loop.run_epochs()
        return run.finish()


class Run:
    """One run's collaborators: its data, model, optimizer, parts, loop and record."""

    def __init__(self, cfg, run_dir: Path, overrides: list[str], trial=None):
        self.cfg, self.run_dir, self.overrides, self.trial = cfg, run_dir, overrides, trial
        self.dist = distributed.current()
        self.clock = Clock(epochs=cfg.trainer.epochs)
        self.record = RunRecord(run_dir, self.dist.is_main)

    def setup(self) -> None:
        """Build data, model, the parts, optimizer, scheduler and loop; then attach the parts."""
        cfg, t = self.cfg, self.cfg.trainer
        validate_run(cfg, self.run_dir)  # before the run folder is made
        self.device = self.dist.device or distributed.resolve_device(t.device)
        threads = _cpu_threads(self.device, self.dist, t.get("threads"))
        self.run_dir.mkdir(parents=True, exist_ok=True)
        require(
            writable(self.run_dir),
            f"run folder {self.run_dir} is not writable; choose another with hydra.run.dir=...",
        )
        torch.manual_seed(cfg.seed)
        share = training_share(cfg, self.dist.rank, self.dist.world)  # a variant's roles
        self.data = build_data(
            cfg.dataset, self.device, cfg.seed, self.dist.rank, self.dist.world, share
        )
        self.data.cache_dir, self.data.cache_write = self.run_dir / CACHE, self.dist.is_main
        torch.manual_seed(cfg.seed)  # the model's initialisation depends on the seed alone
        shape, classes = self.data.input_shape, self.data.num_classes
        self.model = build_model(cfg.model, shape, classes).to(self.device)
        early = build_parts(self, early=True)  # given weights, adapters: before anything else
        self.fast = fast_path.for_run(t, self.device, self.model, shape)  # auto: resolved once
        fast_path.apply(self.fast, self.model)
        self.parts = Parts(list(early.values()))
        self.build_optimization(early)
        per_epoch = self.loop.steps_per_epoch
        every = t.get("progress_every_s", 30)
        mode, main = t.get("progress", "auto"), self.dist.is_main
        self.record.progress = Progress(mode, self.clock.epochs, per_epoch, main, every)
        self.parts = Parts([p for _, p in sorted({**early, **build_parts(self, False)}.items())])
        self.scheduler = self.parts.chain("schedule", self.scheduler, self.loop.steps_per_epoch)
        self.parts.call("attach", self)
        if self.dist.is_main:
            self.record.logger = build_logger(cfg.logger, self.run_dir, cfg)
        if threads not in (None, *THREADS_SAID):  # once a process (a local sweep's jobs)
            THREADS_SAID.append(threads)
            self.record.progress.note(f"sam-run: {threads}")
        self.record.fingerprint = fingerprint(cfg, self.model, self.dist.world)
        self.loop.say_notes()
        if self.device.type == "cuda" and self.dist.is_main:
            self.record.progress.note(f"sam-run: fast path: {fast_path.describe(self.fast)}")

    def build_optimization(self, early: dict) -> None:
        """The loop (a part may name its own), the run's length, the optimizer over the parts'
        parameter groups, the wrapped model and the learning rate's schedule."""
        cfg, t = self.cfg, self.cfg.trainer
        loop_class = next((p.loop_class for p in early.values() if p.loop_class), EpochLoop)
        lengths = loop_class.lengths(cfg, self.data)
        self.clock.total_steps = lengths.total_steps  # a step budget ends the last epoch early
        self.clock.epochs = -(-lengths.total_steps // lengths.steps_per_epoch)
        # DDP, or FSDP2 (whose sharded parameters the optimizer must see): trainer.strategy
        self.net = strategy.wrap(self.model, cfg, self.dist)
        groups = self.parts.chain("param_groups", parameter_groups(self.model), self.model)
        self.optimizer = build_optimizer(
            cfg, groups, lengths.optimizer_steps, lengths.optimizer_steps_per_epoch
        )
        self.loop = loop_class(self, lengths.steps_per_epoch)
        if self.fast.compile:
            self.compile(str(t.get("compile_mode", "default")))
        self.optimizer.bind(
            model=self.net, grad_scaler=self.loop.scaler, clip_grad_norm=t.get("gradient_clip")
        )
        self.loop.evaluating(self.net)
        self.scheduler = build_scheduler(
            cfg.scheduler, self.optimizer, lengths.steps_per_epoch, lengths.total_steps
        )

    def compile(self, mode: str) -> None:
        """The model (evaluation, the optimizer's BatchNorm rule) and the training pass's
        forward and loss (one graph) under torch.compile; eager, recorded so, where this machine
        cannot compile."""
        net = compiled(self.net, mode, self.device)
        if net is self.net:  # no compiler: said in one line
            self.fast = self.fast._replace(compile=False)
            return
        self.net = net
        self.loop.forward_loss = compiled_forward_loss(self.loop.forward_loss, mode)

    def checkpointed(self) -> dict:
        """Everything a checkpoint holds, by its name there: the run's own state, then the
        parts'."""
        return {
            "model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler,
            "scaler": self.loop.scaler, "rng": RNGState(self.device), "clock": self.clock,
            "logger": self.record.logger, **self.parts.stateful(),
        }  # fmt: skip

    def resume(self) -> None:
        """Continue from the checkpoint, if there is one; then start the logger, the parts and
        the wall clock."""
        record, clock = self.record, self.clock
        # a sharded run reads its own shards, not the assembled model
        state = record.checkpoint.load(assemble=not self.dist.sharded)
        if state is not None:
            path = record.checkpoint.path
            require_resumable(
                state.get("fingerprint") or {}, record.fingerprint, path, self.run_dir
            )
            if self.dist.sharded and state.get("sharded"):
                state = load_sharded(record.checkpoint, state, self.model, self.dist.rank)
            for name, part in self.checkpointed().items():
                try:
                    part.load_state_dict(state[name])
                except (RuntimeError, KeyError, ValueError) as e:
                    raise UserError(
                        f"checkpoint {path} does not fit this run's {name} "
                        f"({type(e).__name__}); use another run folder or delete it"
                    ) from None
            record.saved = record.evaluated = (clock.epoch, clock.step)
            at = state.get("epoch_progress")  # a checkpoint within an epoch: it goes on there
            if at is not None:
                self.loop.resume_point, record.evaluated = at, (0, at["evaluated_step"])
            # the checkpoint's evaluation line: a run resumed at its end finishes from it
            lines = [r for r in record.log.rows() if r.get("step") == clock.step]
            # an evaluation line (a classifier's or a density model's): it has the test loss
            record.last = next((r for r in reversed(lines) if "test_loss" in r), {})
        if self.dist.is_main:
            record.log.truncate_after(clock.step)  # lines past the checkpoint are redone
        record.logger.start()
        self.parts.call("start", state is not None)  # after the logger: its failure is logged
        if state is not None and self.dist.is_main:
            print(f"resuming {self.run_dir} from epoch {clock.epoch} (step {clock.step})",
                  file=sys.stderr)  # fmt: skip
        record.started -= clock.elapsed

    def save(self, within_epoch: dict | None = None) -> None:
        """A checkpoint: at an evaluation, or within an epoch (``within_epoch``: the epoch's
        place and sums so far, ``trainer.checkpoint_every_n_steps``)."""
        record, clock = self.record, self.clock
        clock.elapsed = record.last["time_s"] if within_epoch is None else record.now()
        if self.dist.sharded:  # every process writes its shards
            state = {n: p.state_dict() for n, p in self.checkpointed().items() if n != "model"}
            state["fingerprint"] = record.fingerprint
            if within_epoch is not None:
                state["epoch_progress"] = within_epoch
            save_sharded(record.checkpoint, state, self.model, self.dist, clock.step)
            if self.dist.is_main:
                self.parts.call("save_files", self.run_dir)
        elif self.dist.is_main:
            state = {name: part.state_dict() for name, part in self.checkpointed().items()}
            state["fingerprint"] = record.fingerprint
            if within_epoch is not None:
                state["epoch_progress"] = within_epoch
            record.checkpoint.save(state)
            self.parts.call("save_files", self.run_dir)
        record.saved = (clock.epoch, clock.step)
        if within_epoch is None:
            record.evaluated = record.saved

    def finish(self) -> dict:
        """summary.json, the run's plots, the logger's summary, and the closing line."""
        record, clock, loop = self.record, self.clock, self.loop
        last = record.last
        require(
            bool(last) or record.status != "completed",
            f"{METRICS} in {self.run_dir} lacks the evaluation line of the "
            f"checkpoint's step {clock.step}, so the run's results cannot be rebuilt; delete the "
            "run folder to train it again",
        )
        summary = {
            "status": record.status, **{k: last.get(k) for k in
                                        ("test_acc", "test_ece", "test_nll", "lambda_max")},
            "epochs": clock.epoch, "step": clock.step, "train_time_s": clock.train_time,
            "overrides": self.overrides, "config": record.fingerprint["config"],
            **provenance(self.model, self.cfg.model, self.data.input_shape, self.device),
            **self.optimizer.summary_values(), **(self.data.corpus or {}),
            "fast_path": self.fast._asdict(),  # what ran: auto resolved on this device
        }  # fmt: skip
        summary.update(self.parts.merged("summary_values", last))
        if loop.test_set.reliability is None and record.status == "completed":
            loop.test_set.log_values()  # a summary rebuilt from the checkpoint: its diagram too
        if loop.test_set.reliability is not None:
            summary["reliability"] = loop.test_set.reliability
        summary.update(
            {k: v for k, v in last.items() if k.startswith("test_") and k not in summary}
        )
        if record.error:
            summary["error"] = record.error
        if self.dist.is_main:
            summary.update(loop.val_set.summary_values(self.cfg, self.run_dir))
            write_json(self.run_dir / SUMMARY, summary)
            _write_plots(self.run_dir, plot_format(self.cfg))
            record.logger.summary(summary)
            record.logger.finish(summary["status"])
            print_final(summary, self.run_dir)
        return summary

    def lambda_max_of(self, model):
        """The run's curvature measurement (its settings, samples and loss) on other weights."""
        curvature = self.parts.stateful().get("curvature")
        return None if curvature is None else curvature.lambda_max_of(model)

    @contextlib.contextmanager
    def stopping_cleanly(self):
        """A run that stops early: Ctrl-C keeps the last checkpoint (the same call resumes), a
        requeue (SystemExit) likewise, and any other error is recorded as a failed summary."""
        try:
            yield
        except KeyboardInterrupt as e:
            self.record.close_logger(e)
            raise Interrupted(*self.record.saved, self.clock.epoch) from e
        # submitit requeues on SIGUSR2, then sys.exit()s; the requeued job resumes
        except SystemExit as e:
            self.record.close_logger(e)
            raise
        except BaseException as e:
            # another run's folder stays as it is
            if self.dist.is_main and not isinstance(e, RunFolderConflict):
                failed = {"status": "failed", "error": one_line(e), "overrides": self.overrides}
                write_failure(self.run_dir, failed)
            self.record.close_logger(e)
            raise


def _cpu_threads(device, dist, given) -> str | None:
    """On a CPU, torch's threads by the runner's rule (the allowed CPUs shared by the processes,
    or trainer.threads); the line that says so."""
    if device.type != "cpu":
        return None
    n = distributed.set_cpu_threads(dist.world, given)
    return distributed.threads_note(n, dist.world, given)


def _write_plots(run_dir: Path, fmt: str = "png") -> None:
    try:
        write_run_plots(run_dir, fmt)
    # plots are a view of the run's files: never fail a finished run over them
    except Exception as e:
        print(f"sam-run: warning: run plots not written ({one_line(e)})", file=sys.stderr)
