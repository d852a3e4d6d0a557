"""The measuring parts of scripts/gpu_check.py, one per process (docs/gpu_check.md):

    python scripts/gpu_parts.py PART --scratch DIR [--cpu] [--results gpu_check.json]

PART is ``env``, ``data``, ``train:<model>``, ``compile:<model>``, ``curvature:<model>``,
``models``, ``sharded`` or ``estimates``. Each writes DIR/<PART>.json ({"result": ...,
"errors": {...}}) after every sub-measurement, so that a part stopped at its timeout still
leaves what it measured, and records an error in one sub-measurement without giving up the
others.

Training goes through the runner itself: ``Run.setup()`` builds data (CIFAR-100 written in
torchvision's on-disk format, held on the device), model, optimizer, scaler, autocast,
channels_last and torch.compile exactly as ``sam-run`` does, and ``Stepper.step`` is the body of
``EpochLoop.train_epoch``'s loop. Configurations are timed alternately, a few steps at a time,
with the device synchronised around each timing; figures are medians over rounds.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import torch  # noqa: E402 (after the path: the checkout's sam_runner, not an installed one)

SIZES = {
    "gpu": dict(
        batch=128, n_train=10240, n_test=2048, warmup=3, rounds=5, steps=10, eval_repeats=3,
        hessian_samples=4096, hessian_iter=100, hvp_batch=512, hvp_repeats=5, curvature_steps=20,
    ),
    "cpu": dict(
        batch=4, n_train=64, n_test=8, warmup=1, rounds=1, steps=1, eval_repeats=1,
        hessian_samples=16, hessian_iter=3, hvp_batch=8, hvp_repeats=1, curvature_steps=1,
    ),
}  # fmt: skip
CONFIGS = {
    "fp32": ("trainer.precision=fp32",),
    "bf16": ("trainer.precision=bf16",),
    "bf16_cl": ("trainer.precision=bf16", "trainer.channels_last=true"),
    "bf16_cl_compile": (
        "trainer.precision=bf16",
        "trainer.channels_last=true",
        "trainer.compile=true",
    ),
}
# trainer.compile_mode's measured modes (max-autotune itself adds CUDA graphs to the last)
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune-no-cudagraphs")
for _mode in COMPILE_MODES[1:]:
    CONFIGS[f"bf16_cl_compile_{_mode}"] = (
        *CONFIGS["bf16_cl_compile"],
        f"trainer.compile_mode={_mode}",
    )
OPTIMIZERS = ("sam", "base", "gear_sam", "spectral_sam")  # SAM first: its peak memory alone
# the models the study presets use beyond the two measured in full (timm's without weights:
# nothing can be downloaded on the device, and the architecture alone sets the speed)
PRESET_MODELS = {
    "wrn28_10": ("model=wrn28_10",),
    "vgg19_bn": ("model=vgg19_bn",),
    "vit_tiny": ("model=vit_tiny",),
    "timm:resnet50": ("model=timm", "model.name=resnet50", "model.pretrained=false"),
}
# --cpu: every model is this small CNN (the dry run checks the code path, not the models' speed:
# ResNet-18 takes seconds a step on two CPU cores, WRN-16-8 in bf16 ten times that)
STAND_IN = ("model=cnn", "model.channels=8")
CARRIED = ("hydra", "omegaconf", "antlr4", "wandb", "submitit", "hydra_plugins", "mnist1d")


# ---------------------------------------------------------------------------- bookkeeping
class Part:
    """The part's JSON file, rewritten after every sub-measurement."""

    def __init__(self, name: str, scratch: Path, cpu: bool):
        self.name, self.scratch, self.cpu = name, scratch, cpu
        self.size = SIZES["cpu" if cpu else "gpu"]
        self.device = "cpu" if cpu else "cuda"
        self.result, self.errors = {}, {}
        if cpu and name.split(":")[0] in ("train", "compile", "curvature", "models"):
            self.result["stand_in"] = " ".join(STAND_IN)
        self.path = scratch / (name.replace(":", "_") + ".json")

    def save(self) -> None:
        self.path.write_text(json.dumps({"result": self.result, "errors": self.errors}, indent=1))

    def attempt(self, key: str, fn, *args):
        """``fn(*args)``, or None with the error recorded under ``key``; saved either way."""
        try:
            return fn(*args)
        except Exception as e:
            traceback.print_exc()
            lines = str(e).strip().splitlines() or [""]
            self.errors[key] = f"{type(e).__name__}: {lines[0][:300]}"
            return None
        finally:
            self.save()

    def sync(self) -> None:
        if not self.cpu:
            torch.cuda.synchronize()


