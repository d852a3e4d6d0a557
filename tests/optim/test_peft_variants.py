"""On a PEFT model every SAM variant perturbs and updates the trainable parameters alone: the
frozen weights are the same at every pass and after the step, and SAM's ‖ε‖ = ρ over the
adapters alone."""

import pytest
import torch
from optim_helpers import DEFAULT_KW, build, closure_for, mlp

from sam_runner.adapters.lora import add_lora
from sam_runner.optim import VARIANTS
from sam_runner.optim.build import parameter_groups


def lora_mlp():
    model = mlp(seed=1)
    model.requires_grad_(False)
    for layer in (model[0], model[2]):
        add_lora(layer, rank=2, alpha=4)
    with torch.no_grad():  # a trained adapter: the frozen weights get a gradient path through B
        for layer in (model[0], model[2]):
            layer.lora_B.normal_(0, 0.3)
    return model.double()


def split(model):
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}
    trainable = [p for p in model.parameters() if p.requires_grad]
    return frozen, trainable


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_variant_leaves_the_frozen_weights_alone(name):
    model = lora_mlp()
    frozen, trainable = split(model)
    groups = parameter_groups(model)  # the runner's groups: the trainable parameters only
    assert {id(p) for g in groups for p in g["params"]} == {id(p) for p in trainable}
    opt = build(name, model, lr=0.05, groups=groups, **DEFAULT_KW[name])
    seen = []

    def watch():
        seen.append({n: p.detach().clone() for n, p in model.named_parameters() if n in frozen})

    closure = closure_for(opt, model)
    for _ in range(3):
        opt.step(lambda: (watch(), closure())[1])
    watch()
    if name == "flat_lora":  # its one pass is at W + ε by design: W is restored after each step
        seen = seen[-1:]
    for state in seen:
        for n, v in state.items():
            assert torch.equal(v, frozen[n]), (name, n)


def test_sam_s_radius_is_over_the_trainable_parameters_alone():
    model = lora_mlp()
    frozen, trainable = split(model)
    opt = build("sam", model, lr=0.05, rho=0.07, groups=parameter_groups(model))
    at = {}

    def record():
        at[opt.pass_index] = [p.detach().clone() for p in trainable]

    closure = closure_for(opt, model)
    opt.step(lambda: (record(), closure())[1])
    eps = torch.cat([(b - a).reshape(-1) for a, b in zip(at[0], at[1])])
    assert eps.norm().item() == pytest.approx(0.07, rel=1e-12)
