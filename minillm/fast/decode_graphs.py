"""Decode graphs: a decode-only step run at fixed shapes, as one captured or compiled graph.

In a decode-only step the model's work depends on the batch through two integers only: B, the
rows (one new token per request), and W, the blocks of the longest context. Rounded up to a
bucket (B in 1, 2, 4, ... up to ``max_num_seqs``; W in powers of two up to a sequence's most
blocks), every tensor of the step has a shape fixed by the bucket, so the whole forward can be
made once per bucket and replayed (nano-vllm's ``capture_cudagraph``, vLLM's CUDA graphs):

* the step's integers go into **persistent input buffers** (``DecodeInputs``: ids, positions,
  slots, context lengths, block tables, views of one flat buffer), filled by one copy (on the
  CPU written in place, the block tables from the requests' own lists);
* the graph returns each row's **argmax** beside the logits: a step whose rows are all plainly
  greedy takes it as its tokens (``FastRunner.sample``), no sampler call;
* rows past the real ones are **padding**: token 0 at position 0, a context of one slot, a
  block table of ``NULL_BLOCK`` only, and their K/V written to the pool's **scratch slot**
  (``KVCache(scratch_block=True)``: a block the allocator never hands out), so a padding row
  never touches a request's cache; their logits are dropped;
* attention reads the pool through the block tables (``DecodeMeta``): with the
  engine's "kernel" backend, the CPU kernel itself, compiled graphs calling it as the operator
  ``torch.ops.minillm.paged_decode`` (no mask, nothing read past a row's context); otherwise
  traced into the graph, compiled on the CPU as products and sums inductor fuses into loops
  over the whole bucket width (``PagedReductions``), captured on CUDA with the engine's "flex"
  backend (its block mask made inside the graph) or else ``PagedInPlace`` (the padding mask
  made inside the graph from the context lengths).

How a bucket's graph is made (``LLM(decode_graphs=...)``):

* ``"cuda"`` (``True`` on CUDA): captured as a ``torch.cuda.CUDAGraph`` (after a warm-up run on
  a side stream) by ``LLM.warmup()`` for every bucket, else on first use; a step is then one
  replay instead of ~1,000 kernel launches.
  **Unverified**: written for CUDA, run only on the CPU here (see the README's GPU section).
* ``"compile"`` (``True`` on the CPU): inductor with its C++ wrapper, so the step's kernels
  are called from C++, not one Python call per op, compiled ahead of time (``aot_compile``:
  called as a plain function, no dynamo entry per step; the guarded ``torch.compile`` where
  that fails), and from its second step on called straight through inductor's C++ entry with
  the inputs recorded on its first (``graph_call``: no Python wrappers per step). One function per batch bucket, with W dynamic, compiled on first use (measured
  cold: ~17 s for the shipped model, ~70 s for SmolLM2-135M; inductor's disk cache makes a
  later process faster); only batches up to ``CPU_MAX_BATCH`` use it: at larger batches the
  per-op cost is shared by many rows and the step runs eager.
* ``"eager"``: the same fixed-shape function run eagerly: the padding, buffers and paged reads
  without a compiler (what the tests check the others against).

Steps with a prefill, or with more rows or blocks than the largest bucket, run eager as before.
"""

from __future__ import annotations

import torch

from contextlib import contextmanager

from . import cpu_kernel, kernel_cache
from .attention import NULL_BLOCK, AttentionBackend, DecodeMeta, PagedInPlace, PagedReductions
from ..models.llama import AttentionBatch

MODES = ("eager", "compile", "cuda")
#: compiles one batch size's function may make: one serves every width; torch raises past it
MAX_COMPILES = 1
#: on the CPU, batches above this run eager: compiling a bucket takes seconds and above a few
#: rows the per-op overhead a graph removes is shared by the batch
CPU_MAX_BATCH = 4

_PAGED = PagedInPlace()
_REDUCTIONS = PagedReductions()


def buckets(limit: int) -> list[int]:
    """1, 2, 4, ... below ``limit``, then ``limit`` itself."""
    out, b = [], 1
    while b < limit:
        out.append(b)
        b *= 2
    return out + [limit]


