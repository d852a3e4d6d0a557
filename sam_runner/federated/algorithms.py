"""The server's algorithms (``federated=<name>``): what each changes in a client's local step and
in the server's update. Every client step is the run's own optimizer (any SAM variant over any
base, the shared engine's ``step``); an algorithm only filters ε (``filter_``), adjusts the
gradients a step perturbs and descends along (``adjust``), and turns the clients' weighted mean
into the new global weights (``server_update``)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from ..errors import integer, number, require
from ..registry import FEDERATED

if TYPE_CHECKING:
    from omegaconf import DictConfig


class Centralized:
    """``federated=none``: no federation; the run trains as it always has."""

    enabled = False


class FedAvg:
    """FedAvg (McMahan et al. 2017): θ ← θ + η_s·(Σ_k n_k θ_k / Σ_k n_k − θ), a ``lerp`` (exact at
    η_s = 1: the weighted mean itself). With a SAM variant as the local optimizer it is FedSAM
    (Caldarola et al. 2022; Qu et al. 2022), with ASAM FedASAM."""

    enabled = True
    perturbs = False  # whether the algorithm needs a perturbing optimizer (not optimizer=base)

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        self.server_lr = float(cfg.server_lr)

    def begin_round(self, names: dict, lr: float) -> None:
        """Called before a round's clients run: ``names`` maps id(parameter) → its name."""

    def filter_(self, eps: list) -> None:
        """Change a client's ε in place before the perturbed pass (here: nothing)."""

    def adjust(self, params: list, grads: list) -> list:  # noqa: ARG002 (the hook's signature)
        """The gradients a client step uses in place of ``grads`` (here: ``grads`` themselves)."""
        return grads

    def server_update(self, global_: list, mean: list, names: list, lr: float) -> list:  # noqa: ARG002
        """The new global float tensors from the old ones and the clients' weighted mean
        (``names``: each tensor's parameter name, None for a buffer). Buffers (BatchNorm's running
        statistics) are the clients' mean whatever the server's step: a server_lr > 1 could push
        a running variance below zero."""
        torch._foreach_lerp_(global_, mean, self.server_lr)
        return [g if n else m for g, m, n in zip(global_, mean, names)]

    def state_dict(self) -> dict:
        """Nothing: FedAvg keeps no state between rounds."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore."""
        pass


def low_frequency_removed_(t: torch.Tensor, cutoff: float) -> None:
    """Zero the lowest ``cutoff`` share of the rFFT bins (DC first) of ``t`` flattened, in
    place."""
    flat = t.reshape(-1)
    spectrum = torch.fft.rfft(flat.to(torch.promote_types(t.dtype, torch.float32)))
    k = math.ceil(cutoff * spectrum.numel())
    if k == 0:
        return
    spectrum[:k] = 0
    flat.copy_(torch.fft.irfft(spectrum, n=flat.numel()).to(t.dtype))


class FedFFT(FedAvg):
    """FedFFT: each tensor of a client's ε loses its lowest ``fft_cutoff`` share of frequencies
    along the flattened tensor before the perturbed pass (the low frequencies are where the
    clients' perturbations disagree); ε is not rescaled. Cutoff 0: FedSAM exactly (no
    transform runs)."""

    perturbs = True

    def __init__(self, cfg: DictConfig) -> None:
        super().__init__(cfg)
        self.cutoff = float(cfg.fft_cutoff)

    def filter_(self, eps: list) -> None:
        """Zero the lowest ``fft_cutoff`` share of each ε tensor's frequencies, in place (nothing
        at cutoff 0)."""
        if self.cutoff == 0:
            return
        for e in eps:
            low_frequency_removed_(e, self.cutoff)


class FedVSSAM(FedAvg):
    """FedVSSAM, as we formulate it: the global direction v = −Δ/(s·η) (the last server update
    per local step, in gradient units); a client's adjusted direction a = (1 − c)·g + c·v is what
    ε is built from (local flatness search) and what the base step descends along, with g the
    perturbed gradient there (local descent); the server update is Δ = (1 − m)·Δ_round +
    m·Δ_previous (global update) on the parameters, the buffers being the clients' mean. The
    clients' directions share c·v, so their spread is
    (1 − c) times FedSAM's. c = 0 and m = 0: FedSAM exactly."""

    perturbs = True

    def __init__(self, cfg: DictConfig) -> None:
        super().__init__(cfg)
        self.c, self.m = float(cfg.correction), float(cfg.server_momentum)
        self.steps = int(cfg.local_steps)
        self.direction: dict = {}  # parameter name → v (empty before the first update)
        self.previous: list | None = None  # Δ_previous over the float state tensors
        self._v: dict = {}  # id(parameter) → v, for this round's clients

    def begin_round(self, names: dict, lr: float) -> None:  # noqa: ARG002 (the hook's signature)
        """Take the server's direction of each parameter for the round's client steps."""
        self._v = {pid: self.direction[n] for pid, n in names.items() if n in self.direction}

    def adjust(self, params: list, grads: list) -> list:
        """Each gradient moved towards the server's direction by ``correction`` (unchanged at 0)."""
        if self.c == 0 or not self._v:
            return grads
        return [
            torch.lerp(g, self._v[id(p)], self.c) if id(p) in self._v else g
            for p, g in zip(params, grads)
        ]

    def server_update(self, global_: list, mean: list, names: list, lr: float) -> list:
        """The new global weights: the clients' mean update with server momentum (FedAvg's at 0);
        the direction kept for the next round."""
        delta = torch._foreach_sub(mean, global_)
        if self.m > 0 and self.previous is not None:
            torch._foreach_lerp_(delta, self.previous, self.m)
        self.previous = delta
        self.direction = {n: -d / (self.steps * lr) for n, d in zip(names, delta) if n}
        if self.m == 0:  # FedAvg's own server step, bit for bit
            return super().server_update(global_, mean, names, lr)
        torch._foreach_add_(global_, delta, alpha=self.server_lr)
        # buffers (BatchNorm's running statistics) are the clients' mean: a momentum could push
        # a running variance below zero
        return [g if n else m for g, m, n in zip(global_, mean, names)]

    def state_dict(self) -> dict:
        """The server's directions and last update."""
        return {"direction": self.direction, "previous": self.previous}

    def load_state_dict(self, state: dict) -> None:
        """Restore the server's directions and last update."""
        self.direction, self.previous = dict(state["direction"]), state["previous"]


