"""The GPU check's ``host`` part (scripts/gpu_check.py): the host's work per step with a tiny
model on the device, and the synchronising calls a step makes there.

``host_step_over_bare`` and ``host_sam_over_davda54`` are bench section ``host``'s ratios
(scripts/bench_host.py: one Linear layer, so the device's compute is ≈ 0 and the host's work is
the step) with the runner and the bare loops on the check's device, the device synchronised
around each timed block; ``*_us_per_step`` their step times. ``syncs_per_step``: under CUDA's
sync debug mode (``torch.cuda.set_sync_debug_mode("warn")``: a warning per synchronising call),
the warnings a runner step raises, per variant (0 is the design: tests/optim/test_host_syncs.py
counts the same on the CPU by a ``TorchFunctionMode``). The dry run (``--cpu``) times the CPU and
records no sync count (CUDA's debug mode is CUDA's)."""

from __future__ import annotations

import warnings

import torch
from bench_host import ONE_LAYER, BareLoop
from benchutil import interleaved_ratio, median_time, set_up_run

STEPS = {"cpu": 20, "cuda": 200}  # steps per timed block
SYNC_VARIANTS = ("base", "sam", "gear_sam", "look_sam", "esam")  # one step rule each


def host_part(part) -> None:
    """Fill ``part.result`` with the host ratios, the step times and the syncs per step.

    Args:
        part: gpu_parts' ``Part`` (its device, its result dict, its ``attempt``).
    """
    from gpu_parts import Stepper

    steps = STEPS[part.device]
    for name, variant in (("host_step_over_bare", "base"), ("host_sam_over_davda54", "sam")):
        run = set_up_run(*ONE_LAYER, f"optimizer={variant}", "base_optimizer=sgd",
                         f"trainer.device={part.device}")  # fmt: skip
        ours, bare = Stepper(run, part), BareLoop(run, sam=variant == "sam")
        bare.order = bare.order.to(bare.x.device)  # the bare loop's indices where its data is

        def block(stepper, n=steps):
            for _ in range(n):
                stepper.step()
            part.sync()

        part.result[name] = interleaved_ratio(lambda: block(ours), lambda: block(bare), 5)
        part.result[f"{name}_us_per_step"] = {
            "ours": 1e6 * median_time(lambda: block(ours), 3) / steps,
            "bare": 1e6 * median_time(lambda: block(bare), 3) / steps,
        }
        part.save()
    if part.device == "cuda":
        part.result["syncs_per_step"] = {
            v: part.attempt(f"syncs:{v}", syncs_per_step, v, Stepper, part) for v in SYNC_VARIANTS
        }


def syncs_per_step(variant: str, stepper_class, part, steps: int = 10) -> float:
    """Synchronising calls per runner step of ``variant`` on CUDA (after a warm-up step: the
    first step builds buffers and may copy once)."""
    run = set_up_run(*ONE_LAYER, f"optimizer={variant}", "trainer.device=cuda")
    stepper = stepper_class(run, part)
    stepper.step()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(steps):
                stepper.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught) / steps
