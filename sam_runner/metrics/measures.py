"""The curvature and sharpness measures a run can log beside λ_max, each registered with its
config section (under ``metrics``), the keys it writes and the schema of its options.

A measure is a function ``(m: Measurement, **options) -> {key: value}``, its options the keys of its
config section but ``enabled`` (named as the measuring function's arguments, whose defaults apply
to options a config leaves out); the tracker calls every
enabled one after λ_max, on the same fixed subset and in the same mode. Measures that move θ (and
put it back, ``moves_parameters``) run after the others: moving θ in place invalidates the
gradient graphs the operator caches. Adding a measure is a
function here and its section in ``conf/metrics/default.yaml`` (with ``enabled: false``).

Schema words (checked before a run starts): ``positive`` (a finite number > 0), ``nonnegative``,
``fraction`` (in (0, 1)), ``count`` (an integer >= 1), ``probes`` (an integer >= 2),
``hutch_probes`` (an integer >= 6), ``off_or_count`` (an integer >= 0), ``bool``,
``bit_widths`` (a non-empty list of integers in 2..16), ``null_or_positive``, ``flip_kinds``
(a non-empty list of flip.py's kinds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ..registry import MEASURES
from . import sharpness as S
from .hvp import HessianOperator
from .objective import Objective
from .solvers import SeededProbes, hessian_trace, spectral_density

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence
    from typing import Any

    import torch

# metrics.trace.num_samples and metrics.density.num_samples: the first samples of the Hessian
# subset (docs/metrics.md#trace, #density: what the smaller subset changes, measured)
TRACE_SAMPLES = 1024
DENSITY_SAMPLES = 1024


def token_inputs(m: Measurement) -> bool:
    """Whether the model reads token ids (model=gpt): the input-space measures (input_grad,
    flip, path_norm) are undefined there and left out."""
    return m.data is not None and len(m.data.input_shape) == 1


def leading_batches(batches: Iterable[tuple[torch.Tensor, torch.Tensor]], num_samples: int) -> list:
    """The first ``num_samples`` samples of ``batches``, in the same batches (the last cut)."""
    out, left = [], num_samples
    for x, y in batches:
        if left <= 0:
            break
        out.append((x[:left], y[:left]))
        left -= len(y)
    return out


@dataclass
class Measurement:
    """What a measure gets: the Hessian operator over the whole subset, the leading batches the
    sharpness measures use, the seed, and whether this is the run's last measurement."""

    operator: HessianOperator
    sharpness_batches: list
    loss_fn: object
    seed: int
    final: bool
    eigenvectors: object = None  # [k, n]: the top-k Ritz vectors of this measurement (flat, unit)
    data: object = None  # the run's Data (test-set measures), None where there is none
    step: dict | None = None  # the run's SGD step {lr, momentum, weight_decay} (sharpness_dim)
    init_state: dict | None = None  # the weights the run started from (dist_from_init)
    _objective: Objective | None = field(default=None, repr=False)
    _operators: dict = field(default_factory=dict, repr=False)
    _moments: tuple | None = field(default=None, repr=False)
    _slq: dict = field(default_factory=dict, repr=False)
    _probes: dict = field(default_factory=dict, repr=False)

    def objective(self) -> Objective:
        """The mean loss over the sharpness batches (opened once, closed by ``close``)."""
        if self._objective is None:
            self._objective = Objective(self.operator.model, self.loss_fn, self.sharpness_batches)
        return self._objective

    @property
    def test(self) -> Iterable | None:
        """The run's test batches, or None (a Data of training tensors only): the test-set
        measures leave their keys out then."""
        return None if self.data is None else self.data.test

    def operator_on(self, num_samples: int) -> HessianOperator:
        """A Hessian operator on the first ``num_samples`` samples of the subset (the measurement's
        own when that is all of them), with its HVP method; opened once per size (its graphs
        cached for every measure on that size), closed by ``close``."""
        op = self.operator
        # the leading samples of the whole subset, not of this process's share of it
        batches = leading_batches(op.whole_batches, num_samples)
        size = sum(len(y) for _, y in batches)
        if size == sum(len(y) for _, y in op.whole_batches):
            return op
        if size not in self._operators:
            self._operators[size] = op.on(batches)
        return self._operators[size]

    def sharpness_operator(self) -> HessianOperator:
        """The Hessian operator on the sharpness batches (``operator_on``)."""
        return self.operator_on(sum(len(y) for _, y in self.sharpness_batches))

    def fisher_moments(self) -> tuple:
        """``per_sample_gradient_moments`` on the sharpness samples, taken once for both Fisher
        measures."""
        if self._moments is None:
            self._moments = S.per_sample_gradient_moments(self.objective())
        return self._moments

    def slq(self, num_samples: int, num_runs: int, num_steps: int) -> dict:
        """``spectral_density`` on the first ``num_samples`` samples, taken once per setting
        (the density and the sharpness dimension share it)."""
        key = (num_samples, num_runs, num_steps)
        if key not in self._slq:
            op = self.operator_on(num_samples)
            self._slq[key] = spectral_density(
                op, num_runs, num_steps, seed=self.seed, probes=self.probes(op)
            )
        return self._slq[key]

    def probes(self, op: HessianOperator) -> SeededProbes:
        """The seeded Rademacher probes on ``op`` and their HVPs, shared by every measure that
        draws them with the measurement's seed: the trace, the quantization's diagonal and the
        density's start vectors (docs/metrics.md#shared-probes)."""
        if id(op) not in self._probes:
            self._probes[id(op)] = SeededProbes(op, self.seed)
        return self._probes[id(op)]

    def close_operators(self) -> None:
        """Close the operators ``operator_on`` opened (their cached graphs go), and forget the
        probes' products (θ is about to move)."""
        self._probes.clear()
        for op in reversed(list(self._operators.values())):
            op.close()
        self._operators.clear()

    def close(self) -> None:
        """Release the operators and the objective (their hooks and cached graphs)."""
        self.close_operators()
        if self._objective is not None:
            self._objective.close()
            self._objective = None


