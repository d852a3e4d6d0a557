"""Bench section "eval": what sam-eval costs (python scripts/bench.py --only eval).

- eval_per_job_s: wall seconds of measuring one default-model job (the default config: MNIST-1D,
  cnn1d, SAM; trained for one epoch) with ``metrics=full``, in this process, everything included
  (data, the model rebuilt from its checkpoint, the training and test sets, λ_1..3, trace,
  density, every sharpness measure); the median of ``--repeats``.
- eval_full_over_default: that measurement over the same job's default one (``sam-eval JOB``:
  the same sets, λ_max alone), one warm-up of each, then alternately (default, full) per repeat;
  the median of the repeats' ratios. Target ≤ 8.
- eval_full_new_over_old: the ``metrics=full`` measurement over the same one without the five
  generalization measures (complexity, quantization, input_grad, flip, sharpness_dim), alternately
  per repeat after a warm-up; the median of the ratios. Target ≤ 1.3.
- eval_full_share_<part>, eval_full_part_s_<part>: where the full measurement's curvature time
  goes: each part's share of it and its seconds (``eigenvalues``: λ_1..3 on the whole subset;
  then each measure, in the order the tracker runs them; ``fisher_trace_ratio`` includes the
  per-sample gradients both Fisher measures share), from the tracker's own timers
  (``CurvatureTracker.times``), the median over ``--repeats`` measurements after one warm-up.
- corruptions_over_clean_eval: the corruption evaluation of that job (every MNIST-1D corruption
  at its five severities: ``corrupted_copies`` = 15 copies of the test set) over one clean
  test-set evaluation (``evaluate``), each the median of ``--repeats``, measured alternately.
  Each corrupted copy is one more pass over the test set, so the target is ≤ 1.2 × copies
  (no per-sample Python work in the generation).
- corruptions_over_clean_eval_image, corrupted_copies_image: the same on CIFAR-shaped data
  (2,000 random 8-bit 32×32 colour test images, the ``cnn`` model): the nine generated image
  corruptions × 5 severities = 45 copies.
"""

from __future__ import annotations

import contextlib
import functools
import statistics
import tempfile
import time
from pathlib import Path

import torch
from benchutil import median_time
from omegaconf import OmegaConf
from torch import nn

from sam_runner import distributed
from sam_runner.data import Arrays, tensor_data
from sam_runner.metrics.evaluate import evaluate
from sam_runner.metrics.robustness import corruption_values
from sam_runner.models import build_model


def _compose(config_name, overrides):
    from sam_runner.sweep.plan import compose

    return compose(overrides, config_name)


def _trained_default_job(folder: Path) -> Path:
    from sam_runner.train import train

    cfg = _compose("config", ["trainer.epochs=1", "trainer.progress=none", "metrics=off"])
    cfg_plain = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    del cfg_plain["hydra"]
    job = folder / "job"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "config.yaml").write_text(OmegaConf.to_yaml(cfg_plain))
    train(cfg_plain, job)
    return job


def _timed_measure(job: Path, settings: dict, which: str) -> float:
    """Wall seconds of one sam-eval measurement of ``job`` with ``settings[which]``."""
    from sam_runner.evaluation.job import measure_job

    t0 = time.perf_counter()
    record = measure_job(job, settings[which])
    assert record["status"] == "completed", record.get("error")
    return time.perf_counter() - t0


def _eval_full_and_ratio(job: Path, repeats: int) -> tuple[float, float]:
    """(median seconds of the metrics=full measurement, median of full / default), measured
    alternately after one warm-up of each (one-time costs: imports, the HVP timing choices)."""
    from sam_runner.evaluation.settings import compose_eval, plain

    settings = {m: plain(compose_eval([f"metrics={m}"], job)) for m in ("default", "full")}
    timed = functools.partial(_timed_measure, job, settings)

    timed("default"), timed("full")
    fulls, ratios = [], []
    for _ in range(repeats):  # alternated: slow drift of a shared machine cancels
        default = timed("default")
        fulls.append(timed("full"))
        ratios.append(fulls[-1] / default)
    return statistics.median(fulls), statistics.median(ratios)


NEW_MEASURES = ("complexity", "quantization", "input_grad", "flip", "sharpness_dim")


