"""ESAM: β = 1, γ = 1 is SAM; the descent pass runs on the top-γ of the batch by loss rise (the
paper's ⌊γB⌋, the official code's strict rule with ``faithful``); the weight mask, per
coordinate or per tensor, scaled by 1/β; the counted cost; bad options."""

import math

import pytest
import torch
import torch.nn.functional as F
from optim_helpers import X, Y, bn_net, build, closure_for, flat, mlp, ref_grad, ref_loss

from sam_runner.module_state import gradients_skipped, is_trainable


def _run(name, steps, **kw):
    model = mlp()
    opt = build(name, model, lr=0.05, momentum=0.9, **kw)
    passes = []
    for _ in range(steps):
        calls = []
        opt.step(closure_for(opt, model, calls=calls))
        passes.append(len(calls))
    return flat(model.parameters()), passes, opt


@pytest.mark.parametrize("faithful", [False, True])
def test_beta_1_gamma_1_is_sam_bit_for_bit(faithful):
    got, passes, esam = _run("esam", 5, beta=1.0, gamma=1.0, faithful=faithful)
    want, sam_passes, sam = _run("sam", 5)
    assert torch.equal(got, want) and passes == sam_passes == [2] * 5
    assert esam.grad_evals == sam.grad_evals


def _selected_descent(model, theta, eps, n, strict):
    """The gradient at θ+ε over the samples whose loss rose most, computed independently."""
    before, _ = ref_loss(model, theta, per_sample=True)
    after, _ = ref_loss(model, theta + eps, per_sample=True)
    rise = after - before
    top = torch.topk(rise, n)
    keep = rise > top.values[-1] if strict else torch.zeros_like(rise, dtype=torch.bool)
    if not strict:
        keep[top.indices] = True
    _, g = ref_grad(model, theta + eps, X[keep], Y[keep])
    return g, int(keep.sum())


@pytest.mark.parametrize("faithful, kept", [(False, 8), (True, 7)])
def test_the_descent_pass_runs_on_the_samples_whose_loss_rose_most(faithful, kept):
    model, rho, lr = mlp(), 0.05, 0.1
    opt = build("esam", model, lr=lr, rho=rho, beta=1.0, gamma=0.5, faithful=faithful)
    theta, calls, costs = flat(model.parameters()), [], []
    opt.step(closure_for(opt, model, calls=calls, costs=costs))
    assert calls == [0, 1, 2]
    _, g = ref_grad(model, theta)
    d, n = _selected_descent(model, theta, rho * g / g.norm(), 8, strict=faithful)
    assert n == kept  # ⌊γB⌋ = 8 of 16; the strict rule keeps one fewer
    torch.testing.assert_close(flat(model.parameters()), theta - lr * d, rtol=1e-9, atol=1e-12)
    # cost: the first pass, a forward without gradients (⅓), the kept share of the batch
    assert costs == [1.0, 1 / 3, kept / 16]
    assert opt.grad_evals == pytest.approx(1 + 1 / 3 + kept / 16, rel=1e-15)


def test_the_selection_covers_the_whole_batch_across_micro_batches():
    a, b = mlp(), mlp()
    one, four = build("esam", a, gamma=0.25), build("esam", b, gamma=0.25)
    for _ in range(3):
        one.step(closure_for(one, a, micro=1))
        four.step(closure_for(four, b, micro=4))
    torch.testing.assert_close(flat(b.parameters()), flat(a.parameters()), rtol=1e-9, atol=1e-12)
    assert one.grad_evals == four.grad_evals == pytest.approx(3 * (1 + 1 / 3 + 4 / 16))


def _epsilon(model, **kw):
    opt = build("esam", model, lr=0.0, rho=0.05, gamma=1.0, **kw)
    theta, seen = flat(model.parameters()), {}
    opt.step(closure_for(opt, model, record=seen))
    _, g = ref_grad(model, theta)
    return seen[1] - theta, g


