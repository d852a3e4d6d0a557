"""The study presets' GPU time, from the throughput scripts/gpu_check.py measured (its part
``estimates``; docs/gpu_check.md gives the definitions).

Each preset of conf/experiment/ (not the ``_mini`` ones, not ``example``) is composed by Hydra,
its sweep expanded into jobs, and each job's model, optimizer, batch size, dataset and epochs read
off its composed config. One job takes

    epochs × (steps per epoch × seconds per step + evaluation) + one λ_max measurement

with steps per epoch = training images // batch (the loader drops the last partial batch),
seconds per step = batch / (measured base images/s of its model and precision) × the optimizer's
cost in base steps: measured for base, SAM, GEAR-SAM and spectral SAM (side by side), for the
other variants their number of passes × (measured SAM/base) / 2; evaluation = test images /
measured evaluation images/s, once per evaluated epoch; λ_max = the measured time of one
measurement on 4,096 samples (the default: once, at the end), where that model's was measured.
Assumed: images/s does not depend on the batch size (measured at one batch), nor on the base
optimizer (measured with SGD), nor on the dataset's class count (measured on CIFAR-100).
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRECISIONS = {"fp32": "as configured (fp32)", "bf16_cl": "trainer.precision=bf16 + channels_last"}
# images (train, test) of the real datasets; long-tailed cuts are applied to the training count
DATASETS = {
    "cifar10": (50000, 10000, 10),
    "cifar100": (50000, 10000, 100),
    "cifar100_lt": (50000, 10000, 100),
}
# the overrides of a job that change its cost: config groups (composed by Hydra, once per
# preset and choice) and values (read as YAML); the optimizer matters by its name alone
COMPOSED = ("model", "model.name", "dataset")
VALUES = {
    "dataset.batch_size": "batch",
    "dataset.imbalance_ratio": "imbalance_ratio",
    "trainer.epochs": "epochs",
    "trainer.eval_every_n_epochs": "eval_every",
}
CPU_DATASETS = ("mnist1d", "digits")  # 1-D signals and 8×8 digits: minutes on a CPU
MEASURED_RATIOS = {"gear_sam": "gear_sam_over_sam", "spectral_sam": "spectral_sam_over_sam"}


def presets() -> list[str]:
    return sorted(
        p.stem
        for p in (ROOT / "conf" / "experiment").glob("*.yaml")
        if not p.stem.endswith("_mini") and p.stem != "example"
    )


def measured_rates(results: dict) -> dict:
    """(model, precision) -> the measured figures a job's time is made of."""
    parts = {name: p.get("result") or {} for name, p in results.get("parts", {}).items()}
    per_model = {
        r["model"]: r["configs"] for name, r in parts.items() if name.startswith("train:") and r
    }
    per_model.update(parts.get("models", {}).get("models", {}))
    lam = {
        r.get("model"): r.get("lambda_max_s") for n, r in parts.items() if n[:10] == "curvature:"
    }
    rates = {}
    for model, configs in per_model.items():
        for precision in PRECISIONS:
            c = configs.get(precision) or {}
            base = (c.get("images_per_s") or {}).get("base")
            if base and c.get("sam_over_base") and c.get("eval_images_per_s"):
                rates[(model, precision)] = {**c, "base": base, "lambda_max_s": lam.get(model)}
    return rates


def step_cost(optimizer: str, rate: dict) -> float:
    """The optimizer's step in base steps (measured, or its passes at SAM's cost per pass)."""
    from sam_runner.optim import VARIANTS

    if optimizer == "base":
        return 1.0
    sam = rate["sam_over_base"]
    if optimizer == "sam":
        return sam
    if rate.get(MEASURED_RATIOS.get(optimizer)):
        return sam * rate[MEASURED_RATIOS[optimizer]]
    return VARIANTS[optimizer].passes * sam / 2


def train_images(dataset: str, imbalance_ratio) -> int:
    import torch

    from sam_runner.data.labels import long_tail_indices

    n, _, classes = DATASETS[dataset]
    if imbalance_ratio is None:
        return n
    labels = torch.arange(n) % classes
    return len(long_tail_indices(labels, classes, float(imbalance_ratio)))


def job_seconds(job: dict, rate: dict) -> tuple[float, bool]:
    """(seconds of one job, whether its λ_max measurement is included)."""
    batch, epochs, every = int(job["batch"]), int(job["epochs"]), int(job["eval_every"])
    steps = train_images(job["dataset"], job["imbalance_ratio"]) // batch
    step_s = batch / rate["base"] * step_cost(job["optimizer"], rate)
    evaluations = epochs // every + (1 if epochs % every else 0)  # and always the last epoch
    eval_s = DATASETS[job["dataset"]][1] / rate["eval_images_per_s"]
    lam = rate.get("lambda_max_s")
    return epochs * steps * step_s + evaluations * eval_s + (lam or 0.0), lam is not None


