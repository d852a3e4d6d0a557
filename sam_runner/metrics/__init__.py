"""Metrics: calibration and curvature (the contract's public functions live here)."""
from .calibration import expected_calibration_error, reliability_bins
from .hessian import top_hessian_eigenvalues

__all__ = ["expected_calibration_error", "reliability_bins", "top_hessian_eigenvalues"]
