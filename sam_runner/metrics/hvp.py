"""Hessian-vector products of the mean loss over fixed batches (``HessianOperator``).

Two methods:
- ``double_backward``: g = ∂L/∂θ with ``create_graph``, then Hv = ∂(g·v)/∂θ. When the graphs of
  all batches fit in ``graph_cache_mb`` (measured on the first batch from the tensors autograd
  saves), they are built once and reused by every HVP, so an HVP is one extra backward instead
  of forward + backward + backward. Otherwise batches are processed one at a time (memory
  bounded by one batch's graph).
- ``forward_over_reverse``: ``torch.func.jvp`` of ``torch.func.grad``.
``auto`` takes ``double_backward`` when the graphs are cached; otherwise it times both on the
first batch once per (model, device, batch shape) and keeps the faster. On a CPU,
``double_backward``'s batches are spread over worker threads with an equal share of the
intra-op threads each (small convolutions use two cores poorly: ~1.3× on 2 cores), their sums
added in a fixed order. The choice, the cache and the threads are ours, not from a paper.
"""

from __future__ import annotations

import time

import torch

from .objective import Objective, grad_or_zero

HVP_METHODS = ("auto", "double_backward", "forward_over_reverse")
_method_choice: dict = {}  # (model type, device, params, batch shape, cached) -> method name


class _BatchPool:
    """Sums ``fn(i)`` (lists of tensors) over batch indices, on CPU worker threads when there are
    cores to share: worker w takes indices w, w + W, ...; partial sums are added in worker order.
    autograd and the ATen kernels release the GIL, so the threads run in parallel."""

    def __init__(self, device, n_batches):
        threads = torch.get_num_threads()
        self.workers = min(threads, n_batches) if device.type == "cpu" else 1
        self._threads, self._pool = threads, None
        if self.workers > 1:
            from concurrent.futures import ThreadPoolExecutor

            per_worker = max(1, threads // self.workers)
            self._pool = ThreadPoolExecutor(
                self.workers, initializer=torch.set_num_threads, initargs=(per_worker,)
            )

    def _per_worker(self, work, indices):
        indices = list(indices)
        if self._pool is None or len(indices) < 2:
            return [work(indices)]
        chunks = [indices[w :: self.workers] for w in range(self.workers)]
        return list(self._pool.map(work, [c for c in chunks if c]))

    def sum(self, fn, indices):
        return _sum_lists(self._per_worker(lambda chunk: _sum_lists(fn(i) for i in chunk), indices))

    def map(self, fn, indices) -> list:
        """[fn(i) for i in indices], computed on the workers."""
        done = dict(
            pair
            for part in self._per_worker(lambda chunk: [(i, fn(i)) for i in chunk], indices)
            for pair in part
        )
        return [done[i] for i in indices]

    def close(self):
        if self._pool is not None:
            self._pool.shutdown()
            self._pool = None
            torch.set_num_threads(self._threads)  # the workers' setting is process-wide in ATen


def _sum_lists(lists):
    out = None
    for ts in lists:
        out = list(ts) if out is None else torch._foreach_add(out, ts)
    return out


class _SavedBytes:
    """Counts the bytes autograd saves for backward (an estimate of a graph's memory)."""

    def __init__(self):
        self.bytes = 0

    def pack(self, t):
        self.bytes += t.numel() * t.element_size()
        return t


class HessianOperator(Objective):
    """Flat v ↦ H v for the mean loss over ``batches``; counts the HVPs it performs."""

    def __init__(self, model, loss_fn, batches, method: str = "auto", graph_cache_mb: float = 1024):
        if method not in HVP_METHODS:
            raise ValueError(
                f"hvp method={method!r} is unknown; choose one of {', '.join(HVP_METHODS)}"
            )
        super().__init__(model, loss_fn, batches)
        self.graph_cache_mb = graph_cache_mb
        self.hvps = 0
        self._graphs = None
        self._pool = _BatchPool(self.device, len(self.batches))
        self._cache_ok = self._graph_fits(graph_cache_mb)
        self.method = self._choose(method)

    def close(self):
        self._graphs = self._first_graph = None
        self._pool.close()
        super().close()

    # -- Hessian-vector products
    def _graph_fits(self, budget_mb) -> bool:
        """Whether the create_graph gradients of all batches fit in ``budget_mb``: what a cached
        graph keeps alive (each HVP's own backward saves tensors too, but frees them at once)."""
        counter = _SavedBytes()
        with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t):
            g = grad_or_zero(self.batch_loss(0), self.params, create_graph=True)
        fits = counter.bytes * len(self.batches) <= budget_mb * 2**20
        self._first_graph = g if fits else None
        return fits

    def _build_graphs(self):
        """Every batch's create_graph gradients, once (batch 0's from ``_graph_fits``), on the
        workers.
        """
        if self._graphs is None:
            self._graphs = [self._first_graph] + self._pool.map(
                lambda j: grad_or_zero(self.batch_loss(j), self.params, create_graph=True),
                range(1, len(self.batches)),
            )

    def _grads_with_graph(self, i):
        if self._cache_ok:
            return self._graphs[i]
        return grad_or_zero(self.batch_loss(i), self.params, create_graph=True)

    def _hvp_double_backward(self, vs, n_batches=None):
        if self._cache_ok:
            self._build_graphs()  # here, not inside the workers: they only read the cache
        return self._pool.sum(
            lambda i: grad_or_zero(
                self._grads_with_graph(i), self.params, grad_outputs=vs, retain_graph=self._cache_ok
            ),
            range(n_batches or len(self.batches)),
        )

    def _hvp_forward_over_reverse(self, vs, n_batches=None):
        primals = tuple(p.detach() for p in self.params)

        def batch(i):
            grad_fn = torch.func.grad(lambda ps: self.batch_loss(i, ps))
            return torch.func.jvp(lambda *ps: grad_fn(ps), primals, tuple(vs))[1]

        # one thread: functional_call swaps the module's parameters in place, so it cannot overlap
        return _sum_lists(batch(i) for i in range(n_batches or len(self.batches)))

    def hvp_list(self, vs, method=None, n_batches=None):
        method = method or self.method
        fn = (
            self._hvp_double_backward
            if method == "double_backward"
            else self._hvp_forward_over_reverse
        )
        return [h.detach() for h in fn(vs, n_batches)]

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        self.hvps += 1
        hv = self.hvp_list(self.unflat(v.to(self.dtype)))
        return self.flat(hv).to(v.dtype)

    def _choose(self, method):
        # With cached graphs an HVP is one backward through the saved graph, which forward-over-
        # reverse (it recomputes the forward and the gradient each time) cannot beat: no timing.
        if method != "auto":
            return method
        if self._cache_ok:
            return "double_backward"
        x0 = self.batches[0][0]
        key = (
            type(self.model).__name__,
            str(self.device),
            self.numel,
            tuple(x0.shape),
            self._cache_ok,
            len(self.batches),
        )
        if key not in _method_choice:
            # not the global RNG: a resumed run must draw as an unbroken one
            g = torch.Generator().manual_seed(0)
            vs = [
                torch.randn(p.shape, generator=g, dtype=p.dtype).to(p.device) for p in self.params
            ]
            cost = {}
            for m in ("double_backward", "forward_over_reverse"):
                self.hvp_list(vs, m, 1)  # warm-up; timed on the first batch only
                t0 = time.perf_counter()
                self.hvp_list(vs, m, 1)
                if self.device.type == "cuda":
                    torch.cuda.synchronize(self.device)
                cost[m] = time.perf_counter() - t0
            _method_choice[key] = min(cost, key=cost.get)
        return _method_choice[key]
