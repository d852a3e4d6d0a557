"""Probabilistic circuits (``model=pc``): a smooth, decomposable circuit over discrete variables
(circuit.py), its exact Hessian trace with respect to the sum weights and that trace's per-node
decomposition (curvature.py), mini-batch EM (em.py), the trace regularizers with their closed-form
EM updates (regularizers.py) and the density-estimation task of a run (task.py).
docs/circuits.md gives the formulas and their derivations."""

from .circuit import ProbabilisticCircuit
from .curvature import WeightView, hessian_trace, node_curvature, trace_by_depth

__all__ = [
    "ProbabilisticCircuit",
    "WeightView",
    "hessian_trace",
    "node_curvature",
    "trace_by_depth",
]
