"""fp16: a step the scaler skips because only the perturbed (last) pass overflowed must leave
no trace: the parameters, the trajectory after it and the variant's state are those of a twin
that never took that step. Float64 on the CPU, where scaling by a power of two is exact."""

import pytest
import torch
import torch.nn.functional as F
from optim_helpers import X, Y, build, flat, mlp

from sam_runner.optim import VARIANTS

PERTURBING = sorted(n for n in VARIANTS if VARIANTS[n].passes > 1)
# refreshes on perturbing steps 1, 3, ...; LookSAM refreshing (two passes) on every step
KW = {"precond_sam": dict(refresh_every=2), "look_sam": dict(k=1)}


def _run(name, poison_at, steps=4):
    """``steps`` steps under a GradScaler; on step ``poison_at`` only the last pass yields inf."""
    model = mlp()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8)
    opt = build(name, model, lr=0.05, **KW.get(name, {})).bind(grad_scaler=scaler)
    step = {"k": 0}

    def closure():
        opt.zero_grad(set_to_none=True)
        out = model(X)
        loss = opt.reduce_loss(F.cross_entropy(out, Y, reduction="none"), out, Y)
        if step["k"] == poison_at and opt.pass_index == opt.passes - 1:
            loss = loss * float("inf")
        scaler.scale(loss).backward()
        return loss.detach()

    trajectory = []
    for k in range(1, steps + 1):
        step["k"] = k
        before = flat(model.parameters())
        opt.step(closure)
        scaler.update()
        if k == poison_at:
            assert torch.equal(flat(model.parameters()), before)  # skipped, θ restored
        else:
            trajectory.append(flat(model.parameters()))
    return opt, trajectory


def _state(opt):
    """The variant's own state and per-parameter state, without the engine's step count."""
    own = {k: v for k, v in opt.variant_state().items() if k != "step_count"}
    per_param = [t for p in opt.state for t in opt.state[p].values() if torch.is_tensor(t)]
    return own, per_param


@pytest.mark.parametrize("poison_at", [1, 2], ids=["first-step", "later-step"])
@pytest.mark.parametrize("name", PERTURBING)
def test_a_step_skipped_for_the_perturbed_pass_alone_leaves_no_trace(name, poison_at):
    skipped, with_skip = _run(name, poison_at)
    twin, without = _run(name, poison_at=None, steps=3)
    assert len(with_skip) == len(without) == 3
    for a, b in zip(with_skip, without):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)
    (own_a, pp_a), (own_b, pp_b) = _state(skipped), _state(twin)
    assert own_a.keys() == own_b.keys()
    for key in own_a:
        a, b = own_a[key], own_b[key]
        if torch.is_tensor(a):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15, msg=key)
        else:
            assert a == b, key
    assert len(pp_a) == len(pp_b)
    for a, b in zip(pp_a, pp_b):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-15)
