"""Training-set samplers: ``uniform`` (shuffle each epoch) and sampling-side methods.

A sampler sees the per-sample losses of every pass (``observe``) and may set the
loader's per-example weights at the end of each epoch (``end_epoch``).
"""
from __future__ import annotations

import torch

from .errors import require


class UniformSampler:
    """Plain shuffling: nothing to observe, nothing to change."""

    def observe(self, pass_index, idx, targets, per_sample_loss) -> None:
        pass

    def end_epoch(self, loader) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def log_values(self) -> dict:
        return {}


class SGSSampler:
    """Sharpness-Guided Equilibrium Sampling (SGS-SAM; known from its abstract).

    From the per-sample losses of both passes of a step, Δ_c = mean over the step's samples
    of class c of [ℓ(θ+ε) − ℓ(θ)]; S_c is its EMA (``beta``, updated each step for the
    classes present in that step). Class weight w_c = (n_c + 1)^(−α) · exp(−λ ẑ(S_c)),
    ẑ the z-score across classes, n_c the cumulative count of class c sampled so far. At
    the end of every epoch each example's sampling probability is set ∝ w_{y}; the
    loader then draws the next epoch's examples with replacement. No extra passes.
    Defaults α = 0.5, λ = 0.5 (spec/variants.md).

    From the abstract: raising the sampling probability of rarely sampled classes and
    lowering it for classes with large SAM-induced loss changes, from cumulative class
    counts and EMA sharpness estimates, refreshed on the sampling side. Ours: the weight
    formula, the per-step EMA with β = 0.9, ℓ(θ+ε) taken from the last pass of the step
    (the descent pass; EISAM's third), classes not yet observed get ẑ = 0, the first epoch
    is uniform, and under data parallelism S is averaged and counts summed across
    processes at the end of each epoch so that every process draws the same examples.
    Steps that do not perturb (one pass: ``optimizer=base`` or ``interval`` > 1) update
    only the counts. Config: ``dataset.sampler=sgs`` with options
    ``+dataset.sgs.alpha=...``, ``+dataset.sgs.lam=...``, ``+dataset.sgs.beta=...``.
    """

    def __init__(self, num_classes: int, alpha: float = 0.5, lam: float = 0.5, beta: float = 0.9, loader=None):
        require(alpha >= 0, f"dataset.sgs.alpha={alpha} must be >= 0")
        require(lam >= 0, f"dataset.sgs.lam={lam} must be >= 0")
        require(0 <= beta < 1, f"dataset.sgs.beta={beta} must be in [0, 1)")
        self.num_classes, self.alpha, self.lam, self.beta = num_classes, alpha, lam, beta
        self.loader = loader
        self.sharpness = None   # S_c
        self.observed = None    # whether S_c has been set
        self.counts = None      # n_c, cumulative
        self.class_weights = None
        self._pass0 = []   # (per-class loss sums, per-class counts) of recent pass-0 micro-batches
        self._later = {}   # pass index > 0 -> per-class loss sums of this step's micro-batches

    def _zeros(self, device):
        return torch.zeros(self.num_classes, device=device)

    def observe(self, pass_index, idx, targets, per_sample_loss) -> None:
        device = per_sample_loss.device
        if self.sharpness is None:
            self.sharpness, self.counts = self._zeros(device), self._zeros(device)
            self.observed = torch.zeros(self.num_classes, dtype=torch.bool, device=device)
        if pass_index == 0 and self._later:
            self._fold()  # a new step begins: the previous one is complete
        sums = self._zeros(device).index_add_(0, targets, per_sample_loss.detach().float())
        if pass_index == 0:
            counts = self._zeros(device).index_add_(0, targets, torch.ones(len(targets), device=device))
            self.counts += counts
            self._pass0.append((sums, counts))
        else:
            self._later.setdefault(pass_index, []).append(sums)

    def _fold(self) -> None:
        """Fold the finished step into S: Δ_c from pass 0 and the step's last pass, for the classes present.

        The step's pass-0 micro-batches are the last ones seen before its later passes (steps
        that did not perturb left pass-0 records only), paired micro-batch by micro-batch."""
        last = self._later[max(self._later)]
        first = self._pass0[-len(last):]
        loss0 = torch.stack([s for s, _ in first]).sum(0)
        count = torch.stack([c for _, c in first]).sum(0)
        delta = (torch.stack(last).sum(0) - loss0) / count.clamp_min(1)
        present = (count > 0) & torch.isfinite(delta)  # an fp16 overflow step teaches nothing
        ema = torch.where(self.observed, self.beta * self.sharpness + (1 - self.beta) * delta, delta)
        self.sharpness = torch.where(present, ema, self.sharpness)
        self.observed = self.observed | present
        self._pass0, self._later = [], {}

    def end_epoch(self, loader) -> None:
        if self.sharpness is None:
            return
        if self._later:
            self._fold()
        self._pass0 = []
        s, seen, counts = self._global()
        n_seen = seen.sum().clamp_min(1)
        mean = (s * seen).sum() / n_seen
        std = (((s - mean) * seen).square().sum() / n_seen).sqrt()
        z = torch.where(seen & (std > 0), (s - mean) / std.clamp_min(1e-12), torch.zeros_like(s))
        self.class_weights = (counts + 1).pow(-self.alpha) * torch.exp(-self.lam * z)
        self._apply(loader)

    def _apply(self, loader) -> None:
        if loader is not None and self.class_weights is not None:
            loader.weights = self.class_weights.to(loader.y.device)[loader.y]

    def _global(self):
        """(S, observed, n) over all processes: S averaged, counts summed; this process's own stay local."""
        import torch.distributed as dist
        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return self.sharpness, self.observed, self.counts
        s, seen, counts = self.sharpness.clone(), self.observed.float(), self.counts.clone()
        for t in (s, seen, counts):
            dist.all_reduce(t)
        return s / dist.get_world_size(), seen > 0, counts

    def state_dict(self) -> dict:
        return {"sharpness": self.sharpness, "observed": self.observed, "counts": self.counts,
                "class_weights": self.class_weights}

    def load_state_dict(self, state: dict) -> None:
        if not state:
            return
        self.sharpness, self.observed = state["sharpness"], state["observed"]
        self.counts, self.class_weights = state["counts"], state["class_weights"]
        self._apply(self.loader)

    def log_values(self) -> dict:
        if self.class_weights is None:
            return {}
        w = self.class_weights
        return {"sgs_weight_ratio": float(w.max() / w.min())}


def _sgs(cfg, data):
    from .data import TensorLoader
    require(isinstance(data.train, TensorLoader),
            f"dataset.sampler=sgs needs an in-memory dataset (mnist1d, digits, cifar10, cifar100, cifar100_lt), "
            f"not dataset={cfg.name}")
    opts = dict(cfg.get("sgs") or {})
    unknown = set(opts) - {"alpha", "lam", "beta"}
    require(not unknown, f"dataset.sgs has unknown keys {sorted(unknown)}; accepted: alpha, lam, beta")
    return SGSSampler(data.num_classes, loader=data.train,
                      **{k: float(v) for k, v in opts.items()})


SAMPLERS = {"uniform": lambda cfg, data: UniformSampler(), "sgs": _sgs}


def build_sampler(cfg, data):
    name = cfg.get("sampler", "uniform")
    require(name in SAMPLERS, f"dataset.sampler={name!r} is unknown; choose one of {', '.join(SAMPLERS)}")
    return SAMPLERS[name](cfg, data)
