"""SAM variants: ``torch.optim.Optimizer`` subclasses built on one shared two-pass engine.

``VARIANTS`` maps the config names (``conf/optimizer/<name>.yaml``) to the classes. Each
variant registers itself in its own module (``@VARIANTS.register(...)``), and every module of
this package is imported here: adding a variant is one module and one yaml.
"""

from ..registry import VARIANTS
from .engine import SharpnessAware
from .lion import Lion, LionK

globals().update({cls.__name__: cls for cls in VARIANTS.values()})  # SAM, ASAM, GEARSAM, ...

__all__ = [
    "SharpnessAware",
    "VARIANTS",
    "Lion",
    "LionK",
    *(cls.__name__ for cls in VARIANTS.values()),
]