def _new_over_old(job: Path, repeats: int) -> float:
    """Median of (metrics=full) / (metrics=full without the generalization measures)."""
    from sam_runner.evaluation.settings import compose_eval, plain

    old = ["metrics=full", *(f"metrics.{m}.enabled=false" for m in NEW_MEASURES)]
    settings = {
        "old": plain(compose_eval(old, job)),
        "new": plain(compose_eval(["metrics=full"], job)),
    }
    timed = functools.partial(_timed_measure, job, settings)

    timed("old"), timed("new")
    return statistics.median(timed("new") / timed("old") for _ in range(repeats))


def _shares(job: Path, repeats: int) -> dict:
    """The full measurement's seconds per part (``CurvatureTracker.times``) and their shares."""
    from sam_runner.evaluation.settings import compose_eval, plain
    from sam_runner.losses import mean_loss
    from sam_runner.metrics.sharpness_dim import step_for
    from sam_runner.metrics.tracker import CurvatureTracker
    from sam_runner.rebuild import load_run

    metrics = OmegaConf.create(plain(compose_eval(["metrics=full"], job))["metrics"])
    run = load_run(job, torch.device("cpu"), strict=True)
    loss = mean_loss(str(OmegaConf.select(run.cfg, "trainer.loss", default="cross_entropy")))
    times = []
    for _ in range(repeats + 1):  # the first one warms up
        seed = int(run.cfg.seed)
        tracker = CurvatureTracker(metrics, run.model, run.data, None, seed, None, loss)
        tracker.step = step_for(metrics, run.cfg)  # as sam-eval: sharpness_dim's step
        tracker.measure(final=True)
        times.append(tracker.times)
    parts = {k: statistics.median(t[k] for t in times[1:]) for k in times[-1]}
    total = sum(parts.values())
    out = {f"eval_full_part_s_{k}": v for k, v in parts.items()}
    out.update({f"eval_full_share_{k}": v / total for k, v in parts.items()})
    return out


def _ratio(model, data, dataset_cfg, repeats: int) -> tuple[float, int]:
    """(corruption evaluation / clean evaluation, corrupted copies evaluated)."""
    metrics = OmegaConf.create({"ece_bins": 15, "corruptions": {"enabled": True}})
    dist, plain = distributed.current(), contextlib.nullcontext()
    ce = nn.CrossEntropyLoss(reduction="none")
    clean = lambda: evaluate(model, data.test, ce, plain, dist, metrics)  # noqa: E731
    corrupted = lambda: corruption_values(model, data, metrics, dataset_cfg, 0)  # noqa: E731
    values, _ = corrupted()
    copies = 5 * sum(k.startswith("test_acc_c_") for k in values)
    ratios = []
    for _ in range(repeats):  # alternated: slow drift of a shared machine cancels
        ratios.append(median_time(corrupted, 1, 0) / median_time(clean, 3, 0))
    return statistics.median(ratios), copies


def _image_case(repeats: int) -> tuple[float, int]:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (2000, 3, 32, 32), generator=g, dtype=torch.uint8)
    y = torch.randint(0, 10, (2000,), generator=g)
    stats = ((0.5, 0.5, 0.5), (0.29, 0.29, 0.29))
    ds = OmegaConf.create({"name": "cifar10", "batch_size": 128, "augment": False, "data_dir": "."})
    data = tensor_data(Arrays(x[:500], y[:500], x, y, 10, stats), ds, torch.device("cpu"), 0)
    torch.manual_seed(0)
    model = build_model(OmegaConf.create({"arch": "cnn", "channels": 32}), (3, 32, 32), 10)
    return _ratio(model.eval(), data, ds, repeats)


def run(args) -> dict:
    quick = bool(getattr(args, "quick", False))
    repeats = 1 if quick else max(3, int(getattr(args, "repeats", 5)))
    out = {}
    with tempfile.TemporaryDirectory() as d:
        job = _trained_default_job(Path(d))
        full, ratio = _eval_full_and_ratio(job, repeats)
        out.update(eval_per_job_s=full, eval_full_over_default=ratio, eval_full_target=8)
        out.update(eval_full_new_over_old=_new_over_old(job, repeats), eval_full_new_target=1.3)
        out.update(_shares(job, repeats))
        from sam_runner.rebuild import load_run

        run = load_run(job, torch.device("cpu"), strict=True)
        cfg, data, model = run.cfg, run.data, run.model
        ratio, copies = _ratio(model, data, cfg.dataset, repeats)
    out.update(corruptions_over_clean_eval=ratio, corrupted_copies=copies)
    out["corruptions_target"] = 1.2 * copies
    ratio, copies = _image_case(repeats)
    out.update(corruptions_over_clean_eval_image=ratio, corrupted_copies_image=copies)
    return out
