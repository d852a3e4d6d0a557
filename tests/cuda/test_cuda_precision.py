"""The optimizer on a GPU where its path differs from the CPU's: fp16 under the CUDA GradScaler
(a skipped step leaves no trace, as the CPU float64 test demands), bf16 autocast, channels_last
weights (the same ε as contiguous ones) and torch.compile (the same steps as eager, BatchNorm
statistics kept to the first pass). Whole runs in every precision close the file."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import compose
from omegaconf import OmegaConf
from torch import nn

from sam_runner.models import build_model
from sam_runner.optim import VARIANTS
from sam_runner.optim.build import parameter_groups
from sam_runner.train import train

pytestmark = pytest.mark.cuda

DEV = "cuda"
PERTURBING = sorted(n for n in VARIANTS if VARIANTS[n].passes > 1)
KW = {"precond_sam": dict(refresh_every=2), "sam_sps": dict(momentum=0.0)}


@pytest.fixture
def exact_fp32():
    """Convolutions and matrix products in full float32 (cuDNN uses TF32 by default)."""
    old = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = old


def _optimizer(name, model, **kw):
    kw = {"lr": 0.05, "momentum": 0.9, "total_steps": 100, **KW.get(name, {}), **kw}
    return VARIANTS[name](parameter_groups(model), torch.optim.SGD, **kw).bind(model=model)


def _cnn(seed=0):
    torch.manual_seed(seed)
    return build_model(OmegaConf.create({"arch": "cnn", "channels": 16}), (3, 32, 32), 10).to(DEV)


def _batch(n=32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 32, 32, generator=g).to(DEV), torch.randint(0, 10, (n,), generator=g)


def _closure(opt, model, x, y, autocast=None, scaler=None, poison=None):
    y = y.to(x.device)

    def closure():
        opt.zero_grad(set_to_none=True)
        with autocast or torch.autocast(DEV, enabled=False):
            out = model(x)
        loss = opt.reduce_loss(F.cross_entropy(out.float(), y, reduction="none"), out, y)
        if poison is not None and poison(opt):
            loss = loss * float("inf")
        (scaler.scale(loss) if scaler is not None else loss).backward()
        return loss.detach()

    return closure


def _flat(tensors):
    return torch.cat([t.detach().reshape(-1) for t in tensors])


# ------------------------------------------------------------------ fp16: the CUDA GradScaler
def _fp16_run(name, poison_at, steps=4):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 5), nn.ReLU(), nn.Linear(5, 3))
    model = model.to(DEV)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 6, generator=g).to(DEV), torch.randint(0, 3, (16,), generator=g)
    scaler = torch.amp.GradScaler(DEV, init_scale=2.0**8)
    opt = _optimizer(name, model).bind(grad_scaler=scaler)
    step = {"k": 0}
    last_pass = lambda o: step["k"] == poison_at and o.pass_index == o.passes - 1
    closure = _closure(opt, model, x, y, scaler=scaler, poison=last_pass)
    trajectory, scales = [], []
    for k in range(1, steps + 1):
        step["k"] = k
        before = _flat(model.parameters())
        opt.step(closure)
        scaler.update()
        scales.append(scaler.get_scale())
        if k == poison_at:
            assert torch.equal(_flat(model.parameters()), before)  # skipped, θ restored
        else:
            trajectory.append(_flat(model.parameters()))
    return opt, trajectory, scales


@pytest.mark.parametrize("name", PERTURBING)
def test_fp16_step_skipped_for_the_perturbed_pass_alone_leaves_no_trace(name):
    """As tests/optim/test_fp16_skip.py on the CPU: the found-inf flag lives on the GPU, the
    engine hands it to the CUDA scaler, which halves its scale; float32 is exact under powers
    of two, so the trajectory after the skip is the twin's that never took that step."""
    skipped, with_skip, scales = _fp16_run(name, poison_at=2)
    twin, without, _ = _fp16_run(name, poison_at=None, steps=3)
    assert scales[:2] == [2.0**8, 2.0**7]
    for a, b in zip(with_skip, without, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    own = lambda o: {k: v for k, v in o.variant_state().items() if k != "step_count"}
    for key, value in own(skipped).items():
        other = own(twin)[key]
        if torch.is_tensor(value):
            assert value.device.type == DEV, key
            torch.testing.assert_close(value, other, rtol=1e-6, atol=1e-7, msg=key)
        else:
            assert value == other, key


# ------------------------------------------------------------------ bf16, channels_last
def _eps_after_one_step(name, model, x, y, autocast=None):
    opt = _optimizer(name, model)
    seen, perturb = {}, opt.perturb_

    def recording(params, pgrads):
        # ε as applied: SAM builds it in the gradients' storage, which the next pass reuses
        theta = [p.detach().clone() for p in params]
        perturb(params, pgrads)
        seen["eps"] = [p.detach() - t for p, t in zip(params, theta)]

    opt.perturb_ = recording
    opt.step(_closure(opt, model, x, y, autocast=autocast))
    return _flat(seen["eps"]), _flat(model.parameters())


@pytest.mark.usefixtures("exact_fp32")
def test_bf16_autocast_gives_the_fp32_perturbation_to_bf16_precision():
    x, y = _batch()
    eps32, _ = _eps_after_one_step("sam", _cnn(), x, y)
    eps16, _ = _eps_after_one_step("sam", _cnn(), x, y, torch.autocast(DEV, dtype=torch.bfloat16))
    assert eps16.dtype == torch.float32  # the parameters, and so ε, stay float32
    assert float(eps16.norm()) == pytest.approx(0.05, rel=1e-5)  # ‖ε‖ = ρ
    assert float((eps16 - eps32).norm() / eps32.norm()) < 5e-2


@pytest.mark.usefixtures("exact_fp32")
@pytest.mark.parametrize("name", ["sam", "gear_sam", "spectral_sam"])
def test_channels_last_gives_the_same_perturbation_and_step(name):
    """The runner turns channels_last on for image models on a GPU: ε is built from gradients
    in that memory format (spectral SAM writes its conv kernels' ε through a copy there)."""
    x, y = _batch()
    plain = _cnn()
    last = copy.deepcopy(plain).to(memory_format=torch.channels_last)
    assert last.stage1[0].weight.is_contiguous(memory_format=torch.channels_last)
    eps_a, theta_a = _eps_after_one_step(name, plain, x, y)
    eps_b, theta_b = _eps_after_one_step(name, last, x, y)
    torch.testing.assert_close(eps_b, eps_a, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(theta_b, theta_a, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------ torch.compile
@pytest.mark.usefixtures("exact_fp32")
def test_compiled_model_takes_the_eager_steps_and_keeps_batchnorm_to_the_first_pass():
    """The second pass freezes BatchNorm's running statistics by a module flag: the compiled
    model must see it (a guard, a recompile) or its statistics would take both passes."""
    x, y = _batch()
    eager, compiled_model = _cnn(), _cnn()
    compiled = torch.compile(compiled_model)
    states = []
    for net, model in ((eager, eager), (compiled, compiled_model)):
        opt = _optimizer("sam", model).bind(model=net)
        for _ in range(3):
            opt.step(_closure(opt, net, x, y))
        states.append(model.state_dict())
    start = _cnn().state_dict()
    for key, value in states[0].items():
        if key.endswith("running_mean"):
            assert not torch.equal(value, start[key]), key  # the first pass updated it
        torch.testing.assert_close(states[1][key], value, rtol=1e-4, atol=1e-5, msg=key)


# ------------------------------------------------------------------ whole runs
@pytest.mark.parametrize(
    "precision, channels_last", [("fp32", False), ("bf16", True), ("fp16", False)]
)
def test_a_run_completes_on_the_gpu(precision, channels_last, tmp_path):
    cfg = compose(
        "dataset=digits",
        "model=cnn",
        "trainer.epochs=2",
        "trainer.device=cuda",
        f"trainer.precision={precision}",
        f"trainer.channels_last={str(channels_last).lower()}",
        "trainer.progress=none",
        "metrics.hessian.num_samples=256",
        "metrics.hessian.max_iter=10",
    )
    summary = train(cfg, tmp_path, ["x"])
    assert summary["status"] == "completed", summary.get("error")
    assert summary["device"].startswith("cuda")
    assert 0.0 <= summary["test_acc"] <= 1.0 and summary["lambda_max"] > 0
