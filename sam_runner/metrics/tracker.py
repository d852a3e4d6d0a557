"""Curvature measured during training: when, on which samples, with which warm start.

Every measurement runs on the same fixed, seeded subset of the training set
(``metrics.hessian.num_samples``, capped at the training set; with ``dataset.batch_size=full``
the whole training set, in order: the loss the steps descend), in fp32 without augmentation,
over the parameters the run trains (``params=trainable``, the default: a PEFT run's adapters
and what it trains in full) or over all of them (``params=all``), on the run's loss
(``trainer.loss``, as a mean over the samples, never label-smoothed),
BatchNorm in eval mode (``bn_mode=eval``, default) or with batch statistics
(``bn_mode=train``; running statistics are never changed by a measurement), every other module
in eval mode (no dropout: the loss is deterministic). Each module's own train/eval flag is
restored afterwards. It happens every ``every_n_epochs`` epochs (a federated run: every
``every_n_rounds`` rounds, the global model), every ``every_n_steps`` steps
(within an epoch: ``log_values`` during training), and always at the end; a second request at
the same step returns the first measurement's keys. Lanczos starts from the previous top
eigenvector mixed with a little seeded noise (so a stale vector orthogonal to the new top
direction cannot trap it; the mix is our choice). The time spent is ``hessian_time_s``; the
run does not count it as training time.

Keys written: ``lambda_max`` (``lambda_2``.. when k > 1), ``hessian_hvps`` (on the whole subset)
and ``hessian_presolve_hvps`` (on its leading batches, when ``presolve_batches`` is on),
``hessian_method``, ``hessian_converged`` (only when false), ``hessian_time_s``, the training
dynamics of dynamics.py (``eos_ratio`` and ``eos_threshold`` for an SGD base optimizer whose lr
sets the step, so not SAM-SPS; ``sam_edge``, ``sam_edge_ratio`` and ``grad_norm`` for
``optimizer=sam`` with plain SGD; ``grad_topk_overlap`` when asked for), and the keys of every
enabled measure of measures.py. Rows logged from within an epoch also carry ``step_loss``
(train.py). Every dataset is measured alike (``Data.train_subset``): an image folder's subset
is decoded once, when the tracker is made (so an unreadable image or a subset that does not fit
stops the run before it trains), and kept in the run folder's cache.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf
from torch.nn.modules.batchnorm import _BatchNorm

from .. import distributed
from ..adapters import every_parameter_trainable
from ..clock import Clock
from ..errors import integer, number, require
from ..losses import mean_loss
from ..module_state import full_state, modes_restored
from ..part import Part
from ..registry import MEASURES
from ..rundir import INIT_WEIGHTS
from ..runfiles import InitialWeights
from .dynamics import dynamics
from .hvp import HVP_METHODS, HVP_PRECISIONS, HessianOperator, cpu_has_bf16
from .measures import Measurement, leading_batches
from .preconditioned import preconditioned_sharpness
from .sharded import ShardedHessianOperator
from .sharpness_dim import step_for
from .solvers import hessian_eigenpairs, whole_norm

BN_MODES = ("eval", "train")
# the parameters the Hessian is of: those the run trains (a PEFT run's adapters), or every one
HESSIAN_PARAMS = ("trainable", "all")
SCHEMA = {
    "positive": ("a finite number > 0", lambda v: 0 < v < math.inf),
    "nonnegative": ("a finite number >= 0", lambda v: 0 <= v < math.inf),
    "fraction": ("a number in (0, 1)", lambda v: 0 < v < 1),
    "count": ("an integer >= 1", lambda v: v >= 1),
    "probes": ("an integer >= 2", lambda v: v >= 2),
    "hutch_probes": (
        "an integer >= 6 (Hutch++: a third sketch, a third exact, a third residual)",
        lambda v: v >= 6,
    ),
    "off_or_count": ("an integer >= 0 (0 = off)", lambda v: v >= 0),
}
HESSIAN_SCHEMA = {
    "k": "count",
    "num_samples": "count",
    "batch_size": "count",
    "every_n_epochs": "off_or_count",
    "every_n_rounds": "off_or_count",
    "every_n_steps": "off_or_count",
    "presolve_batches": "off_or_count",
    "tol": "positive",
    "presolve_tol": "fraction",
    "max_iter": "count",
    "graph_cache_mb": "nonnegative",
    "warm_start": "bool",
    "enabled": "bool",
    "bn_mode": "choice",
    "params": "choice",
    "method": "choice",
    "precision": "choice",
    "grad_topk_overlap": "bool",
}


def cross_entropy_mean(out, target):
    return F.cross_entropy(out.float(), target)


def _options(cfg, section: str) -> dict:
    """The options of ``metrics.<section>`` as a plain dict (empty when the section is absent)."""
    node = OmegaConf.select(cfg, section) if OmegaConf.is_config(cfg) else None
    return dict(OmegaConf.to_container(node) if OmegaConf.is_config(node) else node or {})


def check_options(section: str, options, schema: dict) -> None:
    """One-line errors for the options of ``metrics.<section>`` against a schema (see measures.py):
    unknown keys (with the accepted ones), then each value."""
    unknown = sorted(set(options) - set(schema))
    require(
        not unknown,
        f"metrics.{section}.{unknown[0] if unknown else ''} is not a key; accepted: "
        f"{', '.join(schema)}",
    )
    for key, kind in schema.items():
        if key not in options:
            continue
        name, value = f"metrics.{section}.{key}", options[key]
        if kind == "choice":  # checked against its choices by the caller
            continue
        if kind == "bool":
            require(isinstance(value, bool), f"{name}={value!r} must be true or false")
        elif kind == "bit_widths":
            ok = isinstance(value, (list, tuple)) and len(value) > 0
            ok = ok and all(
                isinstance(b, int) and not isinstance(b, bool) and 2 <= b <= 16 for b in value
            )
            require(ok, f"{name}={value!r} must be a non-empty list of integers in 2..16")
        elif kind == "flip_kinds":
            from .flip import KINDS

            ok = isinstance(value, (list, tuple)) and len(value) > 0
            bad = [k for k in value if k not in KINDS] if ok else []
            require(
                ok and not bad,
                f"{name}={value!r}: {bad[0] if bad else 'empty'} is not a kind; choose from "
                f"{', '.join(KINDS)}",
            )
        elif kind == "null_or_positive":
            if value is not None:
                number(name, value, "null or a finite number > 0", lambda v: 0 < v < math.inf)
        elif kind in ("count", "probes", "hutch_probes", "off_or_count"):
            integer(name, value, *SCHEMA[kind])
        else:
            number(name, value, *SCHEMA[kind])


def check_precision(precision) -> None:
    """``metrics.hessian.precision``: fp32, or bf16 where the machine computes in bf16 (a GPU,
    or a CPU with AVX-512 BF16 or AMX)."""
    require(
        precision in HVP_PRECISIONS,
        f"metrics.hessian.precision={precision!r} is unknown; choose fp32 or bf16",
    )
    require(
        precision != "bf16" or torch.cuda.is_available() or cpu_has_bf16(),
        "metrics.hessian.precision=bf16 but this CPU has no bf16 arithmetic (AVX-512 BF16 or "
        "AMX) and there is no GPU; use metrics.hessian.precision=fp32",
    )


def validate(cfg) -> None:
    """Every curvature and measure option of a ``metrics`` config, before anything trains."""
    h = cfg.get("hessian") or {}
    require(
        h.get("bn_mode", "eval") in BN_MODES,
        f"metrics.hessian.bn_mode={h.get('bn_mode')!r} is unknown; choose eval or train",
    )
    require(
        h.get("method", "auto") in HVP_METHODS,
        f"metrics.hessian.method={h.get('method')!r} is unknown; choose one of "
        f"{', '.join(HVP_METHODS)}",
    )
    require(
        h.get("params", "trainable") in HESSIAN_PARAMS,
        f"metrics.hessian.params={h.get('params')!r} is unknown; choose trainable or all",
    )
    check_options("hessian", h, HESSIAN_SCHEMA)
    check_precision(h.get("precision", "fp32"))
    k, max_iter = h.get("k", 1), h.get("max_iter", 100)
    require(
        k <= max_iter,
        f"metrics.hessian.k={k} must be at most metrics.hessian.max_iter={max_iter} (Lanczos "
        "finds at most max_iter eigenvalues); lower k or raise max_iter",
    )
    for entry in MEASURES.entries():
        check_options(
            entry.config, _options(cfg, entry.config), {"enabled": "bool", **entry.schema}
        )
    integer("metrics.ece_bins", cfg.get("ece_bins", 15), "an integer >= 1", lambda n: n >= 1)
    sharp = cfg.get("sharpness") or {}
    integer(  # its first samples measure the sharpness measures: none would be no batch at all
        "metrics.sharpness.num_samples",
        sharp.get("num_samples", 1024),
        "an integer >= 1",
        lambda n: n >= 1,
    )


class CurvatureTracker:
    def __init__(
        self,
        cfg,
        model,
        data,
        optimizer,
        seed,
        clock: Clock | None = None,
        loss_fn=cross_entropy_mean,
    ):
        validate(cfg)
        self.loss_fn = loss_fn  # the run's loss (trainer.loss), as a mean, never label-smoothed
        self.cfg, self.model, self.data, self.optimizer, self.seed = (
            cfg,
            model,
            data,
            optimizer,
            seed,
        )
        self.clock = clock if clock is not None else Clock()
        # a dataset this package can draw a measurement subset from (every one of data/)
        self.tensor_data = getattr(data, "measurable", data.train_tensors is not None)
        self.enabled = bool(self.h.get("enabled", True)) and self.tensor_data
        # the periods, as plain values: log_values runs after every step
        self.every = {k: int(self.h.get(k, 0) or 0)
                      for k in ("every_n_steps", "every_n_epochs", "every_n_rounds")}  # fmt: skip
        self.vector = None
        self._subset = None
        if self.enabled and data.train_tensors is None:  # decode now: bad files fail up front
            self._subset = data.train_subset(int(self.h.get("num_samples", 4096)), seed)
        self.history = {"lambda_max": [], "armijo_alpha": []}
        self.density = None
        self._last = None  # (step, keys) of the last measurement: one per step, whoever asks
        self.note = None  # note(text): told as each further measure starts (sam-eval's lines)
        self.step = None  # the run's SGD step {lr, momentum, weight_decay}: sharpness_dim
        self.init_state = None  # the weights the run started from: dist_from_init
        self._ritz = None
        self.times = {}  # the last measurement's seconds per part: "eigenvalues", each measure
        self.unsharded = None  # a sharded run's model structure (meta): see measure
        self._sharded = None  # the sharded model while it is measured on its shards

    @property
    def h(self):
        return self.cfg.get("hessian", {})

    # ------------------------------------------------------------------ schedule
    def log_values(self) -> dict:
        """A measurement's keys when one is due at the clock's time, else nothing: every
        ``every_n_steps`` steps within an epoch; at the end of every ``every_n_epochs``-th epoch
        (``every_n_rounds``-th round) and of the last one."""
        if not self.enabled:
            return {}
        clock = self.clock
        if clock.within_epoch:
            n = self.every["every_n_steps"]
            due = n > 0 and clock.step % n == 0
        else:
            # a federated run's epochs are its rounds: its own key says how often, in rounds
            n = self.every["every_n_rounds" if clock.rounds else "every_n_epochs"]
            due = clock.final or (n > 0 and clock.epoch % n == 0)
        if not due:
            return {}
        if self._last is not None and self._last[0] == clock.step:  # measured at this step already
            return dict(self._last[1])
        out = self.measure(clock.final)
        self._last = (clock.step, out)
        return out

    def num_samples(self) -> int:
        """How many training samples a measurement uses: the subset (capped at the training set);
        with a full batch, the whole training set."""
        if self._subset is not None:
            return len(self._subset[1])
        if self.data.full_batch:
            return self.data.train_size
        return min(int(self.h.get("num_samples", 4096)), self.data.train_size)

    # ------------------------------------------------------------------ measuring
    def _batches(self):
        if self._subset is None:
            self._subset = self.data.train_subset(int(self.h.get("num_samples", 4096)), self.seed)
        x, y = self._subset
        bs = int(self.h.get("batch_size", 512))
        return [(x[i : i + bs], y[i : i + bs]) for i in range(0, len(y), bs)]

    def _init_vector(self, op):
        if self.vector is None or not self.h.get("warm_start", True):
            return None
        if [t.shape for t in self.vector] != list(op.shapes):  # measured gathered, now sharded
            return None
        v = op.flat([t.to(op.device) for t in self.vector]).double()
        g = torch.Generator().manual_seed(self.seed + 17 + len(self.history["lambda_max"]))
        noise = torch.randn(op.numel, generator=g, dtype=torch.float64).to(op.device)
        reduce = op.reduce_sum  # a sharded operator's vectors: each process its chunk
        return v / whole_norm(v, reduce) + 0.1 * noise / whole_norm(noise, reduce)

    def measure(self, final: bool) -> dict:
        """λ_max (and λ_2..k) and every enabled measure, in the measurement's mode. A sharded
        model (trainer.strategy=fsdp) is measured on its shards (``ShardedHessianOperator``)
        when every measure it takes can be (``on_shards``: the trace, the density); else on its
        gathered weights, in an unsharded copy that lives while it measures (``unsharded``: its
        structure, on the meta device)."""
        if self.unsharded is None:
            return self._measure(final)
        if all(e.meta.get("on_shards", False) for e in self._enabled_measures(final)):
            return self._measure_on_shards(final)
        return self._measure_gathered(final)

    def _enabled_measures(self, final: bool) -> list:
        """The measures of measures.py this measurement takes."""
        return [
            e
            for e in MEASURES.entries()
            if _options(self.cfg, e.config).get("enabled", False)
            and (final or not e.meta.get("final_only"))
        ]

    def _measure_on_shards(self, final: bool) -> dict:
        """``_measure`` with the unsharded structure (meta) as the model whose modes and
        trainable parameters it sets, and the sharded model's shards as the parameters."""
        sharded = self.model
        self.model, self._sharded = self.unsharded, sharded
        try:
            return self._measure(final)
        finally:
            self.model, self._sharded = sharded, None

    def _measure_gathered(self, final: bool) -> dict:
        sharded, whole = self.model, self.unsharded
        state = full_state(sharded)  # every process: the gathers are collective
        whole.to_empty(device=next(sharded.parameters()).device)
        whole.load_state_dict(state)
        self.model = whole
        try:
            return self._measure(final)
        finally:
            self.model = sharded
            whole.to_empty(device="meta")

    def _measure(self, final: bool) -> dict:
        t0 = time.perf_counter()
        every = self.h.get("params", "trainable") == "all"
        with (
            modes_restored(self.model),
            every_parameter_trainable(self.model) if every else nullcontext(),
        ):
            self.model.eval()  # dropout and the like off: the Hessian of a deterministic loss
            # only BatchNorm normalizes with batch statistics
            if self.h.get("bn_mode", "eval") == "train":
                for m in self.model.modules():
                    if isinstance(m, _BatchNorm):
                        m.train()
            with self._operator(self._batches()) as op:
                self.times = {}
                out = self._eigenvalues(op)
                self.times["eigenvalues"] = time.perf_counter() - t0
                out.update(self._measures(op, final))
        out["hessian_time_s"] = time.perf_counter() - t0
        return out

    def _operator(self, batches) -> HessianOperator:
        """The measurement's operator; several processes take each their share of the samples."""
        h, dist = self.h, distributed.current()
        cache_mb, precision = float(h.get("graph_cache_mb", 1024)), str(h.get("precision", "fp32"))
        if self._sharded is not None:
            shards = (self._sharded, self.model, self.loss_fn, batches, dist)
            return ShardedHessianOperator(*shards, cache_mb, precision)
        method = str(h.get("method", "auto"))
        model = (self.model, self.loss_fn, batches, method, cache_mb)
        return HessianOperator(*model, dist=dist, precision=precision)

    def _eigenvalues(self, op) -> dict:
        h = self.h
        r = hessian_eigenpairs(
            self.model,
            self.loss_fn,
            op.batches,
            int(h.get("k", 1)),
            tol=float(h.get("tol", 1e-3)),
            max_iter=int(h.get("max_iter", 100)),
            init=self._init_vector(op),
            presolve_batches=int(h.get("presolve_batches", 0) or 0),
            presolve_tol=float(h.get("presolve_tol", 3e-2)),
            seed=self.seed + 31,
            operator=op,
        )
        self.vector = [v.detach().clone() for v in r.vectors]
        self._ritz = r.ritz_vectors  # this measurement's top-k, for the trace's deflation
        out = {
            "lambda_max": r.values[0],
            **{f"lambda_{i}": v for i, v in enumerate(r.values[1:], start=2)},
            "hessian_hvps": r.hvps,
        }
        if r.presolve_hvps:
            out["hessian_presolve_hvps"] = r.presolve_hvps
        out["hessian_method"] = r.method
        if not r.converged:
            out["hessian_converged"] = False
        overlap = bool(h.get("grad_topk_overlap", False))
        out.update(dynamics(op, r, self.optimizer, overlap, self.data.full_batch))
        out.update(preconditioned_sharpness(op, self.optimizer))  # Adam-family bases only
        self.history["lambda_max"].append(r.values[0])
        return out

    def _measures(self, op, final: bool) -> dict:
        """Every enabled measure; the sharpness ones on the first ``sharpness.num_samples``
        samples."""
        n = int(OmegaConf.select(self.cfg, "sharpness.num_samples", default=1024))
        m = Measurement(
            op,
            # the leading samples of the whole subset on every process (a process's own share
            # held fewer than n with several processes: rank 0 wrote a measure of its share)
            leading_batches(op.whole_batches, n),
            self.loss_fn,
            self.seed,
            final,
            self._ritz,
            self.data,
            self.step,
            self.init_state,
        )
        out = {}
        try:
            for entry in sorted(
                MEASURES.entries(), key=lambda e: e.meta.get("moves_parameters", False)
            ):
                options = _options(self.cfg, entry.config)
                if entry.meta.get("moves_parameters", False):
                    m.close_operators()  # moving θ invalidates their graphs: free them first
                if options.pop("enabled", False) and (final or not entry.meta.get("final_only")):
                    if self.note is not None:
                        self.note(f"{entry.name} (metrics.{entry.config})")
                    t0 = time.perf_counter()
                    out.update(entry.target(m, **options))
                    self.times[entry.name] = time.perf_counter() - t0
        finally:
            m.close()
        if "hessian_density" in out:  # a summary.json entry, not a metrics line's
            self.density = out.pop("hessian_density")
        if "armijo_alpha" in out:
            # NaN when not accepted: left out of the Pearson
            self.history["armijo_alpha"].append(out["armijo_alpha"])
        return out

    def summary_extras(self) -> dict:
        if not self.tensor_data:
            return {"hessian_skipped": "curvature metrics need a dataset with a measurement subset"}
        if not self.enabled:
            return {}
        out = {
            "hessian_bn_mode": str(self.h.get("bn_mode", "eval")),
            # a summary rebuilt from the checkpoint measured nothing: the count the settings draw
            "hessian_num_samples": len(self._subset[1])
            if self._subset is not None
            else self.num_samples(),
        }
        if self.density is not None:
            out["hessian_density"] = self.density
        a, lam = self.history["armijo_alpha"], self.history["lambda_max"]
        if len(a) == len(lam) and len(a) >= 3:
            # the Armijo probe's claim: log α tracks log λ_max over this run's measurements
            # NaN α: not > 0
            pairs = [(math.log(x), math.log(y)) for x, y in zip(a, lam) if x > 0 and y > 0]
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


