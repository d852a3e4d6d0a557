"""``train(cfg)``: one run, top to bottom. Collaborators do the rest (data, models,
optim, metrics, runfiles, loggers); this file only puts them in order."""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from pathlib import Path

import torch
from torch import nn

from . import distributed
from .data import build_data
from .errors import Interrupted, RunFolderConflict, UserError, one_line, require
from .loggers import build_logger
from .metrics.evaluate import evaluate
from .metrics.tracker import CurvatureTracker
from .models import build_model
from .optim.build import build_optimizer
from .progress import Progress, print_final
from .runfiles import (CHECKPOINT, Checkpoint, MetricsLog, read_json, require_same_config, result_config,
                       write_json)
from .samplers import build_sampler
from .schedulers import build_scheduler

PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(name: str) -> torch.device:
    require(name in ("auto", "cpu", "cuda") or str(name).startswith("cuda:"),
            f"trainer.device={name!r} is unknown; choose auto, cpu or cuda")
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    require(name == "cpu" or torch.cuda.is_available(),
            f"trainer.device={name} but CUDA is not available here; use trainer.device=cpu or auto")
    return torch.device(name)


def validate(cfg) -> None:
    t = cfg.trainer
    require(isinstance(t.epochs, int) and t.epochs >= 1, f"trainer.epochs={t.epochs} must be an integer >= 1")
    require(t.precision in PRECISIONS, f"trainer.precision={t.precision!r} is unknown; choose fp32, bf16 or fp16")
    require(isinstance(t.accumulate, int) and t.accumulate >= 1,
            f"trainer.accumulate={t.accumulate} must be an integer >= 1")
    bs = cfg.dataset.batch_size
    require(not isinstance(bs, int) or bs <= 0 or bs % t.accumulate == 0,
            f"dataset.batch_size={bs} must be divisible by trainer.accumulate={t.accumulate}")
    clip = t.get("gradient_clip")
    require(clip is None or (isinstance(clip, (int, float)) and clip > 0),
            f"trainer.gradient_clip={clip} must be null or a number > 0")


def fingerprint(cfg, model, world: int = 1) -> dict:
    """What a checkpoint must match to be resumed by this run: its structure, its settings and
    its number of data-parallel processes (per-process batches, ε and dropout depend on it)."""
    return {"model": str(cfg.model.arch), "dataset": str(cfg.dataset.name), "optimizer": str(cfg.optimizer.name),
            "base_optimizer": str(cfg.base_optimizer.name),
            "parameters": int(sum(p.numel() for p in model.parameters())), "world_size": int(world),
            "config": result_config(cfg)}


def require_resumable(saved: dict, now: dict, path: Path, run_dir: Path) -> None:
    require_same_config(saved.get("config"), now["config"], f"checkpoint {path}", run_dir)
    world = saved.get("world_size", now["world_size"])  # checkpoints from before it was recorded: accepted
    if world != now["world_size"]:
        raise RunFolderConflict(f"checkpoint {path} was written by {world} data-parallel process(es) and this run has "
                                f"{now['world_size']}: resume with {world} (trainer.devices, torchrun or SLURM "
                                "tasks), or use another run folder")
    structure = {k: v for k, v in now.items() if k not in ("config", "world_size")}
    if {k: saved.get(k) for k in structure} != structure:
        raise RunFolderConflict(f"checkpoint {path} belongs to a different run ({saved}); this run is {structure}: "
                                "use another run folder or delete the checkpoint")


class _RunState:
    """What train() needs of a run that stops early: its logger (a failure still finishes
    its W&B run) and where it was (for the one-line Ctrl-C message)."""

    def __init__(self):
        self.loggers, self.epoch, self.step = [], 0, 0


