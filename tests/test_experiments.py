"""Study presets: each composes, every job of its sweep builds; the _mini ones run end to end."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT, compose, run_cli
from hydra import compose as hydra_compose
from hydra import initialize_config_dir
from omegaconf import OmegaConf

from sam_runner import data
from sam_runner.cli import register_resolvers
from sam_runner.optim.build import build_optimizer
from sam_runner.paths import config_dir
from sam_runner.registry import MODELS
from sam_runner.schedulers import build_scheduler
from sam_runner.sweep.plan import ValueVariants, expand
from sam_runner.sweep.stages import plan, resolve
from sam_runner.training.fast_path import FastPath
from sam_runner.training.fast_path import resolve as resolve_fast_path
from sam_runner.training.validate import validate_run

PRESETS = sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml"))
STUDIES = [
    "sam_wrn_cifar",
    "tlc_rho_sweep",
    "tlc_vs_sam",
    "gear_vs_sam",
    "calibration",
    "long_tail",
    "spectral_muon",
    "variant_zoo",
    "generalization_measures",
    "ouidecay",
    "jsd_vs_sam",
    "cheaper_sam",
    "optimizer_connectivity",
    "distill_sam",
    "sam_midtraining",
    "federated_sam",
    "optimizer_consistency",
    "peft_flatness",
    "pc_sharpness",
    "baselines",
    "lm_midtraining_hf",
    "peft_flatness_hf",
    "optimizer_consistency_hf",
]
# the catalogue of baselines: the field's known variants and the ones added with it
BASELINES = (
    "base sam asam gsam look_sam esam fsam wsam gcsam bsam msam focal_sam functional_sam sampa"
)
ZOO = "base sam asam gear_sam tlc_sam le_sam eisam csam spectral_sam sam_sps precond_sam gsam"
# preset: (jobs, models, dataset, variants), as README's study table says (minis: their preset's
# comment)
EXPECTED = {
    "example": (4, "auto", "mnist1d", "base sam"),
    "sam_wrn_cifar": (6, "wrn28_10", "cifar100", "base sam"),
    "sam_wrn_cifar_mini": (6, "cnn1d", "mnist1d", "base sam"),
    "tlc_rho_sweep": (108, "resnet18 vgg19_bn", "cifar100", "sam"),
    "tlc_rho_sweep_mini": (24, "cnn mlp", "digits", "sam"),
    "tlc_vs_sam": (12, "resnet18 vgg19_bn", "cifar100", "sam tlc_sam"),
    "tlc_vs_sam_mini": (8, "cnn mlp", "digits", "sam tlc_sam"),
    "gear_vs_sam": (36, "resnet18 wrn16_8", "cifar100", "base sam gear_sam"),
    "gear_vs_sam_mini": (24, "cnn1d mlp", "mnist1d", "base sam gear_sam"),
    "gear_vs_sam_transfer": (9, "timm", "cifar100", "base sam gear_sam"),
    "calibration": (9, "resnet18", "cifar100", "base sam csam"),
    "calibration_mini": (9, "cnn1d", "mnist1d", "base sam csam"),
    "long_tail": (12, "resnet18", "cifar100_lt", "base sam"),
    "long_tail_mini": (8, "cnn1d", "mnist1d", "base sam"),
    "spectral_muon": (18, "vit_tiny", "cifar100", "base sam spectral_sam"),
    "spectral_muon_mini": (12, "mlp", "mnist1d", "base sam spectral_sam"),
    "variant_zoo": (36, "resnet18", "cifar100", ZOO),
    "variant_zoo_mini": (24, "cnn1d", "mnist1d", ZOO),
    "baselines": (28, "resnet18", "cifar100", BASELINES),
    "baselines_mini": (28, "auto", "mnist1d", BASELINES),
    "edge_of_stability": (16, "cnn mlp", "cifar10", "base sam"),
    "edge_of_stability_mini": (6, "mlp", "mnist1d", "base sam"),
    "sharpness_dim_eos_mini": (9, "mlp", "mnist1d", "base"),
    # variant x rho x batch size x lr x seed, base once per rho: 8 base + 16 sam + 16 gsam
    "generalization_measures": (40, "resnet18", "cifar10", "base sam gsam"),
    "generalization_measures_mini": (40, "mlp", "mnist1d", "base sam gsam"),
    # variant x weight averaging (none, swa) x seed
    "swa_vs_sam": (12, "resnet18", "cifar100", "base sam"),
    "swa_vs_sam_mini": (8, "cnn", "digits", "base sam"),
    # weight decay (constant, ouidecay) x variant x seed
    "ouidecay": (12, "resnet18", "cifar100", "base sam"),
    "ouidecay_mini": (8, "cnn1d", "mnist1d", "base sam"),
    # (weight 0: once per variant and seed) + weight 1 x alpha x variant x seed
    "jsd_vs_sam": (36, "resnet18", "cifar100", "base sam"),
    "jsd_vs_sam_mini": (24, "mlp", "mnist1d", "base sam"),
    # the twelve methods of conf/cheaper/ x seeds
    "cheaper_sam": (36, "resnet18", "cifar100", "base sam look_sam esam"),
    "lm_sam": (9, "gpt", "text", "base sam"),
    "lm_sam_mini": (9, "gpt", "text", "base sam"),
    "lm_weight_decay": (12, "gpt", "text", "base"),
    "lm_weight_decay_mini": (6, "gpt", "text", "base"),
    # in stages: pretrain x seed, mid-training {base, sam ρ, sam ρ'} x seed, post-training of
    # each on the second corpus
    "lm_midtraining": (21, "gpt", "text", "base sam"),
    "lm_midtraining_mini": (14, "gpt", "text", "base sam"),
    "grokking": (6, "gpt", "modular_arithmetic", "base sam"),
    "grokking_mini": (2, "gpt", "modular_arithmetic", "base sam"),
    "spectra_sam_mini": (12, "mlp", "arrays", "base sam"),
    "cheaper_sam_mini": (24, "auto", "mnist1d", "base sam look_sam esam"),
    # base optimizer (adamw, muon, lion) x seed, no SAM
    "optimizer_connectivity": (15, "mlp", "mnist1d", "base"),
    "optimizer_connectivity_mini": (9, "mlp", "mnist1d", "base"),
    # in stages (docs/studies.md): teachers {base, sam} x seed, then students {base, sam} x
    # teacher {base, sam} x seed, then aligned SAM students x teacher x seed
    "distill_sam": (24, "resnet18 resnet34", "cifar100", "base sam"),
    "distill_sam_mini": (16, "mlp", "mnist1d", "base sam"),
    # pretrain x seed, mid-training {base, sam ρ, sam ρ'} x seed, post-training of each
    "sam_midtraining": (21, "resnet18", "cifar100", "base sam"),
    "sam_midtraining_mini": (14, "mlp", "mnist1d", "base sam"),
    # the four methods of conf/fed_method/ x Dirichlet alpha (or IID) x seed
    "federated_sam": (16, "resnet18", "cifar100", "base sam"),
    "federated_sam_mini": (16, "auto", "mnist1d", "base sam"),
    # {adamw, muon} pretraining of an mlp and a GPT, then {adamw, muon} x {full, LoRA} x lr from
    # each (x seeds in the full preset)
    "optimizer_consistency": (204, "mlp gpt", "mnist1d text", "base"),
    "optimizer_consistency_mini": (36, "mlp gpt", "mnist1d text", "base"),
    # one pretrained mlp and GPT; LoRA on the mlp, a prompt on the GPT, by 4 variants x seeds
    "peft_flatness": (26, "mlp gpt", "mnist1d text", "base sam flatpo sample"),
    "peft_flatness_mini": (18, "mlp gpt", "mnist1d text", "base sam flatpo sample"),
    # dataset x train_subset x {em, adamw} x {pc_trace, pc_adaptive} x weight x seed
    "pc_sharpness": (192, "pc", "digits mnist1d", "base"),
    "pc_sharpness_mini": (24, "pc", "digits", "base"),
    # model=hf: a released checkpoint (full size) or a tiny model from its config (minis)
    "lm_midtraining_hf": (14, "hf", "text", "base sam"),
    "lm_midtraining_hf_mini": (14, "hf", "text", "base sam"),
    "peft_flatness_hf": (15, "hf", "table", "base sam flatpo sample flat_lora"),
    "peft_flatness_hf_mini": (11, "hf", "text", "base sam flatpo sample flat_lora"),
    "optimizer_consistency_hf": (18, "hf", "text", "base"),
    "optimizer_consistency_hf_mini": (10, "hf", "text", "base"),
}


def sweep_of(preset):
    """(the preset's composed config, its jobs); a preset in stages: every stage's jobs."""
    c, jobs = _stages_of(preset)
    return c, [job for _, job in jobs]


def _stages_of(preset):
    """(the composed config, [(job folder relative to the sweep folder, job overrides)])."""
    register_resolvers()
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        c = hydra_compose("config", overrides=[f"experiment={preset}"], return_hydra_config=True)
    if c.get("stages") is not None:
        stages = plan([f"experiment={preset}"], Path("sweep"), c)
        return c, [(f"{s.name}/{n}", job) for s in stages for n, job in enumerate(s.jobs)]
    params = OmegaConf.to_container(c.hydra.sweeper.params, resolve=False) or {}
    return c, [(str(n), job) for n, job in enumerate(expand([f"experiment={preset}"], params))]


def _on_a_cluster(cfg) -> bool:
    """A full-size model=hf preset: its released checkpoint and its data files are fetched on the
    cluster (docs/language_models.md), so its jobs are composed and their optimizers built, not
    checked against files this machine lacks."""
    return cfg.model.arch == "hf" and cfg.model.get("config") is None


def test_every_study_has_a_mini():
    for study in STUDIES:
        assert study in PRESETS and f"{study}_mini" in PRESETS, study


# every preset's config is composed by test_every_job_of_the_sweep_builds; through the CLI's
# --cfg path in CI: one of each kind (a sweep, a mini, stages, an hf model, a circuit), the
# others under -m slow (a second each: CI's 30 minutes)
CLI_PRESETS = ("example", "baselines_mini", "distill_sam", "lm_midtraining_hf_mini", "pc_sharpness")


@pytest.mark.parametrize(
    "preset",
    [p if p in CLI_PRESETS else pytest.param(p, marks=pytest.mark.slow) for p in PRESETS],
)
def test_cfg_job_prints_the_preset(preset, capsys):
    code, out, _ = run_cli(["-m", f"experiment={preset}", "--cfg", "job"], capsys)
    assert code == 0 and "optimizer:" in out


# the two largest full-size sweeps take 10-25 s to build: outside CI's 30-minute budget
BIG_SWEEPS = ("pc_sharpness", "optimizer_consistency")


@pytest.mark.parametrize(
    "preset",
    [pytest.param(p, marks=pytest.mark.slow) if p in BIG_SWEEPS else p for p in PRESETS],
)
def test_every_job_of_the_sweep_builds(preset):
    """Each job's composed config passes validation and builds its optimizer and scheduler, and the
    sweep is the study the README describes: its job count, models, dataset and variants; the
    preset's GPU fast path (``_check_fast_path``)."""
    c, jobs = sweep_of(preset)
    _check_fast_path(preset, c)
    n_jobs, archs, dataset, variants = EXPECTED[preset]
    assert len(jobs) == n_jobs
    if preset in STUDIES or preset.endswith("_mini"):
        assert c.study.name == preset
    tiny = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 3))
    # axes that cannot break construction are collapsed to keep this fast
    inert = ("seed=", "dataset.batch_size=", "base_optimizer.lr=", "dataset.label_noise=")
    distinct = {tuple(o for o in job if not o.startswith(inert)) for job in jobs}
    composed, compose_job = set(), ValueVariants()  # as sam-run -m checks a sweep's jobs
    for job in sorted(distinct):
        cfg = compose_job(list(job))
        # stage:NAME, as sam-run's checks do
        awaiting = resolve(cfg, list(job), Path("sweep"), read=False)
        composed.add((cfg.model.arch, cfg.dataset.name, cfg.optimizer.name))
        if not _on_a_cluster(cfg):
            validate_run(cfg, awaiting=awaiting)
            data.validate(cfg.dataset)
        assert cfg.model.arch in MODELS
        # on a CPU every job runs eagerly, contiguous, without cuDNN's autotuner
        on_cpu = resolve_fast_path(cfg.trainer, "cpu", True, True, True)
        assert (on_cpu.channels_last, on_cpu.cudnn_benchmark, on_cpu.compile) == (False,) * 3
        opt = build_optimizer(cfg, tiny, total_steps=100)
        build_scheduler(cfg.scheduler, opt, 10, 100)
    assert {a for a, _, _ in composed} == set(archs.split())
    assert {d for _, d, _ in composed} == set(dataset.split())
    assert {v for _, _, v in composed} == set(variants.split())