# ---------------------------------------------------------------------------- env, data
def env(part: Part, results: Path) -> None:
    """Versions, the GPU, and where each carried package imports from (CARRIED and every
    module of the wheels the driver installed)."""
    r = part.result
    r.update(python=platform.python_version(), torch=torch.__version__, cpus=_cpus())
    r.update(cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version())
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        r.update(gpu=p.name, gpu_memory_gib=round(p.total_memory / 2**30, 1))
        r.update(capability=f"{p.major}.{p.minor}", multiprocessors=p.multi_processor_count)
        r.update(driver=_driver(), cudnn_tf32=torch.backends.cudnn.allow_tf32)
        r.update(matmul_tf32=torch.backends.cuda.matmul.allow_tf32)
    else:
        r.update(gpu=None)
    import torchvision

    r["torchvision"] = torchvision.__version__
    r["carried"] = {name: part.attempt(f"import {name}", _where, name) for name in carried(results)}


def carried(results: Path) -> list[str]:
    wheels = json.loads(results.read_text()).get("wheels", {}) if results.exists() else {}
    installed = [m for d in (wheels.get("installed") or {}).values() for m in d["modules"]]
    return list(dict.fromkeys([*CARRIED, *installed]))


def _driver() -> str | None:
    import subprocess

    try:
        query = ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]
        return subprocess.run(query, capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def _cpus() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def _where(module: str) -> str:
    """Where ``module`` imports from, and its distribution's version."""
    import importlib
    import importlib.metadata as md

    mod = importlib.import_module(module)
    where = str(Path(mod.__file__).parent) if getattr(mod, "__file__", None) else "namespace"
    dists = md.packages_distributions().get(module, [])
    return f"{', '.join(f'{d} {md.version(d)}' for d in dists)} ({where})"


def data(part: Part) -> None:
    """CIFAR-100 in torchvision's real on-disk format (the tests' writer; random pixels)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from cifar_files import write_cifar

    s = part.size
    attrs = write_cifar(part.scratch / "data", "cifar100", s["n_train"], s["n_test"])
    (part.scratch / "cifar100.json").write_text(json.dumps(attrs))
    part.result.update(dataset="cifar100", n_train=s["n_train"], n_test=s["n_test"])


def _point_torchvision_at_the_files(scratch: Path) -> None:
    """Our files' checksums in torchvision's integrity table (the tests do the same)."""
    from torchvision import datasets

    for attr, value in json.loads((scratch / "cifar100.json").read_text()).items():
        setattr(datasets.CIFAR100, attr, value)


# ---------------------------------------------------------------------------- runs
def make_run(part: Part, model: tuple, config: str, optimizer: str):
    """A ``Run`` of the runner, set up (not started) on the check's CIFAR-100 files."""
    from hydra import compose, initialize_config_dir

    from sam_runner.cli import register_resolvers
    from sam_runner.paths import config_dir
    from sam_runner.train import Run

    register_resolvers()
    s = part.size
    overrides = [
        *(STAND_IN if part.cpu else model),
        *CONFIGS[config],
        f"optimizer={optimizer}",
        "dataset=cifar100",
        f"dataset.data_dir={part.scratch / 'data'}",
        "dataset.download=false",
        f"dataset.batch_size={s['batch']}",
        f"trainer.device={part.device}",
        "trainer.progress=none",
        "trainer.epochs=1000",
        f"metrics.hessian.num_samples={s['hessian_samples']}",
        f"metrics.hessian.max_iter={s['hessian_iter']}",
    ]
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose("config", overrides=overrides)  # as sam-run composes a run
    run = Run(cfg, Path(tempfile.mkdtemp(dir=part.scratch)), overrides)
    run.setup()
    return run


class Stepper:
    """A run's training steps outside its epoch loop: each ``step`` is the body of
    ``EpochLoop.train_epoch``'s loop (``EpochLoop.train_step``: the optimizer step with its
    epoch statistics, the parts' hooks, the checks), epochs following on."""

    def __init__(self, run, part: Part):
        self.run, self.part, self.epoch, self.batches = run, part, 0, iter(())
        self.stats = self.bar = None
        run.model.train()

    def _batch(self):
        try:
            return next(self.batches)
        except StopIteration:
            from sam_runner.training.evaluation import EpochStats

            r = self.run
            self.epoch += 1
            r.data.train.set_epoch(self.epoch)
            self.batches = iter(r.data.train)
            self.stats = EpochStats(r.device, r.dist)
            self.bar = r.record.progress.epoch_bar(self.epoch, 0)
            return next(self.batches)

    def step(self):
        x, y, idx = self._batch()
        self.run.loop.train_step(x, y, idx, self.stats, self.bar, 0.0)

    def seconds_per_step(self, steps: int) -> float:
        self.part.sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step()
        self.part.sync()
        return (time.perf_counter() - t0) / steps


def build_config(part: Part, model: tuple, config: str, optimizers, out: dict) -> dict:
    """The config's runs, each warmed up (its first step's time kept: compilation, autotuning);
    the first optimizer's run is built and stepped alone, for its peak memory."""
    steppers, before = {}, 0
    if not part.cpu:
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
    for i, name in enumerate(optimizers):
        stepper = Stepper(make_run(part, model, config, name), part)
        out.setdefault("first_step_s", {})[name] = stepper.seconds_per_step(1)
        if part.size["warmup"] > 1:
            stepper.seconds_per_step(part.size["warmup"] - 1)
        if i == 0:  # data, model, optimizer state and both passes' activations, nothing else
            peak = None if part.cpu else (torch.cuda.max_memory_allocated() - before) / 2**30
            out[f"peak_gib_{name}"] = peak
            out.update(what_was_built(stepper.run))
        steppers[name] = stepper
    return steppers


def what_was_built(run) -> dict:
    """Where the runner put the data, whether it compiled the model, its weights' format."""
    kernels = [p for p in run.model.parameters() if p.ndim == 4]
    return {
        "data_device": str(run.data.train.x.device),
        "net": type(run.net).__name__,  # OptimizedModule: torch.compile'd
        "channels_last": bool(kernels)
        and all(p.is_contiguous(memory_format=torch.channels_last) for p in kernels),
    }


def timed_rounds(steppers: dict, rounds: int, steps: int) -> dict:
    """Seconds per step of every stepper, per round; the order reverses every other round
    (ABBA: slow drift cancels)."""
    times = {key: [] for key in steppers}
    for r in range(rounds):
        for key in list(steppers)[:: 1 if r % 2 == 0 else -1]:
            times[key].append(steppers[key].seconds_per_step(steps))
    return times


def ratio(times: dict, a, b) -> float | None:
    """Median over rounds of time(a) / time(b), each round's pair measured side by side."""
    if a not in times or b not in times:
        return None
    return statistics.median(x / y for x, y in zip(times[a], times[b]))


def eval_images_per_s(part: Part, stepper: Stepper) -> float:
    """Test-set images per second through the runner's evaluation (gather, calibration)."""
    run, n = stepper.run, len(stepper.run.data.test.y)
    run.loop.test_set.log_values()  # warm-up (and the eval-mode graph under compile)
    samples = []
    for _ in range(part.size["eval_repeats"]):
        part.sync()
        t0 = time.perf_counter()
        run.loop.test_set.log_values()  # ends in host reads: synchronised
        samples.append(time.perf_counter() - t0)
    run.model.train()
    return n / statistics.median(samples)


# ---------------------------------------------------------------------------- training parts
def measure(part: Part, model: tuple, configs, optimizers, out: dict, evaluate=(), rounds=None):
    """Build every (config, optimizer) run, time them all alternately, and summarise each config
    into ``out[config]``; returns the per-round times by (config, optimizer)."""
    steppers = {}
    for config in configs:
        into = out.setdefault(config, {})
        built = part.attempt(config, build_config, part, model, config, optimizers, into)
        steppers.update({(config, name): s for name, s in (built or {}).items()})
    s = part.size
    rounds = rounds or s["rounds"]
    times = part.attempt("timing", timed_rounds, steppers, rounds, s["steps"]) or {}
    for config in configs:
        t = {name: times[(config, name)] for name in optimizers if (config, name) in times}
        into = out[config]
        into["images_per_s"] = {name: s["batch"] / statistics.median(v) for name, v in t.items()}
        into["sam_over_base"] = ratio(t, "sam", "base")
        into["gear_sam_over_sam"] = ratio(t, "gear_sam", "sam")
        into["spectral_sam_over_sam"] = ratio(t, "spectral_sam", "sam")
        if config in evaluate and (config, "sam") in steppers:
            stepper = steppers[(config, "sam")]
            into["eval_images_per_s"] = part.attempt(
                f"{config} eval", eval_images_per_s, part, stepper
            )
        part.save()
    return times


def train_part(part: Part, model: str) -> None:
    """fp32, bf16 and bf16 + channels_last, every optimizer of OPTIMIZERS, side by side."""
    _point_torchvision_at_the_files(part.scratch)
    part.result.update(model=model, batch=part.size["batch"], configs={})
    configs = ("fp32", "bf16", "bf16_cl")
    measure(part, (f"model={model}",), configs, OPTIMIZERS, part.result["configs"], configs)


def compile_part(part: Part, model: str) -> None:
    """bf16 + channels_last + torch.compile against the same without compile, side by side:
    the first SAM step compiles both passes' graphs (``compile_s``)."""
    _point_torchvision_at_the_files(part.scratch)
    part.result.update(model=model, batch=part.size["batch"], configs={})
    configs, out = ("bf16_cl", "bf16_cl_compile"), part.result["configs"]
    times = measure(part, (f"model={model}",), configs, OPTIMIZERS, out)
    compiled = out.get("bf16_cl_compile", {})
    compiled["compile_s"] = compiled.get("first_step_s", {}).get("sam")
    compiled["compiled"] = compiled.get("net") == "OptimizedModule"  # the runner compiled it
    plain = {k[0]: v for k, v in times.items() if k[1] == "sam"}
    compiled["speedup_sam"] = ratio(plain, "bf16_cl", "bf16_cl_compile")
    part.save()
    compile_modes(part, model, compiled)


def compile_modes(part: Part, model: str, default: dict) -> None:
    """``part.result["modes"]``: each compile mode's compile time and SAM step against eager
    bf16 + channels_last, side by side (the default mode's from the four optimizers' timing; the
    others, SAM alone, after it: a part stopped at its timeout keeps the default's). The CPU dry
    run records the others as not measured: two more inductor compiles would outlast its
    budget."""
    keys = ("compile_s", "speedup_sam", "compiled")
    modes = part.result["modes"] = {"default": {k: default.get(k) for k in keys}}
    if part.cpu:
        modes.update({m: {"skipped": "measured on a GPU only"} for m in COMPILE_MODES[1:]})
        part.save()
        return
    names = {m: f"bf16_cl_compile_{m}" for m in COMPILE_MODES[1:]}
    out = {}
    times = measure(part, (f"model={model}",), ("bf16_cl", *names.values()), ("sam",), out)
    plain = {k[0]: v for k, v in times.items()}
    for mode, name in names.items():
        c = out.get(name, {})
        modes[mode] = {
            "compile_s": c.get("first_step_s", {}).get("sam"),
            "speedup_sam": ratio(plain, "bf16_cl", name),
            "compiled": c.get("net") == "OptimizedModule",
        }
    part.save()


def models_part(part: Part) -> None:
    """The other models of the study presets: base and SAM, fp32 and bf16 + channels_last."""
    _point_torchvision_at_the_files(part.scratch)
    part.result.update(batch=part.size["batch"], models={})
    for name, model in PRESET_MODELS.items():
        out = part.result["models"].setdefault(name, {})
        configs = ("fp32", "bf16_cl")
        rounds = min(3, part.size["rounds"])  # four models in one part's time
        part.attempt(name, measure, part, model, configs, ("sam", "base"), out, configs, rounds)
        if not part.cpu:
            torch.cuda.empty_cache()


# ---------------------------------------------------------------------------- curvature
def curvature_part(part: Part, model: str) -> None:
    """One HVP over one gradient, and one λ_max measurement as a run makes it (fp32, the
    default metrics settings: 4,096 samples, tol 1e-3, presolve), after a few SAM steps."""
    _point_torchvision_at_the_files(part.scratch)
    stepper = Stepper(make_run(part, (f"model={model}",), "fp32", "sam"), part)
    stepper.seconds_per_step(part.size["curvature_steps"])
    part.result["model"] = model
    part.attempt("hvp_over_grad", hvp_over_grad, part, stepper.run)
    part.attempt("lambda_max", lambda_max, part, stepper.run)


def hvp_over_grad(part: Part, run) -> None:
    import torch.nn.functional as F
    from benchutil import interleaved_ratio

    from sam_runner.metrics.hvp import HessianOperator
    from sam_runner.module_state import modes_restored

    x, y = run.data.train_subset(part.size["hvp_batch"], 0)
    model = run.model
    params = [p for p in model.parameters() if p.requires_grad]
    with modes_restored(model):
        model.eval()
        grad = lambda: torch.autograd.grad(F.cross_entropy(model(x), y), params)
        with HessianOperator(model, F.cross_entropy, [(x, y)], "auto", graph_cache_mb=0) as op:
            g = torch.Generator().manual_seed(0)
            v = torch.randn(op.numel, generator=g).to(op.device)
            repeats = part.size["hvp_repeats"]
            part.result["hvp_over_grad"] = interleaved_ratio(lambda: op(v), grad, repeats)
            part.result.update(hvp_method=op.method, hvp_batch=len(y))


def lambda_max(part: Part, run) -> None:
    part.sync()
    t0 = time.perf_counter()
    tracker = run.parts.stateful()["curvature"].tracker
    out = tracker.measure(final=True)
    part.sync()
    part.result.update(
        lambda_max_s=time.perf_counter() - t0,
        lambda_max=out["lambda_max"],
        lambda_max_hvps=out["hessian_hvps"],
        lambda_max_presolve_hvps=out.get("hessian_presolve_hvps", 0),
        hessian_method=out.get("hessian_method"),
        hessian_converged=out.get("hessian_converged", True),
        hessian_num_samples=len(tracker._subset[1]),
    )


# ---------------------------------------------------------------------------- sharded
def sharded_part(part: Part) -> None:
    """trainer.strategy=fsdp and its companions (docs/running.md, sharded training):
    scripts/bench_fsdp.py's figures with 2 gloo processes on this machine's CPU cores (a quiet
    machine: the figures the project's loaded 2-core machine cannot show), and with 2 NCCL
    processes where there are 2 GPUs or more (then the peak GPU memory of FSDP over DDP too);
    activation checkpointing's peak memory, time and bit-exactness on the GPU; bf16 curvature's
    error against fp32 on the GPU."""
    import bench_fsdp

    quick = argparse.Namespace(quick=part.cpu)
    if part.cpu:  # the dry run: the code path, one sharded step of 2 processes
        from sam_runner import distributed

        step = lambda: distributed.launch(
            bench_fsdp._step_probe, ("fsdp", 1), 2, torch.device("cpu")
        )
        part.attempt("cpu_gloo", lambda: part.result.update(fsdp_step_s=step()[0]))
    else:
        part.attempt("cpu_gloo", lambda: part.result.update(cpu_gloo=bench_fsdp.run(quick)))
    part.attempt("activation_checkpointing", activation_checkpointing, part)
    part.attempt("bf16_curvature", bf16_curvature, part)
    if not part.cpu and torch.cuda.device_count() >= 2:
        cuda = torch.device("cuda")
        part.attempt("nccl", lambda: part.result.update(nccl=bench_fsdp.run(quick, cuda)))


def _gpt_step(part: Part, recompute: bool, steps: int):
    """(median seconds of a SAM step, peak allocated bytes or None, the parameters after) of
    a GPT with dropout, its blocks recomputed in the backward pass when ``recompute``."""
    import torch.nn.functional as F

    from sam_runner.models import GPT, blocks_of
    from sam_runner.optim import SAM
    from sam_runner.training import strategy

    big = not part.cpu
    torch.manual_seed(0)
    width, layers, context, batch = (512, 8, 256, 16) if big else (32, 2, 16, 2)
    model = GPT(256, context, n_layer=layers, n_head=8 if big else 2, n_embd=width, dropout=0.1)
    model = model.to(part.device)
    if recompute:
        for block in blocks_of(model):
            strategy.checkpoint_activations(block)
    opt = SAM(model.parameters(), torch.optim.SGD, rho=0.05, lr=0.01).bind(model=model)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(0, 256, (batch, context), generator=g).to(part.device)

    def closure():
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x[:, :-1]).flatten(0, 1), x[:, 1:].flatten())
        loss.backward()
        return loss.detach()

    if not part.cpu:
        torch.cuda.reset_peak_memory_stats()
    torch.manual_seed(2)  # the same dropout draws in both
    times = []
    for _ in range(steps):
        part.sync()
        t0 = time.perf_counter()
        opt.step(closure)
        part.sync()
        times.append(time.perf_counter() - t0)
    peak = None if part.cpu else torch.cuda.max_memory_allocated()
    return (
        statistics.median(times[1:] or times),
        peak,
        [p.detach().clone() for p in model.parameters()],
    )


