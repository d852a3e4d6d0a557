"""Curvature measured during training: when to measure, on which samples, warm starts."""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from .hessian import hvp_fn, lanczos


class CurvatureTracker:
    def __init__(self, cfg, model, data, optimizer, seed, autocast):
        self.cfg = cfg.get("hessian", {})
        self.enabled = bool(self.cfg.get("enabled", True)) and data.train_tensors is not None
        self.model, self.data, self.optimizer, self.seed = model, data, optimizer, seed
        self.vector = None
        self.last = {}

    def _measure(self):
        t0 = time.perf_counter()
        x, y = self.data.train_subset(int(self.cfg.get("num_samples", 4096)), self.seed)
        bs = int(self.cfg.get("batch_size", 1024))
        batches = [(x[i:i + bs], y[i:i + bs]) for i in range(0, len(y), bs)]
        was = self.model.training
        self.model.train(self.cfg.get("bn_mode", "eval") == "train")
        hvp, params = hvp_fn(self.model, lambda out, t: F.cross_entropy(out.float(), t), batches)
        g = torch.Generator().manual_seed(self.seed + 31)
        vals, vec, hvps = lanczos(hvp, params, int(self.cfg.get("k", 1)), float(self.cfg.get("tol", 1e-3)),
                                  int(self.cfg.get("max_iter", 100)), self.vector, g)
        self.model.train(was)
        self.vector = [v.detach() for v in vec]
        out = {"lambda_max": vals[0], "hessian_hvps": hvps, "hessian_time_s": time.perf_counter() - t0}
        for i, v in enumerate(vals[1:], start=2):
            out[f"lambda_{i}"] = v
        self.last = out
        return out

    def on_step(self, epoch, step, net):
        n = int(self.cfg.get("every_n_steps", 0) or 0)
        if self.enabled and n > 0 and step % n == 0:
            return self._measure()
        return None

    def on_epoch_end(self, epoch, step, net, final):
        n = int(self.cfg.get("every_n_epochs", 0) or 0)
        if self.enabled and (final or (n > 0 and epoch % n == 0)):
            return self._measure()
        return {}

    def summary_extras(self):
        return {"hessian_bn_mode": self.cfg.get("bn_mode", "eval")} if self.enabled else {}

    def state_dict(self):
        return {"vector": self.vector} if self.vector is not None else {}

    def load_state_dict(self, state):
        self.vector = state.get("vector")