def test_the_paper_mask_keeps_each_coordinate_with_probability_beta():
    model, beta = mlp(width=40), 0.6
    eps, g = _epsilon(model, beta=beta)
    kept = eps != 0
    want = 0.05 / beta * g / g.norm()
    torch.testing.assert_close(eps[kept], want[kept], rtol=1e-9, atol=1e-15)
    live = g != 0  # coordinates with a gradient (dead ReLUs give none)
    n = int(live.sum())
    hits = int((kept & live).sum())
    assert n > 500 and abs(hits - beta * n) <= 3.2905 * math.sqrt(n * beta * (1 - beta))
    # the draws: u ~ U[0, 1) per coordinate from a generator seeded by perturb_seed, kept
    # where u < β (resumes and reruns depend on this stream staying the same)
    u = torch.rand(g.numel(), generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    assert torch.equal(kept & live, (u < beta) & live)


def test_the_faithful_mask_keeps_whole_tensors_normalised_over_the_kept_ones():
    model = mlp(depth=6)
    eps, g = _epsilon(model, beta=0.5, faithful=True, perturb_seed=1)
    pieces, i = [], 0
    for p in model.parameters():
        pieces.append((eps[i : i + p.numel()], g[i : i + p.numel()]))
        i += p.numel()
    kept = [(e, gt) for e, gt in pieces if e.abs().sum() > 0]
    assert 0 < len(kept) < len(pieces)  # some tensors perturbed, some not (seed 1)
    assert all(torch.equal(e, torch.zeros_like(e)) for e, gt in pieces if e.abs().sum() == 0)
    norm = torch.cat([gt for _, gt in kept]).norm()
    for e, gt in kept:
        torch.testing.assert_close(e, 0.05 / 0.5 * gt / norm, rtol=1e-9, atol=1e-15)


def test_a_closure_without_select_rows_is_warned_and_counted_as_a_full_pass():
    model = mlp()
    opt = build("esam", model, gamma=0.5)

    def closure():
        opt.zero_grad()
        out = model(X)
        loss = opt.reduce_loss(F.cross_entropy(out, Y, reduction="none"), out, Y)
        loss.backward()
        return loss

    with pytest.warns(UserWarning, match="select_rows"):
        opt.step(closure)
    assert opt.grad_evals == pytest.approx(1 + 1 / 3 + 1)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(beta=0.0), r"beta must be a number in \(0, 1\], got 0.0"),
        (dict(beta=1.5), "beta must be"),
        (dict(gamma=0), r"gamma must be a number in \(0, 1\], got 0"),
        (dict(gamma=-0.5), "gamma must be"),
    ],
)
def test_bad_options(kw, message):
    with pytest.raises(ValueError, match=message):
        build("esam", mlp(), **kw)


def _no_skips(opt):
    """``opt`` drawing its mask as usual but skipping nothing in the first pass (the reference)."""
    draw = opt.first_pass_skips
    opt.first_pass_skips = lambda: (draw(), [])[1]
    return opt


@pytest.mark.parametrize("micro", [1, 2])
def test_the_faithful_first_pass_skips_the_tensors_drawn_out_and_changes_nothing(micro):
    """The unperturbed tensors get no gradient at θ (autograd skips them, as the official code's
    frozen tensors), and the run is bit for bit the one that computes every gradient; BatchNorm's
    statistics included."""
    a, b = bn_net(), bn_net()
    kw = dict(lr=0.05, momentum=0.9, beta=0.5, gamma=0.5, faithful=True, perturb_seed=3)
    fast, ref = build("esam", a, **kw), _no_skips(build("esam", b, **kw))
    skipped = []
    for _ in range(4):
        seen = {}

        def watch(closure, seen=seen):
            def run():
                seen.setdefault(fast.pass_index, [p.requires_grad for p in a.parameters()])
                return closure()

            return run

        fast.step(watch(closure_for(fast, a, micro=micro)))
        ref.step(closure_for(ref, b, micro=micro))
        skipped.append(seen[0].count(False))
        assert seen[2] == [True] * len(seen[2])  # the descent pass: every gradient
        assert all(p.requires_grad for p in a.parameters())  # restored
    assert 0 < sum(skipped) < 4 * len(list(a.parameters()))
    for x, y in zip(a.state_dict().values(), b.state_dict().values()):
        assert torch.equal(x, y)


def test_a_skipped_parameter_is_still_trained():
    p = torch.nn.Parameter(torch.ones(2))
    with gradients_skipped([p]):
        assert not p.requires_grad and is_trainable(p)
    assert p.requires_grad and is_trainable(p) and not hasattr(p, "_gradient_skipped")


def test_a_step_that_draws_every_tensor_out_is_a_plain_step_not_a_crash():
    """``faithful`` with a tiny β: some steps keep no tensor (chance (1 − β)^tensors). The first
    pass then runs in full (a pass skipping every parameter had nothing to backpropagate and
    raised), ε is 0, and the step equals SGD's at θ."""
    a, b = mlp(), mlp()
    b.load_state_dict(a.state_dict())
    opt = build("esam", a, lr=0.1, beta=1e-6, gamma=1.0, faithful=True, perturb_seed=0)
    sgd = torch.optim.SGD(b.parameters(), lr=0.1)
    for _ in range(3):
        opt.step(closure_for(opt, a))
        sgd.zero_grad()
        F.cross_entropy(b(X), Y).backward()
        sgd.step()
    for x, y in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(x, y)