def _pearson(a, b):
    if len(a) < 3:
        return None
    x, y = torch.tensor(a, dtype=torch.float64), torch.tensor(b, dtype=torch.float64)
    x, y = x - x.mean(), y - y.mean()
    den = float(x.norm() * y.norm())
    return float((x * y).sum()) / den if den > 0 else None


class CurvaturePart(Part):
    """The run's curvature tracker as a part: measurements within epochs, at epoch ends and at
    evaluations (``metrics.hessian.every_n_*``), its summary keys and its checkpointed history;
    at the start, the references the generalization measures compare with (θ⁰, the SGD step)."""

    name = "curvature"

    def __init__(self, run):
        self.run = run
        loss = mean_loss(run.cfg.trainer.get("loss", "cross_entropy"))
        # a model may name what its Hessian is of (a circuit: its sum weights, a WeightView)
        model = getattr(run.model, "curvature_view", lambda: run.model)()
        self.tracker = CurvatureTracker(
            run.cfg.metrics, model, run.data, run.optimizer, run.cfg.seed, run.clock, loss
        )
        self.tracker.unsharded = run.dist.unsharded

    def start(self, resumed: bool) -> None:
        """θ⁰ kept from a fresh start (``checkpoints/init.pt``), else read back; the run's SGD
        step for ``sharpness_dim``."""
        run, tracker = self.run, self.tracker
        tracker.step = step_for(run.cfg.metrics, run.cfg)
        initial = InitialWeights(run.run_dir / INIT_WEIGHTS)
        if not resumed:
            start = full_state(run.model)
            if run.dist.is_main:
                initial.save(start)
        else:
            start = initial.load()
        tracker.init_state = start if tracker.enabled else None

    def measure_values(self) -> dict:
        return self.tracker.log_values()

    def log_values(self) -> dict:
        tracker = self.tracker
        if tracker.clock.final and tracker.enabled:  # the last measurement can take a while
            self.run.record.progress.note(
                f"measuring the Hessian's top eigenvalue(s) on {tracker.num_samples()} training "
                "samples (metrics.hessian.*) ..."
            )
        return tracker.log_values()

    def summary_values(self, last: dict) -> dict:  # noqa: ARG002 (the hook's signature)
        return self.tracker.summary_extras()

    def lambda_max_of(self, model) -> float | None:
        """The run's measurement (its settings, samples and loss) on other weights."""
        if not self.tracker.enabled:
            return None
        t = self.tracker
        other = CurvatureTracker(t.cfg, model, t.data, t.optimizer, t.seed, t.clock, t.loss_fn)
        return other.measure(final=True).get("lambda_max")

    def state_dict(self) -> dict:
        return self.tracker.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.tracker.load_state_dict(state)


def build_part(run) -> CurvaturePart:
    """Always a part (its state has always been in the checkpoint), measuring what is on."""
    return CurvaturePart(run)


def check(cfg, where=None) -> None:  # noqa: ARG001 (every check's signature)
    validate(cfg.metrics)
