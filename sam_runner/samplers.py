"""Training-set samplers: ``uniform`` (shuffle each epoch) and sampling-side methods.

A sampler sees the per-sample losses of every pass (``observe``) and may set the
loader's per-example weights at the end of each epoch (``end_epoch``).
"""
from __future__ import annotations

from .errors import require


class UniformSampler:
    """Plain shuffling: nothing to observe, nothing to change."""

    def observe(self, pass_index, idx, targets, per_sample_loss) -> None:
        pass

    def end_epoch(self, loader) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass

    def log_values(self) -> dict:
        return {}


SAMPLERS = {"uniform": lambda cfg, data: UniformSampler()}


def build_sampler(cfg, data):
    name = cfg.get("sampler", "uniform")
    require(name in SAMPLERS, f"dataset.sampler={name!r} is unknown; choose one of {', '.join(SAMPLERS)}")
    return SAMPLERS[name](cfg, data)
