"""Few-row projections split by output rows across threads, so batch-1 decode uses every core.

A decode step with one or a few rows is a chain of matrix-vector products: its time is the
weight bytes divided by how fast the cores pull them from memory. Torch's own intra-op threads
(one OpenMP team per MKL call, ~121 calls per SmolLM2-135M step) do use a second core when it
is free, but every call ends at an OpenMP barrier: when another process holds a core, each
barrier waits for a descheduled thread, and a two-thread step became 5-40x slower than a
one-thread one (``benchmarks/linear_paths.py --step``).

Here each projection's weight ``[out, in]`` is cut into row pieces (views: no copy; cuts on
multiples of ``ROW_ALIGN`` rows) that the calling thread and persistent worker threads (torch
with one intra-op thread each) claim one by one; the pieces' outputs are concatenated. Torch
ops release the GIL, so the pieces stream in parallel. A worker that is slow to wake takes
fewer pieces, and a piece a descheduled worker holds too long is recomputed by the caller, so
on a busy machine a step costs about what one thread costs instead of a time slice per call.
Every output element is the dot product the unsplit call computes, over the same row, so the
result is bit-identical to ``F.linear`` (``tests/test_linear_paths.py`` checks it).

Steps of more than ``max_rows`` tokens (prefills) stay on one ``F.linear`` with torch's own
intra-op threads: a GEMM uses every core well.
"""

from __future__ import annotations

import queue
import threading
import time
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
#: each thread's share of a split call comes in this many pieces, claimed as they come: a
#: worker that wakes late takes fewer, and nobody waits for more than one piece at the end
CHUNKS_PER_THREAD = 4
#: how long the caller waits for a worker's unfinished piece once its own are done before
#: computing it itself: this many of its own pieces' time, plus an allowance for a wake-up
GRACE_JOBS, GRACE_S = 1.5, 200e-6

__all__ = ["DEFAULT_MAX_ROWS", "MIN_SPLIT_BYTES", "RowSplitLinear", "ShardPool", "use_row_split"]


class ShardPool:
    """``num_threads - 1`` persistent worker threads that help the calling thread through a
    list of independent jobs. Workers are joined by ``close()`` (also when the pool is
    garbage-collected), so an engine that goes away leaves no thread behind."""

    def __init__(self, num_threads: int):
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 2:
            raise ValueError(f"num_threads must be an int >= 2 for a shard pool, got {num_threads!r}")
        self.num_threads = num_threads
        self._inboxes = [queue.SimpleQueue() for _ in range(num_threads - 1)]
        self._done = queue.SimpleQueue()  # (job list number) from a worker that finished its pass
        self._threads = [threading.Thread(target=_work, args=(inbox, self._done), name=f"minillm-shard-{n + 1}",
                                          daemon=True) for n, inbox in enumerate(self._inboxes)]
        before = torch.get_num_threads()
        for t in self._threads:
            t.start()
        for _ in self._threads:  # each worker has set its own intra-op count to 1 ...
            self._done.get()
        torch.set_num_threads(before)  # ... which torch also reports process-wide: put ours back
        self._closed = False
        self._seq = 0  # numbers the job lists (a worker's message names the list it finished)
        self.calls = 0  # job lists run
        self.helped = 0  # jobs a worker claimed
        self.backups = 0  # of those, jobs not finished in time: computed here too
        self.hooks: list = []  # what use_row_split registered on the model for this pool
        self._finalizer = weakref.finalize(self, _stop, self._inboxes, self._threads)

    @property
    def closed(self) -> bool:
        return self._closed

    def run(self, fn, jobs: list[tuple]) -> list:
        """``[fn(*job) for job in jobs]``, the jobs shared out as they come: this thread and
        every awake worker each claim the next unclaimed job until none is left, so nobody
        waits for a worker still waking up. A job a worker claimed but has not finished within
        a grace time is computed here too (a backup: the same computation, so the same bits;
        the late answer is ignored), so on a machine busier than its cores a descheduled
        worker costs a little, not a scheduler time slice."""
        if self._closed:
            raise RuntimeError("the shard pool is closed")
        while True:  # messages of earlier calls whose workers finished after we had moved on
            try:
                self._done.get_nowait()
            except queue.Empty:
                break
        self._seq += 1
        self.calls += 1
        claims = [threading.Lock() for _ in jobs]
        results: list = [None] * len(jobs)
        task = (self._seq, claims, fn, jobs, results, torch.is_inference_mode_enabled())
        for inbox in self._inboxes:
            inbox.put(task)
        with one_intra_op_thread():
            start, mine = time.perf_counter(), 0
            for i, job in enumerate(jobs):
                if claims[i].acquire(blocking=False):
                    results[i] = _call(fn, job)
                    mine += 1
            if mine < len(jobs):
                self.helped += len(jobs) - mine
                per_job = (time.perf_counter() - start) / max(mine, 1)
                deadline = time.perf_counter() + GRACE_JOBS * per_job + GRACE_S
                while any(r is None for r in results):
                    left = deadline - time.perf_counter()
                    if left <= 0:
                        break
                    try:
                        self._done.get(timeout=left)
                    except queue.Empty:
                        break
                for i, r in enumerate(results):
                    if r is None:  # claimed by a worker that is late (descheduled): ours too
                        results[i] = _call(fn, jobs[i])
                        self.backups += 1
        for r in results:
            if isinstance(r, _Failed):
                raise r.error
        return results

    def close(self) -> None:
        """Stop and join the workers (idempotent)."""
        self._closed = True
        self._finalizer()


class _Failed:
    """A job's exception, kept in its result slot for the caller to raise."""

    def __init__(self, error: BaseException):
        self.error = error


def _call(fn, job):
    try:
        return fn(*job)
    except BaseException as e:
        return _Failed(e)


def _work(inbox: queue.SimpleQueue, done: queue.SimpleQueue) -> None:
    torch.set_num_threads(1)  # this thread's share runs alone: the pool is the parallelism
    done.put(0)
    while True:
        task = inbox.get()
        if task is None:
            return
        seq, claims, fn, jobs, results, inference = task
        with torch.inference_mode() if inference else torch.no_grad():  # modes are per thread: the caller's
            for i, job in enumerate(jobs):
                if claims[i].acquire(blocking=False):
                    results[i] = _call(fn, job)
        done.put(seq)


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
        bounds = shard_bounds(self.out_features, pool.num_threads * CHUNKS_PER_THREAD)
        self._split = len(bounds) > 1 and self.weight.is_contiguous()
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
        for hook in pool.hooks:
            hook.remove()
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
    pool.hooks = _one_thread_for_small_steps(model, max_rows)
    return pool


def _one_thread_for_small_steps(model: nn.Module, max_rows: int) -> list:
    """Forward hooks that run a whole step of at most ``max_rows`` tokens with one intra-op
    thread on the calling thread: the pool is that step's parallelism, and torch's OpenMP team
    woken by a small op (attention, a norm) would spin on the core the pool's worker needs."""
    saved = []

    def before(module, args, kwargs):
        ids = args[0] if args else kwargs.get("input_ids")
        small = ids is not None and ids.numel() <= max_rows and torch.get_num_threads() > 1
        saved.append(torch.get_num_threads() if small else None)
        if small:
            torch.set_num_threads(1)

    def after(module, args, kwargs, output):
        threads = saved.pop() if saved else None
        if threads is not None:
            torch.set_num_threads(threads)

    return [model.register_forward_pre_hook(before, with_kwargs=True),
            model.register_forward_hook(after, with_kwargs=True, always_call=True)]
