"""SAM variants: ``torch.optim.Optimizer`` subclasses built on one shared two-pass engine.

``VARIANTS`` maps the config names (``conf/optimizer/<name>.yaml``) to the classes.
Adding a variant: one module here, one yaml there, one line below.
"""
from .engine import SharpnessAware
from .base import Base
from .sam import SAM
from .asam import ASAM
from .gear_sam import GEARSAM
from .tlc_sam import TLCSAM
from .le_sam import LESAM
from .eisam import EISAM
from .csam import CSAM
from .spectral_sam import SpectralSAM
from .sam_sps import SAMSPS
from .precond_sam import PrecondSAM
from .gsam import GSAM

VARIANTS = {
    "base": Base,
    "sam": SAM,
    "asam": ASAM,
    "gear_sam": GEARSAM,
    "tlc_sam": TLCSAM,
    "le_sam": LESAM,
    "eisam": EISAM,
    "csam": CSAM,
    "spectral_sam": SpectralSAM,
    "sam_sps": SAMSPS,
    "precond_sam": PrecondSAM,
    "gsam": GSAM,
}

__all__ = ["SharpnessAware", "VARIANTS", *(cls.__name__ for cls in VARIANTS.values())]