def bucket_for(n: int, sizes: list[int]) -> int | None:
    """The smallest size >= n (None: n is larger than every size)."""
    for s in sizes:
        if s >= n:
            return s
    return None


def decode_forward(model, kv_cache, ids, positions, slots, block_tables, context_lens,
                   attention: AttentionBackend = _PAGED) -> tuple[torch.Tensor, torch.Tensor]:
    """The model's forward over B decode rows at fixed shapes: logits [B, vocab] and each row's
    argmax [B] (a greedy row's token, made inside the graph: ``FastRunner.sample`` takes it when
    every row is plainly greedy). Pure tensor work (no host reads), so it can be captured or
    compiled for a (B, W) bucket. ``attention`` reads ``DecodeMeta`` (the padding mask is made
    only for one that ``uses_mask``)."""
    B, W = block_tables.shape
    mask = None
    if attention.uses_mask:
        L = W * kv_cache.block_size
        pad = torch.arange(L, device=ids.device) >= context_lens[:, None]
        mask = torch.zeros((B, 1, 1, L), dtype=kv_cache.dtype, device=ids.device).masked_fill_(
            pad.view(B, 1, 1, L), float("-inf"))
    meta = DecodeMeta(block_tables, context_lens, slots, W, mask)
    batch = AttentionBatch(positions=positions, slot_mapping=slots, num_decode=B, attention=attention,
                           decode_meta=meta)
    logits = model(ids, batch, kv_cache)
    return logits, logits.argmax(dim=-1)


class DecodeInputs:
    """The persistent input buffers of one (B, W) bucket, on the device: views of one flat
    buffer (ids, positions, slots, context lengths, then the block tables row by row), so that
    a step fills them all with one copy (``values`` lays out a step's integers that way). Made
    as padding rows (token 0 at position 0 writing to ``scratch_slot``, a one-slot context), so
    a graph can be made before any request fills them."""

    def __init__(self, batch: int, width: int, device: torch.device, scratch_slot: int = 0):
        self.batch, self.width = batch, width
        # what padding rows hold, per column; sliced to the rows a step pads
        self._pad = ([0] * batch, [0] * batch, [scratch_slot] * batch, [1] * batch, [NULL_BLOCK] * (batch * width))
        self.flat = torch.tensor(self.values([], [], [], [], []), dtype=torch.long, device=device)
        self.ids, self.positions, self.slots, self.context_lens = self.flat[:4 * batch].view(4, batch).unbind(0)
        self.block_tables = self.flat[4 * batch:].view(batch, width)
        self.host = _host_view(self.flat)  # on the CPU: the buffer as a numpy array, filled in place

    def fill(self, values: list[int]) -> None:
        """Write ``values`` (``values()``'s layout) into the buffer: on the CPU in place through
        numpy (~1.5 us for a batch-1 step against ~8 for a tensor made and copied), else one copy."""
        if self.host is not None:
            self.host[:] = values
        else:
            self.flat.copy_(torch.tensor(values, dtype=torch.long))

    def values(self, ids: list, positions: list, slots: list, context_lens: list, tables: list) -> list[int]:
        """The flat buffer's contents for a step whose first rows hold these values (``tables``:
        ``width`` block ids per row, ``NULL_BLOCK`` past a row's own) and padding after them."""
        k = self.batch - len(ids)
        z, _, s, one, null = self._pad
        return ids + z[:k] + positions + z[:k] + slots + s[:k] + context_lens + one[:k] + tables + null[:k * self.width]

    def args(self):
        return self.ids, self.positions, self.slots, self.block_tables, self.context_lens


def _host_view(flat: torch.Tensor):
    """``flat`` as a numpy array sharing its memory (CPU only; None elsewhere or without numpy)."""
    if flat.device.type != "cpu":
        return None
    try:
        return flat.numpy()
    except (RuntimeError, TypeError):  # torch built without numpy
        return None