@FEDERATED.register("none", "no federation: one centralized run (default)")
def none(cfg: DictConfig | None) -> Centralized:  # noqa: ARG001 (every entry's signature)
    """No federation: centralized training."""
    return Centralized()


@FEDERATED.register("fedavg", "FedAvg over simulated clients (optimizer=sam: FedSAM)")
def fedavg(cfg: DictConfig) -> FedAvg:
    """Federated averaging."""
    return FedAvg(cfg)


@FEDERATED.register("fedfft", "FedAvg + the low frequencies of each client's ε removed")
def fedfft(cfg: DictConfig) -> FedFFT:
    """FedAvg with the low frequencies of each client's ε removed."""
    return FedFFT(cfg)


@FEDERATED.register("fedvssam", "FedAvg + a variance-suppressed direction, local and global")
def fedvssam(cfg: DictConfig) -> FedVSSAM:
    """FedAvg with a variance-suppressed direction, local and global."""
    return FedVSSAM(cfg)


def check(cfg: DictConfig) -> None:
    """The ``federated`` group's keys, and what a federated run cannot be combined with: one line
    each, before anything is written."""
    f = cfg.get("federated")
    name = "none" if f is None else f.get("name", "none")
    FEDERATED.entry(name)
    if name == "none":
        return
    integer("federated.clients", f.clients, "an integer >= 1", lambda n: n >= 1)
    integer("federated.rounds", f.rounds, "an integer >= 1", lambda n: n >= 1)
    integer("federated.local_steps", f.local_steps, "an integer >= 1", lambda n: n >= 1)
    integer("federated.eval_every", f.eval_every, "an integer >= 1", lambda n: n >= 1)
    number("federated.participation", f.participation, "a number in (0, 1]", lambda p: 0 < p <= 1)
    a = f.dirichlet_alpha
    if a is not None:
        number("federated.dirichlet_alpha", a, "null (IID) or a number > 0",
               lambda x: 0 < x < math.inf)  # fmt: skip
    number("federated.server_lr", f.server_lr, "a finite number > 0", lambda x: 0 < x < math.inf)
    number("federated.measure_cutoff", f.measure_cutoff, "a number in (0, 1)", lambda x: 0 < x < 1)
    if name == "fedfft":
        number("federated.fft_cutoff", f.fft_cutoff, "a number in [0, 1)", lambda x: 0 <= x < 1)
    if name == "fedvssam":
        number("federated.correction", f.correction, "a number in [0, 1]", lambda x: 0 <= x <= 1)
        number("federated.server_momentum", f.server_momentum, "a number in [0, 1)",
               lambda x: 0 <= x < 1)  # fmt: skip
    _check_combination(cfg, name)


def _check_combination(cfg, name: str) -> None:
    from ..registry import VARIANTS

    variant = str(cfg.optimizer.name)
    perturbs = VARIANTS.entry(variant).passes > 1
    require(
        perturbs or name == "fedavg",
        f"federated={name} filters or adjusts the SAM perturbation, and optimizer={variant} has "
        "none; choose a SAM variant (optimizer=sam, asam, ...) or federated=fedavg",
    )
    t = cfg.trainer
    devices = t.get("devices", 1)
    require(
        devices == 1,
        f"trainer.devices={devices} with federated={name}: a federated run is one process (its "
        "clients run one after another); not supported yet, use trainer.devices=1",
    )
    for key, plain in (("weight_averaging", "none"), ("steps", None)):
        value = t.get(key, plain)
        require(
            value == plain,
            f"trainer.{key}={value} with federated={name}: not supported (rounds are the budget "
            "and the global model is what is measured); leave it at its default",
        )
    wd = cfg.get("weight_decay", {}).get("name", "constant")
    require(
        wd == "constant",
        f"weight_decay={wd} with federated={name}: not supported; use weight_decay=constant",
    )
    sampler = cfg.dataset.get("sampler", "uniform")
    require(
        sampler == "uniform",
        f"dataset.sampler={sampler} with federated={name}: not supported; clients draw uniformly",
    )
