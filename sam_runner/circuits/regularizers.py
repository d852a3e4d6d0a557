"""Sharpness regularizers of a circuit (``regularizer=pc_trace``, ``regularizer=pc_adaptive``):
the objective is the mean negative log-likelihood plus weight·R(w), R a measure of the Hessian
trace in the sum weights (curvature.py; docs/circuits.md derives the updates).

With φ_i = mean f_i(x)² (node i's flow) and T_i = mean f_i(x)²·s_i(x) (its share of −tr H):

    pc_trace     R = Σ_i T_i = −tr H                   (every node weighted by its flow)
    pc_adaptive  R = Σ_i T_i / φ_i                     (each node's own local curvature)

Gradient training (any base but em): the term is added to the loss, differentiated exactly
(the flows by a backward pass with a graph, one extra forward and its double backward).

EM (``base_optimizer=em``): the closed-form regularized update. With the E-step's posteriors held
(flows f_i(x) and child responsibilities r_ij(x) = w_ij c_j(x)/p_i(x)), the edge curvature is
h_ij(w) = ρ_ij / w_ij², ρ_ij = mean f_i² r_ij²; maximising Σ_j n̄_ij log w_ij − λκ_i Σ_j ρ_ij/w_ij²
over the simplex with the penalty's gradient taken at the current weights gives

    w_ij ∝ n̄_ij + 2λ·κ_i·h_ij        (κ_i = 1: pc_trace; κ_i = 1/φ_i: pc_adaptive)

pseudo-counts β_ij = 2λκ_i h_ij that EM (em.py) adds to the expected flows n̄_ij.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..part import Part, PassInputs
from .circuit import circuit_of
from .curvature import edge_curvature, flows, node_sums

if TYPE_CHECKING:
    from torch import nn

FLOW_FLOOR = 1e-12  # φ_i below this (a node no example reaches) is taken as this


class CircuitRegularizer(Part):
    """weight·R(w) on a circuit; ``adaptive``: each node's term divided by its flow.

    Args:
        weight: λ >= 0.
        adaptive: False: pc_trace; True: pc_adaptive.
    """

    extra_forwards = 1

    def __init__(self, weight: float, adaptive: bool) -> None:
        self.weight, self.adaptive = weight, adaptive

    def penalty(self, model: nn.Module, x: torch.Tensor, create_graph: bool = True) -> torch.Tensor:
        """R(w) on the batch x (differentiable in the circuit's parameters)."""
        total = 0.0
        for flow, term in node_sums(circuit_of(model), x, create_graph=create_graph):
            if self.adaptive:
                total = total + (term / flow.clamp_min(FLOW_FLOOR * len(x))).sum()
            else:
                total = total + term.sum() / len(x)
        return total

    def pseudo_counts(self, model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
        """β of each sum level on the batch x (shaped like its weights): 2λκ_i h_ij."""
        circuit = circuit_of(model)
        done = flows(circuit, x)  # one forward and top-down pass for both
        edges = edge_curvature(circuit, x, done=done)
        if not self.adaptive:
            return [2 * self.weight * h / len(x) for h in edges]
        node_flows = [f for f, _ in node_sums(circuit, x, done=done)]
        return [
            2 * self.weight * h / f.clamp_min(FLOW_FLOOR * len(x)).unsqueeze(-1)
            for h, f in zip(edges, node_flows)
        ]

    def loss_term(self, objective: torch.Tensor, inputs: PassInputs) -> torch.Tensor:
        """``objective`` with the regularizer's term of the pass's micro-batch."""
        return self.add(objective, inputs.model, inputs.inputs, inputs.logits, inputs.share)

    def add(
        self, loss: torch.Tensor, model: nn.Module, x: torch.Tensor, out: torch.Tensor, share: float
    ) -> torch.Tensor:
        """``loss`` with the term of the micro-batch x (a share ``share`` of the step's batch;
        ``out`` its log-likelihoods): under EM the pseudo-counts are recorded instead."""
        circuit = circuit_of(model)
        if not out.requires_grad:  # a forward no gradient flows from
            return loss
        if getattr(circuit.sum_logits[0], "em_driven", False):  # EM: the closed-form update
            with torch.no_grad():
                for p, beta in zip(circuit.sum_logits, self.pseudo_counts(model, x)):
                    held = getattr(p, "em_prior", None)
                    p.em_prior = share * beta if held is None else held + share * beta
            return loss
        return loss + self.weight * share * self.penalty(model, x)
