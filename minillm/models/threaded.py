"""Few-row projections split by output rows across threads, so batch-1 decode uses every core.

A decode step with one or a few rows is a chain of matrix-vector products: its time is the
weight bytes divided by how fast one core pulls them from memory. Torch's own intra-op
threading does not help there (a one-row ``F.linear`` is one MKL gemv call that barely
parallelises, and under load its OpenMP team spins against other processes), so a second
thread bought a SmolLM2-135M decode step nothing (``benchmarks/linear_paths.py``).

This module cuts each projection's weight ``[out, in]`` into ``num_threads`` contiguous row
shards (views: no copy) and hands all but the first to persistent worker threads, each running
torch with one intra-op thread; the calling thread computes the first shard, then the shards'
outputs are concatenated. Torch ops release the GIL, so the shards stream their rows in
parallel. Each output element is the same dot product the unsplit call computes, over the same
row, so the result is bit-identical to ``F.linear`` (``tests/test_linear_paths.py`` checks it).

Calls with more than ``max_rows`` rows (prefills) stay on one ``F.linear`` with torch's own
intra-op threads: a GEMM already uses every core.
"""

from __future__ import annotations

import queue
import threading
import weakref
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

#: the most rows a call may have to be split across threads: decode steps of a few requests
#: (bigger steps are GEMMs that torch's intra-op threads already spread over the cores)
DEFAULT_MAX_ROWS = 4
#: shards start on multiples of this many rows (the kernels' blocking: keeps every output row
#: computed by the same code path as in the unsplit call; measured: cuts at odd rows change
#: the last bits, cuts at multiples of 8 do not, on AVX-512)
ROW_ALIGN = 64
#: projections with fewer weight bytes stay whole: they come from cache in a few microseconds,
#: less than a hand-off to another thread costs (~10-25 us)
MIN_SPLIT_BYTES = 1 << 20

__all__ = ["DEFAULT_MAX_ROWS", "MIN_SPLIT_BYTES", "RowSplitLinear", "ShardPool", "use_row_split"]


class ShardPool:
    """``num_threads - 1`` persistent worker threads; ``run`` computes one job per thread,
    the first on the calling thread. Workers are joined by ``close()`` (also when the pool is
    garbage-collected), so an engine that goes away leaves no thread behind."""

    def __init__(self, num_threads: int):
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 2:
            raise ValueError(f"num_threads must be an int >= 2 for a shard pool, got {num_threads!r}")
        self.num_threads = num_threads
        self._inboxes = [queue.SimpleQueue() for _ in range(num_threads - 1)]
        self._outboxes = [queue.SimpleQueue() for _ in range(num_threads - 1)]
        self._threads = [threading.Thread(target=_work, args=(i, o), name=f"minillm-shard-{n + 1}", daemon=True)
                         for n, (i, o) in enumerate(zip(self._inboxes, self._outboxes))]
        before = torch.get_num_threads()
        for t in self._threads:
            t.start()
        for outbox in self._outboxes:  # each worker has set its own intra-op count to 1 ...
            outbox.get()
        torch.set_num_threads(before)  # ... which torch also reports process-wide: put ours back
        self._closed = False
        self._finalizer = weakref.finalize(self, _stop, self._inboxes, self._threads)

    @property
    def closed(self) -> bool:
        return self._closed

    def run(self, fn, jobs: list[tuple]) -> list:
        """``[fn(*job) for job in jobs]`` (``len(jobs) <= num_threads``), in parallel: job 0
        on this thread, each other one offered to a worker. A job no worker has claimed by the
        time this thread is free is computed here instead, so on a busy machine (a worker not
        scheduled in time) a split call costs about what the unsplit one does, not a wait
        for a core."""
        if self._closed:
            raise RuntimeError("the shard pool is closed")
        inference = torch.is_inference_mode_enabled()
        offers = []
        for inbox, job in zip(self._inboxes, jobs[1:]):
            claim = threading.Lock()
            inbox.put((claim, fn, job, inference))
            offers.append(claim)
        results, error = [], None
        with one_intra_op_thread():
            try:
                results.append(fn(*jobs[0]))
            except BaseException as e:
                error = e
            for outbox, claim, job in zip(self._outboxes, offers, jobs[1:]):
                if claim.acquire(blocking=False):  # not started by its worker: ours
                    if error is None:
                        try:
                            results.append(fn(*job))
                        except BaseException as e:
                            error = e
                else:  # the worker has it: one answer comes back, in order
                    r = outbox.get()
                    if isinstance(r, BaseException) and error is None:
                        error = r
                    results.append(r)
        if error is not None:
            raise error
        return results

    def close(self) -> None:
        """Stop and join the workers (idempotent)."""
        self._closed = True
        self._finalizer()


