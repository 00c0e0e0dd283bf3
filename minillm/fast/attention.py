"""The fast layer's attention backends: how a step's decode queries read the paged KV pool.

The reference path (``LLM(fast=False)``) needs none of this: its model attends each request
alone, gathering the request's context from the cache (``minillm.models.llama``,
``Attention.attend``). The fast runner (``minillm.fast.runner``) hands the model one of these
backends in ``AttentionBatch.attention`` instead, chosen when the engine is built
(``LLM(attention_backend=...)``); the model then calls ``backend.attend``, which writes the
step's keys and values and attends all decode rows at once:

* ``GatherSDPA`` ("gather"): the decode rows in a few groups of similar context length; each
  group's contexts are gathered slot by slot out of the pool into one padded K/V tensor, then one
  ``scaled_dot_product_attention`` call. Shapes follow the step's contexts.
* ``PagedInPlace`` ("paged"): reads the pool by whole blocks through fixed-shape metadata
  (``DecodeMeta``: ``block_tables[B, W]`` padded with a null block, ``context_lens[B]``,
  ``slot_mapping[B]``): one ``index_select`` on the block axis, one SDPA for all decode rows.
  Every tensor it uses has a shape fixed by (B, W), which is what a captured CUDA graph needs.

* ``PagedKernel`` ("kernel"): the same metadata, read truly in place by a page of C
  (``minillm/fast/kernels/paged_decode.c``, built on first use by ``minillm.fast.cpu_kernel``): each
  row's K/V are read block by block straight out of the pool, once, with no copy and no mask.
  CPU and float32 only; ``"auto"`` picks it where it builds, the cache is float32 on the CPU
  and the model's heads have its vectorised path (``cpu_kernel.has_fast_path``), else ``gather``.

* ``FlexPaged`` ("flex", what ``"auto"`` picks on CUDA): the same metadata turned into a
  FlexAttention ``BlockMask`` (``paged_block_mask``) over the whole pool seen as one long
  sequence: each row visits only its own blocks (the block table is the mask's list of KV
  blocks) and the mask function only trims the last block to the context's length, so the
  fused kernel reads each row's K/V in place, no copy, no padded blocks. On CUDA it runs
  ``torch.compile(flex_attention)``; on the CPU it runs eagerly (torch's unfused reference,
  which scores the whole pool: a test of the plumbing, slow on a real pool). **Unverified on a
  GPU** (see the README's GPU section); ``scripts/gpu_check.sh`` checks it first.

``flash_attn_with_kvcache(q, k_pool, v_pool, cache_seqlens=context_lens, block_table=block_tables)``
would plug in the same way (not shipped: it is a separate package).

The backends never import the model; ``batch`` is the model's ``AttentionBatch`` and ``layer``
its ``Attention`` module (for its head counts and scale).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

#: the block id that pads a block table row: always a real block of the pool, so reading it is
#: safe; what it holds is masked out by ``context_lens``
NULL_BLOCK = 0


@dataclass
class DecodeMeta:
    """Fixed-shape decode metadata for the ``B`` decode rows of a step, built once by the runner
    (inside the step's single upload) and shared by every layer."""

    block_tables: torch.Tensor    # [B, W] block ids of each context, padded with NULL_BLOCK
    context_lens: torch.Tensor    # [B] tokens of each context (the new one included)
    slot_mapping: torch.Tensor    # [B] slot the new token's K/V was written to
    width: int                    # W, on the host (the loop bound)
    mask: torch.Tensor | None = None  # [B, 1, 1, W * block_size] additive (the pool's dtype):
                                      # -inf past each context; None when no row is padded
    flex_mask: object = None          # FlexPaged's BlockMask, made by the first layer, shared
    layer_step: object = None         # the one-call layers' shared step struct (``layer_step``), likewise
    argmax: torch.Tensor | None = None  # [B] int64 the runner gives for greedy rows: where the one-call
                                        # model writes each row's argmax (``layer_step.model_call``)
    argmax_of: object = None          # the logits it wrote ``argmax`` for (None: not this step)


class AttentionBackend:
    """Decode and prefill attention over a paged pool ([blocks, block_size, kv_heads, D])."""

    name = "base"
    #: the runner builds ``DecodeMeta`` (block tables) for this backend; otherwise decode groups
    uses_block_tables = False
    #: with block tables, the backend reads ``DecodeMeta.mask`` (a kernel bounded by
    #: ``context_lens`` needs none, and the runner then makes none)
    uses_mask = True

    def attend(self, layer, q, k, v, batch, k_cache=None, v_cache=None) -> torch.Tensor:
        """Write this step's keys and values into their cache slots, then attend: the decode rows
        (the first ``batch.num_decode``) in one ``decode`` call, each prefill with ``prefill``.
        [T, heads * D]."""
        T = q.shape[0]
        if k_cache is not None:
            k_cache.view(-1, layer.num_kv_heads, layer.head_dim).index_copy_(0, batch.slot_mapping, k)
            v_cache.view(-1, layer.num_kv_heads, layer.head_dim).index_copy_(0, batch.slot_mapping, v)
        n = batch.num_decode
        if n:
            o = self.decode(q[:n], k_cache, v_cache, batch, layer.scale)
            if n == T:  # a decode-only step: no copy into a shared output buffer
                return o
        out = q.new_empty(T, layer.num_heads, layer.head_dim)
        if n:
            out[:n] = o.view(n, layer.num_heads, layer.head_dim)
        for seq in batch.prefills:
            out[seq.q_start:seq.q_start + seq.q_len] = self.prefill(q, k, v, k_cache, v_cache, seq, layer.scale)
        return out.view(T, layer.q_size)

    def decode(self, q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, batch,
               scale: float) -> torch.Tensor:
        """q: [n, heads, D], the decode rows. Returns [n, heads * D]."""
        raise NotImplementedError

    def prefill(self, q, k, v, k_pool, v_pool, seq, scale: float) -> torch.Tensor:
        """Attention of one prefilled request's new tokens (rows of q/k/v: [q_len, heads, D])
        over its context; [q_len, heads, D]. Shared: the new keys are attended as they are
        (causal); after a cached prefix the prefix's slots are read from the pool too
        (``attend_after_prefix``)."""
        rows = slice(seq.q_start, seq.q_start + seq.q_len)
        qp = q[rows].transpose(0, 1).unsqueeze(0)              # [1, heads, q_len, D]
        own_k, own_v = k[rows].transpose(0, 1).unsqueeze(0), v[rows].transpose(0, 1).unsqueeze(0)
        if seq.ctx_len == seq.q_len:                           # nothing cached before
            o = F.scaled_dot_product_attention(qp, own_k, own_v, is_causal=True, scale=scale, enable_gqa=True)
            return o[0].transpose(0, 1)
        heads, dim = k_pool.shape[2], k_pool.shape[3]
        past = seq.slots[:seq.ctx_len - seq.q_len]
        past_k = k_pool.view(-1, heads, dim).index_select(0, past).transpose(0, 1).unsqueeze(0)
        past_v = v_pool.view(-1, heads, dim).index_select(0, past).transpose(0, 1).unsqueeze(0)
        return attend_after_prefix(qp, past_k, past_v, own_k, own_v, scale)[0].transpose(0, 1)


def attend_after_prefix(q, past_k, past_v, own_k, own_v, scale: float) -> torch.Tensor:
    """Queries of a chunk ([1, heads, q_len, D]) over a cached prefix (every query sees all of
    it) and over the chunk itself (causal), without a mask tensor: with one, CUDA's SDPA
    cannot use flash attention (which takes no mask) and with GQA likely falls back to the math
    kernel, and the CPU's flash kernel reads a [q_len, ctx] mask and visits fully masked blocks.

    * CPU: two calls of the fused flash kernel, the prefix unmasked and the chunk causal
      (square, so ``is_causal`` means what it should), each returning its log-sum-exp; the two
      partial softmaxes are merged by ``logaddexp`` (``benchmarks/attention_backends.py --prefix``).
    * CUDA: one call with ``causal_lower_right(q_len, ctx_len)``, which SDPA runs as flash
      attention's own bottom-right causal (unverified here: no GPU on this machine).
    * anything else: a boolean mask (the readable definition)."""
    q_len, past = q.shape[2], past_k.shape[2]
    if q.device.type == "cpu" and _CPU_FLASH is not None:
        o1, lse1 = _CPU_FLASH(q, past_k, past_v, scale=scale)[:2]
        o2, lse2 = _CPU_FLASH(q, own_k, own_v, is_causal=True, scale=scale)[:2]
        lse = torch.logaddexp(lse1, lse2)
        w1, w2 = (lse1 - lse).exp().unsqueeze(-1), (lse2 - lse).exp().unsqueeze(-1)
        return (o1.float() * w1 + o2.float() * w2).to(q.dtype)
    keys, values = torch.cat((past_k, own_k), dim=2), torch.cat((past_v, own_v), dim=2)
    if q.device.type == "cuda":
        from torch.nn.attention.bias import causal_lower_right

        mask = causal_lower_right(q_len, past + q_len)
    else:
        mask = (torch.arange(past + q_len, device=q.device)[None, :]
                <= past + torch.arange(q_len, device=q.device)[:, None])
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=scale, enable_gqa=True)


