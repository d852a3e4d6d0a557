"""Bench section "results": what logging and reporting cost a run and a sweep.

- results.wandb_log_row_ms: one metrics row through logger=wandb (offline), vs the
  null logger's cost (results.null_log_row_us) — the per-epoch price of W&B.
- results.wandb_init_finish_s: wandb.init + finish of one offline run (once per job).
- results.run_plots_s: write_run_plots on a 200-epoch run (curves + reliability).
- results.report_s / results.report_jobs: sam-report's build + write on a synthetic sweep
  (3 variants × 4 ρ × 3 seeds, plus base; 200 epochs each), in-process.
- results.index_s_per_1000_jobs: the first sam-index of 1,000 small job folders (3 sweeps,
  each job with the default config's .hydra/config.yaml and 10 metrics lines); target ≤ 10 s.
- results.reindex_unchanged_s: sam-index of the same 1,000 folders again, nothing changed
  (no folder read); target ≤ 1 s.
- results.report_1000_jobs_3_sweeps_s: sam-report A B C over those 3 sweeps (build + write).
"""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from pathlib import Path

from benchutil import median_time


def _cfg(mode="offline"):
    from omegaconf import OmegaConf

    return OmegaConf.create(
        {
            "logger": {"name": "wandb", "mode": mode, "project": "bench", "tags": []},
            "optimizer": {"name": "sam", "rho": 0.05},
            "seed": 0,
        }
    )


def _row(epoch, rng):
    return {
        "epoch": epoch,
        "step": epoch * 100,
        "train_loss": rng.random(),
        "train_acc": rng.random(),
        "test_loss": rng.random(),
        "test_acc": rng.random(),
        "test_ece": rng.random() / 10,
        "test_nll": rng.random(),
        "lr": 0.1,
        "rho": 0.05,
        "grad_norm_max": 1 + rng.random(),
        "lambda_max": 10 * rng.random() + 1,
        "time_s": float(epoch),
        "reliability": {
            "confidence": [i / 15 for i in range(15)],
            "accuracy": [rng.random() for _ in range(15)],
            "count": [rng.randrange(100) for _ in range(15)],
        },
    }


def _fake_job(job_dir: Path, overrides, cfg_yaml: str, epochs, rng):
    (job_dir / ".hydra").mkdir(parents=True)
    (job_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (job_dir / ".hydra" / "config.yaml").write_text(cfg_yaml)
    rows = [_row(e, rng) for e in range(1, epochs + 1)]
    (job_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    last = rows[-1]
    (job_dir / "summary.json").write_text(
        json.dumps(
            {
                "status": "completed",
                "overrides": overrides,
                **{k: last[k] for k in ("test_acc", "test_ece", "test_nll", "lambda_max")},
            }
        )
    )


def _fake_sweep(root: Path, epochs: int) -> int:
    rng, n = random.Random(0), 0
    cells = [("base", None)] + [
        (v, r) for v in ("sam", "asam", "gear_sam") for r in (0.01, 0.05, 0.1, 0.2)
    ]
    for variant, rho in cells:
        for seed in range(3):
            overrides = [f"optimizer={variant}", f"seed={seed}"] + (
                [f"optimizer.rho={rho}"] if rho else []
            )
            cfg = (
                f"optimizer:\n  name: {variant}\n"
                + (f"  rho: {rho}\n" if rho else "")
                + "dataset:\n  batch_size: 128\nbase_optimizer:\n  lr: 0.1\n"
            )
            _fake_job(root / str(n), overrides, cfg, epochs, rng)
            n += 1
    return n


def _many_sweeps(root: Path, n_jobs: int = 1000, sweeps: int = 3, epochs: int = 10) -> list:
    """``sweeps`` folders of ``n_jobs`` jobs in all, each with a real composed config."""
    from omegaconf import OmegaConf

    from sam_runner.sweep.plan import compose

    base = OmegaConf.to_container(compose([]), resolve=False)
    base.pop("hydra", None)
    rng, paths = random.Random(1), [root / f"sweep{i}" for i in range(sweeps)]
    variants = ("base", "sam", "asam", "gear_sam")
    for i in range(n_jobs):
        variant, seed = variants[i % 4], (i // 4) % 5
        rho = (0.01, 0.05, 0.1, 0.2)[(i // 20) % 4]
        overrides = [f"optimizer={variant}", f"seed={seed}", f"optimizer.rho={rho}"]
        cfg = dict(base, seed=seed, optimizer=dict(base["optimizer"], name=variant, rho=rho))
        _fake_job(paths[i % sweeps] / str(i), overrides, OmegaConf.to_yaml(cfg), epochs, rng)
    return paths


def _index_figures(tmp: Path, repeats: int) -> dict:
    from sam_runner.results.index import index
    from sam_runner.results.report import build_report, write_report

    sweeps = _many_sweeps(tmp / "many")
    firsts, n = [], {"i": 0}

    def first():
        n["i"] += 1
        firsts.append(index(sweeps, tmp / f"first{n['i']}.sqlite"))

    out = {"results.index_s_per_1000_jobs": median_time(first, repeats)}
    assert firsts[-1]["read"] == 1000, firsts[-1]
    again = tmp / f"first{n['i']}.sqlite"
    out["results.reindex_unchanged_s"] = median_time(lambda: index(sweeps, again), repeats)
    assert index(sweeps, again)["read"] == 0
    report_dir = tmp / "report"
    out["results.report_1000_jobs_3_sweeps_s"] = median_time(
        lambda: write_report(build_report(sweeps), report_dir), max(1, repeats // 2)
    )
    return out


def run(args) -> dict:
    from sam_runner.loggers import NullLogger, build_logger
    from sam_runner.plots.run import write_run_plots
    from sam_runner.results.report import build_report, write_report

    repeats = 2 if args.quick else max(3, args.repeats)
    epochs = 20 if args.quick else 200
    out = {}
    tmp = Path(tempfile.mkdtemp(prefix="bench-results-"))
    try:
        rng = random.Random(0)
        rows = [_row(e, rng) for e in range(1, 51)]
        cfg = _cfg()
        logger = build_logger(cfg.logger, tmp / "wandb_run", cfg)
        logger.start()  # a logger logs once started (the run starts it after resuming)
        state = {"i": 0}

        def log_one():
            row = dict(rows[state["i"] % len(rows)], step=state["i"] + 1)
            state["i"] += 1
            logger.log(row)

        out["results.wandb_log_row_ms"] = median_time(log_one, repeats, warmup=3, inner=20) * 1e3
        logger.finish("completed")
        null = NullLogger()
        out["results.null_log_row_us"] = (
            median_time(lambda: null.log(rows[0]), repeats, inner=1000) * 1e6
        )
        n = {"i": 0}

        def init_finish():
            n["i"] += 1
            one = build_logger(cfg.logger, tmp / f"init{n['i']}", cfg)
            one.start()
            one.finish("completed")

        out["results.wandb_init_finish_s"] = median_time(init_finish, repeats, warmup=1)

        run_dir = tmp / "run"
        run_dir.mkdir()
        (run_dir / "metrics.jsonl").write_text(
            "".join(json.dumps(_row(e, rng)) + "\n" for e in range(1, epochs + 1))
        )
        out["results.run_plots_s"] = median_time(
            lambda: write_run_plots(run_dir), repeats, warmup=1
        )

        sweep = tmp / "sweep"
        out["results.report_jobs"] = _fake_sweep(sweep, epochs)
        out["results.report_s"] = median_time(
            lambda: write_report(build_report(sweep)), repeats, warmup=1
        )
        out.update(_index_figures(tmp, repeats))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out