def activation_checkpointing(part: Part) -> None:
    steps = 3 if part.cpu else 8
    plain_s, plain_peak, plain = _gpt_step(part, False, steps)
    ac_s, ac_peak, recomputed = _gpt_step(part, True, steps)
    part.result["activation_checkpointing"] = {
        "time_over_plain": ac_s / plain_s,
        "peak_memory_over_plain": None if plain_peak is None else ac_peak / plain_peak,
        "max_abs_param_diff": max(float((a - b).abs().max()) for a, b in zip(plain, recomputed)),
    }


def bf16_curvature(part: Part) -> None:
    """λ_max and Hutchinson's trace with metrics.hessian.precision=bf16 against fp32."""
    import torch.nn.functional as F

    from sam_runner.metrics.hvp import HessianOperator
    from sam_runner.metrics.solvers import hessian_eigenpairs, hessian_trace
    from sam_runner.models import GPT

    torch.manual_seed(0)
    model = GPT(256, 64, n_layer=2, n_head=2, n_embd=64).to(part.device).eval()
    g = torch.Generator().manual_seed(3)
    x = torch.randint(0, 256, (64 if not part.cpu else 4, 65), generator=g).to(part.device)
    batches = [(x[:, :-1], x[:, 1:])]

    def loss(out, y):
        return F.cross_entropy(out.flatten(0, 1), y.flatten())

    values = {}
    for precision in ("fp32", "bf16"):
        with HessianOperator(model, loss, batches, "double_backward", precision=precision) as op:
            eig = hessian_eigenpairs(model, None, batches, tol=1e-4, max_iter=60, operator=op)
            values[precision] = (float(eig.values[0]), float(hessian_trace(op, 20, seed=0)[0]))
    (l32, t32), (l16, t16) = values["fp32"], values["bf16"]
    part.result["bf16_curvature"] = {
        "lambda_max_fp32": l32,
        "lambda_max_rel_err": abs(l16 - l32) / abs(l32),
        "trace_rel_err": abs(t16 - t32) / abs(t32),
    }


