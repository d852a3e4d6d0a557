"""Bench section ``compile`` (python scripts/bench.py --only compile): torch.compile on the CPU.

compiled_over_eager_step  the runner's SAM step (a Run set up as sam-run builds it; each step the
                          body of the epoch loop: the engine's two passes, scheduler) with
                          trainer.compile=true over the same run eager, on the default model
                          (MNIST-1D, cnn1d, batch 128), one thread, after the compile (the
                          first steps are warm-up); no target on the CPU: on a GPU a compiled
                          step should gain more (fused kernels cut launches and memory passes;
                          compile_mode=reduce-overhead adds CUDA graphs)
compile_s                 seconds of the compiled run's first step (the compilation)
"""

from __future__ import annotations

import time

from benchutil import interleaved_ratio, set_up_run, single_threaded


@single_threaded
def run(args) -> dict:
    repeats = 3 if args.quick else args.repeats
    from gpu_parts import Stepper  # the epoch loop's body, as the GPU check times it

    eager = Stepper(set_up_run("optimizer=sam"), None)
    fast = Stepper(set_up_run("optimizer=sam", "trainer.compile=true"), None)
    t0 = time.perf_counter()
    fast.step()
    compile_s = time.perf_counter() - t0
    steps = 5 if args.quick else 20
    ratio = interleaved_ratio(
        lambda: [fast.step() for _ in range(steps)],
        lambda: [eager.step() for _ in range(steps)],
        repeats,
        warmup=1,
    )
    return {"compiled_over_eager_step": ratio, "compile_s": compile_s}