#: the CPU's fused flash-attention op, which also returns the log-sum-exp (private in torch,
#: hence looked up, not assumed); GQA is handled inside it
_CPU_FLASH = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)


class GatherSDPA(AttentionBackend):
    """Per decode group (``minillm.fast.runner.split_by_length``), gather the contexts' K/V slot by slot (one
    ``index_select`` over flat slots), padded to the group's longest, then one SDPA call. The
    query heads that share a KV head sit in SDPA's "query length" axis."""

    name = "gather"

    def decode(self, q, k_pool, v_pool, batch, scale):
        n, heads, dim = q.shape
        kv_heads = k_pool.shape[2]
        k_flat, v_flat = k_pool.view(-1, kv_heads, dim), v_pool.view(-1, kv_heads, dim)
        per_kv = heads // kv_heads
        outs = []
        for g in batch.decode_groups:
            m, L = g.end - g.start, g.length
            if g.first_slot is not None:  # contiguous context: a view of the pool
                keys, values = k_flat[g.first_slot:g.first_slot + L], v_flat[g.first_slot:g.first_slot + L]
            elif batch.k_workspace is not None:
                flat = g.slots.view(-1)
                keys = torch.index_select(k_flat, 0, flat, out=batch.k_workspace[:m * L])
                values = torch.index_select(v_flat, 0, flat, out=batch.v_workspace[:m * L])
            else:
                flat = g.slots.view(-1)
                keys, values = k_flat.index_select(0, flat), v_flat.index_select(0, flat)
            keys = keys.view(m, L, kv_heads, dim).transpose(1, 2)
            values = values.view(m, L, kv_heads, dim).transpose(1, 2)
            qd = q[g.start:g.end].reshape(m, kv_heads, per_kv, dim)
            o = F.scaled_dot_product_attention(qd, keys, values, attn_mask=g.mask, scale=scale)
            outs.append(o.reshape(m, heads * dim))
        return outs[0] if len(outs) == 1 else torch.cat(outs)


