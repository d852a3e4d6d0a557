"""The GPU fast path's ``auto`` values: resolved once at setup (fp32, contiguous, eager on a CPU;
bf16, channels_last, cudnn.benchmark and compile on a CUDA GPU with bf16), recorded in
summary.json, explicit values as the opt-out, bad values one line."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY, compose, run_cli

from sam_runner.training.fast_path import FastPath, for_run, resolve, resolved_precision
from sam_runner.training.lengths import autocast_for
from sam_runner.training.run import Run

AUTO = ["trainer.precision=auto", "trainer.channels_last=auto",
        "trainer.cudnn_benchmark=auto", "trainer.compile=auto"]  # fmt: skip
EAGER_FP32 = FastPath("fp32", channels_last=False, cudnn_benchmark=False, compile=False)


def test_auto_on_a_cpu_is_fp32_contiguous_and_eager():
    t = compose(*AUTO).trainer
    assert resolve(t, "cpu", bf16_supported=True, convolutional=True, images=True) == EAGER_FP32
    conv = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3))
    assert for_run(t, torch.device("cpu"), conv, (3, 8, 8)) == EAGER_FP32
    assert resolved_precision("auto", "cpu") == "fp32"
    assert isinstance(autocast_for(torch.device("cpu"), "auto"), type(autocast_for("cpu", "fp32")))


def test_auto_on_a_cuda_gpu_is_the_whole_fast_path():
    t = compose(*AUTO).trainer
    conv_images = resolve(t, "cuda", bf16_supported=True, convolutional=True, images=True)
    assert conv_images == FastPath("bf16", channels_last=True, cudnn_benchmark=True, compile=True)
    # no bf16 on the GPU: fp32; no convolutions (a GPT, an MLP): contiguous
    older = resolve(t, "cuda", bf16_supported=False, convolutional=False, images=False)
    assert older == FastPath("fp32", channels_last=False, cudnn_benchmark=True, compile=True)


def test_the_defaults_and_the_explicit_values_are_the_opt_out_on_cuda():
    assert resolve(compose().trainer, "cuda", True, True, True) == EAGER_FP32
    opt_out = ["trainer.precision=fp32", "trainer.channels_last=false",
               "trainer.cudnn_benchmark=false", "trainer.compile=false"]  # fmt: skip
    assert resolve(compose(*opt_out).trainer, "cuda", True, True, True) == EAGER_FP32
    forced = ["trainer.precision=fp16", "trainer.compile=true", "trainer.channels_last=true"]
    fast = resolve(compose(*forced).trainer, "cpu", False, True, True)
    assert fast == FastPath("fp16", channels_last=False, cudnn_benchmark=False, compile=True)


def test_a_cpu_run_records_what_auto_resolved_to(tmp_path):
    torch.backends.cudnn.benchmark = True  # an earlier job's: the run sets it either way
    small = ["trainer.epochs=1", "dataset.num_samples=200", "trainer.progress=none"]
    code, _, err = run_cli([*small, *AUTO, "metrics=off", "model=cnn1d",
                            f"hydra.run.dir={tmp_path / 'r'}"])  # fmt: skip
    assert code == 0, err
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["fast_path"] == EAGER_FP32._asdict()
    assert summary["config"]["trainer.precision"] == "auto"  # the config as given
    assert not torch.backends.cudnn.benchmark


def test_compile_wires_the_compiled_forward_and_loss_at_setup(tmp_path):
    """Setup compiles lazily (nothing is traced before the first step): the model for evaluation
    and the training pass's forward and loss, and records compile=true."""
    cfg = compose(*TINY, "trainer.compile=true", "metrics=off", "model=mlp")
    run = Run(cfg, tmp_path / "r", [])
    run.setup()
    if run.fast.compile is False:  # no C++ compiler here: eager, recorded so
        pytest.skip("this machine cannot compile for the CPU")
    assert hasattr(run.net, "_orig_mod")
    forward_loss = run.loop.forward_loss
    assert forward_loss._torchdynamo_orig_callable.net is run.model  # one process: no wrapper


@pytest.mark.parametrize(
    ("key", "value", "accepted"),
    [("precision", "fp8", "auto, fp32, bf16, fp16"),
     ("cudnn_benchmark", "sometimes", "auto, true or false"),
     ("compile", "fast", "auto, true or false")],
)  # fmt: skip
def test_a_bad_fast_path_value_is_one_line(key, value, accepted, tmp_path, capsys):
    code, _, err = run_cli([f"trainer.{key}={value}", f"hydra.run.dir={tmp_path / 'r'}"], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert f"trainer.{key}={value!r}" in err and accepted in err
    assert not (tmp_path / "r").exists()
