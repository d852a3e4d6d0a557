"""Hessian-vector products of the mean loss over fixed batches (``HessianOperator``).

Two methods:
- ``double_backward``: g = ∂L/∂θ with ``create_graph``, then Hv = ∂(g·v)/∂θ. When the graphs of
  all batches fit in ``graph_cache_mb`` and in half the device's free memory (measured on the
  first batch from the tensors autograd saves), they are built once and reused by every HVP,
  so an HVP is one extra backward instead of forward + backward + backward. Otherwise batches
  are processed one at a time (memory bounded by one batch's graph).
- ``forward_over_reverse``: ``torch.func.jvp`` of ``torch.func.grad``.
``auto`` takes ``double_backward`` when the graphs are cached; otherwise it times both on the
first batch once per (model, device, batch shape) and keeps the faster.
``hvp_batch`` applies H to several vectors: over cached graphs, all of them through one
backward (``is_grads_batched``, a vmap over the saved graph) or one backward per vector.
``batching="auto"`` keeps the loop on a CPU: on the default model on 2 cores vmap's batched
matrix products copy the saved tensors, 1.5× slower per vector than the loop (3 and 8 vectors,
the median of 7 alternated pairs), and timing the two there costs about as many HVPs as a
trace and, on a loaded machine, picks either. On CUDA it times both once per model shape and
vector count on the first batch and keeps the faster (not measured on a GPU yet). On a CPU,
``double_backward``'s batches are spread over worker threads with an equal share of the
intra-op threads each (small convolutions use two cores poorly: ~1.3× on 2 cores), their sums
added in a fixed order. The choice, the cache and the threads are ours, not from a paper.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import sys
import time
import warnings
from typing import TYPE_CHECKING

import torch

from .objective import Objective, grad_or_zero

if TYPE_CHECKING:
    from collections.abc import Iterator

HVP_METHODS = ("auto", "double_backward", "forward_over_reverse")
HVP_PRECISIONS = ("fp32", "bf16")  # bf16: the HVP's forward under autocast
BATCHINGS = ("auto", "batched", "loop")
_method_choice: dict = {}  # (model type, device, params, batch shape, cached) -> method name
_batching_choice: dict = {}  # (the same, number of vectors) -> whether one batched backward pays


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


def cpu_has_bf16() -> bool:
    """Whether this CPU computes in bf16 natively (AVX-512 BF16 or AMX)."""
    cpu = getattr(torch, "cpu", None)
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(cpu, c, lambda: False)()) for c in checks)


def _share(batches, rank: int, world: int, as_many: bool = False) -> tuple[list, int] | None:
    """(process ``rank``'s share of the samples of ``batches``, batched as they were, or with
    ``as_many`` in as many batches as the whole set had; the whole set's count), or None (no
    split) with fewer samples than processes. Samples are dealt in contiguous runs of
    ``⌈n/world⌉``."""
    batches = [(x, y) for x, y in batches]
    size = max(len(y) for _, y in batches)
    xs, ys = torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])
    n = len(ys)
    per = -(-n // world)
    if (world - 1) * per >= n:  # the last process would get none
        return None
    lo, hi = min(rank * per, n), min((rank + 1) * per, n)
    x, y = xs[lo:hi], ys[lo:hi]
    if as_many:
        size = -(-len(y) // len(batches))
    return [(x[i : i + size], y[i : i + size]) for i in range(0, len(y), size)], n


def _sum_lists(lists):
    out = None
    for ts in lists:
        out = list(ts) if out is None else torch._foreach_add(out, ts)
    return out


GRAPH_CACHE_FREE_SHARE = 0.5  # of the device's free memory, at most, for the cached graphs


def free_memory_bytes(device) -> int | None:
    """The memory free on ``device`` now: CUDA's free memory, or the host's available memory
    (``MemAvailable``, Linux); None where it cannot be read."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def graph_cache_budget(graph_cache_mb: float, device) -> float:
    """Bytes the gradient graphs may take: ``graph_cache_mb`` MiB, and no more than
    ``GRAPH_CACHE_FREE_SHARE`` of the memory free on ``device`` (the rest is the HVPs' own
    and the solver's)."""
    free = free_memory_bytes(device)
    budget = graph_cache_mb * 2**20
    return budget if free is None else min(budget, GRAPH_CACHE_FREE_SHARE * free)


