"""Bench section ``cheaper``: what the cheaper-SAM methods cost per step, over whole cycles.

A LookSAM or randomized-switching step is either a two-pass step or a one-pass step, so one
step's time says little: each measurement here is a block of steps (LookSAM k = 5: two whole
cycles of 5; RST p = 0.5: 20 steps, its seeded draws) against a block of as many steps of the
reference, taken alternately, the median ratio over rounds (``benchutil.interleaved_ratio``).
ESAM (β = 0.6, γ = 0.5), at its defaults and with ``faithful``, against SAM, and SAM under
the default ``every`` schedule against SAM without the schedule's bookkeeping, in blocks of 4
steps, the fastest of 3 (``esam_only()`` runs these rows alone). Models and optimizers as
section ``optim`` builds them (default model at batch 128; CIFAR ResNet-18 at batch 32 without
``--quick``), on one CPU thread.

Keys: ``look_sam_k5_over_base_step_<model>``, ``rst_p05_over_base_step_<model>``,
``esam_over_sam_step_<model>``, ``esam_faithful_over_sam_step_<model>``, their FLOP ratios
``esam_over_sam_flops_<model>``, ``esam_faithful_over_sam_flops_<model>`` (blocks of 4 steps),
``schedule_every_over_plain_step_<model>`` and ``schedule_every_bookkeeping_share_<model>`` (the
bookkeeping's own time over a SAM step's).
"""

from __future__ import annotations

import copy
import time

import torch
from bench_optim import _ratios, _setup, _stepper
from benchutil import interleaved_ratio, median_time, single_threaded

from sam_runner.optim import VARIANTS
from sam_runner.optim.build import parameter_groups


def _steps(name, model, x, y, n, adjust=None, **kw):
    """``n`` optimizer steps of ``name`` (built as the runner builds it, then ``adjust(opt)``)
    as one call."""
    model = copy.deepcopy(model)
    sgd = dict(lr=0.01, momentum=0.9, weight_decay=5e-4)
    opt = VARIANTS[name](parameter_groups(model), torch.optim.SGD, total_steps=10**6, **sgd, **kw)
    if adjust is not None:
        adjust(opt)
    step = _stepper(opt.bind(model=model), model, x, y)

    def block():
        for _ in range(n):
            step()

    return block


@single_threaded
def run(args) -> dict:
    """Single-threaded CPU (benchutil.single_threaded)."""
    out = {}
    for kind in ["default"] if args.quick else ["default", "resnet18"]:
        model, x, y = _setup(kind)
        repeats = 3 if args.quick or kind == "resnet18" else max(args.repeats, 5)
        look = _steps("look_sam", model, x, y, 10, k=5)
        rst = _steps("sam", model, x, y, 20, perturb_schedule="random", perturb_prob=0.5)
        base10, base20 = (_steps("base", model, x, y, n) for n in (10, 20))
        sam = _steps("sam", model, x, y, 4)
        out[f"look_sam_k5_over_base_step_{kind}"] = interleaved_ratio(look, base10, repeats)
        out[f"rst_p05_over_base_step_{kind}"] = interleaved_ratio(rst, base20, repeats)
        out.update(esam_rows(model, x, y, sam, repeats, kind))
        out.update(bookkeeping_row(model, x, y, sam, repeats, kind))
    return out


def _unscheduled(opt) -> None:
    """The plain variant step: ``opt`` without the schedule's bookkeeping (every step perturbs
    with no decision asked, and no pass is counted)."""
    opt.schedule.decide = lambda *_: True
    opt._counted = lambda closure: closure


def bookkeeping_row(model, x, y, sam, repeats: int, kind: str) -> dict:
    """``schedule_every_over_plain_step``: SAM under ``perturb_schedule=every`` (the default:
    the decision, the perturbed count, the counted closure) over the same SAM without them;
    blocks of 4 steps, as ``esam_rows``."""
    plain = _steps("sam", model, x, y, 4, adjust=_unscheduled)
    ratios = _ratios({"every": sam}, plain, repeats, calls=3)
    step = min(median_time(plain, 1, 0) for _ in range(3)) / 4
    return {
        f"schedule_every_over_plain_step_{kind}": ratios["every"],
        f"schedule_every_bookkeeping_share_{kind}": _bookkeeping_s() / step,
    }


def _bookkeeping_s(n: int = 20000) -> float:
    """Seconds a step of SAM spends on the schedule's bookkeeping alone, as ``step`` runs it (the
    decision, the counted closure's two calls, the perturbed count), over ``n`` steps: a share
    of a step far below what the side-by-side ratio resolves on a shared machine."""
    opt = VARIANTS["sam"]([torch.nn.Parameter(torch.zeros(1))], torch.optim.SGD, lr=0.1)

    def closure():
        return None

    t0 = time.perf_counter()
    for k in range(1, n + 1):
        counted = opt._counted(closure)
        perturb = opt.passes > 1 and opt.schedule.decide(k)
        counted(), counted()
        opt.schedule.perturbed += perturb
    return (time.perf_counter() - t0) / n


def esam_rows(model, x, y, sam, repeats: int, kind: str) -> dict:
    """ESAM at its defaults (the paper's per-coordinate mask) and ``faithful`` (the official
    code's per-tensor mask, whose first pass skips the tensors drawn out) over SAM: blocks of 4
    steps (faithful's cost varies with the tensors drawn), the fastest of 3 blocks of each taken
    alternately, the median over rounds (``bench_optim._ratios``: on the shared machine the
    median of single blocks gave 0.81 and 1.05 for the same code in two runs)."""
    fns = {
        key: _steps("esam", model, x, y, 4, **kw)
        for key, kw in (("esam", {}), ("esam_faithful", {"faithful": True}))
    }
    ratios = _ratios(fns, sam, repeats, calls=3)
    out = {f"{key}_over_sam_step_{kind}": r for key, r in ratios.items()}
    sam_flops = _flops(sam)
    for key, f in fns.items():
        out[f"{key}_over_sam_flops_{kind}"] = _flops(f) / sam_flops
    return out


def _flops(fn) -> int:
    """The matrix and convolution FLOPs ``fn()`` runs, forward and backward
    (``torch.utils.flop_counter``: normalization, elementwise and optimizer arithmetic are not
    counted). Unlike a time, it does not depend on who else uses the machine."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()


@single_threaded
def esam_only(kinds=("default",), repeats: int = 5, rows=("esam",)) -> dict:
    """The ESAM rows (and/or ``"bookkeeping"``) alone: ``python -c "import sys;
    sys.path.insert(0, 'scripts'); import bench_cheaper as b; print(b.esam_only())"``."""
    out = {}
    for kind in kinds:
        model, x, y = _setup(kind)
        sam = _steps("sam", model, x, y, 4)
        if "esam" in rows:
            out.update(esam_rows(model, x, y, sam, repeats, kind))
        if "bookkeeping" in rows:
            out.update(bookkeeping_row(model, x, y, sam, repeats, kind))
    return out
