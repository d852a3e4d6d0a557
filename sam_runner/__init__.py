"""sam-runner: an experiment runner for flatness studies (SAM variants, calibration, sharpness)."""

__version__ = "0.1.0"
