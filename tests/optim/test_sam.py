"""SAM and the shared update path against the formula, computed independently."""

import torch
from optim_helpers import X, Y, build, closure_for, flat, mlp, ref_grad


def test_sam_perturbation_and_update_match_the_formula():
    model = mlp()
    opt = build("sam", model, lr=0.1, rho=0.07)
    theta = flat(model.parameters())
    seen = {}
    opt.step(closure_for(opt, model, record=seen))
    _, g = ref_grad(model, theta)
    eps = 0.07 * g / g.norm()
    torch.testing.assert_close(seen[1] - theta, eps, rtol=1e-9, atol=1e-12)
    assert abs((seen[1] - theta).norm().item() - 0.07) < 1e-12  # ‖ε‖ = ρ
    _, d = ref_grad(model, theta + eps)
    torch.testing.assert_close(flat(model.parameters()), theta - 0.1 * d, rtol=1e-9, atol=1e-12)


def test_sams_in_place_perturbation_takes_the_same_steps_bit_for_bit():
    """SAM scales the first-pass gradients in place instead of writing ε first: with AdamW,
    weight decay and float32, the same parameters as the engine's buffered way, to the bit."""
    from sam_runner.optim import SAM

    class Buffered(SAM):  # its own compute_perturbation: the engine's way, ε in the buffers
        def compute_perturbation(self, params, grads, eps):
            super().compute_perturbation(params, grads, eps)

    x, y = X.float(), Y
    runs = []
    for cls in (SAM, Buffered):
        model = mlp().float()
        opt = cls(model.parameters(), torch.optim.AdamW, rho=0.05, lr=1e-2, weight_decay=0.1)
        for _ in range(5):
            opt.step(closure_for(opt, model, x=x, y=y))
        runs.append(flat(model.parameters()))
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], flat(mlp().parameters()))
