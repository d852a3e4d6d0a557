"""SAM variants in other libraries' training loops.

- ``SAMTrainer`` (``hf.py``): a ``transformers.Trainer`` whose optimizer is a variant; its
  ``training_step`` runs the variant's passes over the micro-batches of each optimizer step.

The libraries are imported when their integration is first used (``pip install -e '.[hf]'``).
"""

from __future__ import annotations

__all__ = ["SAMTrainer"]


def __getattr__(name: str):
    if name == "SAMTrainer":
        from .hf import SAMTrainer

        return SAMTrainer
    raise AttributeError(name)
