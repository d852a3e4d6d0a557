"""The shared two-pass engine, checked on every variant: the closure contract, BatchNorm
statistics, state_dict round trips, gradient accumulation, ``interval``, bf16 and fp16
(GradScaler on the CPU), the ρ schedules, weight decay in ε, bad arguments, grad_norm_max."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from optim_helpers import X, Y, bn_net, build, closure_for, flat, mlp, ref_grad

from sam_runner.optim import SAM, VARIANTS
from sam_runner.optim.engine import FOLD_NORMS

NAMES = sorted(VARIANTS)
PERTURBING = [n for n in NAMES if VARIANTS[n].passes > 1]


@pytest.mark.parametrize("name", NAMES)
def test_closure_called_once_per_pass_and_theta_restored(name):
    model = mlp()
    kw = dict(gamma_max=1e-300, weight_decay=0.0) if name == "sam_sps" else {}
    opt = build(name, model, lr=0.0, **kw)  # a zero step: θ must come back bit for bit
    if name == "sampa":  # its first step has no ∇f(y) yet: both passes at θ, as in its code
        opt.step(closure_for(opt, model))
    theta, calls, seen = flat(model.parameters()), [], {}
    opt.step(closure_for(opt, model, calls=calls, record=seen))
    assert calls == list(range(VARIANTS[name].passes))
    assert torch.equal(flat(model.parameters()), theta)
    if len(calls) > 1:
        # the descent pass ran at a perturbed point (SAMPa's at x̃ is its first)
        assert not torch.equal(seen[0 if name == "sampa" else len(calls) - 1], theta)


def test_step_needs_a_closure():
    opt = build("sam", mlp())
    with pytest.raises(ValueError, match="closure"):
        opt.step()


@pytest.mark.parametrize("name", NAMES)
def test_batchnorm_statistics_are_those_of_the_first_pass(name):
    model, reference = bn_net(), bn_net()
    # bSAM's first pass is at a noisy θ (Flat-LoRA's one pass at a noisy W): without noise it is
    # at θ, as this test's reference
    noiseless = {"bsam": dict(num_data=None), "flat_lora": dict(rho=0.0)}.get(name, {})
    opt = build(name, model, lr=0.1, **noiseless)
    opt.step(closure_for(opt, model))
    reference.train()
    reference(X)  # the first pass alone
    for (k, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        if "running" in k or "num_batches" in k:
            assert torch.equal(a, b), k


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_round_trip_continues_the_exact_trajectory(name):
    momentum = 0.0 if name == "sam_sps" else 0.9
    kw = dict(refresh_every=2) if name == "precond_sam" else {}
    model = bn_net()
    opt = build(name, model, lr=0.05, momentum=momentum, **kw)
    for _ in range(3):
        opt.step(closure_for(opt, model))
    saved_model, saved_opt = copy.deepcopy(model.state_dict()), copy.deepcopy(opt.state_dict())
    for _ in range(3):
        opt.step(closure_for(opt, model))
    resumed = bn_net(seed=7)
    resumed.load_state_dict(saved_model)
    opt2 = build(name, resumed, lr=0.05, momentum=momentum, **kw)
    opt2.load_state_dict(saved_opt)
    for _ in range(3):
        opt2.step(closure_for(opt2, resumed))
    assert torch.equal(flat(resumed.parameters()), flat(model.parameters()))
    assert opt2.log_values().keys() == opt.log_values().keys()


@pytest.mark.parametrize("name", NAMES)
def test_accumulating_four_micro_batches_equals_one_batch(name):
    a, b = mlp(), mlp()
    big, small = build(name, a, lr=0.1, momentum=0.0), build(name, b, lr=0.1, momentum=0.0)
    for _ in range(3):
        big.step(closure_for(big, a, micro=1))
        small.step(closure_for(small, b, micro=4))
    torch.testing.assert_close(flat(b.parameters()), flat(a.parameters()), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", PERTURBING)
def test_interval_perturbs_every_kth_step_only(name):
    model = mlp()
    opt = build(name, model, lr=0.05, interval=3)
    per_step = []
    for _ in range(6):
        calls = []
        opt.step(closure_for(opt, model, calls=calls))
        per_step.append(len(calls))
    # the perturbed steps take the variant's own first steps (LookSAM: refresh, then reuse)
    own = []
    other = mlp()
    plain = build(name, other, lr=0.05)
    for _ in range(2):
        calls = []
        plain.step(closure_for(plain, other, calls=calls))
        own.append(len(calls))
    assert per_step == [own[0], 1, 1, own[1], 1, 1] and own[0] == VARIANTS[name].passes


def test_a_plain_interval_step_is_the_base_step():
    a = mlp()
    sam = build("sam", a, lr=0.1, interval=2)
    sam.step(closure_for(sam, a))
    theta = flat(a.parameters())
    sam.step(closure_for(sam, a))  # step 2: no perturbation
    _, g = ref_grad(a, theta)
    torch.testing.assert_close(flat(a.parameters()), theta - 0.1 * g, rtol=1e-12, atol=1e-15)


def _float_model(seed=0):
    return bn_net(seed).float()


@pytest.mark.parametrize("name", NAMES)
def test_bf16_autocast_runs(name):
    model = _float_model()
    x, y = X.float(), Y
    opt = build(name, model, lr=0.05)

    def closure():
        opt.zero_grad(set_to_none=True)
        xs, ys = opt.select_rows(x, y)  # all rows, except in ESAM's descent pass
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(xs)
        loss = opt.reduce_loss(F.cross_entropy(out.float(), ys, reduction="none"), out, ys)
        loss.backward()
        return loss.detach()

    before = flat(model.parameters())
    for _ in range(2):
        loss = opt.step(closure)
    after = flat(model.parameters())
    assert (
        math.isfinite(loss.item())
        and torch.isfinite(after).all()
        and not torch.equal(after, before)
    )


@pytest.mark.parametrize("name", NAMES)
def test_fp16_grad_scaler_skips_an_overflowing_step_and_restores_theta(name):
    model = _float_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    opt = build(name, model, lr=0.05, **(dict(refresh_every=1) if name == "precond_sam" else {}))
    opt.bind(grad_scaler=scaler)
    poison = {"on": False}

    def closure():
        opt.zero_grad(set_to_none=True)
        xs, ys = opt.select_rows(X.float(), Y)
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(xs)
        loss = opt.reduce_loss(F.cross_entropy(out.float(), ys, reduction="none"), out, ys)
        if poison["on"]:
            loss = loss * float("inf")  # every gradient becomes inf/NaN
        scaler.scale(loss).backward()
        return loss.detach()

    opt.step(closure)
    scaler.update()
    theta, scale = flat(model.parameters()), scaler.get_scale()
    poison["on"] = True
    opt.step(closure)
    scaler.update()
    assert torch.equal(flat(model.parameters()), theta)  # skipped, θ restored exactly
    assert scaler.get_scale() < scale  # the scale backed off
    poison["on"] = False
    opt.step(closure)
    scaler.update()
    after = flat(model.parameters())
    # adaptive state not poisoned
    assert torch.isfinite(after).all() and not torch.equal(after, theta)
    assert all(math.isfinite(v) for v in opt.log_values().values())


def test_fp16_unscales_before_the_norm():
    """With a scaler, ε is ρ g / ‖g‖ of the unscaled gradient (‖ε‖ = ρ whatever the scale)."""
    model = mlp().float()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    opt = build("sam", model, lr=0.0, rho=0.05).bind(grad_scaler=scaler)
    seen = {}
    theta = flat(model.parameters())

    def closure():
        seen[opt.pass_index] = flat(model.parameters())
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(X.float()), Y)
        scaler.scale(loss).backward()
        return loss.detach()

    opt.step(closure)
    scaler.update()
    assert abs((seen[1] - theta).norm().item() - 0.05) < 1e-6


def test_rho_schedules():
    model = mlp()
    lr_sched = build("sam", model, lr=0.2, rho=0.1, rho_schedule="lr")
    for g in lr_sched.param_groups:
        g["lr"] = 0.05
    assert lr_sched.current_rho == pytest.approx(0.1 * 0.05 / 0.2)


def test_cosine_rho_schedule_applies_rho_on_the_first_step():
    """Step k (1-based) of T uses ρ · ½(1 + cos(π (k−1)/T)): the ‖ε‖ actually applied, which
    current_rho reports after the step."""
    model = mlp()
    cos = SAM(
        model.parameters(), torch.optim.SGD, lr=0.1, rho=0.1, rho_schedule="cosine", total_steps=4
    )
    applied, reported = [], []
    for _ in range(4):
        seen = {}
        theta = flat(model.parameters())
        cos.step(closure_for(cos, model, record=seen))
        applied.append((seen[1] - theta).norm().item())
        reported.append(cos.current_rho)
    # 0.1, 0.0854, 0.05, 0.0146
    want = [0.1 * 0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(4)]
    assert applied == pytest.approx(want, rel=1e-9)
    assert reported == pytest.approx(want, rel=1e-12)


def test_perturb_with_weight_decay():
    model, wd = mlp(), 0.1
    opt = build("sam", model, lr=0.0, rho=0.05, weight_decay=wd, perturb_with_weight_decay=True)
    theta, seen = flat(model.parameters()), {}
    opt.step(closure_for(opt, model, record=seen))
    _, g = ref_grad(model, theta)
    p = g + wd * theta
    torch.testing.assert_close(seen[1] - theta, 0.05 * p / p.norm(), rtol=1e-9, atol=1e-12)
    plain = build("sam", mlp(), lr=0.0, rho=0.05, weight_decay=wd)  # default: weight decay not in ε
    seen = {}
    plain.step(closure_for(plain, plain.model, record=seen))
    torch.testing.assert_close(seen[1] - theta, 0.05 * g / g.norm(), rtol=1e-9, atol=1e-12)


def test_grad_norm_max_is_the_running_max_and_resets_on_log():
    model = mlp()
    opt = build("sam", model, lr=0.5)
    norms = []
    for _ in range(4):
        norms.append(ref_grad(model, flat(model.parameters()))[1].norm().item())
        opt.step(closure_for(opt, model))
    assert opt.log_values()["grad_norm_max"] == pytest.approx(max(norms), rel=1e-9)
    assert "grad_norm_max" not in opt.log_values()  # reset
    opt.step(closure_for(opt, model))
    assert "grad_norm_max" in opt.log_values()


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(rho=-1.0), "rho must be"),
        (dict(rho=float("nan")), "rho must be"),
        (dict(rho_schedule="linear"), "rho_schedule must be one of"),
        (dict(interval=0), "interval must be"),
        (dict(rho_schedule="cosine", total_steps=None), "total_steps"),
    ],
)
def test_bad_engine_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SAM(mlp().parameters(), torch.optim.SGD, lr=0.1, **kwargs)


def test_base_optimizer_must_be_a_class():
    with pytest.raises(ValueError, match="optimizer class"):
        SAM(mlp().parameters(), torch.optim.SGD(mlp().parameters(), lr=0.1), lr=0.1)


@pytest.mark.parametrize(
    "name, kwargs, message",
    [
        ("asam", dict(eta=-1.0), "eta"),
        ("gear_sam", dict(beta=1.0), "beta"),
        ("gear_sam", dict(blocks="module"), "blocks must be one of"),
        ("tlc_sam", dict(rho=0.9), r"rho=0.9 must lie in \[rho_min, rho_max\]"),
        ("tlc_sam", dict(rho_min=0.5, rho_max=0.1), "rho_min <= rho_max"),
        ("tlc_sam", dict(rho_schedule="lr"), "constant"),
        ("le_sam", dict(sigma=-0.1), "sigma"),
        ("le_sam", dict(sigma_schedule="step"), "sigma_schedule"),
        ("eisam", dict(predict_lr=-1.0), "predict_lr"),
        ("csam", dict(gamma=-1.0), "gamma"),
        ("spectral_sam", dict(rho_spectral=-1.0), "rho_spectral"),
        ("sam_sps", dict(lam=2.0), "lam"),
        ("sam_sps", dict(gamma_max=0.0), "gamma_max"),
        ("precond_sam", dict(refresh_every=0), "refresh_every"),
        ("precond_sam", dict(beta=1.5), "beta"),
        ("gsam", dict(alpha=-0.1), "alpha"),
    ],
)
def test_bad_variant_arguments(name, kwargs, message):
    with pytest.raises(ValueError, match=message):
        build(name, mlp(), **kwargs)


def test_unknown_keyword_is_rejected():
    with pytest.raises(TypeError):
        build("sam", mlp(), beta=0.9)  # not SAM's (nor SGD's) keyword


def test_dot_over_tensor_lists_is_exact_to_float32_rounding():
    """⟨a, b⟩ over large, nearly orthogonal float32 lists (GSAM, TLC-SAM and SAM-SPS steer on it):
    within float32 rounding of the float64 value; a polarization identity would lose it."""
    g = torch.Generator().manual_seed(0)
    a = [torch.randn(1000, 1000, generator=g), torch.randn(3, 3, generator=g)]
    b = [torch.randn(1000, 1000, generator=g), torch.randn(3, 3, generator=g)]
    want = sum(float((x.double() * y.double()).sum()) for x, y in zip(a, b))
    opt = SAM([torch.zeros(1, requires_grad=True)], torch.optim.SGD, lr=0.1)
    assert float(opt.dot(a, b)) == pytest.approx(want, rel=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_variant_state_read_onto_the_cpu_moves_to_the_parameters_device(name, tmp_path):
    """Checkpoints load with map_location="cpu"; a GPU run's next step must not mix devices
    (GEAR-SAM's block energies stayed on the CPU and its first resumed step failed). The meta
    device stands in for the GPU (same dispatch checks, no data); tests/cuda has the real one."""
    model = mlp()
    opt = build(name, model)
    for _ in range(2):
        opt.step(closure_for(opt, model))
    torch.save(opt.state_dict(), tmp_path / "opt.pt")
    on_meta = mlp().to("meta")
    resumed = build(name, on_meta)
    resumed.load_state_dict(torch.load(tmp_path / "opt.pt", map_location="cpu", weights_only=True))
    state = resumed.variant_state()
    assert {v.device.type for v in state.values() if torch.is_tensor(v)} <= {"meta"}
    x, y = X.to("meta"), Y.to("meta")
    resumed.step(closure_for(resumed, on_meta, x, y))  # GEAR-SAM raised here
    assert {v.device.type for v in resumed.variant_state().values() if torch.is_tensor(v)} <= {
        "meta"
    }


@pytest.mark.parametrize(
    "name, kw, want",
    [
        ("base", {}, 1.0),
        ("sam", {}, 2.0),
        ("eisam", {}, 3.0),
        ("look_sam", dict(k=5), (2 + 4 * 1) / 5),  # a refresh, then four one-pass steps
        # first pass, a forward without gradients (1/3), the descent on ⌊γB⌋ = 8 of 16 rows
        ("esam", dict(gamma=0.5), 1 + 1 / 3 + 8 / 16),
        ("esam", dict(gamma=0.5, faithful=True), 1 + 1 / 3 + 7 / 16),  # the strict rule: 7
        ("esam", dict(gamma=1.0), 2.0),
    ],
)
def test_grad_evals_per_step_is_the_counted_passes_exactly(name, kw, want):
    model = mlp()
    opt = build(name, model, lr=0.05, **kw)
    for _ in range(10):
        opt.step(closure_for(opt, model))
    assert opt.summary_values()["grad_evals_per_step"] == pytest.approx(want, rel=1e-14)


def test_buffers_are_made_only_by_the_variants_that_use_them():
    """base holds no θ nor ε buffer, SAM θ alone (ε is built in the gradients); a variant that
    writes ε into its buffers (ESAM) holds both."""
    held = {}
    for name in ("base", "sam", "esam"):
        model = mlp()
        opt = build(name, model, lr=0.1)
        for _ in range(2):
            opt.step(closure_for(opt, model))
        held[name] = {k for k in ("theta", "eps") if k in opt._cache}
    assert held == {"base": set(), "sam": {"theta"}, "esam": {"theta", "eps"}}


def test_the_first_pass_gradients_are_let_go_before_the_second_pass():
    """When the second pass's closure sets the gradients to None, nothing holds the first pass's
    any more: its backward does not allocate beside them."""
    import weakref

    model = mlp()
    opt = build("sam", model, lr=0.1)
    first, alive = [], []

    def closure():
        if first:  # the second pass, its gradients just let go
            opt.zero_grad(set_to_none=True)
            alive.append(sum(r() is not None for r in first))
        else:
            opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(X), Y)
        loss.backward()
        if not first:
            first.extend(weakref.ref(p.grad) for p in model.parameters())
        return loss

    opt.step(closure)
    assert alive == [0] and len(first) == len(list(model.parameters()))


def test_grad_norm_max_folds_every_step_s_norm_and_leaves_out_non_finite_ones():
    opt = build("base", mlp())
    norms = [float(n) for n in torch.rand(150, generator=torch.Generator().manual_seed(0)) * 5]
    norms[3], norms[100] = float("inf"), float("nan")  # found-inf fp16 steps
    opt.global_norm = lambda grads: torch.tensor(grads[0])  # the norm each step saw
    for i, n in enumerate(norms):  # more than FOLD_NORMS steps: folded on the way and when read
        opt._track_grad_norm([n])
        if i == 70:
            state = opt.state_dict()  # a checkpoint within the steps: the max so far
    finite = [n for n in norms if math.isfinite(n)]
    assert float(state["grad_norm_max"]) == max(finite[:70])  # steps 0-70, the inf left out
    assert opt.log_values() == {"grad_norm_max": torch.tensor(max(finite)).item()}
    assert opt.log_values() == {}  # reset, nothing since


def test_a_plain_steps_grad_norm_max_is_every_steps_global_norm_max_bit_for_bit():
    """On the CPU a step that perturbs not keeps its per-tensor norms alone; folded (every
    FOLD_NORMS steps and when read) they give each step's ``global_norm`` bits, whether the
    parameters with a gradient stay the same or change within the fold (a layer frozen)."""
    model = mlp(width=40).float()
    opt = build("base", model, lr=0.05)
    x, seen = torch.randn(16, 6, generator=torch.Generator().manual_seed(3)), []
    for step in range(150):
        if step == 100:  # a fold of rows of two widths
            model[0].weight.requires_grad_(False)
        opt.step(closure_for(opt, model, x=x))
        seen.append(opt.global_norm(opt._lists()[1]))  # the step's ‖g‖ (the update reads g)
        if step == 70:
            assert len(opt._step_norm_parts) == 71 - FOLD_NORMS  # the norms wait, unreduced
            state = opt.state_dict()  # a checkpoint within a fold: the max so far
    assert torch.equal(state["grad_norm_max"], torch.stack(seen[:71]).max())
    assert opt.log_values() == {"grad_norm_max": torch.stack(seen).max().item()}


def test_step_hooks_and_the_profiler_range_run_where_asked_and_zero_grad_sets_none():
    model = mlp()
    opt = build("sam", model, lr=0.1)
    calls = []
    opt.step(closure_for(opt, model))  # no hook, no profiler: the step itself
    handle = opt.register_step_pre_hook(lambda *_: calls.append("pre"))
    opt.register_step_post_hook(lambda *_: calls.append("post"))
    opt.step(closure_for(opt, model))
    assert calls == ["pre", "post"]
    handle.remove()
    base = opt.base_optimizer  # its own hooks run too, though its step skips torch's wrapper
    base_handle = base.register_step_post_hook(lambda *_: calls.append("base post"))
    opt.step(closure_for(opt, model))
    assert calls == ["pre", "post", "base post", "post"]  # the base step within the SAM step
    base_handle.remove()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        opt.step(closure_for(opt, model))
    assert {"Optimizer.step#SAM.step", "Optimizer.step#SGD.step"} <= {e.name for e in prof.events()}
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    opt.step(closure_for(opt, model))
    opt.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())
