"""How many requests fit on a real GPU: the KV cache in 显存, for published model shapes.

The shipped model is tiny and runs on a CPU, so every pool the notebooks print is a few MiB of
RAM. The chapter speaks of 显存 (GPU memory) on real cards. This module does the chapter's
arithmetic for real models, from their ``config.json`` facts only (layers, KV heads, head
size, vocabulary; nothing measured, nothing guessed), with the engine's own formula
(``minillm.kv_cache.kv_bytes_per_token``):

* bytes per token of context = 2 (K and V) x layers x KV heads x head_dim x bytes per number;
* the KV budget on a card = its memory x the fraction the engine may use - the weights;
* requests that fit = budget // (context rounded up to whole blocks x bytes per token).

GB here is 10^9 bytes, for the card (the number on its spec sheet) and for the weights alike,
so the arithmetic can be done by hand. Activations and the CUDA context are not counted: the
``utilization`` fraction (0.9, as engines default to) leaves room for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from minillm.kv_cache import kv_bytes_per_token
from minillm.models.config import ModelConfig

GB = 10**9
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}
CARDS_GB = {"24 GB (RTX 4090, L4)": 24, "80 GB (A100, H100)": 80, "141 GB (H200)": 141}

# config.json facts of three published models (Hugging Face model pages): only the fields the
# engine's config loader reads. GQA: fewer KV heads than query heads.
PUBLISHED_CONFIGS = {
    "Llama-3-8B": {"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
                   "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                   "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0,
                   "tie_word_embeddings": False},
    "Qwen2.5-7B": {"architectures": ["Qwen2ForCausalLM"], "hidden_size": 3584, "intermediate_size": 18944,
                   "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                   "vocab_size": 152064, "max_position_embeddings": 131072, "rope_theta": 1000000.0,
                   "tie_word_embeddings": False},
    "Qwen3-0.6B": {"architectures": ["Qwen3ForCausalLM"], "hidden_size": 1024, "intermediate_size": 3072,
                   "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
                   "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960,
                   "rope_theta": 1000000.0, "tie_word_embeddings": True},
}


def _positive(name: str, value, kind=int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int) or value <= 0:
        raise ValueError(f"{name} must be a positive {'number' if kind is float else 'integer'}, got {value!r}")


def _dtype_bytes(name: str, dtype) -> int:
    if isinstance(dtype, str) and dtype in DTYPE_BYTES:
        return DTYPE_BYTES[dtype]
    if isinstance(dtype, int) and not isinstance(dtype, bool) and dtype in DTYPE_BYTES.values():
        return dtype
    raise ValueError(f"{name} must be one of {', '.join(DTYPE_BYTES)} (or 4, 2, 1 bytes), got {dtype!r}")


@dataclass(frozen=True)
class ModelShape:
    """What the KV cache and the weights of one model depend on, read from its config."""

    name: str
    num_layers: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    num_params: int

    @classmethod
    def from_config(cls, name: str, config: ModelConfig | dict) -> ModelShape:
        cfg = config if isinstance(config, ModelConfig) else ModelConfig.from_dict(config, source=name)
        return cls(name, cfg.num_hidden_layers, cfg.num_attention_heads, cfg.num_key_value_heads,
                   cfg.head_dim, param_count(cfg))

    def kv_bytes_per_token(self, kv_dtype="bf16") -> int:
        """The engine's formula: K and V of one token in every layer."""
        return kv_bytes_per_token(self.num_layers, self.num_kv_heads, self.head_dim, _dtype_bytes("kv_dtype", kv_dtype))

    def weight_bytes(self, weight_dtype="bf16") -> int:
        return self.num_params * _dtype_bytes("weight_dtype", weight_dtype)


