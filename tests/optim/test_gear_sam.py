"""GEAR-SAM: EMA of squared block gradient norms, closed-form allocation, ‖ε‖ = ρ, β = 0 is SAM."""

import pytest
import torch
from optim_helpers import build, closure_for, flat, mlp, ref_grad
from torch import nn


def _groups(model):
    """Runner-style groups: block 'a' = first layer (weight and bias groups), block 'b' = the
    rest."""
    lin = [m for m in model if isinstance(m, nn.Linear)]
    return [
        dict(params=[lin[0].weight], block="a", kind="weight"),
        dict(params=[lin[0].bias], block="a", kind="bias"),
        dict(params=[m.weight for m in lin[1:]], block="b", kind="weight"),
        dict(params=[m.bias for m in lin[1:]], block="b", kind="bias"),
    ]


def _check_formula(model, opt, block_of, rho, beta, lr, steps=3):
    """Steps ``opt`` and checks ε and θ against the spec, ``block_of[i]`` the block of the
    i-th tensor of model.parameters()."""
    # blocks numbered as they first appear
    dense = {b: i for i, b in enumerate(dict.fromkeys(block_of))}
    block_of, nb = [dense[b] for b in block_of], len(dense)
    block = torch.cat([torch.full((p.numel(),), b) for p, b in zip(model.parameters(), block_of)])
    theta, a = flat(model.parameters()), torch.zeros(nb, dtype=torch.float64)
    for t in range(1, steps + 1):
        seen = {}
        opt.step(closure_for(opt, model, record=seen))
        _, g = ref_grad(model, theta)
        gb = torch.stack([g[block == b].norm() for b in range(nb)])
        a = beta * a + (1 - beta) * gb**2
        s = (a / (1 - beta**t)).sqrt()
        r = rho * s / s.norm()
        eps = g * (r / gb)[block]
        torch.testing.assert_close(seen[1] - theta, eps, rtol=1e-8, atol=1e-12)
        assert abs((seen[1] - theta).norm().item() - rho) < 1e-12  # ‖ε‖ = ρ exactly
        _, d = ref_grad(model, theta + eps)
        theta = theta - lr * d
        torch.testing.assert_close(flat(model.parameters()), theta, rtol=1e-8, atol=1e-12)
    assert opt.block_energy.shape == (nb,)  # one scalar per block
    torch.testing.assert_close(opt.block_energy, a)


def test_gear_sam_matches_the_formula_over_steps():
    model = mlp()
    opt = build("gear_sam", model, groups=_groups(model), lr=0.1, rho=0.05, beta=0.9)
    _check_formula(model, opt, [0, 0, 1, 1, 1, 1], rho=0.05, beta=0.9, lr=0.1)


class RootNet(nn.Module):
    """Two top-level children and a parameter of the root module itself."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Linear(5, 5), nn.ReLU())
        self.out = nn.Linear(5, 3)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 3))
        self.double()

    def forward(self, x):
        return self.out(self.body(x)) * self.scale


def test_gear_sam_on_a_plain_list_takes_the_bound_models_top_level_children():
    """The spec's default: one block per top-level child (body, out) plus one for root
    parameters."""
    model = RootNet()
    opt = build("gear_sam", model, lr=0.1, rho=0.05, beta=0.9)  # plain list, model bound
    block_of = {
        id(p): name
        for name, m in (("body", model.body), ("out", model.out))
        for p in m.parameters()
    }
    _check_formula(
        model,
        opt,
        [block_of.get(id(p), "root") for p in model.parameters()],
        rho=0.05,
        beta=0.9,
        lr=0.1,
    )


def test_gear_sam_without_model_or_blocks_warns_once_and_is_sam():
    from sam_runner.optim import GEARSAM

    a, b = mlp(), mlp()
    gear = GEARSAM(a.parameters(), torch.optim.SGD, lr=0.1, beta=0.9)  # not bound, no block keys
    sam = build("sam", b, lr=0.1)
    with pytest.warns(UserWarning, match="exactly SAM.*bind\\(model=") as record:
        for _ in range(3):
            gear.step(closure_for(gear, a))
            sam.step(closure_for(sam, b))
    assert len([w for w in record if "GEARSAM" in str(w.message)]) == 1
    torch.testing.assert_close(flat(a.parameters()), flat(b.parameters()), rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("blocks", ["group", "tensor", "layer"])
def test_gear_sam_with_beta_zero_is_sam(blocks):
    a, b = mlp(), mlp()
    gear = build(
        "gear_sam",
        a,
        groups=_groups(a) if blocks == "group" else None,
        lr=0.1,
        beta=0.0,
        blocks=blocks,
    )
    sam = build("sam", b, lr=0.1)
    for _ in range(3):
        sa, sb = {}, {}
        gear.step(closure_for(gear, a, record=sa))
        sam.step(closure_for(sam, b, record=sb))
        torch.testing.assert_close(sa[1], sb[1], rtol=1e-10, atol=1e-13)  # float64 rounding only
    # float64 rounding only
    torch.testing.assert_close(flat(a.parameters()), flat(b.parameters()), rtol=1e-10, atol=1e-13)


def test_gear_sam_block_counts():
    model = mlp()
    counts = {}
    for blocks, groups in (
        ("group", _groups(model)),
        ("group", None),
        ("tensor", None),
        ("layer", None),
    ):
        opt = build("gear_sam", model, groups=groups, lr=0.0, blocks=blocks)
        opt.step(closure_for(opt, model))
        counts[(blocks, groups is None)] = opt.block_energy.numel()
    # runner groups: 2 blocks; a plain list with the model bound: its 3 top-level Linear children;
    # 6 tensors; 3 Linear layers
    assert counts == {
        ("group", False): 2,
        ("group", True): 3,
        ("tensor", True): 6,
        ("layer", True): 3,
    }


def test_gear_sam_layer_blocks_need_the_model():
    from sam_runner.optim import GEARSAM

    model = mlp()
    # not bound to a model
    gear = GEARSAM(model.parameters(), torch.optim.SGD, lr=0.1, blocks="layer")
    with pytest.raises(ValueError, match="needs the model"):
        gear.step(closure_for(gear, model))
