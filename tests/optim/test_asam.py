"""ASAM: ε = ρ T² g / ‖T g‖, T = |θ| + η on weights, 1 on biases; scale invariance."""

import torch
from optim_helpers import X, Y, build, closure_for, flat, mlp, ref_grad
from torch import nn


def _t_vector(model, eta):
    """T per entry, from the formula: |θ| + η on tensors with more than one dimension, 1 on
    biases."""
    return torch.cat(
        [
            (p.detach().abs() + eta if p.ndim > 1 else torch.ones_like(p)).reshape(-1)
            for p in model.parameters()
        ]
    )


def test_asam_perturbation_and_update_match_the_formula():
    model = mlp()
    opt = build("asam", model, lr=0.1, rho=0.5, eta=0.01)
    theta, t = flat(model.parameters()), _t_vector(model, 0.01)
    seen = {}
    opt.step(closure_for(opt, model, record=seen))
    _, g = ref_grad(model, theta)
    eps = 0.5 * t * t * g / (t * g).norm()
    torch.testing.assert_close(seen[1] - theta, eps, rtol=1e-9, atol=1e-12)
    _, d = ref_grad(model, theta + eps)
    torch.testing.assert_close(flat(model.parameters()), theta - 0.1 * d, rtol=1e-9, atol=1e-12)


def test_asam_reads_the_group_kind_flag():
    """With runner-style groups, a 1-D tensor in a 'weight' group is adaptive (normalisation
    weights).
    """
    model = mlp()
    lin = [m for m in model if isinstance(m, nn.Linear)]
    groups = [
        dict(params=[lin[0].bias], kind="weight"),
        dict(params=[p for m in lin for p in m.parameters() if p is not lin[0].bias], kind="bias"),
    ]
    opt = build("asam", model, groups=groups, lr=0.0, rho=0.5, eta=0.01)
    seen = {}
    opt.step(closure_for(opt, model, record=seen))
    model2 = mlp()  # the same initial point: its first-pass gradient, by hand
    model2.zero_grad()
    torch.nn.functional.cross_entropy(model2(X), Y).backward()
    gs = {n: p.grad for n, p in model2.named_parameters()}
    t = {
        n: (p.detach().abs() + 0.01 if n == "0.bias" else torch.ones_like(p))
        for n, p in model2.named_parameters()
    }
    norm = torch.sqrt(sum(((t[n] * gs[n]) ** 2).sum() for n in gs))
    eps = torch.cat(
        [(0.5 * t[n] ** 2 * gs[n] / norm).reshape(-1) for n, _ in model2.named_parameters()]
    )
    torch.testing.assert_close(seen[1] - flat(model2.parameters()), eps, rtol=1e-9, atol=1e-12)


def _perturbed_loss(name, model, **kw):
    opt = build(name, model, lr=0.0, **kw)
    seen, losses = {}, {}
    closure = closure_for(opt, model, record=seen)

    def tracking():
        loss = closure()
        losses[opt.pass_index] = loss
        return loss

    opt.step(tracking)
    return losses[1], seen


def test_asam_perturbation_is_invariant_to_relu_rescaling():
    """Scale layer 1 by c and layer 2 by 1/c (same function): ASAM's ε scales along (ε₁·c, ε₂/c)
    and the perturbed loss is unchanged; SAM's is not (the point of adaptivity)."""
    c = 4.0
    a, b = mlp(bias=False), mlp(bias=False)
    with torch.no_grad():
        b[0].weight.mul_(c)
        b[2].weight.div_(c)
    la, sa = _perturbed_loss("asam", a, rho=0.5, eta=0.0)
    lb, sb = _perturbed_loss("asam", b, rho=0.5, eta=0.0)
    torch.testing.assert_close(lb, la, rtol=1e-9, atol=1e-12)
    n1, n2 = a[0].weight.numel(), a[2].weight.numel()
    ea, eb = sa[1] - flat(a.parameters()), sb[1] - flat(b.parameters())
    torch.testing.assert_close(eb[:n1], c * ea[:n1], rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(eb[n1 : n1 + n2], ea[n1 : n1 + n2] / c, rtol=1e-9, atol=1e-12)
    a, b = mlp(bias=False), mlp(bias=False)
    with torch.no_grad():
        b[0].weight.mul_(c)
        b[2].weight.div_(c)
    sam_a, _ = _perturbed_loss("sam", a, rho=0.5)
    sam_b, _ = _perturbed_loss("sam", b, rho=0.5)
    assert abs(sam_a.item() - sam_b.item()) > 1e-4  # SAM is not invariant