def train(cfg, run_dir: str | Path = ".", overrides: list[str] | tuple = ()) -> dict:
    """Train one run in ``run_dir``; returns its summary (also written to summary.json)."""
    run_dir = Path(run_dir)
    done = read_json(run_dir / "summary.json")
    if done and done.get("status") == "completed":
        require_same_config(done.get("config"), result_config(cfg), f"the completed run in {run_dir}", run_dir)
        print_final(done, run_dir, already=True)
        return done
    dist = distributed.current()
    run = _RunState()
    try:
        return _train(cfg, run_dir, list(overrides), dist, run)
    except KeyboardInterrupt as e:  # checkpoint and metrics stay as they were: the same call resumes
        _close_loggers(run.loggers, e)
        raise Interrupted(run.epoch, run.step) from e
    except SystemExit as e:
        # an interruption too: submitit requeues on SIGUSR2, then sys.exit()s; the requeued job resumes
        _close_loggers(run.loggers, e)
        raise
    except BaseException as e:
        if dist.is_main and not isinstance(e, RunFolderConflict):  # another run's folder stays as it is
            _write_summary(run_dir, {"status": "failed", "error": one_line(e), "overrides": list(overrides)})
        _close_loggers(run.loggers, e)
        raise


def _write_summary(run_dir: Path, summary: dict) -> None:
    try:
        write_json(run_dir / "summary.json", summary)
    except OSError:
        pass  # an unwritable run folder is reported by the error that got us here


def _close_loggers(loggers, error: BaseException) -> None:
    """Finish the loggers of a run that stops early: ``interrupted`` (Ctrl-C), ``preempted``
    (SystemExit: submitit's requeue), else ``failed`` with the error."""
    if isinstance(error, (KeyboardInterrupt, SystemExit)):
        status = "interrupted" if isinstance(error, KeyboardInterrupt) else "preempted"
        summary = {"status": status}
    else:
        status = "failed"
        summary = {"status": status, "error": f"{type(error).__name__}: {error}".splitlines()[0]}
    for logger in loggers:
        try:
            logger.summary(summary)
            logger.finish(status)
        except Exception as e:  # the run's own error is the one to report
            print(f"sam-run: warning: logger not finished ({type(e).__name__}: {e})", file=sys.stderr)


def _write_plots(run_dir: Path) -> None:
    try:
        from .plots import write_run_plots
        write_run_plots(run_dir)
    except Exception as e:  # plots are a view of the run's files: never fail a finished run over them
        print(f"sam-run: warning: run plots not written ({type(e).__name__}: {e})", file=sys.stderr)


