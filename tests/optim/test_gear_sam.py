"""GEAR-SAM: EMA of squared block gradient norms, closed-form allocation, ‖ε‖ = ρ, β = 0 is SAM."""
import pytest
import torch
from torch import nn

from optim_helpers import build, closure_for, flat, mlp, ref_grad


def _groups(model):
    """Runner-style groups: block 'a' = first layer (weight and bias groups), block 'b' = the rest."""
    lin = [m for m in model if isinstance(m, nn.Linear)]
    return [dict(params=[lin[0].weight], block="a", kind="weight"), dict(params=[lin[0].bias], block="a", kind="bias"),
            dict(params=[m.weight for m in lin[1:]], block="b", kind="weight"),
            dict(params=[m.bias for m in lin[1:]], block="b", kind="bias")]


def test_gear_sam_matches_the_formula_over_steps():
    model, rho, beta, lr = mlp(), 0.05, 0.9, 0.1
    opt = build("gear_sam", model, groups=_groups(model), lr=lr, rho=rho, beta=beta)
    # flat-vector masks of the two blocks, in model.parameters() order
    sizes = [p.numel() for p in model.parameters()]
    block = torch.cat([torch.full((n,), 0 if i < 2 else 1) for i, n in enumerate(sizes)])
    theta, a = flat(model.parameters()), torch.zeros(2, dtype=torch.float64)
    for t in range(1, 4):
        seen = {}
        opt.step(closure_for(opt, model, record=seen))
        _, g = ref_grad(model, theta)
        gb = torch.stack([g[block == b].norm() for b in range(2)])
        a = beta * a + (1 - beta) * gb ** 2
        s = (a / (1 - beta ** t)).sqrt()
        r = rho * s / s.norm()
        eps = g * (r / gb)[block]
        torch.testing.assert_close(seen[1] - theta, eps, rtol=1e-8, atol=1e-12)
        assert abs((seen[1] - theta).norm().item() - rho) < 1e-12          # ‖ε‖ = ρ exactly
        _, d = ref_grad(model, theta + eps)
        theta = theta - lr * d
        torch.testing.assert_close(flat(model.parameters()), theta, rtol=1e-8, atol=1e-12)
    assert opt.block_energy.shape == (2,)                                   # one scalar per block
    torch.testing.assert_close(opt.block_energy, a)


@pytest.mark.parametrize("blocks", ["group", "tensor", "layer"])
def test_gear_sam_with_beta_zero_is_sam(blocks):
    a, b = mlp(), mlp()
    gear = build("gear_sam", a, groups=_groups(a) if blocks == "group" else None, lr=0.1, beta=0.0, blocks=blocks)
    sam = build("sam", b, lr=0.1)
    for _ in range(3):
        sa, sb = {}, {}
        gear.step(closure_for(gear, a, record=sa))
        sam.step(closure_for(sam, b, record=sb))
        torch.testing.assert_close(sa[1], sb[1], rtol=1e-10, atol=1e-13)  # float64 rounding only
    torch.testing.assert_close(flat(a.parameters()), flat(b.parameters()), rtol=1e-10, atol=1e-13)  # float64 rounding only


def test_gear_sam_block_counts():
    model = mlp()
    counts = {}
    for blocks, groups in (("group", _groups(model)), ("group", None), ("tensor", None), ("layer", None)):
        opt = build("gear_sam", model, groups=groups, lr=0.0, blocks=blocks)
        opt.step(closure_for(opt, model))
        counts[(blocks, groups is None)] = opt.block_energy.numel()
    # runner groups: 2 blocks; a plain list is one group: 1 block; 6 tensors; 3 Linear layers
    assert counts == {("group", False): 2, ("group", True): 1, ("tensor", True): 6, ("layer", True): 3}


def test_gear_sam_layer_blocks_need_the_model():
    from sam_runner.optim import GEARSAM
    model = mlp()
    gear = GEARSAM(model.parameters(), torch.optim.SGD, lr=0.1, blocks="layer")  # not bound to a model
    with pytest.raises(ValueError, match="needs the model"):
        gear.step(closure_for(gear, model))
