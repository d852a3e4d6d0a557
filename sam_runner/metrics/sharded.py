"""The Hessian of an FSDP2-sharded model (``trainer.strategy=fsdp``) without gathering the model.

FSDP2 shards each parameter along dim 0 in chunks of ⌈d₀/N⌉ rows (the last processes' shorter
or empty). Each process keeps its chunk, padded with zero rows to that length, as the leaf of
the HVP's graph. A forward gathers every whole parameter *inside* the graph
(``all_gather_single_autograd``, whose backward is a reduce-scatter, itself differentiable) and
runs the model's structure (on the meta device) through ``functional_call`` on them and on the
model's buffers. g = ∂L/∂leaf is then this process's chunk of the gradient of the loss over
every process's samples (the reduce-scatter sums them), and ∂⟨g, v⟩/∂leaf, each process
differentiating its own scalar with its own chunk v of the vector, is its chunk of H v: the
collectives of the processes' backwards pair up. FSDP2's own all-gather has no double backward,
hence the structure rather than the sharded module.

The operator's vectors are chunks too (n/N entries per process, padding left out): the solvers
sum their inner products and norms over the processes (``reduce_sum``, one all-reduce each).
The whole weights exist only inside one batch's graph while its HVP runs (or, with the graphs
cached, inside each cached graph: counted in the cache's budget like any saved tensor).
"""

from __future__ import annotations

import math

import torch
from torch.distributed._functional_collectives import all_gather_single_autograd

from ..activation_checkpointing import checkpointing_paused
from ..module_state import reshard_gathered
from .hvp import HessianOperator
from .objective import Objective