def param_count(cfg: ModelConfig) -> int:
    """Parameters of a Llama / Qwen2 / Qwen3 model, counted from its shapes."""
    h, hd = cfg.hidden_size, cfg.head_dim
    q, kv = cfg.num_attention_heads * hd, cfg.num_key_value_heads * hd
    attention = h * q + 2 * h * kv + q * h
    attention += (q + 2 * kv) * cfg.qkv_bias + h * cfg.o_bias + 2 * hd * cfg.qk_norm
    mlp = 3 * h * cfg.intermediate_size + (2 * cfg.intermediate_size + h) * cfg.mlp_bias
    layer = attention + mlp + 2 * h  # two RMSNorm weights
    embeddings = cfg.vocab_size * h * (1 if cfg.tie_word_embeddings else 2)
    return cfg.num_hidden_layers * layer + embeddings + h  # + the final norm


PUBLISHED = {name: ModelShape.from_config(name, cfg) for name, cfg in PUBLISHED_CONFIGS.items()}


def _shape(model) -> ModelShape:
    if isinstance(model, ModelShape):
        return model
    if model in PUBLISHED:
        return PUBLISHED[model]
    raise ValueError(f"model must be a ModelShape or one of {', '.join(PUBLISHED)}, got {model!r}")


def kv_budget_bytes(card_gb, model, *, utilization: float = 0.9, weight_dtype="bf16") -> int:
    """Bytes left for the KV cache on a card of ``card_gb`` GB once the weights are loaded."""
    _positive("card_gb", card_gb, float)
    if not (isinstance(utilization, (int, float)) and 0 < utilization <= 1):
        raise ValueError(f"utilization must be in (0, 1], got {utilization!r}")
    shape = _shape(model)
    return int(card_gb * GB * utilization) - shape.weight_bytes(weight_dtype)


def tokens_held(context_tokens: int, block_size: int = 16) -> int:
    """Tokens of KV a request of ``context_tokens`` reserves: whole blocks of ``block_size``."""
    _positive("context_tokens", context_tokens)
    _positive("block_size", block_size)
    return -(-context_tokens // block_size) * block_size


@dataclass(frozen=True)
class Capacity:
    """One row of the calculator: a model on a card at one context length."""

    model: str
    card_gb: float
    context_tokens: int
    kv_dtype: str
    bytes_per_token: int
    bytes_per_request: int
    weight_bytes: int
    kv_budget_bytes: int
    max_requests: int

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def capacity(model, card_gb, context_tokens: int, *, kv_dtype="bf16", weight_dtype="bf16",
             block_size: int = 16, utilization: float = 0.9) -> Capacity:
    """How many requests of ``context_tokens`` (prompt + output) fit in the KV budget at once;
    0 when the weights alone do not fit."""
    shape = _shape(model)
    per_token = shape.kv_bytes_per_token(kv_dtype)
    per_request = tokens_held(context_tokens, block_size) * per_token
    budget = kv_budget_bytes(card_gb, shape, utilization=utilization, weight_dtype=weight_dtype)
    return Capacity(shape.name, card_gb, context_tokens, str(kv_dtype), per_token, per_request,
                    shape.weight_bytes(weight_dtype), budget, max(budget, 0) // per_request)


def capacity_table(models=None, cards=None, context_tokens: int = 8192, **options) -> list[Capacity]:
    """Every model on every card (the notebook's table)."""
    models = list(PUBLISHED) if models is None else models
    cards = list(CARDS_GB.values()) if cards is None else cards
    return [capacity(m, c, context_tokens, **options) for m in models for c in cards]


def what_buys(model, card_gb, context_tokens: int, **options) -> dict[str, int]:
    """Concurrent requests now, with FP8 KV (1 byte instead of 2), and with half the history."""
    return {
        "baseline": capacity(model, card_gb, context_tokens, **options).max_requests,
        "fp8_kv": capacity(model, card_gb, context_tokens, **{**options, "kv_dtype": "fp8"}).max_requests,
        "half_history": capacity(model, card_gb, max(context_tokens // 2, 1), **options).max_requests,
    }
