"""Metrics: calibration, curvature and activation statistics (the public functions of the Python
API live here)."""

from ..circuits.curvature import hessian_trace as pc_hessian_trace
from .calibration import (
    adaptive_calibration_error,
    brier_score,
    expected_calibration_error,
    maximum_calibration_error,
    reliability_bins,
)
from .complexity import complexity_measures
from .hvp import HessianOperator
from .input_grad import input_grad_norm
from .oui import oui
from .quantization import quantize_weights
from .sharpness_dim import sharpness_dimension
from .solvers import (
    hessian_eigenpairs,
    hessian_trace,
    smoothed_density,
    spectral_density,
    top_hessian_eigenvalues,
)

__all__ = [
    "expected_calibration_error",
    "adaptive_calibration_error",
    "maximum_calibration_error",
    "brier_score",
    "reliability_bins",
    "top_hessian_eigenvalues",
    "hessian_eigenpairs",
    "hessian_trace",
    "spectral_density",
    "smoothed_density",
    "HessianOperator",
    "oui",
    "sharpness_dimension",
    "quantize_weights",
    "complexity_measures",
    "input_grad_norm",
    "pc_hessian_trace",
]
