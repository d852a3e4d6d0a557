"""Reference computations shared by the metrics tests."""

import torch


def dense_hessian(model, loss_fn, x, y):
    """The full Hessian (float64) of loss_fn(model(x), y) over all parameters, in the model's
    mode."""
    names = [n for n, _ in model.named_parameters()]
    params = [p.detach() for p in model.parameters()]
    sizes = [p.numel() for p in params]

    def f(flat):
        chunks = [c.view_as(p) for c, p in zip(flat.split(sizes), params)]
        return loss_fn(torch.func.functional_call(model, dict(zip(names, chunks)), (x,)), y)

    flat = torch.cat([p.reshape(-1) for p in params])
    return torch.autograd.functional.hessian(f, flat).double()