@MEASURES.register(
    "trace",
    "Hutchinson estimate of tr(H), Rademacher probes",
    config="trace",
    keys=("hessian_trace", "hessian_trace_se"),
    schema={"num_probes": "probes", "num_samples": "count", "deflate": "bool"},
    on_shards=True,
)
def trace(
    m: Measurement, num_samples: int = TRACE_SAMPLES, deflate: bool = True, **options: Any
) -> dict:
    """``hessian_trace`` and its standard error: Hutchinson, deflated by the top Ritz vectors
    when asked."""
    # deflated by the λ_1..k Ritz vectors this measurement computed (docs/metrics.md#trace)
    basis = m.eigenvectors if deflate else None
    op = m.operator_on(num_samples)
    mean, se = hessian_trace(op, seed=m.seed, basis=basis, probes=m.probes(op), **options)
    return {"hessian_trace": mean, "hessian_trace_se": se}


@MEASURES.register(
    "density",
    "spectral density (stochastic Lanczos quadrature), at the end, into summary.json",
    config="density",
    keys=("hessian_density",),
    final_only=True,
    schema={"num_runs": "count", "num_steps": "count", "num_samples": "count"},
    on_shards=True,
)
def density(
    m: Measurement, num_samples: int = DENSITY_SAMPLES, num_runs: int = 3, num_steps: int = 25
) -> dict:
    """``hessian_density``: the spectral density by stochastic Lanczos quadrature."""
    return {"hessian_density": m.slq(num_samples, num_runs, num_steps)}


@MEASURES.register(
    "worst_case",
    "max over ‖ε‖ ≤ ρ of L(θ+ε) − L(θ) by normalized ascent (adaptive: ASAM's ball)",
    config="sharpness.worst_case",
    keys=("sharpness_worst",),
    moves_parameters=True,
    schema={"rho": "positive", "steps": "count", "adaptive": "bool", "eta": "nonnegative"},
)
def worst_case(m: Measurement, **options: Any) -> dict:
    """``sharpness_worst``: the largest L(θ+ε) − L(θ) over the ball, by normalized ascent."""
    return {"sharpness_worst": S.worst_case_sharpness(m.objective(), seed=m.seed, **options)}


@MEASURES.register(
    "average",
    "E L(θ+δ) − L(θ) over δ ~ N(0, σ²I), Monte Carlo",
    config="sharpness.average",
    keys=("sharpness_avg", "sharpness_avg_se"),
    moves_parameters=True,
    schema={"sigma": "positive", "num_samples": "probes"},
)
def average(m: Measurement, **options: Any) -> dict:
    """``sharpness_avg`` and its standard error: E L(θ+δ) − L(θ), δ Gaussian, Monte Carlo."""
    mean, se = S.average_sharpness(m.objective(), seed=m.seed, **options)
    return {"sharpness_avg": mean, "sharpness_avg_se": se}


