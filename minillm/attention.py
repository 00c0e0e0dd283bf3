"""Attention backends: how a step's queries read the paged KV pool.

The model computes q, k, v and writes the new keys and values into the pool; what happens next
is a backend's job, chosen when the runner is built (``LLM(attention_backend=...)``):

* ``GatherSDPA`` ("gather"): the readable reference, and what "auto" falls back to. Each
  decode group's context is gathered slot by slot out of the pool into one padded K/V tensor, then one
  ``scaled_dot_product_attention`` call. Shapes follow the step's contexts.
* ``PagedInPlace`` ("paged"): reads the pool by whole blocks through fixed-shape metadata
  (``DecodeMeta``: ``block_tables[B, W]`` padded with a null block, ``context_lens[B]``,
  ``slot_mapping[B]``): one ``index_select`` on the block axis, one SDPA for all decode rows.
  Every tensor it uses has a shape fixed by (B, W), which is what a captured CUDA graph needs.

* ``PagedKernel`` ("kernel"): the same metadata, read truly in place by a page of C
  (``minillm/kernels/paged_decode.c``, built on first use by ``minillm.cpu_kernel``): each
  row's K/V are read block by block straight out of the pool, once, with no copy and no mask.
  CPU and float32 only; ``"auto"`` picks it where it builds, the cache is float32 on the CPU
  and the model's heads have its vectorised path (``cpu_kernel.has_fast_path``), else ``gather``.

A GPU kernel plugs in as a further backend with the same ``decode`` signature: FlexAttention's
paged attention (``torch.nn.attention.flex_attention`` with a block mask built from
``block_tables``/``context_lens``) or ``flash_attn_with_kvcache(q, k_pool, v_pool,
cache_seqlens=context_lens, block_table=block_tables)``, which read the pool in place. None is
shipped: nothing on this machine can verify CUDA code.

The backends never import the model; ``batch`` is the model's ``AttentionBatch``.
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


class AttentionBackend:
    """Decode and prefill attention over a paged pool ([blocks, block_size, kv_heads, D])."""

    name = "base"
    #: the runner builds ``DecodeMeta`` (block tables) for this backend; otherwise decode groups
    uses_block_tables = False
    #: with block tables, the backend reads ``DecodeMeta.mask`` (a kernel bounded by
    #: ``context_lens`` needs none, and the runner then makes none)
    uses_mask = True

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
    """The reference: per decode group, gather the contexts' K/V slot by slot (one
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
    (``minillm.cpu_kernel.paged_decode``): one task per (row, KV head) walks the row's blocks in
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
    kernel's operator; ``minillm.decode_graphs``): ``k_pool[block_tables]`` is an
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


BACKENDS = {"gather": GatherSDPA, "paged": PagedInPlace, "kernel": PagedKernel}
DEFAULT_BACKEND = "gather"


def backends_for(device: torch.device | str, dtype: torch.dtype) -> tuple[str, ...]:
    """The backends an engine on ``device`` with a cache of ``dtype`` can run (what the parity
    tests parametrise over: "kernel" only where it serves, i.e. a float32 cache on the CPU)."""
    return tuple(name for name in BACKENDS if name != "kernel" or kernel_usable(device, dtype))


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
    """The backend name an engine runs: "auto" becomes "kernel" where ``kernel_usable`` and
    (given the model's ``head_dim`` and query heads per KV head ``group``) the kernel has its
    vectorised path for that shape, else "gather"; an explicit "kernel" where it is not usable
    is a ValueError saying why (any head shape is served: the generic loop is correct)."""
    name = DEFAULT_BACKEND if name is None else name
    if name == "auto":
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
    name = DEFAULT_BACKEND if name is None else name
    if not isinstance(name, str) or name not in BACKENDS:
        raise ValueError(f"attention_backend must be one of {tuple(BACKENDS)}, got {name!r}")
    return BACKENDS[name]()
