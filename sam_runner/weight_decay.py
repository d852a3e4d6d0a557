"""Layer-wise weight decay (``weight_decay=<name>``): ``constant`` (every parameter group at
``base_optimizer.weight_decay``, the runner's rule) or ``ouidecay`` (Fernández-Hernández et al.
2025: each conv and linear layer's coefficient rescaled from its OUI; docs/weight_decay.md).

OUI is collected by forward hooks on the tracked layers during the training forward of the
first pass (never the second SAM pass, a regularizer's forward, evaluation or the curvature
measurement), only on the steps whose value can reach an update (the ``window`` steps before
each one), plus step 1 and the last step of each epoch for the logged ``oui``. A collected
step sums each unit's positive count over the step's micro-batches and, under data parallel,
over the processes (one all-reduce): the OUI is the whole batch's, on every process alike.
"""

from __future__ import annotations

import contextlib
import math
from collections import OrderedDict, deque
from typing import TYPE_CHECKING

import torch
from torch import nn

from .errors import integer, number, require
from .metrics.oui import oui_from_counts
from .part import Part
from .registry import WEIGHT_DECAYS

if TYPE_CHECKING:
    from collections.abc import Iterator

    from omegaconf import DictConfig

    from .clock import Clock
    from .distributed import Topology
    from .part import Run

TRACKED = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear)
POSITIONS = ("random", "first")


def tracked_layers(model: nn.Module, trainable: bool = True) -> OrderedDict:
    """``{name: module}`` of the conv and linear layers with a (``trainable``: trainable) weight
    of ≥ 2 dims, in model order (the first layer and the head included)."""
    out = OrderedDict()
    for name, m in model.named_modules():
        w = getattr(m, "weight", None)
        if name and isinstance(m, TRACKED) and isinstance(w, nn.Parameter):
            if (w.requires_grad or not trainable) and w.ndim > 1:
                out[name] = m
    return out


