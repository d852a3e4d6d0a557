"""Bench section ``circuits``: what a probabilistic circuit's training step and its exact
curvature cost, in log-likelihood forwards of the same batch (no gradient), side by side
(``benchutil.interleaved_ratio``), on one CPU thread. The circuit is ``model=pc``'s default
(depth 3, 8 sum units, 4 repetitions) on binarized digits' 64 variables, batch 100.

Keys: ``pc_em_step_over_forward`` (a mini-batch EM step: forward, backward, the update),
``pc_em_regularized_step_over_forward`` (with ``regularizer=pc_adaptive``'s pseudo-counts),
``pc_exact_trace_over_forward`` (``pc_hessian_trace`` on the batch: forward and the sum layers'
backward), ``pc_sgd_step_over_forward`` (a plain gradient step on the logits, for scale).
"""

from __future__ import annotations

import torch
from benchutil import interleaved_ratio, single_threaded

from sam_runner.circuits import ProbabilisticCircuit
from sam_runner.circuits.em import EM
from sam_runner.circuits.regularizers import CircuitRegularizer
from sam_runner.metrics import pc_hessian_trace


def _circuit_and_batch():
    torch.manual_seed(0)
    pc = ProbabilisticCircuit(64, 2, depth=3, sum_units=8, repetitions=4)
    x = (torch.rand(100, 64) < 0.4).float()
    return pc, x


def _step(pc, x, opt, regularizer=None):
    def run():
        def closure():
            opt.zero_grad()
            out = pc(x)
            loss = -out.mean()
            if regularizer is not None:
                loss = regularizer.add(loss, pc, x, out, 1.0)
            loss.backward()
            return loss

        opt.step(closure)

    return run


@single_threaded
def run(args) -> dict:
    repeats = 3 if args.quick else args.repeats
    pc, x = _circuit_and_batch()

    def forward():
        with torch.no_grad():
            pc(x)

    out = {}
    em = EM(pc.parameters(), lr=0.1)
    out["pc_em_step_over_forward"] = interleaved_ratio(_step(pc, x, em), forward, repeats, 2, 5)
    reg = CircuitRegularizer(0.01, adaptive=True)
    out["pc_em_regularized_step_over_forward"] = interleaved_ratio(
        _step(pc, x, em, reg), forward, repeats, 2, 5
    )
    out["pc_exact_trace_over_forward"] = interleaved_ratio(
        lambda: pc_hessian_trace(pc, [x]), forward, repeats, 2, 5
    )
    plain, _ = _circuit_and_batch()
    sgd = torch.optim.SGD(plain.parameters(), lr=0.1)
    out["pc_sgd_step_over_forward"] = interleaved_ratio(
        _step(plain, x, sgd), lambda: forward(), repeats, 2, 5
    )
    return out
