"""``SAMTrainer``: a Hugging Face ``transformers.Trainer`` whose optimizer is a SAM variant.

The Trainer takes one optimizer step per ``gradient_accumulation_steps`` micro-batches and never
hands its optimizer a closure. ``SAMTrainer.training_step`` keeps the micro-batches of the
current step; on the last one it calls the variant's ``step(closure)``, the closure running
forward and backward over all of them with the Trainer's own loss scaling (so every pass of the
variant sees the whole accumulated batch). The Trainer's own ``optimizer.step()`` that follows
is then a no-op (the step is taken), its scheduler moves the variant's learning rate as usual,
and its checkpoints hold the variant's ``state_dict``.

The optimizer: ``optimizers=(variant, scheduler)`` as for any Trainer, or built here:
``SAMTrainer(..., variant="sam", variant_kwargs={"rho": 0.05}, base_optimizer=torch.optim.AdamW)``
with the Trainer's parameter groups (weight decay off for biases and norms), learning rate, betas
and epsilon. Gradient clipping (``args.max_grad_norm``) is the variant's, before its base step.
Anything else is refused: an optimizer that is not a SAM variant, a variant whose passes need
the runner's loss hooks (``esam``, ``csam``, ``focal_sam``, ``functional_sam``: their per-sample
weights or logits come through ``reduce_loss``, which a model computing its own loss skips), and
fp16 loss scaling (bf16 and fp32 run).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from transformers import Trainer

from ..errors import UserError
from ..optim.engine import SharpnessAware
from ..registry import VARIANTS

if TYPE_CHECKING:
    from typing import Any

    from torch import nn

# variants whose passes need the per-sample losses or logits through reduce_loss/select_rows
NEEDS_LOSS_HOOKS = ("esam", "csam", "focal_sam", "functional_sam")


class _StepTakenInTrainingStep(torch.optim.Optimizer):
    """What the Trainer holds as its optimizer: the variant's groups and state, a ``step`` that
    does nothing (``training_step`` took it) and the variant's ``state_dict``."""

    def __init__(self, variant: SharpnessAware):  # noqa: D107 (no Optimizer.__init__: shared)
        self.variant = variant
        self.defaults, self.state = variant.defaults, variant.state
        self.param_groups = variant.param_groups
        self._optimizer_step_pre_hooks, self._optimizer_step_post_hooks = {}, {}
        self._optimizer_state_dict_pre_hooks, self._optimizer_state_dict_post_hooks = {}, {}
        self._optimizer_load_state_dict_pre_hooks = {}
        self._optimizer_load_state_dict_post_hooks = {}
        self._zero_grad_profile_name = "SAMTrainer.zero_grad"

    def step(self, closure=None):  # noqa: ARG002 (the Trainer's call, after training_step's)
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.variant.zero_grad(set_to_none=set_to_none)

    def state_dict(self):
        return self.variant.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self.variant.load_state_dict(state_dict)
        self.param_groups = self.variant.param_groups


def _require_variant(optimizer) -> SharpnessAware:
    variant = getattr(optimizer, "variant", optimizer)
    if not isinstance(variant, SharpnessAware):
        raise UserError(
            f"SAMTrainer's optimizer must be a SAM variant (sam_runner.optim), got "
            f"{type(variant).__name__}; use transformers.Trainer for other optimizers"
        )
    name = getattr(VARIANTS.entry_of(type(variant)), "name", type(variant).__name__)
    if name in NEEDS_LOSS_HOOKS:
        raise UserError(
            f"SAMTrainer cannot run {name}: its passes need the per-sample losses or logits "
            "through optimizer.reduce_loss; train it with sam-run or a closure of your own"
        )
    return variant


class SAMTrainer(Trainer):
    """A ``transformers.Trainer`` whose optimizer is a SAM variant (module docstring).

    Args:
        variant: the config name of the variant to build when no optimizer is given (``sam``).
        variant_kwargs: its keywords (``rho``, the variant's own), beside the base's.
        base_optimizer: the base optimizer class (``torch.optim.AdamW``).
    """

    def __init__(
        self,
        *args: Any,
        variant: str = "sam",
        variant_kwargs: dict | None = None,
        base_optimizer: type = torch.optim.AdamW,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        if self.args.fp16:
            raise UserError("SAMTrainer runs fp32 or bf16 (bf16=True); fp16 loss scaling is not "
                            "supported: set fp16=False")  # fmt: skip
        self.variant_name, self.variant_kwargs = variant, dict(variant_kwargs or {})
        self.base_optimizer_cls = base_optimizer
        self.variant: SharpnessAware | None = None
        self._window: list = []
        if self.optimizer is not None:
            self.variant = _require_variant(self.optimizer)
            self.optimizer = _StepTakenInTrainingStep(self.variant)

    def create_optimizer(self, model: nn.Module | None = None) -> torch.optim.Optimizer:
        """The SAM variant around ``base_optimizer`` over the Trainer's two parameter groups
        (with and without weight decay)."""
        if self.optimizer is None:
            model = self.model if model is None else model
            decay = set(self.get_decay_parameter_names(model))
            named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
            wd = self.args.weight_decay
            groups = [
                {"params": [p for n, p in named if n in decay], "weight_decay": wd},
                {"params": [p for n, p in named if n not in decay], "weight_decay": 0.0},
            ]
            base_kwargs = {"lr": self.args.learning_rate}
            if issubclass(self.base_optimizer_cls, torch.optim.Adam):  # AdamW is an Adam
                base_kwargs.update(betas=(self.args.adam_beta1, self.args.adam_beta2),
                                   eps=self.args.adam_epsilon)  # fmt: skip
            cls = VARIANTS.entry(self.variant_name).target
            self.variant = _require_variant(
                cls(groups, self.base_optimizer_cls, **self.variant_kwargs, **base_kwargs)
            )
            self.optimizer = _StepTakenInTrainingStep(self.variant)
        return self.optimizer

    def training_step(
        self,
        model: nn.Module,
        inputs: dict[str, Any],
        num_items_in_batch: int | torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Keep the micro-batch; on the step's last, the variant's passes over all of them."""
        self._window.append((inputs, num_items_in_batch))
        if not self.accelerator.sync_gradients:
            return torch.zeros((), device=self.args.device)
        window, self._window = self._window, []
        variant = self.variant
        variant.bind(model=model, clip_grad_norm=self.args.max_grad_norm or None)

        def closure():
            variant.zero_grad(set_to_none=True)
            total = torch.zeros((), device=self.args.device)
            for micro, count in window:
                total += super(SAMTrainer, self).training_step(model, micro, count)
            return total

        return variant.step(closure).detach()

    def _clip_grad_norm(self, model):
        """The variant clipped before its base step: the norm of the gradients it left."""
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        return torch.linalg.vector_norm(torch.stack([g.norm() for g in grads])) if grads else None
