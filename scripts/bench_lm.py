"""Bench section ``lm``: the trainer's GPT step against a bare nanoGPT-style loop.

``gpt_step_over_bare_loop``: a block of training steps of ``dataset=text model=gpt`` with AdamW
and no perturbation (``EpochLoop.train_epoch`` of the real trainer: its random windows, the
optimizer engine's closure, the scheduler, the statistics) over as many steps of a bare loop in
the same process on a copy of the same model: draw a batch of windows the nanoGPT way (numpy
offsets, a gather), forward, cross-entropy over the flattened logits, ``zero_grad``, backward,
``AdamW.step``. ``sam_adamw_over_adamw_step``: the trainer's SAM-AdamW block over its AdamW one.
Model: the lm_sam_mini one (2 layers, 4 heads, 64 channels, context 64, batch 32, the built-in
corpus), one CPU thread; blocks alternated, the median ratio over rounds.
"""

from __future__ import annotations

import copy
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from benchutil import interleaved_ratio, single_threaded

STEPS = 10
MODEL = [
    "dataset=text",
    "model=gpt",
    "model.n_layer=2",
    "model.n_head=4",
    "model.n_embd=64",
    "dataset.block_size=64",
    "dataset.batch_size=32",
    f"dataset.steps_per_epoch={STEPS}",
    "base_optimizer=adamw",
    "scheduler=constant",
    "trainer.steps=100000000",
    "metrics.hessian.enabled=false",
    "trainer.progress=none",
]


def _trainer_block(optimizer: str, folder: str):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from conftest import compose  # real Hydra composition of the config tree

    from sam_runner.train import Run

    run = Run(compose(*MODEL, f"optimizer={optimizer}"), Path(folder), [])
    run.setup()
    run.resume()
    return run, run.loop.train_epoch


def bare_adamw_block(model, ids, lr, t=64, b=32):
    """A bare loop of STEPS AdamW steps on random windows of ``ids`` (a copy of ``model``): the
    reference the trainer's step is priced against (here and in bench_hf.py)."""
    model = copy.deepcopy(model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), weight_decay=0.05)
    rng = np.random.default_rng(0)

    def block():
        for _ in range(STEPS):
            ix = rng.integers(0, len(ids) - t, b)
            w = torch.from_numpy(ids[ix[:, None] + np.arange(t + 1)].astype(np.int64))
            x, y = w[:, :-1], w[:, 1:]
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.size(-1)), y.reshape(-1)
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

    return block


@single_threaded
def run(args) -> dict:
    repeats = 3 if args.quick else max(args.repeats, 7)
    with tempfile.TemporaryDirectory() as d1, tempfile.TemporaryDirectory() as d2:
        adamw, ours = _trainer_block("base", d1)
        _, sam = _trainer_block("sam", d2)
        lr = float(adamw.cfg.base_optimizer.lr)
        bare = bare_adamw_block(adamw.model, adamw.data.train.ids, lr)
        return {
            "gpt_step_over_bare_loop": interleaved_ratio(ours, bare, repeats),
            "sam_adamw_over_adamw_step": interleaved_ratio(sam, ours, repeats),
        }
