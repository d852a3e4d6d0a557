"""SpectralSAM: hidden matrices get ρ_s · msign(G) · sqrt(max(1, d_out/d_in)); the rest Euclidean
SAM.
"""

import torch
from optim_helpers import build, closure_for, flat, mlp, ref_grad
from torch import nn

# Muon's published quintic Newton–Schulz coefficients (Keller Jordan's Muon), 5 steps
A, B, C = 3.4445, -4.7750, 2.0315


def newton_schulz(g, steps=5, dtype=torch.float32):
    x = g.to(dtype)
    tall = x.shape[0] > x.shape[1]
    if tall:
        x = x.T
    x = x / x.norm()
    for _ in range(steps):
        s = x @ x.T
        x = A * x + B * s @ x + C * s @ s @ x
    return x.T if tall else x


def test_spectral_sam_matches_the_formula():
    """Plain list of a 4-matrix MLP: the first and last matrices are excluded (first layer,
    head)."""
    model = mlp(depth=4, width=7)
    lin = [m for m in model if isinstance(m, nn.Linear)]
    opt = build("spectral_sam", model, lr=0.1, rho=0.05, rho_spectral=0.2)
    theta, seen = flat(model.parameters()), {}
    opt.step(closure_for(opt, model, record=seen))
    _, g = ref_grad(model, theta)
    eps, offset = torch.zeros_like(g), 0
    hidden = {id(lin[1].weight), id(lin[2].weight)}
    others = torch.zeros_like(g, dtype=torch.bool)
    for p in model.parameters():
        n, sl = p.numel(), slice(offset, offset + p.numel())
        if id(p) in hidden:
            d_out, d_in = p.shape
            eps[sl] = (
                (0.2 * newton_schulz(g[sl].view(p.shape)) * max(1.0, d_out / d_in) ** 0.5)
                .double()
                .reshape(-1)
            )
        else:
            others[sl] = True
        offset += n
    eps[others] = 0.05 * g[others] / g[others].norm()
    # the iteration runs in float32
    torch.testing.assert_close(seen[1] - theta, eps, rtol=1e-5, atol=1e-7)
    _, d = ref_grad(model, theta + (seen[1] - theta))
    torch.testing.assert_close(flat(model.parameters()), theta - 0.1 * d, rtol=1e-9, atol=1e-12)


def test_spectral_sam_matrix_perturbations_have_the_spec_spectral_norm():
    """‖E_W‖₂ = ρ_s · sqrt(max(1, d_out/d_in)) up to the quintic's band of singular values, for
    conv kernels (reshaped to d_out × d_in·k·k) and tall and wide matrices; groups set
    ``hidden``."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv1d(2, 4, 3),
        nn.Conv1d(4, 12, 3),
        nn.Flatten(),
        nn.Linear(12 * 6, 30),
        nn.Linear(30, 5),
    ).double()
    hidden = [model[1].weight, model[3].weight]
    rest = [p for p in model.parameters() if all(p is not h for h in hidden)]
    opt = build(
        "spectral_sam",
        model,
        groups=[dict(params=hidden, hidden=True), dict(params=rest, hidden=False)],
        lr=0.0,
        rho_spectral=0.3,
    )
    x, y = torch.randn(8, 2, 10, dtype=torch.float64), torch.randint(0, 5, (8,))
    seen = {}
    opt.step(closure_for(opt, model, x=x, y=y, record=seen))
    offsets, i = {}, 0
    for p in model.parameters():
        offsets[id(p)] = (i, p)
        i += p.numel()
    theta = flat(model.parameters())
    for w in hidden:
        a, p = offsets[id(w)]
        e = (seen[1] - theta)[a : a + p.numel()].view(p.shape[0], -1)
        target = 0.3 * max(1.0, e.shape[0] / e.shape[1]) ** 0.5
        sv = torch.linalg.svdvals(e)
        assert 0.68 * target <= sv.max() <= 1.2 * target, sv / target
        kept = sv[sv > 1e-4 * target]  # G may be rank-deficient: msign is U Vᵀ on its range
        # every direction of G perturbed (≈ U Vᵀ), not just the top one
        assert kept.min() >= 0.5 * target


def test_msign_equals_muon_iteration_for_wide_tall_and_square_batches():
    """Wide matrices run the iteration on the short side's Gram matrix: the same iterates, so
    the result is the float64 iteration's up to float32 rounding (looser when ill-conditioned)."""
    from sam_runner.optim.spectral_sam import msign

    torch.manual_seed(0)
    # (1, 129, 400) and its transpose: a short side of 128 or more takes the half-product path
    for shape in [(3, 16, 120), (2, 120, 16), (2, 24, 30), (1, 9, 9), (1, 129, 400), (1, 400, 129)]:
        g = torch.randn(*shape, dtype=torch.float64)
        want = torch.stack([newton_schulz(m, dtype=torch.float64) for m in g])
        torch.testing.assert_close(msign(g).double(), want, rtol=0, atol=1e-5)
        g[0, :, 0] *= 1e3  # one dominant direction: a spread of singular values of 1e3
        want = torch.stack([newton_schulz(m, dtype=torch.float64) for m in g])
        assert torch.linalg.matrix_norm(msign(g).double() - want, ord=2).max() <= 1e-2


