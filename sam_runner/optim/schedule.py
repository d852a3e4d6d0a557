"""Which steps perturb: the engine's ``perturb_schedule`` (every variant takes it).

- ``every``: every ``interval``-th step (the default; ``interval=1`` perturbs every step).
- ``random``: each step perturbs with probability ``perturb_prob``, drawn from the schedule's
  own seeded generator (randomized switching, Zhao, Zhang, Hu 2022).
- ``late``: plain steps until ``perturb_from``, then every step (SAM in the late phase, Zhou
  et al.). A fraction f of training (a float in [0, 1], or 0): step k (1-based) of T perturbs
  iff k − 1 ≥ f·T, so f = 0 perturbs from the start and f = 1.0 never. An epoch E (an integer
  ≥ 1, epochs counted from 1 as the runner counts them): step k perturbs iff k − 1 ≥ (E − 1)·S,
  S the optimizer steps of an epoch, so every step of epochs E, E + 1, ... perturbs and E = 1 is
  the variant. The type decides: ``1`` is epoch 1 (every step), ``1.0`` the fraction 1 (none).
- ``adaptive``: AE-SAM (Jiang et al. 2023). With q_t = ‖g_t‖² of the first pass,
  μ_t = δ μ_{t−1} + (1 − δ) q_t and σ²_t = δ σ²_{t−1} + δ (1 − δ)(q_t − μ_{t−1})², perturb iff
  q_t ≥ μ_t + c_t σ_t, c_t = λ₂ + (λ₁ − λ₂)·(k − 1)/T moving linearly from λ₂ to λ₁. Our
  choices: μ₀ = σ²₀ = 0, the statistics in float64 on the host, a non-finite q (an fp16
  overflow) leaves them unchanged and the step plain.

The schedule's state (generator, statistics) is a small dict of Python values, saved with the
optimizer's state so that a resumed run takes the same decisions.
"""

from __future__ import annotations

import math
import random

SCHEDULES = ("every", "random", "late", "adaptive")


def is_epoch(start: float) -> bool:
    """Whether ``perturb_from`` names an epoch (an integer >= 1) rather than a fraction of
    training (a float in [0, 1], or the integer 0)."""
    return isinstance(start, int) and not isinstance(start, bool) and start >= 1


def last_epoch(total_steps: int | None, steps_per_epoch: int | None) -> int | None:
    """The run's last epoch (1-based; a step budget may end it early), None when unknown."""
    if not (total_steps or 0) > 0 or not (steps_per_epoch or 0) > 0:
        return None
    return -(-int(total_steps) // int(steps_per_epoch))


def _check_start(schedule, start, total_steps, steps_per_epoch) -> str | None:
    if is_epoch(start):
        last = last_epoch(total_steps, steps_per_epoch)
        if schedule == "late" and not (steps_per_epoch or 0) > 0:
            return f"perturb_from={start} is an epoch: it needs steps_per_epoch > 0"
        if last is not None and start > last:
            return (
                f"perturb_from={start} is beyond the last epoch ({last}); give an epoch in "
                f"1..{last} or a fraction of training in [0, 1]"
            )
        return None
    if not (isinstance(start, (int, float)) and not isinstance(start, bool) and 0 <= start <= 1):
        return (
            "perturb_from must be a fraction of training in [0, 1] (a float) or an epoch (an "
            f"integer >= 1), got {start!r}"
        )
    return None


def check_schedule(
    schedule: str,
    prob: float,
    start: float,
    interval: int,
    total_steps: int,
    delta: float,
    steps_per_epoch: int | None = None,
) -> str | None:
    """The first problem with the schedule's options, or None."""
    if schedule not in SCHEDULES:
        return f"perturb_schedule must be one of {SCHEDULES}, got {schedule!r}"
    if not (isinstance(prob, (int, float)) and 0 <= prob <= 1):
        return f"perturb_prob must be a number in [0, 1], got {prob!r}"
    problem = _check_start(schedule, start, total_steps, steps_per_epoch)
    if problem:
        return problem
    if not (isinstance(delta, (int, float)) and 0 <= delta < 1):
        return f"perturb_delta must be a number in [0, 1), got {delta!r}"
    if schedule != "every" and int(interval) != 1:
        return f"interval={interval} applies to perturb_schedule='every' only, not {schedule!r}"
    if schedule in ("late", "adaptive") and not (total_steps or 0) > 0:
        return f"perturb_schedule={schedule!r} needs total_steps > 0"
    return None


class PerturbSchedule:
    def __init__(
        self,
        schedule: str,
        interval: int,
        prob: float,
        start: float,
        delta: float,
        lambda1: float,
        lambda2: float,
        seed: int,
        total: int,
        steps_per_epoch: int | None = None,
    ) -> None:
        self.schedule, self.interval, self.total = schedule, int(interval), total
        self.prob, self.start = float(prob), float(start)
        # ``late``: steps k with k − 1 >= start_step perturb (k 1-based)
        if is_epoch(start):
            self.start_step = (int(start) - 1) * int(steps_per_epoch or 0)
        else:
            self.start_step = self.start * total if total else 0.0
        self.delta, self.lambda1, self.lambda2 = float(delta), float(lambda1), float(lambda2)
        self.rng = random.Random(int(seed))
        self.mu, self.var = 0.0, 0.0
        self.perturbed = 0  # steps that took the perturbed pass

    @property
    def needs_grad_norm(self) -> bool:
        """Whether the decision needs ‖g‖² of this step's first pass (AE-SAM)."""
        return self.schedule == "adaptive"

    def decide(self, step: int, sq_norm: float | None = None) -> bool:
        """Whether step ``step`` (1-based) perturbs; ``sq_norm`` = ‖g_t‖² for ``adaptive``."""
        if self.schedule == "every":
            return (step - 1) % self.interval == 0
        if self.schedule == "random":
            return self.rng.random() < self.prob
        if self.schedule == "late":
            return step - 1 >= self.start_step
        return self._adaptive(step, sq_norm)

    def _adaptive(self, step: int, q: float) -> bool:
        if not math.isfinite(q):
            return False
        d, mu_prev = self.delta, self.mu
        self.mu = d * mu_prev + (1 - d) * q
        self.var = d * self.var + d * (1 - d) * (q - mu_prev) ** 2
        t = min(max(step - 1, 0) / self.total, 1.0)
        c = self.lambda2 + (self.lambda1 - self.lambda2) * t
        return q >= self.mu + c * math.sqrt(self.var)

    def state(self) -> dict:
        """The schedule's random state and running statistics, for a checkpoint."""
        return dict(rng=self.rng.getstate(), mu=self.mu, var=self.var, perturbed=self.perturbed)

    def load(self, state: dict) -> None:
        """Restore the random state and running statistics from ``state``."""
        version, internal, gauss = state["rng"]
        self.rng.setstate((int(version), tuple(int(i) for i in internal), gauss))
        self.mu, self.var = float(state["mu"]), float(state["var"])
        self.perturbed = int(state["perturbed"])
