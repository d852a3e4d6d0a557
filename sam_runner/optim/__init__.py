"""SAM variants: ``torch.optim.Optimizer`` subclasses built on one shared two-pass engine.

``VARIANTS`` maps the config names (``conf/optimizer/<name>.yaml``) to the classes.
Adding a variant: one module here, one yaml there, one line below.
"""
from .engine import SharpnessAware
from .base import Base
from .sam import SAM

VARIANTS = {
    "base": Base,
    "sam": SAM,
}

__all__ = ["SharpnessAware", "VARIANTS", *(cls.__name__ for cls in VARIANTS.values())]