def _work(inbox: queue.SimpleQueue, outbox: queue.SimpleQueue) -> None:
    torch.set_num_threads(1)  # this thread's share runs alone: the pool is the parallelism
    outbox.put(True)
    while True:
        task = inbox.get()
        if task is None:
            return
        claim, fn, job, inference = task
        if not claim.acquire(blocking=False):  # the caller got there first and computed it
            continue
        try:  # grad and inference modes are per thread: take the caller's
            with torch.inference_mode() if inference else torch.no_grad():
                outbox.put(fn(*job))
        except BaseException as e:  # handed to the caller, which raises it
            outbox.put(e)


def _stop(inboxes, threads) -> None:
    for inbox in inboxes:
        inbox.put(None)
    for t in threads:
        if t is not threading.current_thread():
            t.join()


@contextmanager
def one_intra_op_thread():
    """Torch on this thread with one intra-op thread for the block (its share of a split)."""
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def shard_bounds(rows: int, parts: int, align: int = ROW_ALIGN) -> list[tuple[int, int]]:
    """``parts`` contiguous ``[start, stop)`` ranges covering ``rows``, as even as the
    alignment allows (fewer parts when there are too few rows: at least ``align`` each)."""
    parts = max(1, min(parts, rows // align))
    cuts = [0] + [min(rows, round(rows * i / parts / align) * align) for i in range(1, parts)] + [rows]
    return [(a, b) for a, b in zip(cuts, cuts[1:]) if b > a]


class RowSplitLinear(nn.Module):
    """``F.linear(x, weight, bias)``, its output rows computed by a ``ShardPool``'s threads
    when ``x`` has at most ``max_rows`` rows. Keeps the original ``weight`` / ``bias``
    parameters (the shards are views of them), so the state dict and tied weights are unchanged."""

    def __init__(self, linear: nn.Linear, pool: ShardPool, max_rows: int = DEFAULT_MAX_ROWS):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.pool, self.max_rows = pool, max_rows
        bounds = shard_bounds(self.out_features, pool.num_threads)
        self._split = len(bounds) == pool.num_threads and self.weight.is_contiguous()
        self._shards = [(self.weight[a:b], None if self.bias is None else self.bias[a:b]) for a, b in bounds]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // max(x.shape[-1], 1)
        if not self._split or rows > self.max_rows or self.pool.closed or torch.is_grad_enabled():
            return F.linear(x, self.weight, self.bias)
        outs = self.pool.run(_linear, [(x, w, b) for w, b in self._shards])
        return torch.cat(outs, dim=-1)

    def unsplit(self) -> nn.Linear:
        """The plain ``nn.Linear`` this wraps (same parameters)."""
        lin = nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                        device="meta", dtype=self.weight.dtype)
        lin.weight, lin.bias = self.weight, self.bias
        return lin

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"shards={len(self._shards) if self._split else 1}, max_rows={self.max_rows}")


def _linear(x, w, b):
    return F.linear(x, w, b)


def use_row_split(model: nn.Module, num_threads: int | None, max_rows: int = DEFAULT_MAX_ROWS,
                  min_bytes: int = MIN_SPLIT_BYTES) -> ShardPool | None:
    """Swap ``model``'s float projections (``model.projections()``) of at least ``min_bytes``
    for ``RowSplitLinear``s sharing one new ``ShardPool`` of ``num_threads`` threads and return
    the pool (the caller closes it; closing leaves the modules computing unsplit), or None when
    no projection is that big. ``num_threads`` None or 1 puts the plain ``nn.Linear``s back,
    closes their pool and returns None."""
    for name, value, low in (("max_rows", max_rows, 1), ("min_bytes", min_bytes, 0)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if num_threads is not None and (isinstance(num_threads, bool) or not isinstance(num_threads, int)
                                    or num_threads < 1):
        raise ValueError(f"num_threads must be None or an int >= 1, got {num_threads!r}")
    old_pools = set()
    for owner, name in model.projections():
        module = getattr(owner, name)
        if isinstance(module, RowSplitLinear):
            old_pools.add(module.pool)
            setattr(owner, name, module.unsplit())
    for pool in old_pools:
        pool.close()
    if num_threads is None or num_threads < 2:
        return None
    big = [(owner, name) for owner, name in model.projections()
           if isinstance(getattr(owner, name), nn.Linear) and getattr(owner, name).weight.device.type == "cpu"
           and getattr(owner, name).weight.numel() * getattr(owner, name).weight.element_size() >= min_bytes]
    if not big:  # nothing worth a thread: no pool
        return None
    pool = ShardPool(num_threads)
    for owner, name in big:
        setattr(owner, name, RowSplitLinear(getattr(owner, name), pool, max_rows))
    return pool
