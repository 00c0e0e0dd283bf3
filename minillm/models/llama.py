"""The Llama family (Llama, Qwen2, Qwen3) in one readable file, reading and writing a paged KV cache.

One forward pass takes every token of the step, flattened: the newest token of each decoding
request, then the uncached tokens of each request being prefilled. Linear layers see them
as one matrix; only attention needs to know which token belongs to which request, and that
is what ``AttentionBatch`` says. Qwen2 adds a bias to q/k/v; Qwen3 adds an RMSNorm on q
and k per head. Everything else is shared.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from .config import ModelConfig, rope_inv_freq


@dataclass
class PrefillSeq:
    """One request being prefilled: its rows in the flat batch and where its context lives."""

    q_start: int        # first row of this request's new tokens in the flat batch
    q_len: int          # number of new tokens this step
    ctx_len: int        # tokens in its context after this step (cached prefix + new)
    slots: torch.Tensor | None = None  # [ctx_len] flat cache slots of the whole context


@dataclass
class AttentionBatch:
    """Per-step layout, built once by the runner and shared by every layer."""

    positions: torch.Tensor                 # [T] position of each token
    slot_mapping: torch.Tensor | None       # [T] flat cache slot each token's K/V is written to
    num_decode: int = 0                     # rows [0, num_decode) are single decode tokens
    decode_slots: torch.Tensor | None = None  # [num_decode, L] padded slots of each context
    decode_mask: torch.Tensor | None = None   # [num_decode, 1, 1, L] True where a key is real
    prefills: list[PrefillSeq] = field(default_factory=list)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for every position, computed once in float32."""

    def __init__(self, config: ModelConfig, max_positions: int):
        super().__init__()
        inv_freq = rope_inv_freq(config)
        freqs = torch.outer(torch.arange(max_positions, dtype=torch.float32), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype):
        # [T, 1, D] so it broadcasts over heads
        return self.cos[positions].unsqueeze(1).to(dtype), self.sin[positions].unsqueeze(1).to(dtype)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
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
        T = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(T, self.num_heads, self.head_dim)
        k = k.view(T, self.num_kv_heads, self.head_dim)
        v = v.view(T, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin

        if k_cache is not None:  # write this step's keys and values into their slots
            k_flat = k_cache.view(-1, self.num_kv_heads, self.head_dim)
            v_flat = v_cache.view(-1, self.num_kv_heads, self.head_dim)
            k_flat.index_copy_(0, batch.slot_mapping, k)
            v_flat.index_copy_(0, batch.slot_mapping, v)

        out = torch.empty_like(q)
        n = batch.num_decode
        if n:
            # Decode: one query per request against its whole cached context, all requests in
            # one call. The query heads that share a KV head sit in the "query length" axis.
            keys = k_flat[batch.decode_slots].transpose(1, 2)    # [n, kv_heads, L, D]
            values = v_flat[batch.decode_slots].transpose(1, 2)
            group = self.num_heads // self.num_kv_heads
            qd = q[:n].view(n, self.num_kv_heads, group, self.head_dim)
            o = F.scaled_dot_product_attention(qd, keys, values, attn_mask=batch.decode_mask, scale=self.scale)
            out[:n] = o.reshape(n, self.num_heads, self.head_dim)
        for seq in batch.prefills:
            rows = slice(seq.q_start, seq.q_start + seq.q_len)
            qp = q[rows].transpose(0, 1).unsqueeze(0)              # [1, heads, q_len, D]
            if seq.ctx_len == seq.q_len:                           # nothing cached before
                keys, values, mask, causal = k[rows], v[rows], None, True
            else:                                                  # a cached prefix precedes
                keys, values = k_flat[seq.slots], v_flat[seq.slots]
                past = seq.ctx_len - seq.q_len
                mask = (torch.arange(seq.ctx_len, device=x.device)[None, :]
                        <= past + torch.arange(seq.q_len, device=x.device)[:, None])
                causal = False
            o = F.scaled_dot_product_attention(
                qp, keys.transpose(0, 1).unsqueeze(0), values.transpose(0, 1).unsqueeze(0),
                attn_mask=mask, is_causal=causal, scale=self.scale, enable_gqa=True,
            )
            out[rows] = o[0].transpose(0, 1)
        return self.o_proj(out.reshape(T, self.q_size))


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
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, cos, sin, batch, k_cache, v_cache):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, batch, k_cache, v_cache)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, config: ModelConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
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

    @torch.inference_mode()
    def full_logits(self, token_ids: list[int] | torch.Tensor) -> torch.Tensor:
        """Logits at every position of one sequence, recomputing everything: no KV cache.
        This is what each decode step would cost without a cache."""
        device = self.lm_head.weight.device
        ids = torch.as_tensor(token_ids, dtype=torch.long, device=device)
        n = ids.shape[0]
        batch = AttentionBatch(positions=torch.arange(n, device=device), slot_mapping=None,
                               prefills=[PrefillSeq(q_start=0, q_len=n, ctx_len=n)])
        return self.forward(ids, batch).float()
