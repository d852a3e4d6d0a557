"""Curvature measured during training: when, on which samples, with which warm start.

Every measurement runs on the same fixed, seeded subset of the training set
(``metrics.hessian.num_samples``, capped at the training set), in fp32 without
augmentation, with the plain cross-entropy (no label smoothing), BatchNorm in eval mode
(``bn_mode=eval``, default) or with batch statistics (``bn_mode=train``; running statistics
are never changed by a measurement), every other module in eval mode (no dropout: the loss is
deterministic). Each module's own train/eval flag is restored afterwards. It happens every ``every_n_epochs`` epochs, every
``every_n_steps`` steps, and always at the end; Lanczos starts from the previous top
eigenvector mixed with a little seeded noise (so a stale vector orthogonal to the new top
direction cannot trap it; the mix is our choice). The time spent is ``hessian_time_s``;
train.py does not count it as training time.

Keys written: ``lambda_max`` (``lambda_2``.. when k > 1), ``hessian_hvps`` (on the whole
subset) and ``hessian_presolve_hvps`` (on its leading batches, when ``presolve_batches`` is on),
``hessian_time_s``, ``eos_ratio`` = λ_max / (stability threshold of the base optimizer, see
``stability_threshold``; only for an SGD base optimizer whose lr sets the step, so not
SAM-SPS), and, when enabled, ``hessian_trace`` (+ ``_se``),
``sharpness_worst``, ``sharpness_avg`` (+ ``_se``), ``sharpness_dir`` / ``sharpness_dir_max``,
``armijo_alpha`` / ``armijo_curvature`` (NaN, written as null, with ``armijo_accepted`` false
when no step was accepted), ``fisher_rao`` (+ ``_se``). Curvature needs a
tensor dataset (``data.train_tensors``); for image folders it is skipped and summary.json
says so.
"""
from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from torch.nn.modules.batchnorm import _BatchNorm

from ..errors import require
from . import sharpness as S
from .hessian import HessianOperator, hessian_eigenpairs, hessian_trace, modes_restored, spectral_density


def _cross_entropy(out, target):
    return F.cross_entropy(out.float(), target)


def inverse_stability_threshold(optimizer) -> float | None:
    """1 / (the largest curvature at which the base optimizer's iteration on a 1-D quadratic is
    stable), so that eos_ratio = λ_max · this. With lr η, momentum β and dampening d (PyTorch's
    SGD: b ← βb + (1−d)g; heavy ball steps along b, Nesterov along g + βb) the iteration's
    characteristic polynomial has its root at −1 when λ reaches
      plain SGD 2/η;  heavy ball (2+2β)/(η(1−d));  Nesterov (2+2β)/(η(1+β(2−d))).
    Finite, and 0 at η = 0 (end of a cosine-to-0 schedule), where the threshold is infinite.
    None unless the base optimizer is SGD, and for variants whose own step replaces the lr
    (``replaces_lr``, e.g. SAM-SPS's Polyak step)."""
    base = getattr(optimizer, "base_optimizer", optimizer)
    if getattr(optimizer, "replaces_lr", False) or not isinstance(base, torch.optim.SGD):
        return None
    group = base.param_groups[0]
    lr, beta = float(group["lr"]), float(group.get("momentum", 0.0) or 0.0)
    d = float(group.get("dampening", 0.0) or 0.0) if beta else 0.0  # without momentum there is no buffer
    if group.get("nesterov", False):
        return lr * (1 + beta * (2 - d)) / (2 + 2 * beta)
    return lr * (1 - d) / (2 + 2 * beta)


def stability_threshold(optimizer) -> float | None:
    """The threshold itself (``math.inf`` at η = 0); see ``inverse_stability_threshold``."""
    inv = inverse_stability_threshold(optimizer)
    return None if inv is None else (1 / inv if inv > 0 else math.inf)


def _pearson(a, b):
    if len(a) < 3:
        return None
    x, y = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    x, y = x - x.mean(), y - y.mean()
    den = float(x.norm() * y.norm())
    return float((x * y).sum()) / den if den > 0 else None


