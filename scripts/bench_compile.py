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

import tempfile
import time
from pathlib import Path

from benchutil import interleaved_ratio, single_threaded


def _run(*overrides):
    from hydra import compose, initialize_config_dir

    from sam_runner.cli import register_resolvers
    from sam_runner.paths import config_dir
    from sam_runner.training.run import Run

    register_resolvers()
    overrides = ["optimizer=sam", "trainer.progress=none", "trainer.epochs=1000", *overrides]
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose("config", overrides=overrides)
    run = Run(cfg, Path(tempfile.mkdtemp()), overrides)
    run.setup()
    return run


@single_threaded
def run(args) -> dict:
    repeats = 3 if args.quick else args.repeats
    from gpu_parts import Stepper  # the epoch loop's body, as the GPU check times it

    eager, fast = Stepper(_run(), None), Stepper(_run("trainer.compile=true"), None)
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