# full-size presets without the GPU fast path: the README's five-epoch example (its compile
# would outlast its training)
WITHOUT_FAST_PATH = ("example",)


def _check_fast_path(preset: str, cfg) -> None:
    """On a CUDA GPU with bf16 (resolved here on the CPU) a full-size preset runs bf16 autocast
    (pc_sharpness: fp32, its circuits' sums), channels_last, cudnn.benchmark and compile; a mini
    preset none of them; on a CPU, both run fp32 eager; curvature is measured in fp32."""
    t, given = cfg.trainer, str(cfg.trainer.precision)
    on_cpu = resolve_fast_path(t, "cpu", True, True, True)
    assert on_cpu == FastPath("fp32" if given == "auto" else given, False, False, False)
    on_gpu = resolve_fast_path(t, "cuda", True, True, True)
    if preset.endswith("_mini") or preset in WITHOUT_FAST_PATH:
        assert on_gpu == on_cpu, on_gpu
    else:
        expected = "fp32" if preset == "pc_sharpness" else "bf16"
        assert on_gpu == FastPath(expected, True, True, True), on_gpu
    assert cfg.metrics.hessian.get("precision", "fp32") == "fp32"


def test_sam_wrn_cifar_is_the_papers_setting():
    c, jobs = sweep_of("sam_wrn_cifar")
    assert (c.model.arch, c.trainer.epochs, c.dataset.batch_size) == ("wrn28_10", 200, 128)
    assert (c.base_optimizer.lr, c.base_optimizer.momentum, c.base_optimizer.weight_decay) == (
        0.1,
        0.9,
        5e-4,
    )
    assert c.optimizer.rho == 0.1 and c.scheduler.name == "cosine" and len(jobs) == 6
    assert "16.5" in c.study.reference and "18.8" in c.study.reference


