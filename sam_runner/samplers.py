"""Training-set samplers: ``uniform`` (shuffle each epoch) and sampling-side methods.

A sampler sees the per-sample losses of every pass (``observe``) and may set the
loader's per-example weights at the end of each epoch (``end_epoch``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from typing_extensions import override

from .errors import number, require
from .part import Part
from .registry import SAMPLERS

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from .data import Data
    from .data.loaders import FolderLoader, TensorLoader
    from .part import Run


class UniformSampler(Part):
    """Plain shuffling: nothing to observe, nothing to change (a part all the same: the
    checkpoint has always held the sampler's state, empty here)."""

    name = "sampler"
    loader = None  # the training loader (set by build_part)


class SGSSampler(UniformSampler):
    """Sharpness-Guided Equilibrium Sampling (SGS-SAM; known from its abstract).

    From the per-sample losses of both passes of a step, Δ_c = mean over the step's samples
    of class c of [ℓ(θ+ε) − ℓ(θ)]; S_c is its EMA (``beta``, updated each step for the
    classes present in that step). Class weight w_c = (n_c + 1)^(−α) · exp(−λ ẑ(S_c)),
    ẑ the z-score across classes, n_c the cumulative count of class c sampled so far. At
    the end of every epoch each example's sampling probability is set ∝ w_{y}; the
    loader then draws the next epoch's examples with replacement. No extra passes.
    Defaults α = 0.5, λ = 0.5 (docs/variants.md).

    From the abstract: raising the sampling probability of rarely sampled classes and
    lowering it for classes with large SAM-induced loss changes, from cumulative class
    counts and EMA sharpness estimates, refreshed on the sampling side. Ours: the weight
    formula, the per-step EMA with β = 0.9, ℓ(θ+ε) taken from the last pass of the step
    (the descent pass; EISAM's third), classes not yet observed get ẑ = 0, the first epoch
    is uniform, and under data parallelism each step's class sums and counts are summed over
    the processes (once, at the end of the epoch): S and n are those of the global batches,
    the same on every process, so every process draws the same examples and rank 0's
    checkpoint resumes exactly.
    Steps that do not perturb (one pass: ``optimizer=base`` or ``interval`` > 1) update
    only the counts. Config: ``dataset.sampler=sgs`` with options ``dataset.sgs.alpha=...``,
    ``dataset.sgs.lam=...``, ``dataset.sgs.beta=...`` (every dataset config already has these
    keys, from conf/common/dataset.yaml, so they are set without ``+``: Hydra refuses to add a
    key that exists).
    """

    def __init__(
        self,
        num_classes: int,
        alpha: float = 0.5,
        lam: float = 0.5,
        beta: float = 0.9,
        loader: TensorLoader | FolderLoader | None = None,
    ) -> None:
        require(alpha >= 0, f"dataset.sgs.alpha={alpha} must be >= 0")
        require(lam >= 0, f"dataset.sgs.lam={lam} must be >= 0")
        require(0 <= beta < 1, f"dataset.sgs.beta={beta} must be in [0, 1)")
        self.num_classes, self.alpha, self.lam, self.beta = num_classes, alpha, lam, beta
        self.loader = loader
        self.sharpness = None  # S_c
        self.observed = None  # whether S_c has been set
        self.counts = None  # n_c, cumulative
        self.class_weights = None
        self._pass0 = []  # (per-class loss sums, per-class counts) of recent pass-0 micro-batches
        self._later = {}  # pass index > 0 -> per-class loss sums of this step's micro-batches
        # this epoch's finished perturbing steps: [pass-0 sums, last-pass sums, counts]
        self._steps = []
        self._new = None  # this epoch's pass-0 class counts, not yet in ``counts``

    def _zeros(self, device):
        return torch.zeros(self.num_classes, device=device)

    @override
    def observe(
        self,
        pass_index: int,
        idx: torch.Tensor,
        targets: torch.Tensor,
        per_sample_loss: torch.Tensor,
    ) -> None:
        """Add a pass's per-sample losses to its class sums (and the first pass's class counts);
        a step's sums are folded into the estimates once complete."""
        device = per_sample_loss.device
        if self.sharpness is None:
            self.sharpness, self.counts = self._zeros(device), self._zeros(device)
            self.observed = torch.zeros(self.num_classes, dtype=torch.bool, device=device)
        if self._new is None:
            self._new = self._zeros(device)
        if pass_index == 0 and self._later:
            self._close_step()  # a new step begins: the previous one is complete
        sums = self._zeros(device).index_add_(0, targets, per_sample_loss.detach().float())
        if pass_index == 0:
            counts = self._zeros(device).index_add_(
                0, targets, torch.ones(len(targets), device=device)
            )
            self._new += counts
            self._pass0.append((sums, counts))
        else:
            self._later.setdefault(pass_index, []).append(sums)

    def _close_step(self) -> None:
        """Record the finished step's per-class sums: pass 0 and its last pass, paired micro-batch
        by
        micro-batch. Its pass-0 micro-batches are the last ones seen before its later passes (steps
        that did not perturb left pass-0 records only)."""
        last = self._later[max(self._later)]
        first = self._pass0[-len(last) :]
        self._steps.append(
            torch.stack(
                [
                    torch.stack([s for s, _ in first]).sum(0),
                    torch.stack(last).sum(0),
                    torch.stack([c for _, c in first]).sum(0),
                ]
            )
        )
        self._pass0, self._later = [], {}

    def _fold(self, loss0, loss1, count) -> None:
        """Fold one step's (global) class sums into S: Δ_c for the classes present."""
        delta = (loss1 - loss0) / count.clamp_min(1)
        present = (count > 0) & torch.isfinite(delta)  # an fp16 overflow step teaches nothing
        ema = torch.where(
            self.observed, self.beta * self.sharpness + (1 - self.beta) * delta, delta
        )
        self.sharpness = torch.where(present, ema, self.sharpness)
        self.observed = self.observed | present

    @override
    def end_epoch(self, loader: TensorLoader | FolderLoader | None = None) -> None:
        """Set the loader's per-example weights from the classes' sharpness for the next epoch."""
        loader = loader if loader is not None else self.loader
        if self._new is None:  # nothing observed since the last epoch's end
            return
        if self._later:
            self._close_step()
        device = self._new.device
        steps = (
            torch.stack(self._steps)
            if self._steps
            else torch.zeros(0, 3, self.num_classes, device=device)
        )
        steps, new = self._sum_over_processes(steps, self._new)
        for loss0, loss1, count in steps:  # in step order: the same EMA as folding step by step
            self._fold(loss0, loss1, count)
        self.counts = self.counts + new
        self._pass0, self._steps, self._new = [], [], None
        s, seen = self.sharpness, self.observed
        n_seen = seen.sum().clamp_min(1)
        mean = (s * seen).sum() / n_seen
        std = (((s - mean) * seen).square().sum() / n_seen).sqrt()
        z = torch.where(seen & (std > 0), (s - mean) / std.clamp_min(1e-12), torch.zeros_like(s))
        self.class_weights = (self.counts + 1).pow(-self.alpha) * torch.exp(-self.lam * z)
        self._apply(loader)

    def _apply(self, loader) -> None:
        if loader is not None and self.class_weights is not None:
            loader.weights = self.class_weights.to(loader.y.device)[loader.y]

    @staticmethod
    def _sum_over_processes(steps, new):
        """The epoch's per-step class sums and counts summed over all processes (one all-reduce):
        S and n are then those of the global batches, the same on every process and in the
        checkpoint."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
            return steps, new
        flat = torch.cat([steps.flatten(), new])
        dist.all_reduce(flat)  # every process runs the same steps, so the sizes agree
        return flat[: -len(new)].view_as(steps), flat[-len(new) :]

    @override
    def state_dict(self) -> dict:
        """The sharpness estimates and class weights, for a checkpoint."""
        return {
            "sharpness": self.sharpness,
            "observed": self.observed,
            "counts": self.counts,
            "class_weights": self.class_weights,
        }

    @override
    def load_state_dict(self, state: dict) -> None:
        """Restore the sharpness estimates and class weights, on the labels' device."""
        if not state:
            return
        # a checkpoint is read onto the CPU; the state lives where the loader's labels (and the
        # losses) are
        device = self.loader.y.device if self.loader is not None else None
        to = lambda t: t if t is None or device is None else t.to(device)
        self.sharpness, self.observed = to(state["sharpness"]), to(state["observed"])
        self.counts, self.class_weights = to(state["counts"]), to(state["class_weights"])
        self._apply(self.loader)

    @override
    def log_values(self) -> dict:
        """The ratio of the largest class weight to the smallest (nothing before the first
        epoch's end)."""
        if self.class_weights is None:
            return {}
        w = self.class_weights
        return {"sgs_weight_ratio": float(w.max() / w.min())}


@SAMPLERS.register("uniform", "plain shuffling each epoch")
def uniform(_cfg: DictConfig, _data: Data) -> UniformSampler:
    """``uniform``: every example equally likely (the loader's own order)."""
    return UniformSampler()


def sgs_options(cfg: DictConfig) -> dict:
    """``dataset.sgs`` checked: the keys SGSSampler takes, as numbers."""
    opts = dict(cfg.get("sgs") or {})
    unknown = set(opts) - {"alpha", "lam", "beta"}
    require(
        not unknown, f"dataset.sgs has unknown keys {sorted(unknown)}; accepted: alpha, lam, beta"
    )
    return {k: number(f"dataset.sgs.{k}", v, "a number", math.isfinite) for k, v in opts.items()}


@SAMPLERS.register(
    "sgs", "sharpness-guided equilibrium sampling for long tails (SGS-SAM)", check=sgs_options
)
def sgs(cfg: DictConfig, data: Data) -> SGSSampler:
    """``sgs``: classes sampled by their sharpness, on a loader that samples by index."""
    # every loader of data/ samples by index: TensorLoader and FolderLoader both take per-example
    # weights and know their labels (y)
    require(
        hasattr(data.train, "weights") and hasattr(data.train, "y"),
        f"dataset.sampler=sgs needs a loader that samples by index (per-example weights), not "
        f"{type(data.train).__name__} of dataset={cfg.name}",
    )
    return SGSSampler(data.num_classes, loader=data.train, **sgs_options(cfg))


def build_sampler(cfg: DictConfig, data: Data) -> UniformSampler:
    """The sampler ``dataset.sampler`` names (``uniform`` when unset)."""
    return SAMPLERS.build(cfg.get("sampler", "uniform"), cfg, data)


def build_part(run: Run) -> UniformSampler:
    """The run's sampler, bound to its training loader."""
    sampler = build_sampler(run.cfg.dataset, run.data)
    sampler.loader = run.data.train  # the loader whose per-example weights it sets
    return sampler


def check(cfg: DictConfig, where: object = None) -> None:  # noqa: ARG001 (every check's signature)
    """The chosen sampler's keys (every check's signature)."""
    entry = SAMPLERS.entry(cfg.dataset.get("sampler", "uniform"))
    if entry.meta.get("check"):
        entry.check(cfg.dataset)
