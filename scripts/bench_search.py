"""Bench section: the search sweeper (python scripts/bench.py --only search).

search_pruned_epochs_fraction   the epochs an ASHA-pruned search trains over those the same
                                search trains unpruned (hparams_search=sam_rho_lr, the same
                                sampler seed, one seeded run each, real sam-run processes):
                                16 trials of 8 epochs on the mini recipe (MNIST-1D, 1,200
                                examples, batches of 64, no Hessian, CPU); --quick: 6 of 4
search_pruned_best_gap_points   the unpruned search's best val_acc minus the pruned one's, in
                                points (target: <= 0.5 at a fraction <= 0.5)
search_sweeper_s_per_trial      the sweeper's own time per trial over a 200-trial study
                                (--quick: 50) in its journal: ask with the pinned TPE, the
                                folder checks, tell, the orphan scan, every journal read; the
                                jobs return at once (an instant launcher), so no training
                                (target <= 0.2 s)
search_report_s_per_epoch       a pruned job's cost per evaluation: report to its trial in the
                                journal and ask ASHA (the same study, at its end)
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[1]
MINI = [
    "dataset.num_samples=1200",
    "dataset.batch_size=64",
    "metrics.hessian.enabled=false",
    "trainer.device=cpu",
    "trainer.progress=none",
]


def search(folder: Path, trials: int, epochs: int, pruner: str) -> dict:
    """One real search (sam-run -m in a process): its epochs trained and best val_acc."""
    cmd = [sys.executable, "-m", "sam_runner.cli", "-m", "hparams_search=sam_rho_lr", *MINI]
    cmd += [f"trainer.epochs={epochs}", f"hydra.sweeper.n_trials={trials}"]
    cmd += [f"hydra.sweeper.pruner={pruner}", f"hydra.sweep.dir={folder}"]
    cmd += [f"dataset.data_dir={folder.parent / 'data'}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    summaries = [json.loads((folder / str(n) / "summary.json").read_text()) for n in range(trials)]
    return {
        "epochs": sum(s["epochs"] for s in summaries),
        # the objective the search ranks by: the completed trials' final val_acc
        "best": max(s["val_acc"] if s["status"] == "completed" else 0 for s in summaries),
        "pruned": sum(s["status"] == "pruned" for s in summaries),
    }


class Instant:
    """A launcher whose jobs return a value at once (the sweeper's own cost alone)."""

    def __init__(self):
        self.rng = random.Random(0)

    def launch(self, jobs, **_):  # initial_job_idx: the numbers are the trials'
        return [SimpleNamespace(return_value=self.rng.random()) for _ in jobs]


def sweeper_overhead(folder: Path, trials: int) -> tuple[float, float]:
    from omegaconf import OmegaConf

    from sam_runner.sweep import hydra_api
    from sam_runner.sweep.search import Search
    from sam_runner.sweep.trial import TrialLink

    cfg = hydra_api.compose(
        ["hparams_search=sam_rho_lr", "hydra.sweeper.pruner=asha", f"hydra.sweep.dir={folder}"]
    )
    settings = OmegaConf.to_container(cfg.hydra.sweeper, resolve=True)
    settings.pop("_target_")
    settings["n_trials"] = trials
    sweeper = Search(**settings)
    sweeper.config, sweeper.launcher = cfg, Instant()
    start = time.perf_counter()
    sweeper.sweep([])
    per_trial = (time.perf_counter() - start) / trials
    # a job's side: one more trial, reporting 8 evaluations
    import optuna

    from sam_runner.sweep.study import open_storage

    study = optuna.load_study(study_name="search", storage=open_storage(folder, None))
    trial = study.ask(sweeper.space)
    link = TrialLink(str(folder), "", "search", trial.number)
    start = time.perf_counter()
    for epoch in range(1, 9):
        link.should_stop(epoch, 0.5)
    return per_trial, (time.perf_counter() - start) / 8


def run(args) -> dict:
    trials, epochs, many = (6, 4, 50) if args.quick else (16, 8, 200)
    with tempfile.TemporaryDirectory() as d:
        plain = search(Path(d) / "none", trials, epochs, "none")
        pruned = search(Path(d) / "asha", trials, epochs, "asha")
        per_trial, per_epoch = sweeper_overhead(Path(d) / "overhead", many)
    return {
        "search_pruned_epochs_fraction": pruned["epochs"] / plain["epochs"],
        "search_pruned_best_gap_points": 100 * (plain["best"] - pruned["best"]),
        "search_pruned_trials": pruned["pruned"],
        "search_sweeper_s_per_trial": per_trial,
        "search_report_s_per_epoch": per_epoch,
    }
