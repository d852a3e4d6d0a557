"""Kept importable from here: the checks live in ``sam_runner.training.validate`` (a config whole)
and ``sam_runner.training.warnings`` (legal settings almost surely not meant)."""

from .training.validate import validate_config, validate_run, validate_trainer
from .training.warnings import warnings

__all__ = ["validate_config", "validate_run", "validate_trainer", "warnings"]
