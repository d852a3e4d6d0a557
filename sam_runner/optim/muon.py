"""Muon for the 2-D hidden weight matrices, AdamW for everything else (as Muon requires).

One optimizer over parameter groups flagged ``use_muon``; the group dicts are shared
with the two inner optimizers, so schedulers and SAM variants see one set of groups.
Muon's learning rate is matched to AdamW's update RMS (``adjust_lr_fn='match_rms_adamw'``)
so that one ``lr`` serves both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from collections.abc import Callable

    from torch.optim.optimizer import ParamsT


class MuonWithAdamW(torch.optim.Optimizer):
    def __init__(
        self,
        params: ParamsT,
        lr: float = 1e-3,
        momentum: float = 0.95,
        betas: tuple[float, float] = (0.9, 0.999),
        weight_decay: float = 0.05,
    ) -> None:
        super().__init__(
            params, dict(lr=lr, momentum=momentum, betas=betas, weight_decay=weight_decay)
        )
        muon = [g for g in self.param_groups if g.get("use_muon")]
        adam = [g for g in self.param_groups if not g.get("use_muon")]
        for g in muon:
            bad = [tuple(p.shape) for p in g["params"] if p.ndim != 2]
            if bad:
                raise ValueError(
                    f"Muon takes 2-D matrices only; a use_muon group holds shapes {bad}"
                )
        self.muon = (
            torch.optim.Muon(
                muon,
                lr=lr,
                momentum=momentum,
                weight_decay=weight_decay,
                adjust_lr_fn="match_rms_adamw",
            )
            if muon
            else None
        )
        self.adamw = (
            torch.optim.AdamW(adam, lr=lr, betas=betas, weight_decay=weight_decay) if adam else None
        )
        self._inner = [o for o in (self.muon, self.adamw) if o is not None]
        # where each of our groups lives inside the inner optimizers, to keep one order after a load
        self._where = [
            next(
                (i, j)
                for i, o in enumerate(self._inner)
                for j, h in enumerate(o.param_groups)
                if h is g
            )
            for g in self.param_groups
        ]

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:
        """One step of both inner optimizers (``closure``: the loss, optional)."""
        loss = closure() if closure is not None else None
        for o in self._inner:
            o.step()
        return loss

    def state_dict(self) -> dict:
        """The inner optimizers' states."""
        return {"inner": [o.state_dict() for o in self._inner]}

    def load_state_dict(self, state_dict: dict) -> None:
        """Restore the inner optimizers and share their groups again."""
        for o, sd in zip(self._inner, state_dict["inner"]):
            o.load_state_dict(sd)
        # inner loads replace their group dicts: share them again
        self.param_groups = [self._inner[i].param_groups[j] for i, j in self._where]
