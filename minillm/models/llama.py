"""The Llama family (Llama, Qwen2, Qwen3) in one readable file, reading and writing a paged KV cache.

One forward pass takes every token of the step, flattened: the new tokens of each scheduled
request (one for a decoding request, a chunk of the prompt for one being prefilled). Linear
layers see them as one matrix; only attention needs to know which token belongs to which
request, and that is what ``AttentionBatch`` says. Qwen2 adds a bias to q/k/v; Qwen3 adds an
RMSNorm on q and k per head. Everything else is shared.

Attention here is the reference: each request's queries attend to its whole context, read
back from the paged cache through its slots (``Attention.attend``). The fast layer swaps in a
backend that reads the pool for all decode rows at once (``minillm.fast.attention``) by
setting ``AttentionBatch.attention``; this file never imports it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig, rope_inv_freq


@dataclass
class PrefillSeq:
    """One request of the step: its rows in the flat batch and where its context lives. The
    reference runner describes every request so (a decode is a chunk of one token); the fast
    runner only the prefills, its decode rows go in ``decode_groups`` / ``decode_meta``."""

    q_start: int        # first row of this request's new tokens in the flat batch
    q_len: int          # number of new tokens this step
    ctx_len: int        # tokens in its context after this step (cached prefix + new)
    slots: torch.Tensor | None = None  # [ctx_len] flat cache slots of the whole context
                                       # (None: no cache, the new tokens are the whole context)


@dataclass
class DecodeGroup:
    """Decode rows [start, end) of the flat batch, attended in one call: their contexts are
    gathered from the cache padded to the longest of the group (L)."""

    start: int
    end: int
    slots: torch.Tensor | None          # [end - start, L] flat cache slots of each context (padded)
    mask: torch.Tensor | None = None    # [end - start, 1, 1, L] additive: 0 where a key is real,
                                        # -inf on padding; None when no row is padded
    first_slot: int | None = None       # one request whose context fills consecutive slots
                                        # [first_slot, first_slot + L): attended in place, no gather
    length: int = 0                     # L


@dataclass
class AttentionBatch:
    """Per-step layout, built once by the runner and shared by every layer. The reference
    fills the first three fields; the rest belong to the fast layer (``minillm.fast``)."""

    positions: torch.Tensor                 # [T] position of each token
    slot_mapping: torch.Tensor | None       # [T] flat cache slot each token's K/V is written to
    prefills: list[PrefillSeq] = field(default_factory=list)
    # --- the fast layer's (``minillm.fast.runner``) ---
    # a backend of ``minillm.fast.attention`` (None: the reference attention below)
    attention: object = None
    num_decode: int = 0                     # rows [0, num_decode) are single decode tokens
    decode_groups: list[DecodeGroup] = field(default_factory=list)  # they cover rows [0, num_decode)
    # optional [>= max group m x L, kv_heads, head_dim] buffers the decode gathers write into,
    # reused by every layer and step (a fresh multi-MB tensor per gather costs page faults)
    k_workspace: torch.Tensor | None = None
    v_workspace: torch.Tensor | None = None
    decode_meta: object = None  # ``minillm.fast.attention.DecodeMeta``, for block-table backends


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        if dtype != torch.float32:  # normalise in float32 (no round trip when x already is)
            x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * (x if dtype == torch.float32 else x.to(dtype))


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1) on the two halves of the last axis: rotary embedding is
    ``x * cos + rotate_half(x) * sin``. The model computes the same thing in fewer ops as
    ``x * cos + x.roll(half, -1) * signed_sin`` (``signed_sin``: sin with its first half
    negated, made once per step by ``RotaryEmbedding``)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


# Above this many positions the cos/sin tables are not stored (a config may claim 10**7
# positions; 128-wide tables for that would take gigabytes): angles are computed per step.
ROTARY_TABLE_LIMIT = 1 << 15


class RotaryEmbedding(nn.Module):
    """cos/sin of every position's rotary angles, in float32: a table up to
    ``ROTARY_TABLE_LIMIT`` positions (one lookup per step), computed per step beyond it
    (the same float32 products, so the same values)."""

    def __init__(self, config: ModelConfig, max_positions: int):
        super().__init__()
        self.config, self.max_positions = config, max_positions
        if torch.empty(0).is_meta:
            # the loader builds the model on the meta device and calls reset(device) after: tables made
            # here would go through torch's reference ops, whose import of torch._dynamo costs ~1.7 CPU-s
            for name in ("inv_freq", "cos", "sin"):
                self.register_buffer(name, None, persistent=False)
        else:
            self.reset(None)

    def reset(self, device) -> None:
        """(Re)build in float32 on ``device`` (None: the current default device)."""
        inv_freq = rope_inv_freq(self.config)
        if device is not None:
            inv_freq = inv_freq.to(device)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        if self.max_positions <= ROTARY_TABLE_LIMIT:
            cos, sin = self._angles(torch.arange(self.max_positions, dtype=torch.float32, device=inv_freq.device))
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)
        else:
            self.cos = self.sin = None

    def _angles(self, positions: torch.Tensor):
        freqs = torch.outer(positions.to(torch.float32), self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()

    def forward(self, positions: torch.Tensor, dtype: torch.dtype):
        """(cos, signed_sin) of each position, [T, 1, D] so they broadcast over heads;
        ``signed_sin`` has its first half negated (see ``rotate_half``)."""
        if self.cos is None:
            cos, sin = self._angles(positions)
        else:
            cos, sin = self.cos[positions], self.sin[positions]
        half = sin.shape[-1] // 2
        sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
        if dtype != torch.float32:
            cos, sin = cos.to(dtype), sin.to(dtype)
        return cos.unsqueeze(1), sin.unsqueeze(1)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int = 0):
        super().__init__()
        self.layer_idx = layer_idx  # which layer's cache this is (the compiled path needs it)
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        self.scale = self.head_dim ** -0.5
        # q, k and v projections packed into one matmul (the loader concatenates the weights)
        self.qkv_proj = nn.Linear(config.hidden_size, self.q_size + 2 * self.kv_size, bias=config.qkv_bias)
        self.o_proj = nn.Linear(self.q_size, config.hidden_size, bias=config.o_bias)
        self.qk_norm = config.qk_norm
        if self.qk_norm:
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)

    def forward(self, x, cos, sin, batch: AttentionBatch, k_cache=None, v_cache=None):
        q, k, v = self.project(x, cos, sin)
        return self.o_proj(self.attend(q, k, v, batch, k_cache, v_cache))

    def project(self, x, cos, sin):
        """q [T, heads, D], k and v [T, kv_heads, D] of every token, rotary applied."""
        T = x.shape[0]
        qkv = self.qkv_proj(x)
        v = qkv[:, self.q_size + self.kv_size:].view(T, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = qkv[:, :self.q_size + self.kv_size].split([self.q_size, self.kv_size], dim=-1)
            qk = torch.cat((self.q_norm(q.view(T, self.num_heads, self.head_dim)),
                            self.k_norm(k.view(T, self.num_kv_heads, self.head_dim))), dim=1)
        else:
            qk = qkv[:, :self.q_size + self.kv_size].view(T, self.num_heads + self.num_kv_heads, self.head_dim)
        # rotary on the query and key heads at once (the same elementwise formula for both):
        # qk * cos + rotate_half(qk) * sin, with the half swap as a roll and the sign in `sin`
        qk = torch.addcmul(qk * cos, qk.roll(self.head_dim // 2, -1), sin)
        return qk[:, :self.num_heads], qk[:, self.num_heads:], v

    def attend(self, q, k, v, batch: AttentionBatch, k_cache=None, v_cache=None) -> torch.Tensor:
        """Write this step's keys and values into their cache slots, then let each request's
        queries attend to its whole context read back from the cache: [T, heads * D]. Query i
        of a chunk of n is token ctx_len - n + i of the context: it sees the keys up to itself."""
        if batch.attention is not None:  # the fast layer's backend (``minillm.fast.attention``)
            return batch.attention.attend(self, q, k, v, batch, k_cache, v_cache)
        if k_cache is not None:
            k_flat = k_cache.view(-1, self.num_kv_heads, self.head_dim)
            v_flat = v_cache.view(-1, self.num_kv_heads, self.head_dim)
            k_flat.index_copy_(0, batch.slot_mapping, k)
            v_flat.index_copy_(0, batch.slot_mapping, v)
        out = torch.empty_like(q)
        for seq in batch.prefills:
            rows = slice(seq.q_start, seq.q_start + seq.q_len)
            if seq.slots is None:  # no cache: the chunk is the whole context
                keys, values = k[rows], v[rows]
            else:
                keys, values = k_flat[seq.slots], v_flat[seq.slots]
            n, L = seq.q_len, keys.shape[0]
            mask = None
            if 1 < n < L:  # a chunk after a cached prefix: causal, aligned to the context's end
                mask = torch.arange(L, device=q.device)[None, :] <= L - n + torch.arange(n, device=q.device)[:, None]
            o = F.scaled_dot_product_attention(  # [1, heads, n, D]; GQA: heads share KV heads
                q[rows].transpose(0, 1)[None], keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
                attn_mask=mask, is_causal=1 < n == L, scale=self.scale, enable_gqa=True)
            out[rows] = o[0].transpose(0, 1)
        return out.reshape(q.shape[0], self.q_size)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)), gate and up packed into one matmul."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.intermediate = config.intermediate_size
        self.gate_up_proj = nn.Linear(config.hidden_size, 2 * config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int = 0):
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, batch, k_cache, v_cache):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, batch, k_cache, v_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        # the loader builds this on the meta device, where there is nothing to initialise: giving the
        # (meta) weight skips Embedding's normal_, whose meta version imports torch._dynamo (~1.7 CPU-s
        # in every process that loads a model); on a real device the usual random init stays
        weight = torch.empty(config.vocab_size, config.hidden_size)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=weight if weight.is_meta else None)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """Llama / Qwen2 / Qwen3 decoder. ``forward`` returns logits only for the rows asked for
    (the last token of each request), since no other row is ever sampled from."""

    def __init__(self, config: ModelConfig, max_positions: int):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.rotary = RotaryEmbedding(config, max_positions)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor, batch: AttentionBatch, kv_cache=None,
                logits_rows: torch.Tensor | None = None) -> torch.Tensor:
        x = self.model.embed_tokens(input_ids)
        cos, sin = self.rotary(batch.positions, x.dtype)
        for i, layer in enumerate(self.model.layers):
            k_cache = kv_cache.k[i] if kv_cache is not None else None
            v_cache = kv_cache.v[i] if kv_cache is not None else None
            x = layer(x, cos, sin, batch, k_cache, v_cache)
        if logits_rows is not None:
            x = x.index_select(0, logits_rows)
        return self.lm_head(self.model.norm(x))

    @torch.no_grad()
    def use_decode_layout(self, transposed: bool = True) -> "LlamaForCausalLM":
        """Store every projection's weight ``[out, in]`` as a view of ``[in, out]`` memory
        (``transposed=True``) or back in the usual row-major layout. ``F.linear`` is the same
        call either way; with the transposed layout a few-row product becomes ``x @ Wt`` over a
        contiguous ``Wt``, which MKL streams faster at decode batch sizes on this CPU
        (``benchmarks/linear_paths.py``). Same float32 results up to rounding. A tied lm head
        keeps sharing its memory with the embedding table (a lookup then reads a strided row).
        Refused once ``LLM(compile=True)`` compiles this model: its graph does not check the
        weights' layout (``minillm.fast.compiled``)."""
        if getattr(self, "compiled", False):
            raise RuntimeError("use_decode_layout() after LLM(compile=True): the compiled forward does not "
                               "check its weights, so change the layout before compiling")
        tied = isinstance(self.lm_head, nn.Linear) and self.lm_head.weight is self.model.embed_tokens.weight
        for owner, name in self.projections():
            _relayout(getattr(owner, name), transposed)
        if tied:
            self.model.embed_tokens.weight = self.lm_head.weight
        return self

    def projections(self):
        """(owner module, attribute name) of every projection a decode step multiplies by:
        what a weight layout or a weight dtype (``minillm.models.weights``) changes."""
        for layer in self.model.layers:
            yield layer.self_attn, "qkv_proj"
            yield layer.self_attn, "o_proj"
            yield layer.mlp, "gate_up_proj"
            yield layer.mlp, "down_proj"
        yield self, "lm_head"

    @torch.inference_mode()
    def full_logits(self, token_ids: list[int] | torch.Tensor) -> torch.Tensor:
        """Logits at every position of one sequence, recomputing everything: no KV cache.
        This is what each decode step would cost without a cache."""
        device = self.model.embed_tokens.weight.device  # (the lm head may be int8: no .weight)
        ids = torch.as_tensor(token_ids, dtype=torch.long, device=device)
        n = ids.shape[0]
        batch = AttentionBatch(positions=torch.arange(n, device=device), slot_mapping=None,
                               prefills=[PrefillSeq(q_start=0, q_len=n, ctx_len=n)])
        return self.forward(ids, batch).float()


def _relayout(linear: nn.Module, transposed: bool) -> None:
    if not isinstance(linear, nn.Linear):  # an int8 projection has its own packed layout
        return
    w = linear.weight
    is_t = w.dim() == 2 and w.stride(0) == 1 and w.shape[0] > 1
    if transposed and not is_t:
        linear.weight = nn.Parameter(w.detach().t().contiguous().t(), requires_grad=w.requires_grad)
    elif not transposed and is_t:
        linear.weight = nn.Parameter(w.detach().contiguous(), requires_grad=w.requires_grad)
