"""LookSAM: k = 1 is SAM; a refresh keeps g_v, the part of g_s orthogonal to g (per tensor or
globally); a reuse step applies g + α‖g‖/‖g_v‖ g_v; per_tensor with an AdamW base equals
pytorch_optimizer's LookSAM; bad options."""

import pytest
import torch
from optim_helpers import X, Y, build, closure_for, flat, mlp, ref_grad

from sam_runner.optim import VARIANTS


def _run(name, steps, **kw):
    model = mlp()
    opt = build(name, model, lr=0.05, momentum=0.9, **kw)
    for _ in range(steps):
        opt.step(closure_for(opt, model))
    return flat(model.parameters()), opt


def test_k1_is_sam_bit_for_bit():
    for decompose in ("per_tensor", "global"):
        got, look = _run("look_sam", 6, k=1, decompose=decompose)
        want, sam = _run("sam", 6)
        assert torch.equal(got, want)
        assert look.grad_evals == sam.grad_evals == 12


def _split(model, vec):
    out, i = [], 0
    for p in model.parameters():
        out.append(vec[i : i + p.numel()])
        i += p.numel()
    return out


@pytest.mark.parametrize("decompose", ["per_tensor", "global"])
def test_a_refresh_keeps_the_part_of_g_s_orthogonal_to_g(decompose):
    model, rho = mlp(), 0.05
    opt = build("look_sam", model, lr=0.1, rho=rho, k=3, decompose=decompose)
    theta = flat(model.parameters())
    opt.step(closure_for(opt, model))
    _, g = ref_grad(model, theta)
    _, g_s = ref_grad(model, theta + rho * g / g.norm())
    gv = flat([opt.state[p]["look_sam_gv"] for p in model.parameters()])
    torch.testing.assert_close(flat(model.parameters()), theta - 0.1 * g_s, rtol=1e-9, atol=1e-12)
    pieces = list(zip(_split(model, gv), _split(model, g), _split(model, g_s)))
    if decompose == "global":
        pieces = [(gv, g, g_s)]
    for v, a, s in pieces:  # orthogonal to g, and g_s = g_v + (a multiple of g)
        assert abs(float(v @ a)) <= 1e-12 * float(v.norm() * a.norm() + 1e-300)
        torch.testing.assert_close(v, s - (a @ s) / (a @ a) * a, rtol=1e-9, atol=1e-13)
    assert opt.last_perturbed


@pytest.mark.parametrize("decompose", ["per_tensor", "global"])
def test_a_reuse_step_adds_the_scaled_orthogonal_direction(decompose):
    model, alpha = mlp(), 0.7
    opt = build("look_sam", model, lr=0.1, k=3, alpha=alpha, decompose=decompose)
    opt.step(closure_for(opt, model))
    gv = flat([opt.state[p]["look_sam_gv"] for p in model.parameters()])
    theta, calls = flat(model.parameters()), []
    opt.step(closure_for(opt, model, calls=calls))
    assert calls == [0] and not opt.last_perturbed  # one pass
    _, g = ref_grad(model, theta)
    if decompose == "global":
        want = g + alpha * g.norm() / (gv.norm() + 1e-8) * gv
    else:
        want = torch.cat(
            [a + alpha * a.norm() / (v.norm() + 1e-8) * v
             for a, v in zip(_split(model, g), _split(model, gv))]
        )  # fmt: skip
    torch.testing.assert_close(flat(model.parameters()), theta - 0.1 * want, rtol=1e-9, atol=1e-12)


def test_k5_costs_1_2_passes_per_step_and_refreshes_a_fifth_of_the_steps():
    _, opt = _run("look_sam", 10, k=5)
    assert opt.summary_values() == {"grad_evals_per_step": 1.2, "perturbed_fraction": 0.2}


def test_per_tensor_with_adamw_equals_pytorch_optimizer_looksam_over_30_steps():
    """pytorch_optimizer's LookSAM (a test-only dependency): the caller computes g, then
    ``step(closure)`` runs the closure at θ+ε on a refresh and at θ between."""
    pytorch_optimizer = pytest.importorskip("pytorch_optimizer")
    kw = dict(lr=3e-3, weight_decay=0.01)
    ours_model, theirs_model = mlp(), mlp()
    ours = VARIANTS["look_sam"](
        list(ours_model.parameters()), torch.optim.AdamW, rho=0.05, k=4, alpha=0.6, **kw
    ).bind(model=ours_model)
    theirs = pytorch_optimizer.LookSAM(
        theirs_model.parameters(), torch.optim.AdamW, rho=0.05, k=4, alpha=0.6, **kw
    )

    def their_closure():
        theirs.zero_grad()
        loss = torch.nn.functional.cross_entropy(theirs_model(X), Y)
        loss.backward()
        return loss

    for _ in range(30):
        ours.step(closure_for(ours, ours_model))
        their_closure()
        theirs.step(their_closure)
        theirs.zero_grad()
    assert (flat(ours_model.parameters()) - flat(theirs_model.parameters())).abs().max() <= 1e-6
    assert not torch.equal(flat(ours_model.parameters()), flat(mlp().parameters()))


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(k=0), r"k must be an integer >= 1, got 0"),
        (dict(k=2.5), "k must be an integer"),
        (dict(alpha=-0.1), r"alpha must be a finite number >= 0, got -0.1"),
        (dict(decompose="blockwise"), "decompose must be one of"),
    ],
)
def test_bad_options(kw, message):
    with pytest.raises(ValueError, match=message):
        build("look_sam", mlp(), **kw)