class CurvatureTracker:
    def __init__(self, cfg, model, data, optimizer, seed, autocast=None):
        self.cfg = cfg
        h = cfg.get("hessian", {})
        self.h = h
        self.bn_mode = str(h.get("bn_mode", "eval"))
        require(self.bn_mode in ("eval", "train"), f"metrics.hessian.bn_mode={self.bn_mode!r} is unknown; "
                                                   "choose eval or train")
        self.k = int(h.get("k", 1))
        require(self.k >= 1, f"metrics.hessian.k={self.k} must be an integer >= 1")
        for key in ("every_n_epochs", "every_n_steps", "presolve_batches"):
            v = h.get(key, 0) or 0
            require(isinstance(v, int) and v >= 0, f"metrics.hessian.{key}={v} must be an integer >= 0 (0 = off)")
        tol = h.get("presolve_tol", 3e-2)
        require(isinstance(tol, (int, float)) and 0 < tol < 1,
                f"metrics.hessian.presolve_tol={tol} must be a number in (0, 1)")
        self.tensor_data = data.train_tensors is not None
        self.enabled = bool(h.get("enabled", True)) and self.tensor_data
        self.model, self.data, self.optimizer, self.seed = model, data, optimizer, seed
        self.vector = None
        self._subset = None
        self.history = {"lambda_max": [], "armijo_alpha": []}
        self.density = None

    # ------------------------------------------------------------------ measuring
    def _batches(self):
        if self._subset is None:
            n = int(self.h.get("num_samples", 4096))
            require(n >= 1, f"metrics.hessian.num_samples={n} must be >= 1")
            self._subset = self.data.train_subset(n, self.seed)
        x, y = self._subset
        bs = int(self.h.get("batch_size", 1024))
        require(bs >= 1, f"metrics.hessian.batch_size={bs} must be >= 1")
        return [(x[i:i + bs], y[i:i + bs]) for i in range(0, len(y), bs)]

    def _init_vector(self, op):
        if self.vector is None or not self.h.get("warm_start", True):
            return None
        v = op.flat([t.to(op.device) for t in self.vector]).double()
        g = torch.Generator().manual_seed(self.seed + 17 + len(self.history["lambda_max"]))
        noise = torch.randn(op.numel, generator=g, dtype=torch.float64).to(op.device)
        return v / v.norm() + 0.1 * noise / noise.norm()

    def _measure(self, final: bool) -> dict:
        t0 = time.perf_counter()
        model = self.model
        with modes_restored(model):
            model.eval()  # dropout and the like off: the Hessian of a deterministic loss
            if self.bn_mode == "train":  # only BatchNorm normalizes with batch statistics
                for m in model.modules():
                    if isinstance(m, _BatchNorm):
                        m.train()
            out = self._measure_in_mode(final)
        out["hessian_time_s"] = time.perf_counter() - t0
        return out

    def _measure_in_mode(self, final: bool) -> dict:
        h, cfg, seed = self.h, self.cfg, self.seed
        batches = self._batches()
        out = {}
        with HessianOperator(self.model, _cross_entropy, batches, str(h.get("method", "auto")),
                             float(h.get("graph_cache_mb", 1024))) as op:
            r = hessian_eigenpairs(self.model, _cross_entropy, batches, self.k, tol=float(h.get("tol", 1e-3)),
                                   max_iter=int(h.get("max_iter", 100)), init=self._init_vector(op),
                                   presolve_batches=int(h.get("presolve_batches", 0) or 0),
                                   presolve_tol=float(h.get("presolve_tol", 3e-2)), seed=seed + 31, operator=op)
            self.vector = [v.detach().clone() for v in r.vectors]
            out["lambda_max"] = r.values[0]
            out.update({f"lambda_{i}": v for i, v in enumerate(r.values[1:], start=2)})
            out["hessian_hvps"] = r.hvps
            if r.presolve_hvps:
                out["hessian_presolve_hvps"] = r.presolve_hvps
            out["hessian_method"] = r.method
            if not r.converged:
                out["hessian_converged"] = False
            inv = inverse_stability_threshold(self.optimizer)
            if inv is not None:
                out["eos_ratio"] = r.values[0] * inv
            self.history["lambda_max"].append(r.values[0])

            tr = cfg.get("trace", {})
            if tr.get("enabled", False):
                out["hessian_trace"], out["hessian_trace_se"] = hessian_trace(op, int(tr.get("num_probes", 50)), seed)
            dens = cfg.get("density", {})
            if final and dens.get("enabled", False):
                self.density = spectral_density(op, int(dens.get("num_runs", 3)), int(dens.get("num_steps", 80)), seed)
            out.update(self._sharpness(op))
        return out

    def _sharpness(self, op) -> dict:
        sc, seed, out = self.cfg.get("sharpness", {}), self.seed, {}
        if not any(sc.get(m, {}).get("enabled", False)
                   for m in ("worst_case", "average", "directional", "armijo", "fisher_rao")):
            return out
        # the measures run on the first sharpness.num_samples samples of the Hessian subset
        n = int(sc.get("num_samples", 1024))
        x, y = self._subset
        bs = int(self.h.get("batch_size", 1024))
        batches = [(x[i:min(i + bs, n)], y[i:min(i + bs, n)]) for i in range(0, min(n, len(y)), bs)]
        obj = S.Objective(self.model, _cross_entropy, batches)
        with obj:
            c = sc.get("worst_case", {})
            if c.get("enabled", False):
                out["sharpness_worst"] = S.worst_case_sharpness(
                    obj, float(c.get("rho", 0.05)), int(c.get("steps", 5)), bool(c.get("adaptive", False)),
                    float(c.get("eta", 0.01)), seed)
            c = sc.get("average", {})
            if c.get("enabled", False):
                out["sharpness_avg"], out["sharpness_avg_se"] = S.average_sharpness(
                    obj, float(c.get("sigma", 0.01)), int(c.get("num_samples", 10)), seed)
            c = sc.get("directional", {})
            if c.get("enabled", False):
                out["sharpness_dir"], out["sharpness_dir_max"] = S.directional_sharpness(
                    obj, int(c.get("num_directions", 4)), float(c.get("h", 1e-2)), seed)
            c = sc.get("armijo", {})
            if c.get("enabled", False):
                alpha, curv, _ = S.armijo_probe(obj, float(c.get("alpha0", 1.0)), float(c.get("c", 1e-4)),
                                                float(c.get("beta", 0.5)), int(c.get("max_steps", 40)))
                out["armijo_alpha"], out["armijo_curvature"] = alpha, curv
                out["armijo_accepted"] = math.isfinite(alpha)
                self.history["armijo_alpha"].append(alpha)  # NaN when not accepted: left out of the Pearson
        c = sc.get("fisher_rao", {})
        if c.get("enabled", False):
            fop = HessianOperator(self.model, _cross_entropy, batches, op.method, float(self.h.get("graph_cache_mb", 1024)))
            with fop:
                out["fisher_rao"], out["fisher_rao_se"] = S.fisher_rao_sharpness(
                    fop, int(c.get("num_probes", 20)), float(c.get("damping", 1e-8)), seed)
        return out

    # ------------------------------------------------------------------ schedule
    def on_step(self, epoch, step, net):
        n = int(self.h.get("every_n_steps", 0) or 0)
        if self.enabled and n > 0 and step % n == 0:
            return self._measure(final=False)
        return None

    def on_epoch_end(self, epoch, step, net, final):
        n = int(self.h.get("every_n_epochs", 0) or 0)
        if self.enabled and (final or (n > 0 and epoch % n == 0)):
            return self._measure(final)
        return {}

    def summary_extras(self) -> dict:
        if not self.tensor_data:
            return {"hessian_skipped": "curvature metrics need a tensor dataset (not image_folder)"}
        if not self.enabled:
            return {}
        out = {"hessian_bn_mode": self.bn_mode,
               "hessian_num_samples": len(self._subset[1]) if self._subset is not None else None}
        if self.density is not None:
            out["hessian_density"] = self.density
        a, lam = self.history["armijo_alpha"], self.history["lambda_max"]
        if len(a) == len(lam) and len(a) >= 3:
            # the seed abstract's check: log α against log λ_max over this run's measurements
            pairs = [(math.log(x), math.log(y)) for x, y in zip(a, lam) if x > 0 and y > 0]  # NaN α: not > 0
            r = _pearson([p[0] for p in pairs], [p[1] for p in pairs])
            if r is not None:
                out["armijo_log_alpha_log_lambda_pearson"] = r
        return out

    def state_dict(self):
        state = {"history": {k: list(v) for k, v in self.history.items()}}
        if self.vector is not None:
            state["vector"] = [v.cpu() for v in self.vector]
        return state

    def load_state_dict(self, state):
        if "vector" in state:
            dev = next(self.model.parameters()).device
            self.vector = [v.to(dev) for v in state["vector"]]
        for k, v in state.get("history", {}).items():
            self.history[k] = list(v)