def chunk_rows(rows: int, world: int) -> int:
    """The rows of each FSDP2 chunk of a parameter with ``rows`` rows over ``world`` processes."""
    return -(-rows // world)


def padded_shard(param, world: int) -> torch.Tensor:
    """This process's chunk of the DTensor ``param`` (sharded along dim 0), a copy padded with
    zero rows to the chunk length."""
    if tuple(param.placements) != (torch.distributed.tensor.Shard(0),):
        raise ValueError(f"a parameter sharded as {param.placements}: only dim 0 is supported")
    local = param.to_local().detach()
    missing = chunk_rows(param.shape[0], world) - local.shape[0]
    if missing == 0:
        return local.clone()
    return torch.cat([local, local.new_zeros(missing, *local.shape[1:])])


def split_each_batch(batches, rank: int, world: int) -> tuple[list, int]:
    """(this process's part of each batch, the whole set's sample count): every process gets as
    many batches (each batch's passes are collectives), parts of sizes differing by at most one
    (``tensor_split``). A last batch of fewer samples than processes joins the one before."""
    batches = [(x, y) for x, y in batches]
    if len(batches) > 1 and len(batches[-1][1]) < world:
        (x0, y0), (x1, y1) = batches[-2:]
        batches[-2:] = [(torch.cat([x0, x1]), torch.cat([y0, y1]))]
    total = sum(len(y) for _, y in batches)
    if any(len(y) < world for _, y in batches):
        raise ValueError(f"{total} samples cannot be split among {world} processes")
    return [(x.tensor_split(world)[rank], y.tensor_split(world)[rank]) for x, y in batches], total


class ShardedHessianOperator(HessianOperator):
    """``HessianOperator`` of the FSDP2-sharded ``sharded`` module, its forward run by
    ``structure`` (the model's unsharded structure, on the meta device; its modes and which
    parameters are trainable are the measurement's), over ``batches`` split among the
    processes of ``dist``. Vectors are this process's chunks (see the module docstring);
    ``double_backward`` HVPs, one batch after the other."""

    threaded_batches = False

    def __init__(
        self,
        sharded,
        structure,
        loss_fn,
        batches,
        dist,
        graph_cache_mb: float = 1024,
        precision: str = "fp32",
    ):
        self.sharded, self.reduce_sum = sharded, dist.sum
        reshard_gathered(sharded)  # an evaluation's forward leaves the root's gathered
        named = dict(sharded.named_parameters())
        self._whole_shapes = {n: p.shape for n, p in named.items()}
        self._leaves = {n: padded_shard(p, dist.world) for n, p in named.items()}
        self._group = next(iter(named.values())).device_mesh.get_group()
        self._buffers = dict(sharded.named_buffers())
        method, batching = "double_backward", "loop"  # one batch, one vector at a time
        super().__init__(
            structure, loss_fn, batches, method, graph_cache_mb, batching, dist, precision
        )
        self._rows = [named[n].to_local().shape[0] for n in self.names]
        self._sizes = [r * math.prod(s[1:]) for r, s in zip(self._rows, self.shapes)]
        self.numel = sum(self._sizes)
        # where this process's chunk starts in each whole parameter (FSDP2's chunks, in order)
        self._first_row = [dist.rank * s[0] for s in self.shapes]

    def on(self, batches) -> ShardedHessianOperator:
        """The same model's operator on other ``batches`` (every process's samples), in this
        one's precision."""
        model = (self.sharded, self.model, self.loss_fn, batches, self.dist)
        return ShardedHessianOperator(*model, self.graph_cache_mb, self.precision)

    def rademacher_chunks(self, count: int, generator: torch.Generator) -> torch.Tensor:
        """[count, numel]: this process's chunks of ``count`` Rademacher vectors over the whole
        model, drawn as one process draws them whole (``solvers._rademacher``: the generator's
        values in the same order, parameter by parameter, each parameter's rows cut out), so
        that estimates from them equal one process's to float rounding."""
        rows = []
        for _ in range(count):
            parts = []
            for n, first, r in zip(self.names, self._first_row, self._rows):
                shape = self._whole_shapes[n]
                signs = torch.randint(0, 2, (math.prod(shape),), generator=generator)
                parts.append(signs.view(shape[0], -1)[first : first + r].reshape(-1))
            rows.append(torch.cat(parts))
        return (torch.stack(rows) * 2 - 1).to(self.device, self.dtype)

    def _contexts(self, model) -> list:
        return [checkpointing_paused(model)]  # see activation_checkpointing

    def _trainable(self, model) -> tuple[list, list]:
        names = [n for n, p in model.named_parameters() if p.requires_grad]
        return names, [self._leaves[n].requires_grad_(True) for n in names]

    def _split(self, model, batches, dist) -> tuple[list, int]:  # noqa: ARG002 (the hook's)
        return split_each_batch(batches, dist.rank, dist.world)

    def _forward(self, x, params):
        chunks = dict(self._leaves)
        chunks.update(zip(self.names, self.params if params is None else params))
        whole = {n: self._gathered(c, self._whole_shapes[n][0]) for n, c in chunks.items()}
        return torch.func.functional_call(self.model, {**whole, **self._buffers}, (x,))

    def _gathered(self, chunk: torch.Tensor, rows: int) -> torch.Tensor:
        """The whole parameter from every process's ``chunk``, in the graph (padding dropped)."""
        return all_gather_single_autograd(chunk.contiguous(), 0, self._group)[:rows]

    def flat(self, ts) -> torch.Tensor:
        """Chunks shaped as the leaves (padded) as one flat vector, the padding left out."""
        return torch.cat([t[:r].reshape(-1) for t, r in zip(ts, self._rows)])

    def unflat(self, v: torch.Tensor) -> list:
        """The flat chunk ``v`` shaped as the leaves, zeros in the padding rows."""
        out = []
        for part, r, s in zip(v.split(self._sizes), self._rows, self.shapes):
            rows = part.view(r, *s[1:])
            out.append(torch.cat([rows, rows.new_zeros(s[0] - r, *s[1:])]) if s[0] > r else rows)
        return out

    def _summed(self, t: torch.Tensor) -> torch.Tensor:
        return t  # H v and the gradient are chunks of the whole, summed by the reduce-scatters

    @torch.no_grad()
    def loss(self) -> torch.Tensor:
        return self.dist.sum(Objective.loss(self))

    def _graph_fits(self, budget_mb) -> bool:
        """Whether every process's graphs fit (cached on all or on none: an HVP over cached graphs
        runs no forward, so no all-gathers, and the processes' collectives must pair up)."""
        fits = super()._graph_fits(budget_mb)
        misfits = self.dist.sum(torch.tensor([0.0 if fits else 1.0], device=self.device))
        if float(misfits) > 0:
            self._first_graph = None
            return False
        return True
