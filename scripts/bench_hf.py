"""Bench section ``hf`` (python scripts/bench.py --only hf, or python scripts/bench_hf.py): the
runner on a tiny Hugging Face causal LM (model=hf, a Llama-architecture model built from its
config: 2 layers, 64 wide, 4 heads, 2 key-value heads, the 256-byte vocabulary; context 64,
batch 32, the built-in corpus, one CPU thread).

hf_step_over_bare_loop        a block of the trainer's steps (``EpochLoop.train_epoch``: random
                              windows, the engine's closure, scheduler, statistics) with AdamW and
                              no perturbation, over as many steps of a bare loop on a copy of the
                              same model (numpy offsets, forward, cross-entropy, zero_grad,
                              backward, AdamW.step); target ≤ 1.05
hf_sam_over_base_step         the trainer's SAM-AdamW block over its AdamW block; target ≤ 2.02
hf_sam_peak_memory_over_base_plus_params
                              the peak memory two SAM-AdamW steps add from a fresh optimizer
                              (our SAM, LBFGS-convention closure; its state included) over that
                              of two base-AdamW steps plus one copy of the trainable parameters
                              (a 4-layer, 256-wide model of the same kind, batch 8; measured
                              in a fresh process each, as bench_memory.py: the peak of
                              torch's own allocations, CUDA's or the CPU profiler's);
                              target ≤ 1.0
own_lora_over_peft_step       a training step (forward, backward, AdamW) of the runner's GPT
                              (model=gpt, 2 layers, 64 wide) with our LoRA layers (rank 8 on every
                              Linear of the blocks) over the same with peft's LoRA on the same
                              layers: the measured comparison behind keeping our layers for the
                              runner's own models (docs/fine_tuning.md)
"""

from __future__ import annotations

import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_lm import bare_adamw_block  # noqa: E402
from benchutil import interleaved_ratio, median_time, single_threaded  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
STEPS = 10
TINY = (
    "model.config={model_type: llama, hidden_size: 64, intermediate_size: 128, "
    "num_hidden_layers: 2, num_attention_heads: 4, num_key_value_heads: 2, "
    "max_position_embeddings: 64}"
)
MODEL = [
    "dataset=text",
    "model=hf",
    TINY,
    "dataset.block_size=64",
    "dataset.batch_size=32",
    f"dataset.steps_per_epoch={STEPS}",
    "base_optimizer=adamw",
    "scheduler=constant",
    "trainer.steps=100000000",
    "metrics.hessian.enabled=false",
    "trainer.progress=none",
]


def _compose(*overrides):
    sys.path.insert(0, str(ROOT / "tests"))
    from conftest import compose  # real Hydra composition of the config tree

    return compose(*overrides)


def _trainer_block(optimizer: str, folder: str):
    from sam_runner.train import Run

    run = Run(_compose(*MODEL, f"optimizer={optimizer}"), Path(folder), [])
    run.setup()
    run.resume()
    return run, run.loop.train_epoch


# ---------------------------------------------------------------- peak memory (fresh processes)
MEMORY_MODEL = TINY.replace("hidden_size: 64, intermediate_size: 128", "hidden_size: 256, "
                            "intermediate_size: 512").replace("num_hidden_layers: 2",
                                                               "num_hidden_layers: 4")  # fmt: skip


def _memory_child(kind: str) -> dict:
    sys.path.insert(0, str(ROOT / "scripts"))
    from bench_memory import peak_added

    from sam_runner.models import build_model
    from sam_runner.optim import SAM
    from sam_runner.optim.base import Base

    torch.manual_seed(0)
    model = build_model(_compose("dataset=text", "model=hf", MEMORY_MODEL).model, (64,), 256)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    cls = SAM if kind == "sam" else Base
    opt = cls(params, torch.optim.AdamW, lr=1e-3, **({"rho": 0.05} if kind == "sam" else {}))
    opt.bind(model=model)
    x = torch.randint(0, 256, (8, 64), device=device)
    y = torch.randint(0, 256, (8, 64), device=device)

    def step():
        def closure():
            opt.zero_grad(set_to_none=True)
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
            loss.backward()
            return loss

        opt.step(closure)

    def two_steps():  # from a fresh optimizer: its state (AdamW's, SAM's θ copy) counts
        step()
        step()

    return {
        "bytes": peak_added(two_steps),
        "param_bytes": sum(p.numel() * p.element_size() for p in params),
    }


def _in_child(kind: str) -> dict:
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = dict(os.environ, PYTHONPATH=path, OMP_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, __file__, kind], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- our LoRA against peft's
def _lora_steps():
    import peft

    from sam_runner.adapters.lora import add_lora
    from sam_runner.models import GPT

    torch.manual_seed(0)
    base = GPT(256, 64, n_layer=2, n_head=4, n_embd=64)
    names = [n for n, m in base.named_modules() if isinstance(m, torch.nn.Linear)]
    ours = copy.deepcopy(base).requires_grad_(False)
    modules = dict(ours.named_modules())
    for n in names:
        add_lora(modules[n], 8, 16)
    theirs = peft.get_peft_model(
        copy.deepcopy(base), peft.LoraConfig(r=8, lora_alpha=16, target_modules=names)
    )
    x = torch.randint(0, 256, (32, 64))
    y = torch.randint(0, 256, (32, 64))

    def stepper(model):
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)

        def step():
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), y.reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        return step

    return stepper(ours), stepper(theirs)


@single_threaded
def run(args) -> dict:
    repeats = 3 if args.quick else max(args.repeats, 7)
    out = {}
    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
        adamw, ours = _trainer_block("base", d1)
        _, sam = _trainer_block("sam", d2)
        lr = float(adamw.cfg.base_optimizer.lr)
        bare = bare_adamw_block(adamw.model, adamw.data.train.ids, lr)
        out["hf_step_over_bare_loop"] = interleaved_ratio(ours, bare, repeats)
        out["hf_sam_over_base_step"] = interleaved_ratio(sam, ours, repeats)
        out["hf_base_step_ms"] = 1000 * median_time(ours, repeats) / STEPS
    peak = {"sam": [], "base": []}
    for _ in range(1 if args.quick else 3):
        for kind in peak:
            peak[kind].append(_in_child(kind))
    out["hf_sam_peak_memory_over_base_plus_params"] = statistics.median(
        s["bytes"] / (b["bytes"] + b["param_bytes"]) for s, b in zip(peak["sam"], peak["base"])
    )
    out["hf_sam_peak_mb"] = statistics.median(s["bytes"] for s in peak["sam"]) / 2**20
    out["hf_base_peak_mb"] = statistics.median(b["bytes"] for b in peak["base"]) / 2**20
    out["hf_memory_param_mb"] = peak["sam"][0]["param_bytes"] / 2**20
    own, theirs = _lora_steps()
    out["own_lora_over_peft_step"] = interleaved_ratio(own, theirs, repeats, inner=3)
    return out


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("sam", "base"):
        print(json.dumps(_memory_child(sys.argv[1])))
    else:
        import argparse

        ap = argparse.ArgumentParser(description=__doc__)
        ap.add_argument("--repeats", type=int, default=7)
        ap.add_argument("--quick", action="store_true")
        for k, v in run(ap.parse_args()).items():
            print(f"{k:<42} {v:.4g}")