def _describe(cfg) -> dict:
    from sam_runner.provenance import built_model

    t, d = cfg.trainer, cfg.dataset
    return {
        "model": built_model(cfg.model, (3, 32, 32)),
        "optimizer": str(cfg.optimizer.name),
        "dataset": str(d.name),
        "batch": d.batch_size,
        "imbalance_ratio": d.get("imbalance_ratio"),
        "epochs": t.epochs,
        "eval_every": t.get("eval_every_n_epochs", 1),
    }


def preset_jobs(preset: str, base=None) -> list[tuple[dict, int]]:
    """The preset's jobs as (what sets its cost, how many jobs share it); ``base``: the preset
    composed already."""
    import yaml

    from sam_runner.sweep.plan import compose, expand, sweeper_params

    key = lambda o: o.split("=", 1)[0].lstrip("+~")
    base = base if base is not None else compose([f"experiment={preset}"])
    jobs = expand([], sweeper_params(base))
    groups = Counter(
        tuple(o for o in job if key(o) in (*COMPOSED, *VALUES, "optimizer")) for job in jobs
    )
    composed = {(): _describe(base)}
    out = []
    for overrides, count in groups.items():
        pick = tuple(o for o in overrides if key(o) in COMPOSED)
        if pick not in composed:
            composed[pick] = _describe(compose([f"experiment={preset}", *pick]))
        job = dict(composed[pick])
        for o in overrides:
            if key(o) in VALUES:
                job[VALUES[key(o)]] = yaml.safe_load(o.split("=", 1)[1])
            elif key(o) == "optimizer":
                job["optimizer"] = o.split("=", 1)[1]
        out.append((job, count))
    return out


def step_tracked(preset: str, cfg=None) -> str | None:
    """Why a preset is not extrapolated from throughput, or None: a full-batch run with λ_max
    every few steps costs what its curvature measurements cost, which the check does not time
    at that size (``cfg``: the preset composed already)."""
    from sam_runner.sweep.plan import compose

    cfg = cfg if cfg is not None else compose([f"experiment={preset}"])
    if cfg.get("stages"):  # each stage its own jobs and models (docs/studies.md)
        return "in stages: not extrapolated from throughput (the stages' jobs differ)"
    every = cfg.metrics.hessian.get("every_n_steps") or 0
    if cfg.dataset.batch_size == "full" or every:
        return f"full-batch steps, λ_max every {every} steps: not extrapolated from throughput"
    if str(cfg.dataset.name) in CPU_DATASETS:  # the check times image models only
        return f"dataset={cfg.dataset.name}: a CPU-sized study, not extrapolated from throughput"
    if str(cfg.dataset.name) not in DATASETS:  # token data (GPT) and arrays: not timed
        return f"dataset={cfg.dataset.name}: not timed by the check, not extrapolated"
    if str(cfg.get("federated", {}).get("name", "none")) != "none":
        return "federated rounds: not extrapolated from throughput (clients, not epochs)"
    return None


def fast_path_here(cfg) -> dict:
    """The preset's GPU fast path as this machine resolves it (a convolutional net on images:
    what channels_last would do for one; docs/running.md)."""
    import torch

    from sam_runner.training.fast_path import resolve

    cuda = torch.cuda.is_available()
    bf16 = cuda and torch.cuda.is_bf16_supported()
    return resolve(cfg.trainer, "cuda" if cuda else "cpu", bf16, True, True)._asdict()


def preset_estimate(preset: str, rates: dict) -> dict:
    from sam_runner.sweep.plan import compose

    cfg = compose([f"experiment={preset}"])  # once: the jobs, the reason, the fast path
    jobs = preset_jobs(preset, cfg)
    n_jobs = sum(count for _, count in jobs)
    fast = fast_path_here(cfg)
    reason = step_tracked(preset, cfg)
    if reason:
        return {"jobs": n_jobs, "models": [], "missing": [], "not_estimated": reason,
                "fast_path": fast}  # fmt: skip
    out = {"jobs": n_jobs, "models": set(), "missing": set(), "lambda_max_included": True,
           "fast_path": fast}  # fmt: skip
    seconds = {precision: [] for precision in PRECISIONS}
    for job, count in jobs:
        out["models"].add(job["model"])
        for precision in PRECISIONS:
            rate = rates.get((job["model"], precision))
            if rate is None:
                out["missing"].add(f"{job['model']} {precision}")
                continue
            s, lam = job_seconds(job, rate)
            out["lambda_max_included"] &= lam
            seconds[precision] += [s] * count
    for precision, s in seconds.items():
        out[f"{precision}_gpu_h"] = sum(s) / 3600 if len(s) == n_jobs else None
        out[f"{precision}_job_h"] = [min(s) / 3600, max(s) / 3600] if s else None
    return {**out, "models": sorted(out["models"]), "missing": sorted(out["missing"])}


def preset_estimates(results: dict) -> dict:
    from sam_runner.cli import register_resolvers

    register_resolvers()
    rates = measured_rates(results)
    out = {"precisions": PRECISIONS, "presets": {}}
    for preset in presets():
        out["presets"][preset] = preset_estimate(preset, rates)
    return out