@MEASURES.register(
    "ggn",
    "λ_max of the Gauss–Newton matrix G = Σ JᵀH_ℓJ and of the rest, H − G (torch.func)",
    config="ggn",
    keys=("lambda_max_ggn", "lambda_max_residual"),
    schema={"num_samples": "count", "max_iter": "count", "tol": "positive"},
)
def ggn(
    m: Measurement, num_samples: int = TRACE_SAMPLES, max_iter: int = 100, tol: float = 1e-3
) -> dict:
    """λ_max of the Gauss–Newton part of the Hessian and of the rest."""
    from .ggn import ggn_eigenvalues

    return ggn_eigenvalues(m.operator_on(num_samples), m.seed, tol, max_iter)


@MEASURES.register(
    "blocks",
    "λ_max of each diagonal block H_bb of the Hessian, GEAR-SAM's blocks (top-level children)",
    config="blocks",
    keys=("lambda_max_block_<block>",),
    schema={"num_samples": "count", "max_iter": "count", "tol": "positive"},
)
def blocks(
    m: Measurement, num_samples: int = TRACE_SAMPLES, max_iter: int = 100, tol: float = 1e-3
) -> dict:
    """λ_max of each diagonal block of the Hessian (the model's top-level children)."""
    from .ggn import block_eigenvalues

    return block_eigenvalues(m.operator_on(num_samples), m.seed, tol, max_iter)


@MEASURES.register(
    "directional",
    "dᵀHd along random unit directions d, by HVPs (mean, max)",
    config="sharpness.directional",
    keys=("sharpness_dir", "sharpness_dir_max"),
    schema={"num_directions": "count"},
)
def directional(m: Measurement, **options: Any) -> dict:
    """``sharpness_dir`` and ``sharpness_dir_max``: dᵀHd over random unit directions (mean, max)."""
    mean, top = S.directional_sharpness(m.sharpness_operator(), seed=m.seed, **options)
    return {"sharpness_dir": mean, "sharpness_dir_max": top}


@MEASURES.register(
    "armijo",
    "backtracking line search along −g; its α brackets the curvature along g",
    config="sharpness.armijo",
    keys=("armijo_alpha", "armijo_curvature", "armijo_accepted"),
    moves_parameters=True,
    schema={"alpha0": "positive", "c": "fraction", "beta": "fraction", "max_steps": "count"},
)
def armijo(m: Measurement, **options: Any) -> dict:
    """The backtracking line search along −g: its α and the curvature it brackets."""
    alpha, curvature, _ = S.armijo_probe(m.objective(), **options)
    return {
        "armijo_alpha": alpha,
        "armijo_curvature": curvature,
        "armijo_accepted": math.isfinite(alpha),
    }


@MEASURES.register(
    "fisher_trace_ratio",
    "Σ H_ii/(F_ii + δ), F the diagonal empirical Fisher: exact on small models, else Hutch++",
    config="sharpness.fisher_trace_ratio",
    keys=("fisher_trace_ratio", "fisher_trace_ratio_se"),
    schema={
        "num_probes": "hutch_probes",
        "damping": "positive",
        "exact_max_params": "off_or_count",
        "deflate": "bool",
    },
)
def fisher_trace_ratio(m: Measurement, deflate: bool = True, **options: Any) -> dict:
    """Σ H_ii/(F_ii + δ) and its standard error, F the diagonal empirical Fisher."""
    basis = m.eigenvectors if deflate else None  # docs/metrics.md#fisher-trace-ratio
    mean, se = S.fisher_trace_ratio(
        m.sharpness_operator(), seed=m.seed, moments=m.fisher_moments(), basis=basis, **options
    )
    return {"fisher_trace_ratio": mean, "fisher_trace_ratio_se": se}


@MEASURES.register(
    "fisher_rao_norm",
    "⟨θ, Fθ⟩, F the empirical Fisher (Liang et al. 2019's Fisher–Rao norm, squared)",
    config="sharpness.fisher_rao_norm",
    keys=("fisher_rao_norm", "fisher_rao_norm_se"),
    schema={},
)
def fisher_rao_norm(m: Measurement) -> dict:
    """``fisher_rao_norm`` ⟨θ, Fθ⟩ and its standard error, F the empirical Fisher."""
    # per-sample gradients (the trace ratio's, when it ran): no HVPs
    value, se = S.fisher_rao_norm(m.objective(), m.fisher_moments())
    return {"fisher_rao_norm": value, "fisher_rao_norm_se": se}


@MEASURES.register(
    "complexity",
    "Jiang et al. 2020's norms: param_norm, dist_from_init, path_norm, spectral_norm_product",
    config="complexity",
    keys=("param_norm", "dist_from_init", "path_norm", "spectral_norm_product"),
    schema={},
)
def complexity(m: Measurement) -> dict:
    """Jiang et al.'s norm-based measures of the weights."""
    from .complexity import complexity_measures

    shape = m.data.input_shape if m.data is not None else m.operator.batches[0][0].shape[1:]
    return complexity_measures(m.operator.model, tuple(shape), m.init_state)