def _train(cfg, run_dir: Path, overrides: list[str], dist, run: _RunState) -> dict:
    t = cfg.trainer
    validate(cfg)
    device = dist.device or resolve_device(t.device)
    run_dir.mkdir(parents=True, exist_ok=True)
    require(_writable(run_dir), f"run folder {run_dir} is not writable; choose another with hydra.run.dir=...")
    torch.manual_seed(cfg.seed)
    data = build_data(cfg.dataset, device, cfg.seed, dist.rank, dist.world)
    torch.manual_seed(cfg.seed)  # the model's initialisation depends on the seed alone
    model = build_model(cfg.model, data.input_shape, data.num_classes).to(device)
    if t.channels_last and device.type == "cuda" and len(data.input_shape) == 3:
        model = model.to(memory_format=torch.channels_last)
    steps_per_epoch, epochs = len(data.train), t.epochs
    total_steps = steps_per_epoch * epochs
    optimizer = build_optimizer(cfg, model, total_steps)
    scheduler = build_scheduler(cfg.scheduler, optimizer, steps_per_epoch, total_steps)
    scaler = torch.amp.GradScaler(device.type, enabled=t.precision == "fp16")
    net = dist.wrap(model, cfg)  # DDP when world > 1, then torch.compile when asked
    if t.compile and device.type == "cuda":
        net = torch.compile(net)
    optimizer.bind(model=net, grad_scaler=scaler, clip_grad_norm=t.get("gradient_clip"))
    criterion = nn.CrossEntropyLoss(label_smoothing=float(t.label_smoothing), reduction="none")
    autocast = _autocast(device, t.precision)
    sampler = build_sampler(cfg.dataset, data)
    tracker = CurvatureTracker(cfg.metrics, model, data, optimizer, cfg.seed, autocast)

    ckpt, log = Checkpoint(run_dir / CHECKPOINT), MetricsLog(run_dir / "metrics.jsonl")
    epoch, step, elapsed, train_time, run_id = 0, 0, 0.0, 0.0, None
    fp = fingerprint(cfg, model, dist.world)
    state = ckpt.load()
    if state is not None:
        require_resumable(state.get("fingerprint") or {}, fp, ckpt.path, run_dir)
        try:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
        except (RuntimeError, KeyError, ValueError) as e:
            raise UserError(f"checkpoint {ckpt.path} does not fit this model/optimizer "
                            f"({type(e).__name__}); use another run folder or delete it") from None
        scheduler.load_state_dict(state["scheduler"])
        scaler.load_state_dict(state["scaler"])
        sampler.load_state_dict(state.get("sampler", {}))
        tracker.load_state_dict(state.get("curvature", {}))
        torch.set_rng_state(state["rng"]["torch"])
        if device.type == "cuda" and state["rng"].get("cuda") is not None:
            torch.cuda.set_rng_state(state["rng"]["cuda"], device)
        epoch, step = state["epoch"], state["step"]
        elapsed, train_time, run_id = state["elapsed"], state["train_time"], state.get("logger_run_id")
    if dist.is_main:
        log.truncate_after(step)  # lines past the checkpoint are redone, never repeated
    logger = build_logger(cfg.logger, run_dir, cfg, run_id) if dist.is_main else build_logger({"name": "none"}, run_dir, cfg)
    run.loggers.append(logger)
    progress = Progress(t.get("progress", "auto"), epochs, steps_per_epoch, enabled=dist.is_main)
    if state is not None and dist.is_main:
        print(f"resuming {run_dir} from epoch {epoch} (step {step})", file=sys.stderr)

    start = time.perf_counter() - elapsed

    def log_line(row: dict) -> None:  # a metrics.jsonl line (and the logger's), timed from the run's start
        row["time_s"] = time.perf_counter() - start
        if dist.is_main:
            log.append(row)
            logger.log(row)

    reliability = None
    last, status, error = {}, "completed", None
    while epoch < epochs:
        epoch += 1
        run.epoch = epoch
        epoch_start = time.perf_counter()
        if dist.parallel:  # each process its own dropout masks; from (seed, epoch, rank): a resume draws alike
            torch.manual_seed(rank_seed(cfg.seed, epoch, dist.rank))
        model.train()
        data.train.set_epoch(epoch)
        loss_sum = torch.zeros((), device=device)
        correct = torch.zeros((), device=device)
        seen = 0
        first_bad = torch.full((), -1, dtype=torch.long, device=device)
        bar = progress.epoch_bar(epoch)
        for x, y, idx in data.train:
            micro = list(zip(x.chunk(t.accumulate), y.chunk(t.accumulate), idx.chunk(t.accumulate)))
            counts = {}

            def closure():
                optimizer.zero_grad(set_to_none=True)
                total = torch.zeros((), device=device)
                for i, (xm, ym, im) in enumerate(micro):
                    # under DDP a synced pass all-reduces once, on its last micro-batch
                    quiet = optimizer.pass_syncs and i < len(micro) - 1 and hasattr(net, "no_sync")
                    with (net.no_sync() if quiet else contextlib.nullcontext()), autocast:
                        out = net(xm)
                    per_sample = criterion(out.float(), ym)
                    loss = optimizer.reduce_loss(per_sample, out, ym) / len(micro)
                    scaler.scale(loss).backward()
                    total += loss.detach()
                    sampler.observe(optimizer.pass_index, im, ym, per_sample.detach())
                    if optimizer.pass_index == 0:
                        counts["correct"] = counts.get("correct", 0) + (out.argmax(1) == ym).sum()
                return total

            loss = optimizer.step(closure)
            scheduler.step()
            scaler.update()
            step += 1
            run.step = step
            first_bad = torch.where((first_bad < 0) & ~torch.isfinite(loss), step, first_bad)
            loss_sum += loss.detach() * len(y)
            correct += counts["correct"]
            seen += len(y)
            bar.update(loss_sum, correct, seen)
            extra = tracker.on_step(epoch, step, net)
            if extra:
                train_time -= extra.get("hessian_time_s", 0.0)  # measuring is not training
                log_line({**extra, "epoch": epoch, "step": step})
            if step % 50 == 0 and int(dist.max(first_bad)) >= 0:  # all ranks stop together
                break
        bar.close()
        train_time += time.perf_counter() - epoch_start
        seen *= dist.world  # every process saw an equal share of each global batch
        train_loss, train_acc = dist.sum(loss_sum) / seen, dist.sum(correct) / seen
        first_bad = dist.max(first_bad)
        if int(first_bad) >= 0 or not math.isfinite(float(train_loss)):
            status = "diverged"
            error = f"loss became non-finite at epoch {epoch}, step {int(first_bad) if int(first_bad) >= 0 else step}"
            break
        sampler.end_epoch(data.train)
        final = epoch == epochs
        if not final and epoch % max(1, int(t.get("eval_every_n_epochs", 1))) != 0:
            curvature = tracker.on_epoch_end(epoch, step, net, final)  # a curvature epoch measures all the same
            if curvature:
                log_line({"epoch": epoch, "step": step, **curvature})
            continue
        row = {"epoch": epoch, "step": step, "train_loss": float(train_loss), "train_acc": float(train_acc)}
        evaluation = evaluate(net, data.test, criterion, autocast, dist, cfg.metrics, data.class_counts)
        reliability = evaluation.pop("reliability", None)  # diagram bins go to summary.json only
        row.update(evaluation)
        row["lr"] = optimizer.param_groups[0]["lr"]
        row.update(optimizer.log_values())
        row.update(sampler.log_values())
        row.update(tracker.on_epoch_end(epoch, step, net, final))
        log_line(row)
        last = row
        if dist.is_main:
            ckpt.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                       "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict(),
                       "sampler": sampler.state_dict(), "curvature": tracker.state_dict(),
                       "rng": {"torch": torch.get_rng_state(),
                               "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None},
                       "epoch": epoch, "step": step, "elapsed": row["time_s"], "train_time": train_time,
                       "logger_run_id": logger.run_id, "fingerprint": fp})
        progress.epoch_line(row)

    summary = {"status": status, "test_acc": last.get("test_acc"), "test_ece": last.get("test_ece"),
               "test_nll": last.get("test_nll"), "lambda_max": last.get("lambda_max"),
               "epochs": epoch, "step": step, "train_time_s": train_time, "overrides": overrides,
               "config": fp["config"]}
    summary.update(tracker.summary_extras())
    if reliability is not None:
        summary["reliability"] = reliability
    summary.update({k: v for k, v in last.items() if k.startswith("test_") and k not in summary})
    if error:
        summary["error"] = error
    if dist.is_main:
        write_json(run_dir / "summary.json", summary)
        _write_plots(run_dir)
        logger.summary(summary)
        logger.finish(status)
        print_final(summary, run_dir)
    return summary


def rank_seed(seed: int, epoch: int, rank: int) -> int:
    """The global RNG's seed of one data-parallel process for one epoch (one process: never reseeded)."""
    return ((int(seed) * 1_000_003 + int(epoch)) * 10_007 + int(rank) + 1) % (2 ** 63)


def _autocast(device, precision):
    dtype = PRECISIONS[precision]
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)


def _writable(path: Path) -> bool:
    probe = path / f".write_probe{os.getpid()}"  # per process: data-parallel ranks probe the same folder
    try:
        probe.write_text("")
        probe.unlink()
        return True
    except OSError:
        return False
