"""Metrics: calibration, curvature and activation statistics (the public functions of the Python
API live here)."""

from .calibration import (
    adaptive_calibration_error,
    brier_score,
    expected_calibration_error,
    maximum_calibration_error,
    reliability_bins,
)
from .hvp import HessianOperator
from .oui import oui
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
]