class PagedInPlace(AttentionBackend):
    """Decode over ``DecodeMeta.block_tables``: the K/V of every row are picked from the pool
    with one ``index_select`` on the *block* axis (B x W whole blocks, each a contiguous
    ``block_size x kv_heads x D`` piece of the pool, instead of one row per slot), then one
    SDPA call over all B rows with the fixed padding mask. Every shape is fixed by (B, W): no
    decode groups, no per-step shape logic, which is what a captured CUDA graph or a paged GPU
    kernel needs (``flash_attn_with_kvcache`` would take the same ``block_tables`` and
    ``context_lens`` and read the pool without this copy). The price: every row is padded to
    the step's longest context, where the reference splits rows of very different lengths.

    On the CPU a copy-free variant (an online softmax folding in one block column at a time)
    was measured about 2x slower than this at batch 32 (``benchmarks/attention_backends.py``,
    README there): per-column matmuls of 3 query rows cost more than the copy they avoid."""

    name = "paged"
    uses_block_tables = True

    def decode(self, q, k_pool, v_pool, batch, scale):
        meta: DecodeMeta = batch.decode_meta
        n, heads, dim = q.shape
        bs, kv_heads = k_pool.shape[1], k_pool.shape[2]
        L = meta.width * bs
        flat = meta.block_tables.reshape(-1)
        keys = k_pool.index_select(0, flat).view(n, L, kv_heads, dim).transpose(1, 2)
        values = v_pool.index_select(0, flat).view(n, L, kv_heads, dim).transpose(1, 2)
        qd = q.reshape(n, kv_heads, heads // kv_heads, dim)
        o = F.scaled_dot_product_attention(qd, keys, values, attn_mask=meta.mask, scale=scale)
        return o.reshape(n, heads * dim)


class PagedKernel(AttentionBackend):
    """Decode over ``DecodeMeta.block_tables`` read in place by the CPU kernel
    (``minillm.fast.cpu_kernel.paged_decode``): one task per (row, KV head) walks the row's blocks in
    the pool, scores every key for the query heads sharing it, softmaxes, and sums the values,
    reading each K/V vector once. Bounded by ``context_lens``, so no padding mask is built,
    and no row pays for another's length. Prefill stays the shared SDPA path."""

    name = "kernel"
    uses_block_tables = True
    uses_mask = False

    def decode(self, q, k_pool, v_pool, batch, scale):
        meta: DecodeMeta = batch.decode_meta
        n, heads, dim = q.shape
        if torch.compiler.is_compiling():
            # a ctypes call cannot be traced: a compiled graph calls the same kernel as the
            # operator torch.ops.minillm.paged_decode (``cpu_kernel.op_available``), which
            # inductor's C++ wrapper reaches through the dispatcher
            out = torch.ops.minillm.paged_decode(q, k_pool, v_pool, meta.block_tables, meta.context_lens, scale)
        else:
            from .cpu_kernel import paged_decode

            out = paged_decode(q, k_pool, v_pool, meta.block_tables, meta.context_lens, scale)
        return out.view(n, heads * dim)


class PagedReductions(AttentionBackend):
    """Decode written as elementwise products and sums over the rows' blocks, for compiled
    decode graphs on the CPU whose engine is not on the "kernel" backend (on it they call the
    kernel's operator; ``minillm.fast.decode_graphs``): ``k_pool[block_tables]`` is an
    indirect read that inductor fuses into the reduction loops consuming it, so the pool is
    read in place, without a gathered copy. Run eagerly it would materialise every product
    ([B, W, block, kv heads, group, D] floats), so it is no ``LLM`` option. Measured against the
    traced block reads of ``PagedInPlace`` inside one compiled function (4 query / 2 KV heads of
    64, 1 thread): 211 against 358 us at batch 1 and a 600-token context (64 blocks), 75 against
    96 at 20 tokens, 445 against 752 at batch 4."""

    name = "reductions"
    uses_block_tables = True
    uses_mask = False

    def decode(self, q, k_pool, v_pool, batch, scale):
        meta: DecodeMeta = batch.decode_meta
        n, heads, dim = q.shape
        bs, kv_heads = k_pool.shape[1], k_pool.shape[2]
        group, width = heads // kv_heads, meta.block_tables.shape[1]
        keys = k_pool[meta.block_tables].view(n, width, bs, kv_heads, 1, dim)
        values = v_pool[meta.block_tables].view(n, width, bs, kv_heads, 1, dim)
        scores = (q.view(n, 1, 1, kv_heads, group, dim) * keys).sum(-1) * scale    # [n, W, bs, KVH, G]
        pos = torch.arange(width * bs, device=q.device).view(1, width, bs, 1, 1)
        scores = scores.masked_fill(pos >= meta.context_lens.view(n, 1, 1, 1, 1), float("-inf"))
        p = torch.softmax(scores.view(n, width * bs, kv_heads, group), dim=1)
        out = (p.view(n, width, bs, kv_heads, group, 1) * values).sum((1, 2))       # [n, KVH, G, D]
        return out.reshape(n, heads * dim)


def paged_block_mask(block_tables: torch.Tensor, context_lens: torch.Tensor, num_blocks: int, block_size: int,
                     exact: bool):
    """A FlexAttention ``BlockMask`` for B decode rows (one query each) over the pool seen as one
    sequence of ``num_blocks * block_size`` slots: row b's KV blocks are its block table's first
    ceil(context / block_size) entries (the fused kernel visits only those), and the mask
    function keeps every slot of them but the last block's slots past the context.

    The fused kernel trusts the block list; torch's eager reference ignores it and applies the
    mask function to every slot of the pool, so with ``exact`` the function also checks that a
    slot's block is one of the row's (a [B, num_blocks] table: fine for a test's pool, not for
    a GPU's). Everything is tensor work on the device, so it can be captured in a CUDA graph.
    The index list is padded to ``num_blocks`` columns: the kernel requires one entry per
    block of the KV length (it reads only the first ``kv_num_blocks``)."""
    from torch.nn.attention.flex_attention import BlockMask

    rows, width = block_tables.shape
    lens = context_lens.to(torch.int32)
    used = (lens + block_size - 1) // block_size                    # blocks each row visits
    last = block_tables.gather(1, (used - 1).long().unsqueeze(1)).squeeze(1)
    tail = lens - (used - 1) * block_size                           # slots of the last block in use
    indices = torch.zeros((rows, 1, 1, num_blocks), dtype=torch.int32, device=block_tables.device)
    indices[:, 0, 0, :width] = block_tables
    owner = None
    if exact:
        live = torch.arange(width, device=block_tables.device) < used[:, None]
        cols = torch.where(live, block_tables, num_blocks)            # dead entries: a spare column
        owner = torch.zeros((rows, num_blocks + 1), dtype=torch.bool, device=block_tables.device)
        owner.scatter_(1, cols, True)

    def mask_mod(b, h, q_idx, kv_idx):
        block = kv_idx // block_size
        keep = (block != last[b]) | (kv_idx % block_size < tail[b])
        return keep & owner[b, block] if owner is not None else keep

    # one query per row: a single Q tile of the default size holds it; no Q-side indices (they
    # serve the backward pass only, and their transpose would be [B, num_blocks] more work)
    return BlockMask.from_kv_blocks(used.view(rows, 1, 1), indices, BLOCK_SIZE=(FLEX_Q_TILE, block_size),
                                    mask_mod=mask_mod, seq_lengths=(1, num_blocks * block_size),
                                    **_NO_Q_BLOCKS)


#: FlexAttention's default tile of query rows (a decode row's one query sits in the first)
FLEX_Q_TILE = 128


def _no_q_blocks() -> dict:
    """``compute_q_blocks=False`` where this torch's ``BlockMask.from_kv_blocks`` takes it."""
    import inspect

    try:
        from torch.nn.attention.flex_attention import BlockMask
    except ImportError:
        return {}
    return {"compute_q_blocks": False} if "compute_q_blocks" in inspect.signature(BlockMask.from_kv_blocks).parameters \
        else {}


_NO_Q_BLOCKS = _no_q_blocks()


def flex_available() -> bool:
    """Whether this torch has FlexAttention (``torch.nn.attention.flex_attention``)."""
    try:
        from torch.nn.attention.flex_attention import BlockMask, flex_attention  # noqa: F401
    except ImportError:
        return False
    return hasattr(BlockMask, "from_kv_blocks")


_COMPILED_FLEX = None


def _compiled_flex():
    """``torch.compile(flex_attention)``, made once: the fused kernel (B is the only shape that
    changes between steps; torch marks it dynamic on its first recompile)."""
    global _COMPILED_FLEX
    if _COMPILED_FLEX is None:
        from torch.nn.attention.flex_attention import flex_attention

        _COMPILED_FLEX = torch.compile(flex_attention, fullgraph=True)
    return _COMPILED_FLEX


class FlexPaged(AttentionBackend):
    """Decode through FlexAttention over the paged pool, read in place (``paged_block_mask``):
    queries [B, heads, 1, D], keys and values the pool as one [1, kv_heads, slots, D] sequence
    that every row shares (batch broadcast), GQA inside the kernel. ``compiled`` (default: on
    CUDA) calls the fused kernel, which visits only the rows' blocks; otherwise torch's eager
    reference, given the exact mask."""

    name = "flex"
    uses_block_tables = True
    uses_mask = False

    def __init__(self, compiled: bool | None = None, kernel_options: dict | None = None):
        self.compiled = compiled
        #: passed to the fused kernel (e.g. {"BLOCK_N": 16} if a GPU's default KV tile is larger
        #: than the pool's blocks: unverified which it needs, ``scripts/gpu_check.sh`` tries)
        self.kernel_options = kernel_options

    def decode(self, q, k_pool, v_pool, batch, scale):
        meta: DecodeMeta = batch.decode_meta
        n, heads, dim = q.shape
        blocks, bs, kv_heads = k_pool.shape[0], k_pool.shape[1], k_pool.shape[2]
        compiled = q.device.type == "cuda" if self.compiled is None else self.compiled
        if meta.flex_mask is None:  # once per step: every layer reads the same tables
            meta.flex_mask = paged_block_mask(meta.block_tables, meta.context_lens, blocks, bs, exact=not compiled)
        keys = k_pool.view(1, blocks * bs, kv_heads, dim).transpose(1, 2)
        values = v_pool.view(1, blocks * bs, kv_heads, dim).transpose(1, 2)
        if compiled:
            attend = _compiled_flex()
        else:
            from torch.nn.attention.flex_attention import flex_attention as attend
        extra = {"kernel_options": self.kernel_options} if compiled and self.kernel_options else {}
        # the scale goes into q, flex always sees 1.0: a float argument that changes between calls
        # (engines of other head sizes in one process) makes dynamo turn it into a tensor input
        # made on the host every call
        out = attend((q * scale).view(n, heads, 1, dim), keys, values, block_mask=meta.flex_mask, scale=1.0,
                     enable_gqa=heads != kv_heads, **extra)
        return out.reshape(n, heads * dim)


BACKENDS = {"gather": GatherSDPA, "paged": PagedInPlace, "kernel": PagedKernel, "flex": FlexPaged}
#: what ``make_backend(None)`` / ``resolve_backend(None, ...)`` give: gather, the plainest backend
#: (``LLM`` and the option checks default to "auto", resolved by ``resolve_backend``)
PLAIN_BACKEND = "gather"


def backends_for(device: torch.device | str, dtype: torch.dtype) -> tuple[str, ...]:
    """The backends an engine on ``device`` with a cache of ``dtype`` can run (what the parity
    tests parametrise over: "kernel" only where it serves, i.e. a float32 cache on the CPU)."""
    usable = {"kernel": lambda: kernel_usable(device, dtype), "flex": flex_available}
    return tuple(name for name in BACKENDS if usable.get(name, lambda: True)())


def kernel_usable(device: torch.device | str, dtype: torch.dtype) -> bool:
    """Whether the "kernel" backend can serve a cache of ``dtype`` on ``device``."""
    return _kernel_refusal(device, dtype) is None


def _kernel_refusal(device: torch.device | str, dtype: torch.dtype) -> str | None:
    """Why the kernel cannot serve a cache of ``dtype`` on ``device`` (None: it can)."""
    kind = torch.device(device).type
    if kind != "cpu" or dtype != torch.float32:
        return f"it serves a float32 KV cache on the CPU, not {dtype} on {kind}"
    from .cpu_kernel import available, unavailable_reason

    return None if available() else unavailable_reason()


def resolve_backend(name: str | None, device: torch.device | str, dtype: torch.dtype,
                    head_dim: int | None = None, group: int | None = None) -> str:
    """The backend name an engine runs: "auto" becomes "flex" on CUDA (where torch has it),
    "kernel" where ``kernel_usable`` and (given the model's ``head_dim`` and query heads per KV
    head ``group``) the kernel has its vectorised path for that shape, else "gather"; an explicit "kernel" where it is not usable
    is a ValueError saying why (any head shape is served: the generic loop is correct)."""
    name = PLAIN_BACKEND if name is None else name
    if name == "flex" and not flex_available():
        raise ValueError("attention_backend='flex' needs torch.nn.attention.flex_attention (torch >= 2.5); "
                         "use 'auto', 'gather' or 'paged'")
    if name == "auto":
        if torch.device(device).type == "cuda" and flex_available():
            return "flex"
        if not kernel_usable(device, dtype):
            return "gather"
        from .cpu_kernel import has_fast_path

        fast = head_dim is None or group is None or has_fast_path(head_dim, group)
        return "kernel" if fast else "gather"
    if name == "kernel":
        why = _kernel_refusal(device, dtype)
        if why is not None:
            raise ValueError(f"attention_backend='kernel' cannot be used here: {why}; "
                             f"use 'auto', 'gather' or 'paged'")
    return name


def make_backend(name: str | None = None) -> AttentionBackend:
    """The backend called ``name`` (None: the default)."""
    name = PLAIN_BACKEND if name is None else name
    if not isinstance(name, str) or name not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {tuple(BACKENDS)}, got {name!r}")
    return BACKENDS[name]()