# glibc's mallopt parameters, and what a CPU operator sets them to while it is open
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
HEAP_KEPT_BYTES = 1 << 30
# after it: glibc's dynamic mmap threshold at its maximum and its trim threshold, twice that
# (mallopt turns the dynamic adjustment off, so the defaults cannot be put back as such)
MMAP_THRESHOLD_AFTER, TRIM_THRESHOLD_AFTER = 32 << 20, 64 << 20
_heap_kept_depth = [0]


def _glibc():
    """The C library, where it is glibc (mallopt, malloc_trim); else None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


@contextlib.contextmanager
def heap_kept(device: torch.device | str) -> Iterator[None]:
    """On a CPU with glibc: freed memory stays in the process's heap while the context is open
    (no mmap for large blocks, no trim), so that each HVP's backward reuses the pages of the
    last instead of faulting in fresh zeroed ones; afterwards the free heap goes back to the
    system. On the fsdp bench's 30-HVP λ_max (a SmallCNN, 2048 samples) the page faults were ~20%
    of the HVPs' CPU time (kernel time); without them a process spent 17% fewer CPU seconds
    alone, 27% fewer beside a second one on the same memory bus.

    Args:
        device: where the HVPs run (only a CPU's heap is concerned).
    """
    libc = _glibc() if torch.device(device).type == "cpu" else None
    if libc is None:
        yield
        return
    if _heap_kept_depth[0] == 0:
        libc.mallopt(M_MMAP_THRESHOLD, HEAP_KEPT_BYTES)
        libc.mallopt(M_TRIM_THRESHOLD, HEAP_KEPT_BYTES)
    _heap_kept_depth[0] += 1
    try:
        yield
    finally:
        _heap_kept_depth[0] -= 1
        if _heap_kept_depth[0] == 0:
            libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_AFTER)
            libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_AFTER)
            libc.malloc_trim(0)


class _SavedBytes:
    """Counts the bytes autograd saves for backward (an estimate of a graph's memory)."""

    def __init__(self):
        self.bytes = 0

    def pack(self, t):
        self.bytes += t.numel() * t.element_size()
        return t


class HessianOperator(Objective):
    """Flat v ↦ H v for the mean loss over ``batches``; counts the HVPs it performs."""

    # a sum over the processes that each hold a part of every vector (None: the vectors are
    # whole): the solvers' inner products and norms go through it
    reduce_sum = None
    # whether the batches may run on worker threads (not when each pass is a collective: the
    # processes' collectives must come in the same order)
    threaded_batches = True

    def __init__(
        self,
        model,
        loss_fn,
        batches,
        method: str = "auto",
        graph_cache_mb: float = 1024,
        batching: str = "auto",
        dist=None,
        precision: str = "fp32",
    ):
        """``dist``: the run's processes (``distributed.Topology``); with several, the samples
        are split among them (each its share, batched as before, on a CPU in as many batches
        as before, weighted by the whole set's count) and every H v, loss and gradient is
        all-reduced (summed): the same operator as one process over all the samples, each
        process computing 1/N of it."""
        batches = [(x, y) for x, y in batches]
        split = self._split(model, batches, dist)
        if method not in HVP_METHODS:
            raise ValueError(
                f"hvp method={method!r} is unknown; choose one of {', '.join(HVP_METHODS)}"
            )
        if batching not in BATCHINGS:
            raise ValueError(
                f"hvp batching={batching!r} is unknown; choose one of {', '.join(BATCHINGS)}"
            )
        self.dist = dist if split is not None else None
        self.precision = precision
        super().__init__(model, loss_fn, batches if split is None else split[0])
        self.whole_batches = batches  # every process's samples (``on``)
        self._stack.enter_context(heap_kept(self.device))
        if split is not None:  # each batch weighted by its share of the whole set
            self.weights = [len(y) / split[1] for _, y in self.batches]
        self.graph_cache_mb, self.batching = graph_cache_mb, batching
        self.hvps = 0
        self._graphs = None
        self._pool = _BatchPool(self.device, len(self.batches) if self.threaded_batches else 1)
        self._cache_ok = self._graph_fits(graph_cache_mb)
        self.method = self._choose(method)

    def _split(self, model, batches, dist) -> tuple[list, int] | None:
        """(this process's batches, the whole set's sample count), or None: all of them here."""
        if dist is None or not dist.parallel:
            return None
        # on a CPU the share keeps the batch count, so that its HVPs spread over as many
        # worker threads as one process's would (batches of 256 or 128 cost alike per sample)
        on_cpu = next(model.parameters()).device.type == "cpu"
        return _share(batches, dist.rank, dist.world, as_many=on_cpu)

    def on(self, batches) -> HessianOperator:
        """The operator of the same model on other ``batches`` (every process's samples, split
        among the processes as these are), with this one's HVP method and precision."""
        return HessianOperator(self.model, self.loss_fn, batches, self.method, self.graph_cache_mb,
                               self.batching, self.dist, self.precision)  # fmt: skip

    def batch_loss(self, i, params=None):
        """The batch's weighted mean loss; under ``precision=bf16`` its forward in autocast
        (bf16 matrix products, fp32 reductions), so H v is bf16's."""
        if self.precision != "bf16":
            return super().batch_loss(i, params)
        with torch.autocast(self.device.type, dtype=torch.bfloat16):
            return super().batch_loss(i, params).float()

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
        fits = counter.bytes * len(self.batches) <= graph_cache_budget(budget_mb, self.device)
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
        with warnings.catch_warnings():  # torch's jvp rules still script themselves on first use
            warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated", FutureWarning)
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
        return self._summed(self._local_hvp(v))

    def leading_hvp(self, v: torch.Tensor, n_batches: int) -> torch.Tensor:
        """H v of the loss over each process's first ``n_batches`` batches (the presolve's;
        uncounted), summed over the processes as ``op(v)`` is."""
        hv = self.hvp_list(self.unflat(v.to(self.dtype)), n_batches=n_batches)
        return self._summed(self.flat(hv).to(v.dtype))

    def _local_hvp(self, v: torch.Tensor) -> torch.Tensor:
        """This process's share of H v (all of it on one process)."""
        self.hvps += 1
        hv = self.hvp_list(self.unflat(v.to(self.dtype)))
        return self.flat(hv).to(v.dtype)

    def _summed(self, t: torch.Tensor) -> torch.Tensor:
        """``t`` summed over the processes that split the samples (one all-reduce)."""
        if self.dist is not None:
            t = self.dist.sum(t)
        return t

    @torch.no_grad()
    def loss(self) -> torch.Tensor:
        return self._summed(super().loss())

    def gradient(self) -> torch.Tensor:
        return self._summed(super().gradient())

    # -- several vectors at once
    def hvp_batch(self, V: torch.Tensor) -> torch.Tensor:
        """H applied to each row of V [B, n] (counts B HVPs): through one backward for all rows
        when ``batching_pays(B)``, else one HVP per row. The rows agree with ``op(v)`` to float
        rounding."""
        if len(V) > 1 and self.batching_pays(len(V)):
            try:
                hv = self._hvp_batched(self._unflat_rows(V.to(self.dtype)))
            except RuntimeError:  # an operation vmap cannot batch: the loop, from now on
                _batching_choice[self._shape_key(len(V))] = False
                self.batching = "loop"
            else:
                self.hvps += len(V)
                rows = torch.cat([h.detach().reshape(len(V), -1) for h in hv], 1).to(V.dtype)
                return self._summed(rows)
        return self._summed(torch.stack([self._local_hvp(v) for v in V]))

    def batching_pays(self, count: int) -> bool:
        """Whether ``count`` vectors go through one batched backward: only over cached graphs
        with ``double_backward``; under ``auto``, never on a CPU (measured slower there, see the
        module docstring), and on CUDA when timed faster than the loop (once per model shape
        and count, on the first batch, probe vectors from a private generator)."""
        if self.batching == "loop" or not (self._cache_ok and self.method == "double_backward"):
            return False
        if self.batching == "batched":
            return True
        # split among processes: no timing, which could choose differently in each of them
        if self.device.type != "cuda" or self.dist is not None:
            return False
        key = self._shape_key(count)
        if key not in _batching_choice:
            _batching_choice[key] = self._time_batching(count)
        return _batching_choice[key]

    def _time_batching(self, count) -> bool:
        g = torch.Generator().manual_seed(0)  # not the global RNG (see _choose)
        V = torch.randn(count, self.numel, generator=g).to(self.device, self.dtype)
        rows = self._unflat_rows(V)
        try:
            self._hvp_batched(rows, 1)  # warm-up; timed on the first batch only
            batched = self._timed(lambda: self._hvp_batched(rows, 1))
        except RuntimeError:
            return False
        loop = self._timed(lambda: [self.hvp_list(self.unflat(v), n_batches=1) for v in V])
        return batched < loop

    def _timed(self, fn) -> float:
        t0 = time.perf_counter()
        fn()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0

    def _unflat_rows(self, V) -> list:
        """Rows of V [B, n] as a list of [B, *shape] tensors, one per parameter."""
        sizes = [math.prod(s) for s in self.shapes]
        return [c.reshape(len(V), *s) for c, s in zip(V.split(sizes, 1), self.shapes)]

    def _hvp_batched(self, vs, n_batches=None):
        self._build_graphs()
        count = len(vs[0])

        def batch(i):
            hv = grad_or_zero(
                self._graphs[i],
                self.params,
                grad_outputs=vs,
                retain_graph=True,
                is_grads_batched=True,
            )
            # a parameter the loss does not reach gets one unbatched zero: one per vector
            return [
                h if h.dim() > p.dim() else h.expand(count, *p.shape)
                for h, p in zip(hv, self.params)
            ]

        return self._pool.sum(batch, range(n_batches or len(self.batches)))

    def _shape_key(self, *extra) -> tuple:
        x0 = self.batches[0][0]
        return (
            type(self.model).__name__,
            str(self.device),
            self.numel,
            tuple(x0.shape),
            self._cache_ok,
            len(self.batches),
            *extra,
        )

    def _time_methods(self) -> str:
        """The faster method, timed on a slice of the first batch (its leading 64 samples: the
        two methods' costs grow alike with the batch, and a full batch of a large model would
        cost four full HVPs), each after a warm-up on 2 samples (first-call costs)."""
        # not the global RNG: a resumed run must draw as an unbroken one
        g = torch.Generator().manual_seed(0)
        vs = [torch.randn(p.shape, generator=g, dtype=p.dtype).to(p.device) for p in self.params]
        (x, y), saved = self.batches[0], (self.batches, self.weights)
        cost = {}
        try:
            for m in ("double_backward", "forward_over_reverse"):
                for n in (2, 64):
                    self.batches, self.weights = [(x[:n], y[:n])], [1.0]
                    t0 = time.perf_counter()
                    self.hvp_list(vs, m, 1)
                    if self.device.type == "cuda":
                        torch.cuda.synchronize(self.device)
                    cost[m] = time.perf_counter() - t0
        finally:
            self.batches, self.weights = saved
        return min(cost, key=cost.get)

    def _choose(self, method):
        # With cached graphs an HVP is one backward through the saved graph, which forward-over-
        # reverse (it recomputes the forward and the gradient each time) cannot beat: no timing.
        if method != "auto":
            return method
        if self._cache_ok:
            return "double_backward"
        key = self._shape_key()
        if key not in _method_choice:
            _method_choice[key] = self._time_methods()
        return _method_choice[key]
