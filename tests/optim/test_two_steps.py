"""first_step/second_step (davda54/sam's API) on every variant: SAM bit for bit against a
transcription of davda54/sam's ``sam.py``; every two-pass variant equal to its own
``step(closure)``; clear errors for a step out of order, for variants with passes of their own
and for a missing loss; BatchNorm statistics kept between the two steps."""

import pytest
import torch
import torch.nn.functional as F
from optim_helpers import X, Y, bn_net, build, closure_for, flat, mlp
from oracle_helpers import batches

from sam_runner.optim import VARIANTS
from sam_runner.optim.engine import SharpnessAware

TWO_STEP = sorted(
    n
    for n in VARIANTS
    if VARIANTS[n].passes == 2 and VARIANTS[n].sharpness_step is SharpnessAware.sharpness_step
)
OWN_PASSES = sorted(n for n in VARIANTS if n not in TWO_STEP)  # base, msam, eisam, esam, ...


class Davda54SAM(torch.optim.Optimizer):
    """davda54/sam's ``SAM`` (non-adaptive), transcribed: the first step saves θ and adds
    ρ g/(‖g‖ + 1e-12), ‖g‖ the norm of the per-tensor norms; the second restores θ and steps."""

    def __init__(self, params, base_optimizer, rho=0.05, **kwargs):
        super().__init__(params, dict(rho=rho, **kwargs))
        self.base_optimizer = base_optimizer(self.param_groups, **kwargs)
        self.param_groups = self.base_optimizer.param_groups

    @torch.no_grad()
    def first_step(self, zero_grad=False):
        norm = torch.norm(
            torch.stack([p.grad.norm(p=2) for g in self.param_groups for p in g["params"]
                         if p.grad is not None]), p=2)  # fmt: skip
        for group in self.param_groups:
            scale = group["rho"] / (norm + 1e-12)
            for p in group["params"]:
                if p.grad is None:
                    continue
                self.state[p]["old_p"] = p.data.clone()
                p.add_(p.grad * scale.to(p))
        if zero_grad:
            self.zero_grad()

    @torch.no_grad()
    def second_step(self, zero_grad=False):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.data = self.state[p]["old_p"]
        self.base_optimizer.step()
        if zero_grad:
            self.zero_grad()


def _loss(opt, model, x, y):
    """The mean loss, through ``reduce_loss`` where the optimizer has it (CSAM reweights)."""
    out = model(x)
    if not hasattr(opt, "reduce_loss"):
        return F.cross_entropy(out, y)
    return opt.reduce_loss(F.cross_entropy(out, y, reduction="none"), out, y)


def _two_steps(opt, model, x, y, loss_kw=False):
    loss = _loss(opt, model, x, y)
    loss.backward()
    opt.first_step(zero_grad=True, **({"loss": loss.detach()} if loss_kw else {}))
    perturbed = _loss(opt, model, x, y)
    perturbed.backward()
    opt.second_step(zero_grad=True, **({"loss": perturbed.detach()} if loss_kw else {}))


@pytest.mark.parametrize(
    "base_kw", [dict(lr=0.05, momentum=0.9, weight_decay=5e-4), dict(lr=0.1)], ids=["mom", "sgd"]
)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_sam_first_and_second_step_are_davda54s_bit_for_bit(base_kw, dtype):
    ours, theirs = mlp().to(dtype), mlp().to(dtype)
    opt = VARIANTS["sam"](ours.parameters(), torch.optim.SGD, rho=0.05, **base_kw)
    ref = Davda54SAM(theirs.parameters(), torch.optim.SGD, rho=0.05, **base_kw)
    for x, y in batches(20):
        _two_steps(opt, ours, x.to(dtype), y)
        _two_steps(ref, theirs, x.to(dtype), y)
        assert torch.equal(flat(ours.parameters()), flat(theirs.parameters()))


@pytest.mark.parametrize("name", TWO_STEP)
def test_two_steps_equal_the_variants_own_step(name):
    a, b = mlp(), mlp()
    kw = dict(momentum=0.0) if name == "sam_sps" else dict(momentum=0.9)
    one, two = build(name, a, lr=0.05, **kw), build(name, b, lr=0.05, **kw)
    for x, y in batches(4):
        one.step(closure_for(one, a, x, y))
        _two_steps(two, b, x, y, loss_kw=VARIANTS[name].step_needs_losses)
    torch.testing.assert_close(flat(b.parameters()), flat(a.parameters()), rtol=1e-12, atol=1e-14)
    assert two.summary_values() == one.summary_values()


def test_first_step_twice_and_second_step_alone_are_one_line_errors():
    model = mlp()
    opt = build("sam", model)
    with pytest.raises(ValueError, match="^SAM.second_step called without first_step before it$"):
        opt.second_step()
    F.cross_entropy(model(X), Y).backward()
    opt.first_step()
    with pytest.raises(ValueError, match="^SAM.first_step called twice without second_step"):
        opt.first_step()


@pytest.mark.parametrize("name", OWN_PASSES)
def test_variants_with_passes_of_their_own_refuse_the_two_steps(name):
    model = mlp()
    opt = build(name, model)
    F.cross_entropy(model(X), Y).backward()
    with pytest.raises(ValueError, match="runs passes of its own.*use step\\(closure\\)"):
        opt.first_step()


def test_a_variant_reading_the_losses_asks_for_them():
    model = mlp()
    opt = build("tlc_sam", model)
    F.cross_entropy(model(X), Y).backward()
    with pytest.raises(ValueError, match="first_step needs loss="):
        opt.first_step()


def test_batchnorm_statistics_stay_between_the_two_steps():
    model, reference = bn_net(), bn_net()
    opt = build("sam", model)
    _two_steps(opt, model, X, Y)
    reference.train()
    reference(X)  # the first forward alone moves the running statistics
    for (k, a), b in zip(model.state_dict().items(), reference.state_dict().values()):
        if "running" in k or "num_batches" in k:
            assert torch.equal(a, b), k