def test_gear_vs_sam_transfer_fine_tunes_a_pretrained_timm_resnet50():
    _, jobs = sweep_of("gear_vs_sam_transfer")
    for job in jobs:
        cfg = compose(*job)
        assert (cfg.model.arch, cfg.model.name, cfg.model.pretrained) == ("timm", "resnet50", True)
        assert (cfg.dataset.label_noise, cfg.base_optimizer.lr, cfg.trainer.epochs) == (
            0.0,
            0.01,
            30,
        )


def test_cheaper_sam_mini_is_the_twelve_methods_with_two_seeds():
    _, jobs = sweep_of("cheaper_sam_mini")
    keys = ("name", "interval", "perturb_schedule", "perturb_prob", "perturb_from")
    seeds = {}  # the method's override -> its seeds
    for job in jobs:
        method = next(o for o in job if o.startswith("+cheaper="))
        seeds.setdefault(method, []).append(next(int(o[5:]) for o in job if o.startswith("seed=")))
    methods = {}
    for method, its_seeds in seeds.items():  # one composition per method (seeds change nothing)
        cfg = compose(method, "experiment=cheaper_sam_mini")
        o = cfg.optimizer
        methods[tuple(o.get(k) for k in keys) + (o.get("k"),)] = its_seeds
        assert (cfg.dataset.name, cfg.model.arch, cfg.base_optimizer.name) == (
            "mnist1d", "auto", "sgd",
        )  # fmt: skip
        assert cfg.base_optimizer.lr == 0.1 and cfg.scheduler.name == "cosine"  # the default
    every, rnd, late, ada = "every", "random", "late", "adaptive"
    assert {m[:5] + (m[5],) for m in methods} == {
        ("base", None, every, None, None, None),  # base keeps only its schedule name
        ("sam", 1, every, 0.5, 0.0, None),
        ("sam", 2, every, 0.5, 0.0, None),
        ("sam", 5, every, 0.5, 0.0, None),
        ("sam", 1, rnd, 0.25, 0.0, None),
        ("sam", 1, rnd, 0.5, 0.0, None),
        ("sam", 1, late, 0.5, 0.9, None),
        ("sam", 1, late, 0.5, 0.8, None),
        ("sam", 1, ada, 0.5, 0.0, None),
        ("look_sam", 1, every, 0.5, 0.0, 2),
        ("look_sam", 1, every, 0.5, 0.0, 5),
        ("esam", 1, every, 0.5, 0.0, None),
    }
    assert all(sorted(seeds) == [0, 1] for seeds in methods.values())