def test_symmetric_products_equal_the_full_product():
    from sam_runner.optim.spectral_sam import symmetric_mm

    torch.manual_seed(0)
    for m in (130, 257, 520):  # one, two and four row blocks
        g = torch.randn(2, m, 3 * m, dtype=torch.float64) / (3 * m) ** 0.5  # entries of S near 1
        s = g @ g.mT
        for x, y in [(g, g.mT), (s, s), (s, s @ s)]:
            got = symmetric_mm(x, y)
            torch.testing.assert_close(got, x @ y, rtol=1e-12, atol=1e-9)
            # row blocks of -(-m // (m // 128)) rows: entries a block or more off the diagonal are
            # mirrored
            if m >= 256:
                b = -(-m // min(4, m // 128))
                assert torch.equal(got.tril(-b), got.triu(b).mT)


def test_channels_last_conv_kernels_get_the_same_perturbation():
    """ε of a channels_last kernel (not contiguous as d_out × d_in·k·k) is filled by copy, alike."""
    import copy

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 4, 3),
        nn.ReLU(),
        nn.Conv2d(4, 4, 3),
        nn.ReLU(),
        nn.Conv2d(4, 5, 3),
        nn.Flatten(),
        nn.Linear(5 * 4 * 4, 3),
    )
    other = copy.deepcopy(model).to(memory_format=torch.channels_last)
    x, y = torch.randn(6, 3, 10, 10), torch.randint(0, 3, (6,))
    seen = {}
    for net in (model, other):
        opt = build("spectral_sam", net, lr=0.0, rho_spectral=0.3)
        record = {}
        opt.step(
            closure_for(
                opt,
                net,
                x=x.contiguous(memory_format=torch.channels_last) if net is other else x,
                y=y,
                record=record,
            )
        )
        seen[net is other] = record[1] - flat(net.parameters())
    assert not other[2].weight.is_contiguous()  # the case under test
    # conv sums in another order
    torch.testing.assert_close(seen[True], seen[False], rtol=1e-5, atol=1e-6)


class TokenNet(nn.Module):
    """A learned token (3-D, a root parameter) before the first layer, as in a ViT."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.token = nn.Parameter(0.1 * torch.randn(1, 1, 6))
        self.inp, self.mid1, self.mid2, self.head = (
            nn.Linear(6, 7),
            nn.Linear(7, 7),
            nn.Linear(7, 5),
            nn.Linear(5, 3),
        )
        self.double()

    def forward(self, x):
        x = (x + self.token[0]).relu()
        return self.head(self.mid2(self.mid1(self.inp(x).relu()).relu()).relu())


def test_spectral_sam_on_a_plain_list_reads_hidden_layers_off_the_bound_model():
    """Only mid1 and mid2 weights are hidden: the token, the input layer and the head get SAM's
    ε."""
    model = TokenNet()
    # plain list, model bound
    opt = build("spectral_sam", model, lr=0.0, rho=0.05, rho_spectral=0.2)
    theta, seen = flat(model.parameters()), {}
    opt.step(closure_for(opt, model, record=seen))
    _, g = ref_grad(model, theta)
    hidden, offset, eps = {id(model.mid1.weight), id(model.mid2.weight)}, 0, torch.zeros_like(g)
    others = torch.zeros_like(g, dtype=torch.bool)
    for p in model.parameters():
        sl = slice(offset, offset + p.numel())
        if id(p) in hidden:
            scale = 0.2 * max(1.0, p.shape[0] / p.shape[1]) ** 0.5
            eps[sl] = (scale * newton_schulz(g[sl].view(p.shape))).reshape(-1).double()
        else:
            others[sl] = True
        offset += p.numel()
    eps[others] = 0.05 * g[others] / g[others].norm()
    torch.testing.assert_close(seen[1] - theta, eps, rtol=1e-5, atol=1e-7)


def test_spectral_sam_schedules_the_spectral_radius_with_rho():
    """rho_schedule=cosine scales ρ_s by the same factor as ρ: on step k of T both radii are
    multiplied by ½(1 + cos(π (k − 1)/T)), and the last steps perturb little."""
    import math

    steps = 4
    model = mlp(depth=4, width=7)
    lin = [m for m in model if isinstance(m, nn.Linear)]
    opt = build(
        "spectral_sam",
        model,
        lr=0.0,
        rho=0.05,
        rho_spectral=0.2,
        rho_schedule="cosine",
        total_steps=steps,
    )
    for k in range(1, steps + 1):
        theta, seen = flat(model.parameters()), {}
        opt.step(closure_for(opt, model, record=seen))
        factor = 0.5 * (1 + math.cos(math.pi * (k - 1) / steps))
        _, g = ref_grad(model, theta)
        w = lin[1].weight  # a hidden matrix (7 × 7: the scale's sqrt(max(1, d_out/d_in)) is 1)
        offset = sum(
            p.numel()
            for p in list(model.parameters())[: [id(q) for q in model.parameters()].index(id(w))]
        )
        sl = slice(offset, offset + w.numel())
        expected = 0.2 * factor * newton_schulz(g[sl].view(w.shape)).double().reshape(-1)
        torch.testing.assert_close((seen[1] - theta)[sl], expected, rtol=1e-5, atol=1e-7)