# ---------------------------------------------------------------------------- main
def host_part(part: Part) -> None:
    from gpu_host import host_part as measure

    measure(part)


def estimates(part: Part, results: Path) -> None:
    from gpu_presets import preset_estimates

    part.result.update(preset_estimates(json.loads(results.read_text())))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part")
    ap.add_argument("--scratch", type=Path, required=True)
    ap.add_argument("--cpu", action="store_true", help="the dry run: no CUDA, tiny sizes")
    ap.add_argument("--results", type=Path, help="gpu_check.json so far (for estimates)")
    args = ap.parse_args(argv)
    part = Part(args.part, args.scratch, args.cpu)
    kind, _, model = args.part.partition(":")
    run = {
        "env": lambda: env(part, args.results),
        "data": lambda: data(part),
        "train": lambda: train_part(part, model),
        "compile": lambda: compile_part(part, model),
        "curvature": lambda: curvature_part(part, model),
        "models": lambda: models_part(part),
        "sharded": lambda: sharded_part(part),
        "host": lambda: host_part(part),
        "estimates": lambda: estimates(part, args.results),
    }[kind]
    torch.manual_seed(0)
    if args.cpu:  # a tiny model: one thread is faster, and the HVPs run as on a GPU (no pool)
        torch.set_num_threads(1)
    part.attempt(args.part, run)
    return 1 if part.errors else 0


if __name__ == "__main__":
    sys.exit(main())