MINIS = [p for p in PRESETS if p.endswith("_mini")]


@pytest.mark.slow
@pytest.mark.parametrize("preset", MINIS)
def test_mini_study_runs_and_reports(preset, tmp_path):
    sweep = tmp_path / preset
    # tiny models: 1 thread is fastest
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "sam_runner.cli",
            "-m",
            f"experiment={preset}",
            f"hydra.sweep.dir={sweep}",
            "trainer.progress=none",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    _, jobs = _stages_of(preset)
    for folder, _ in jobs:
        assert json.loads((sweep / folder / "summary.json").read_text())["status"] in (
            "completed",
            "diverged",
        )
    rep = subprocess.run(
        [sys.executable, "-m", "sam_runner.results.report", str(sweep)],
        capture_output=True,
        text=True,
    )
    assert rep.returncode == 0, rep.stderr
    assert (sweep / "report.md").exists() and (sweep / "report.csv").exists()
    if preset in ("sam_midtraining_mini", "lm_midtraining_mini"):  # a row per mid-training
        rows = (sweep / "forgetting.csv").read_text().splitlines()
        assert [r.split(",")[0] for r in rows[1:]] == ["base", "sam ρ=0.05", "sam ρ=0.2"]
        if preset == "lm_midtraining_mini":  # the language model's columns
            assert {"ppl_before", "ppl_after", "quant_loss_rise_4bit"} <= set(rows[0].split(","))
    if preset in ("optimizer_consistency_mini", "peft_flatness_mini"):  # fine_tuning.csv's rows
        with open(sweep / "fine_tuning.csv") as f:
            table = list(csv.DictReader(f))
        if preset == "optimizer_consistency_mini":  # model x pretraining x method x lr
            assert len(table) == 32 and {r["n"] for r in table} == {"1"}
        else:  # model x variant, over two seeds
            assert len(table) == 8 and {r["n"] for r in table} == {"2"}
        assert all(r["loss_rise"] and r["new_loss"] and r["lambda_max"] for r in table)
    if preset == "edge_of_stability_mini":  # GD's λ_max reaches 2/η and stays there
        from sam_runner.results.eos import plateau, traces
        from sam_runner.results.report import build_report

        gd = [t for t in traces(build_report(sweep)) if t["job"].variant == "base"]
        assert len(gd) == 3 and all(0.85 <= plateau(t, "threshold") <= 1.3 for t in gd), [
            plateau(t, "threshold") for t in gd
        ]