@MEASURES.register(
    "quantization",
    "test accuracy, loss and ECE with weights quantized per channel; the predicted loss rise",
    config="quantization",
    keys=("quant_acc_<b>bit", "quant_drop_<b>bit", "quant_loss_rise_pred_<b>bit"),
    final_only=True,
    schema={"bits": "bit_widths", "exact_max_params": "off_or_count", "num_probes": "probes"},
)
def quantization(
    m: Measurement, bits: Sequence[int] = (8, 4), exact_max_params: int = 1024, num_probes: int = 20
) -> dict:
    """Test accuracy, loss and ECE with the weights quantized to each of ``bits``; the predicted
    loss rise."""
    from .quantization import predicted_rise, quantization_values

    if m.test is None:
        return {}
    out = quantization_values(m.operator.model, m.test, [int(b) for b in bits])
    op = m.sharpness_operator()
    rises = predicted_rise(
        op,
        m.operator.model,
        [int(b) for b in bits],
        exact_max_params,
        num_probes,
        m.seed,
        m.probes(op),
    )
    out.update({f"quant_loss_rise_pred_{b}bit": rise for b, rise in rises.items()})
    return out


@MEASURES.register(
    "input_grad",
    "mean per-sample ‖∇ₓ loss‖₂ over the test set",
    config="input_grad",
    keys=("input_grad_norm",),
    final_only=True,
    schema={"num_samples": "count"},
)
def input_grad(m: Measurement, num_samples: int | None = None) -> dict:
    """The mean per-sample ‖∇ₓ loss‖₂ over the test set (nothing on token inputs)."""
    from .input_grad import input_grad_norm

    if m.test is None or token_inputs(m):  # token ids: no gradient with respect to them
        return {}
    return {"input_grad_norm": input_grad_norm(m.operator.model, m.test, num_samples)}


@MEASURES.register(
    "flip",
    "flip probability over sequences of small perturbations (CIFAR-10-P's measure)",
    config="flip",
    keys=("flip_prob", "flip_prob_<kind>"),
    final_only=True,
    schema={"frames": "probes", "num_samples": "count", "kinds": "flip_kinds"},
)
def flip(
    m: Measurement, frames: int = 10, num_samples: int = 1000, kinds: Sequence[str] | None = None
) -> dict:
    """Flip probabilities over sequences of small perturbations of the test inputs (nothing on
    token inputs)."""
    from .flip import KINDS, flip_probabilities

    if m.test is None or token_inputs(m):  # perturbing token ids by small amounts: no meaning
        return {}
    chosen = tuple(kinds) if kinds else KINDS
    return flip_probabilities(m.operator.model, m.test, frames, num_samples, chosen, m.seed)


@MEASURES.register(
    "sharpness_dim",
    "Kaplan–Yorke dimension of the SGD map at the weights, from the Hessian spectrum",
    config="sharpness_dim",
    keys=("sharpness_dim", "sharpness_dim_dense"),
    schema={
        "num_samples": "count",
        "max_dense": "count",
        "top_k": "off_or_count",
        "num_runs": "count",
        "num_steps": "count",
        "lr": "null_or_positive",
    },
)
def sharpness_dim(
    m: Measurement,
    num_samples: int = DENSITY_SAMPLES,
    max_dense: int = 1024,
    top_k: int = 0,
    num_runs: int = 3,
    num_steps: int = 25,
    lr: float | None = None,
) -> dict:
    """The Kaplan–Yorke dimension of the SGD map at the weights, from the Hessian's spectrum (SGD
    runs only)."""
    from .sharpness_dim import dense_eigenvalues, estimated_eigenvalues, sharpness_dimension

    if m.step is None:  # not an SGD run: its map is not gradient descent's (docs/metrics.md)
        return {}
    step = dict(m.step, lr=float(lr) if lr is not None else m.step["lr"])  # step_for checked it
    op = m.operator_on(num_samples)
    dense = op.numel <= max_dense
    if dense:
        values = dense_eigenvalues(op)
    else:  # the density's SLQ when it runs at this measurement with the same settings
        values = estimated_eigenvalues(op, top_k, m.slq(num_samples, num_runs, num_steps), m.seed)
    return {
        "sharpness_dim": sharpness_dimension(values.tolist(), **step),
        "sharpness_dim_dense": dense,
    }