class OUIDecay(Part):
    """Every ``every`` steps, λ_l = λ·(s1 + (s2 − s1)·(o_l − min o)/(max o − min o + eps)) for each
    tracked layer l, where o_l is the mean OUI of its last ``window`` collected steps and λ the
    base coefficient; ``rescale=False`` (``metrics.oui``): OUI is logged, nothing rescaled."""

    name = "weight_decay"

    def __init__(
        self,
        every: int = 256,
        window: int = 5,
        scale_min: float = 0.6666,
        scale_max: float = 5.0,
        eps: float = 1e-8,
        positions: str = "random",
        rescale: bool = True,
    ) -> None:
        self.every, self.window, self.eps = int(every), int(window), float(eps)
        self.scale_min, self.scale_max = float(scale_min), float(scale_max)
        self.positions, self.rescale = positions, rescale
        self.queue: deque = deque(maxlen=self.window)  # per-step OUI vectors [layers], float64
        self.latest = None  # the last collected step's OUI vector
        self.coefficients: dict[str, float] = {}
        self.active, self.counts, self.seen = False, {}, {}

    # ---------------------------------------------------------------- building
    def param_groups(self, groups: list[dict], model: nn.Module) -> list[dict]:
        """The runner's parameter groups with each tracked layer's weight in a group of its own
        (``layer``: its name; the other keys kept), so the base optimizer decays it alone."""
        self.layers = tracked_layers(model)
        if not self.rescale:  # logging only: the runner's groups as they are
            return groups
        require(
            bool(self.layers),
            "weight_decay=ouidecay needs a model with conv or linear layers (their OUI drives "
            "the coefficients); this model has none: use weight_decay=constant",
        )
        from .optim.build import subgroup

        names = {id(m.weight): n for n, m in self.layers.items()}
        out = []
        for g in groups:
            rest = [i for i, p in enumerate(g["params"]) if id(p) not in names]
            for i, p in enumerate(g["params"]):
                if id(p) in names:
                    out.append(subgroup(g, [i], layer=names[id(p)]))
            if rest:
                out.append(subgroup(g, rest))
        return out

    def attach(self, run: Run) -> None:
        """Hooks on the tracked layers; the base coefficient from the optimizer's groups."""
        per_epoch = run.loop.steps_per_epoch
        self.bind(run.model, run.optimizer, run.dist, run.cfg.seed, run.clock, per_epoch)

    def bind(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        dist: Topology,
        seed: int,
        clock: Clock,
        steps_per_epoch: int = 0,
    ) -> None:
        """``attach`` outside a run (a model, its optimizer, the processes, the clock)."""
        self.optimizer, self.dist, self.seed, self.clock = optimizer, dist, int(seed), clock
        self.steps_per_epoch = int(steps_per_epoch)
        if not hasattr(self, "layers"):  # logging only: the groups were not split
            self.layers = tracked_layers(model)
        self.names = list(self.layers)
        self.base = {g["layer"]: g["weight_decay"] for g in optimizer.param_groups if "layer" in g}
        self.coefficients = dict(self.base)
        self.generator = torch.Generator()
        for name, m in self.layers.items():
            m.register_forward_hook(self._hook(name, isinstance(m, nn.Linear)))

    # ---------------------------------------------------------------- collecting
    def due(self, step: int) -> bool:
        """Whether step ``step`` (1-based) is collected."""
        to_update = -step % self.every  # steps from this one to the next update
        n = self.steps_per_epoch
        epoch_end = (n and step % n == 0) or step == self.clock.total_steps
        return step == 1 or (self.rescale and to_update < self.window) or bool(epoch_end)

    @contextlib.contextmanager
    def forward_context(self, pass_index: int) -> Iterator[None]:
        """Around the training forward: the hooks count when this is a collected step's first
        pass."""
        step = self.clock.step + 1
        self.active = pass_index == 0 and self.due(step)
        if self.active and not self.counts:  # the step's first micro-batch: its positions' seed
            self.generator.manual_seed((self.seed * 1_000_003 + step) * 10_007 + self.dist.rank)
        try:
            yield
        finally:
            self.active = False

    def features(self, output: torch.Tensor, linear: bool) -> torch.Tensor:
        """``[b, units]`` of a layer's output: a linear layer's as it is ([b, features]; with
        tokens, one token per sample), a convolution's at one position per sample ([b, C])."""
        if output.ndim == 2:
            return output
        b = output.shape[0]
        flat = output.reshape(b, -1, output.shape[-1]) if linear else output.flatten(2)
        n = flat.shape[1] if linear else flat.shape[2]
        if self.positions == "first":
            at = torch.zeros(b, dtype=torch.long)
        else:
            at = torch.randint(n, (b,), generator=self.generator)
        at = at.to(output.device)
        if linear:  # [b, tokens, features]
            return flat[torch.arange(b, device=output.device), at]
        return flat.gather(2, at.view(b, 1, 1).expand(-1, flat.shape[1], 1)).squeeze(2)

    def _hook(self, name: str, linear: bool):
        def hook(module, inputs, output):  # noqa: ARG001 (torch's hook signature)
            if not self.active or not torch.is_tensor(output) or output.ndim < 2:
                return
            with torch.no_grad():
                positive = (self.features(output.detach(), linear) > 0).sum(0)
            self.counts[name] = self.counts.get(name, 0) + positive
            self.seen[name] = self.seen.get(name, 0) + output.shape[0]

        return hook

    def after_step(self, step: int) -> None:
        """After the optimizer's step ``step``: the collected step's OUI per layer (the
        processes' counts summed: one all-reduce), then, every ``every`` steps, the rescale."""
        if self.counts:
            self.latest = self._step_oui()
            self.queue.append(self.latest)
            self.counts, self.seen = {}, {}
        if self.rescale and step % self.every == 0 and self.queue:
            self.update()

    def _step_oui(self) -> torch.Tensor:
        names = [n for n in self.names if n in self.counts]
        counts = [self.counts[n].double() for n in names]
        seen = torch.tensor([float(self.seen[n]) for n in names], dtype=torch.float64,
                            device=counts[0].device)  # fmt: skip
        flat = self.dist.sum(torch.cat([*counts, seen]))
        parts = flat[: -len(names)].split([c.numel() for c in counts])
        values = {n: oui_from_counts(p, b) for n, p, b in zip(names, parts, flat[-len(names) :])}
        nan = torch.full((), math.nan, dtype=torch.float64, device=flat.device)
        return torch.stack([values.get(n, nan) for n in self.names])

    def scales(self, smoothed: torch.Tensor) -> torch.Tensor:
        """The rule: s1 + (s2 − s1)·(o − min o)/(max o − min o + eps) per layer."""
        lo, hi = smoothed.min(), smoothed.max()
        return self.scale_min + (self.scale_max - self.scale_min) * (smoothed - lo) / (
            hi - lo + self.eps
        )

    def update(self) -> None:
        """Set each tracked layer's group to base·scale (one host sync, every ``every`` steps)."""
        smoothed = torch.stack(list(self.queue)).nanmean(0)
        scale = self.scales(smoothed).tolist()
        self.coefficients = {n: self.base[n] * s for n, s in zip(self.names, scale)}
        for g in self.optimizer.param_groups:
            if "layer" in g:
                g["weight_decay"] = self.coefficients[g["layer"]]

    # ---------------------------------------------------------------- the run's files
    def log_values(self) -> dict:
        """``oui``: the mean over the tracked layers of the last collected step's OUI."""
        if self.latest is None:
            return {}
        return {"oui": float(self.latest.nanmean())}

    def summary_values(self, last: dict) -> dict:  # noqa: ARG002 (the hook's signature)
        """The final per-layer decay coefficients (nothing when only logging)."""
        if not self.rescale:
            return {}
        return {"weight_decay_layers": dict(self.coefficients)}

    def state_dict(self) -> dict:
        """The OUI queue, the latest values and the coefficients, for a checkpoint."""
        return {
            "queue": [v.cpu() for v in self.queue],
            "latest": None if self.latest is None else self.latest.cpu(),
            "coefficients": dict(self.coefficients),
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore the queue, the latest values and the coefficients from a checkpoint."""
        device = next(p.device for g in self.optimizer.param_groups for p in g["params"])
        self.queue = deque((v.to(device) for v in state["queue"]), maxlen=self.window)
        latest = state["latest"]
        self.latest = None if latest is None else latest.to(device)
        self.coefficients = dict(state["coefficients"])
        if self.rescale:
            for g in self.optimizer.param_groups:
                if "layer" in g:
                    g["weight_decay"] = self.coefficients[g["layer"]]


@WEIGHT_DECAYS.register("constant", "base_optimizer.weight_decay on every parameter (default)")
def constant(
    cfg: DictConfig,  # noqa: ARG001
    base_weight_decay: float | None = None,  # noqa: ARG001
    log_oui: bool = False,
) -> OUIDecay | None:
    """The base optimizer's own decay: no part, or OUI logging alone with ``metrics.oui``."""
    return OUIDecay(rescale=False) if log_oui else None  # the optimizer's own decay: no part


@WEIGHT_DECAYS.register("ouidecay", "each conv/linear layer's decay rescaled by its OUI")
def ouidecay(
    cfg: DictConfig,  # noqa: ARG001
    base_weight_decay: float | None = None,
    log_oui: bool = False,  # noqa: ARG001
) -> OUIDecay:
    """OUI-driven per-layer decay: each tracked layer's coefficient rescaled from its OUI."""
    require(
        base_weight_decay is None or base_weight_decay > 0,
        f"weight_decay=ouidecay rescales base_optimizer.weight_decay={base_weight_decay!r}: "
        "nothing to rescale at 0; set base_optimizer.weight_decay > 0",
    )
    every = integer("weight_decay.every_n_steps", cfg.get("every_n_steps", 256), "an integer >= 1",
                    lambda n: n >= 1)  # fmt: skip
    window = integer("weight_decay.window", cfg.get("window", 5), "an integer >= 1",
                     lambda n: n >= 1)  # fmt: skip
    lo = number("weight_decay.scale_min", cfg.get("scale_min", 0.6666), "a finite number >= 0",
                lambda v: 0 <= v < math.inf)  # fmt: skip
    hi = number("weight_decay.scale_max", cfg.get("scale_max", 5.0),
                f"a finite number >= weight_decay.scale_min ({lo})",
                lambda v: lo <= v < math.inf)  # fmt: skip
    positions = cfg.get("positions", "random")
    require(
        positions in POSITIONS,
        f"weight_decay.positions={positions!r} is unknown; choose {', '.join(POSITIONS)}",
    )
    return OUIDecay(every, window, lo, hi, positions=positions)


def build_part(run: Run) -> OUIDecay | None:
    """The run's weight-decay part (None for the base optimizer's constant decay)."""
    return build_weight_decay(run.cfg)


def check(cfg: DictConfig, where: object = None) -> None:  # noqa: ARG001 (every check's signature)
    """Validate the ``weight_decay`` group (every check's signature)."""
    build_weight_decay(cfg)


def build_weight_decay(cfg: DictConfig) -> OUIDecay | None:
    """The ``weight_decay`` group's rule for a run's composed config (absent: constant), keys
    checked; ``metrics.oui=true`` adds OUI logging to ``constant``; None: constant, nothing
    to do."""
    wd_cfg = cfg.get("weight_decay") or {"name": "constant"}
    base = cfg.base_optimizer.get("weight_decay", 0.0) if "base_optimizer" in cfg else None
    log_oui = bool((cfg.get("metrics") or {}).get("oui", False))
    return WEIGHT_DECAYS.build(wd_cfg.get("name", "constant"), wd_cfg, base, log_oui)