class DecodeGraph:
    """One bucket: its buffers and its graph (made on first use)."""

    def __init__(self, graphs: "DecodeGraphs", batch: int, width: int):
        self.graphs, self.batch, self.width = graphs, batch, width
        self.inputs = DecodeInputs(batch, width, graphs.device, graphs.kv_cache.scratch_slot)
        self.runs = 0
        self._fn = None        # compile / eager: called with the buffers
        self._graph = None     # cuda: the captured graph and its output buffers
        self._out = None
        self._direct = None    # compile (ahead of time): inductor's entry with recorded inputs
        self._recorded = False  # whether recording the inner call was tried (``graph_call``)

    def make(self) -> None:
        """Make the graph if it is not made yet: with the buffers as they are (a capture's
        warm-up runs write K/V to their slots; fresh buffers are padding rows, which write to
        the scratch slot)."""
        if self._fn is None and self._graph is None:
            self._make()

    def _make(self):
        g = self.graphs
        model, kv = g.model, g.kv_cache

        def forward(*bufs):
            return decode_forward(model, kv, *bufs, attention=g.attention)

        if g.mode == "compile":
            # one compiled function per batch size, the width W dynamic (every width shares it;
            # a width of 1, only when a whole sequence fits one block, is the only width there is)
            if self.width > 1:
                torch._dynamo.mark_dynamic(self.inputs.block_tables, 1)
            self._fn = g.compiled_for(self.batch, forward, self.inputs.args())
        elif g.mode == "cuda":
            self._capture(forward)
        else:
            self._fn = forward

    def _capture(self, forward) -> None:
        args = self.inputs.args()
        stream = torch.cuda.Stream(device=self.graphs.device)
        stream.wait_stream(torch.cuda.current_stream(self.graphs.device))
        with torch.cuda.stream(stream):  # warm-up: kernel selection and workspaces before capture
            for _ in range(2):
                forward(*args)
        torch.cuda.current_stream(self.graphs.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.graphs.pool()):
            self._out = forward(*args)
        self._graph = graph
        self.graphs.captures += 1

    def __call__(self, n: int, table: torch.Tensor, rows: torch.Tensor, ids, positions, slots,
                 context_lens) -> tuple[torch.Tensor, torch.Tensor]:
        """Fill the buffers from device tensors (the first ``n`` rows real, the rest padding as
        uploaded; the block tables are rows ``rows`` of ``table``), run, and return the real
        rows' logits [n, vocab] and argmax [n]."""
        buf = self.inputs
        buf.ids.copy_(ids)
        buf.positions.copy_(positions)
        buf.slots.copy_(slots)
        buf.context_lens.copy_(context_lens)
        buf.block_tables.fill_(NULL_BLOCK)
        w = min(self.width, table.shape[1])
        buf.block_tables[:n, :w].copy_(table.index_select(0, rows)[:, :w])
        return self.run(n)

    def run_values(self, n: int, values: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Fill the buffers with one copy of ``values`` (``DecodeInputs.values``: ``n`` real
        rows, then padding), run, and return the real rows' logits and argmax."""
        self.inputs.fill(values)
        return self.run(n)

    def run(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the graph on the buffers as they are: the first ``n`` rows' logits and argmax."""
        if self.graphs.kernel_threads and torch.get_num_threads() > 1:
            with kernel_threads_only(True):
                logits, ids = self._forward()
        else:
            logits, ids = self._forward()
        return (logits, ids) if n == self.batch else (logits[:n], ids[:n])

    def _forward(self):
        self.make()
        self.runs += 1
        if self._direct is not None:
            return self._direct()
        if self._graph is not None:  # (a capture records kernels without running them)
            self._graph.replay()
            return [t.clone() for t in self._out]  # the output buffers are rewritten by the next replay
        g = self.graphs
        if not self._recorded and g.direct and g.mode == "compile" and g.compiler == "aot":
            from . import graph_call

            self._recorded = True
            out, self._direct, why = graph_call.record(self._fn, self.inputs.args())
            g.direct_error = why or g.direct_error
            return out
        return self._fn(*self.inputs.args())


@contextmanager
def kernel_threads_only(enabled: bool):
    """A compiled CPU graph's torch kernels on one thread, its streaming projections on the threads
    torch had (``gemv.set_op_threads``), as eager decode steps do (``gemv.keep_torch_on_one_thread``):
    the graph's OpenMP regions are tiny and competed with the kernel's workers for the cores (the
    shipped model's graph step went from 0.95 ms on one thread to 1.33 ms on two)."""
    threads = torch.get_num_threads()
    if not enabled or threads == 1 or not _kernel_op_usable():
        yield
        return
    from . import gemv

    old = gemv.set_op_threads(threads)
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        gemv.set_op_threads(old)


def _kernel_op_usable() -> bool:
    """Whether compiled graphs call the streaming kernel's operator (``gemv``)."""
    from . import gemv

    return gemv.enabled_by_env() and gemv.available() and gemv.op_available()


class DecodeGraphs:
    """The decode graphs of one engine, one per (B, W) bucket, made on first use."""

    def __init__(self, model, kv_cache, device: torch.device, mode: str, max_num_seqs: int, max_model_len: int,
                 attention: AttentionBackend | None = None):
        if mode not in MODES:
            raise ValueError(f"decode graph mode must be one of {MODES}, got {mode!r}")
        if kv_cache.scratch_slot is None:
            raise ValueError("decode graphs need a KV pool with a scratch block (KVCache(scratch_block=True)) "
                             "for their padding rows to write into")
        self.model, self.kv_cache, self.device, self.mode = model, kv_cache, device, mode
        # how a graph's attention reads the pool: with the engine's CPU kernel, the kernel (a
        # compiled graph calls it as a C++ operator through the dispatcher: a Python operator
        # called back from inductor's wrapper had measured slower than the traced reads, 2.4
        # against 1.9 ms a step); "compile" without it, products and sums inductor fuses into
        # loops reading the pool in place (PagedReductions); otherwise, and for CUDA graphs,
        # PagedInPlace's block reads
        kernel = attention is not None and attention.name == "kernel"
        if mode == "compile" and kernel and cpu_kernel.op_available():  # (built on first use)
            self.attention = attention
        elif mode == "compile":
            self.attention = _REDUCTIONS
        elif mode == "eager" and kernel:
            self.attention = attention
        elif mode in ("eager", "cuda") and attention is not None and attention.name == "flex":
            self.attention = attention  # in place through the block mask, capturable
        else:
            self.attention = _PAGED
        max_batch = min(max_num_seqs, CPU_MAX_BATCH) if mode == "compile" else max_num_seqs
        self.batch_sizes = buckets(max_batch)
        # widths from 2 blocks: a compiled graph's dynamic W must not be 1, which torch specialises
        self.widths = [w for w in buckets(-(-max_model_len // kv_cache.block_size)) if w > 1] or [1]
        self.graphs: dict[tuple[int, int], DecodeGraph] = {}
        self._compiled: dict[int, object] = {}
        self.compiles = 0  # graphs inductor made (compile mode): one per batch bucket used
        self.aot = True  # compile ahead of time where torch can (False: always jit; for benchmarks)
        self.compiler: str | None = None  # "aot" or "jit": how they were made (``_compile``)
        self.aot_error: str | None = None  # why ahead-of-time compiling fell back, if it did
        #: compiled graphs called through inductor's entry with recorded inputs (``graph_call``;
        #: False: always through torch's wrappers, for benchmarks); why not, where it was refused
        self.direct = True
        self.direct_error: str | None = None
        #: a compiled CPU graph runs torch's kernels on one thread and the streaming projections on
        #: torch's threads (``kernel_threads_only``): decided here, once
        self.kernel_threads = mode == "compile" and device.type == "cpu" and _kernel_op_usable()
        self._pool = None
        self.captures = 0  # CUDA graphs captured (after ``warm_up``, serving adds none)
        self.warmup: dict | None = None  # what ``warm_up`` made: {"graphs": n, "seconds": s}

    def compiled_for(self, batch: int, forward, example: tuple):
        """The inductor-compiled forward of ``batch`` rows, made once (on ``example``, the
        bucket's buffers) and shared by every width: fixed batch, dynamic W, one graph or an
        error (``fullgraph``); the C++ wrapper calls the kernels without a Python call each."""
        fn = self._compiled.get(batch)
        if fn is None:
            self.model.compiled = True
            fn = self._compiled[batch] = self._compile(forward, example)
            self.compiles += 1
        return fn

    def _compile(self, forward, example: tuple):
        """Ahead of time where torch can (``aot_compile``): the graph is then called as a plain
        function, without dynamo's per-call entry (its frame hook, guard check and config
        switching: ~0.1 ms a step, measured on the shipped model's ~1.4 ms). No guards are
        kept: the function only ever sees its own bucket's buffers (same shapes but W, same
        dtypes and device), the weights do not change after loading (``use_decode_layout``
        refuses once compiled) and steps run in inference mode. Where ahead-of-time
        compiling fails, the usual ``torch.compile`` (guarded, past ``MAX_COMPILES`` torch
        raises instead of silently running eager); ``self.compiler`` says which ran."""
        options = {"cpp_wrapper": True}
        kernel_cache.private_inductor_cache()  # inductor loads what it finds in its cache folder
        if not self.aot:
            self.compiler = "jit"
        else:
            try:
                aot = torch.compile(forward, backend="inductor", dynamic=False, fullgraph=True,
                                    options={**options, "guard_filter_fn": torch.compiler.skip_all_guards_unsafe})
                fn = aot.aot_compile((example, {}))
                fn.disable_guard_check()
                self.compiler = "aot"
                return fn
            except Exception as exc:  # noqa: BLE001 - an experimental path: fall back, say why
                self.compiler, self.aot_error = "jit", f"{type(exc).__name__}: {exc}"
        return torch.compile(
            forward, backend="inductor", dynamic=False, fullgraph=True, recompile_limit=MAX_COMPILES,
            isolate_recompiles=True,
            options={**options, "guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe})

    def pool(self):
        """One CUDA memory pool shared by every captured graph (they never run at once)."""
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        return self._pool

    def graph_for(self, n: int, blocks: int) -> DecodeGraph | None:
        """The bucket's graph for ``n`` decode rows whose longest context spans ``blocks``
        blocks, or None when no bucket is that large (the step runs eager)."""
        b, w = bucket_for(n, self.batch_sizes), bucket_for(blocks, self.widths)
        if b is None or w is None:
            return None
        return self.bucket(b, w)

    def bucket(self, batch: int, width: int) -> DecodeGraph:
        """The graph of bucket (batch, width), its buffers made now, its graph on first use."""
        graph = self.graphs.get((batch, width))
        if graph is None:
            graph = self.graphs[(batch, width)] = DecodeGraph(self, batch, width)
        return graph

    def padding(self, n: int, batch: int) -> dict[str, list[int]]:
        """What the ``batch - n`` padding rows upload: token 0 at position 0, writing to the
        scratch slot, a context of one slot (which the null block's first slot fills)."""
        k = batch - n
        return {"ids": [0] * k, "positions": [0] * k, "slots": [self.kv_cache.scratch_slot] * k,
                "context_lens": [1] * k}


def warm_up(llm) -> int:
    """Make the graphs now rather than in a step that serves someone (``LLM.warmup``); returns
    how many were made (0 without decode graphs, or in "eager" mode, where there is nothing to
    make), and ``graphs.warmup`` says how many and in how many seconds.

    * "cuda": every (B, W) bucket ``max_num_seqs`` and ``max_model_len`` can reach is captured
      directly, its buffers holding padding rows (token 0, position 0, the scratch slot, a
      one-slot context of the null block): a capture depends on shapes only, so no request is
      needed, and a serving step never captures (``DecodeGraph.captures`` stays put).
    * "compile": for each batch bucket, that many greedy 2-token requests run to their first
      decode, their outputs dropped and the requests forgotten (their events stay in the
      trace): one compiled function per batch size serves every width."""
    import time

    graphs = llm.runner.graphs
    if graphs is None or graphs.mode == "eager":
        return 0
    t0 = time.monotonic()
    if graphs.mode == "cuda":
        for b in graphs.batch_sizes:
            for w in graphs.widths:
                graphs.bucket(b, w).make()
        made = len(graphs.graphs)
    else:
        _warm_up_by_requests(llm, graphs)
        made = graphs.compiles
    graphs.warmup = {"graphs": made, "seconds": round(time.monotonic() - t0, 3)}
    return made


def _warm_up_by_requests(llm, graphs) -> None:
    from ..params import SamplingParams

    token = 1 % llm.model_config.vocab_size
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    for b in graphs.batch_sizes:
        reqs = [llm.add_request(prompt_token_ids=[token, token], params=params) for _ in range(b)]
        while any(r.is_live for r in reqs):
            llm.step()
        for r in reqs:
            llm.requests.pop(r.request_id, None)
