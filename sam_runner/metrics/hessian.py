"""Top Hessian eigenvalues by Lanczos on Hessian-vector products."""
from __future__ import annotations

import torch


def _params(model):
    return [p for p in model.parameters() if p.requires_grad]


def hvp_fn(model, loss_fn, batches):
    """v ↦ H v for the mean loss over all samples in ``batches`` (weighted by batch size)."""
    batches = list(batches)
    total = sum(len(y) for _, y in batches)
    params = _params(model)

    def hvp(vs):
        out = [torch.zeros_like(p) for p in params]
        for x, y in batches:
            with torch.enable_grad():
                loss = loss_fn(model(x), y) * (len(y) / total)
                grads = torch.autograd.grad(loss, params, create_graph=True)
                dot = sum((g * v).sum() for g, v in zip(grads, vs))
                hv = torch.autograd.grad(dot, params)
            torch._foreach_add_(out, hv)
        return out

    return hvp, params


def top_hessian_eigenvalues(model, loss_fn, batches, k: int = 1, tol: float = 1e-3, max_iter: int = 100,
                            init=None, generator=None):
    hvp, params = hvp_fn(model, loss_fn, batches)
    vals, _, _ = lanczos(hvp, params, k, tol, max_iter, init, generator)
    return vals


def lanczos(hvp, params, k=1, tol=1e-3, max_iter=100, init=None, generator=None):
    """Lanczos with full reorthogonalisation; stops when the k top Ritz residuals are < tol·|θ|.

    Returns (eigenvalues largest first, top eigenvector as a list of tensors, HVPs used).
    """
    flat = lambda ts: torch.cat([t.reshape(-1) for t in ts])
    shapes = [p.shape for p in params]

    def unflat(v):
        out, i = [], 0
        for s in shapes:
            n = s.numel()
            out.append(v[i:i + n].view(s))
            i += n
        return out

    n = sum(p.numel() for p in params)
    dev = params[0].device
    q = flat(init).to(dev).double() if init is not None else torch.randn(n, generator=generator).to(dev).double()
    q /= q.norm()
    Q, alphas, betas = [q], [], []
    hvps, vals, vecs = 0, None, None
    for j in range(min(max_iter, n)):
        w = flat(hvp([t.to(params[0].dtype) for t in unflat(Q[j])])).double()
        hvps += 1
        a = torch.dot(w, Q[j])
        alphas.append(a)
        Qm = torch.stack(Q)
        w = w - Qm.T @ (Qm @ w)
        w = w - Qm.T @ (Qm @ w)  # twice is enough (Kahan–Parlett)
        b = w.norm()
        T = torch.diag(torch.stack(alphas))
        if betas:
            off = torch.stack(betas)
            T = T + torch.diag(off, 1) + torch.diag(off, -1)
        evals, evecs = torch.linalg.eigh(T)
        order = evals.argsort(descending=True)
        evals, evecs = evals[order], evecs[:, order]
        m = min(k, len(alphas))
        residual = (b * evecs[-1, :m]).abs()
        vals = evals[:m]
        if len(alphas) >= k and bool((residual <= tol * vals.abs().clamp_min(1e-12)).all()):
            break
        if b < 1e-10:
            break
        betas.append(b)
        Q.append(w / b)
    top = (torch.stack(Q[:len(alphas)]).T @ evecs[:, 0]).float()
    return [float(v) for v in vals], unflat(top), hvps
