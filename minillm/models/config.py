"""ModelConfig: the few numbers from config.json that the model code needs.

Reads both config styles: published checkpoints write ``rope_theta`` and ``rope_scaling``;
transformers 5 writes ``rope_parameters`` (with ``rope_theta`` and ``rope_type`` inside).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import torch

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
#: The largest value each size field may have: far above any published model (Llama-3.1-405B:
#: 126 layers, hidden 16384; Gemma: vocabulary 262144), low enough that a file claiming more is
#: refused before anything is allocated for it (a 10**6-layer claim once cost 63 s and 2.9 GB).
SIZE_LIMITS = {
    "vocab_size": 1 << 21,
    "hidden_size": 1 << 16,
    "intermediate_size": 1 << 18,
    "num_hidden_layers": 1 << 10,
    "num_attention_heads": 1 << 10,
    "num_key_value_heads": 1 << 10,
    "head_dim": 1 << 11,
    "max_position_embeddings": 1 << 27,
}


@dataclass
class ModelConfig:
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # Qwen2 (and Llama with attention_bias=True)
    o_bias: bool
    mlp_bias: bool
    qk_norm: bool  # Qwen3
    rope_theta: float
    rope_scaling: dict = field(default_factory=dict)
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    torch_dtype: str | None = None

    generation_defaults: dict = field(default_factory=dict)  # from generation_config.json

    @classmethod
    def from_dict(cls, cfg: dict, source: str = "config.json") -> "ModelConfig":
        """Check every value the model code relies on and name the field of any that is wrong:
        a checkpoint folder is input like any other, and a bad one must fail here, not in torch."""
        if not isinstance(cfg, dict):
            raise ValueError(f"{source}: must be a JSON object, got a {type(cfg).__name__}")
        archs = cfg.get("architectures") or []
        if isinstance(archs, str):
            archs = [archs]
        if not isinstance(archs, list):
            raise ValueError(f"{source}: architectures must be a list of names, got {archs!r}")
        arch = next((a for a in archs if isinstance(a, str) and a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise ValueError(
                f"{source}: unsupported architectures value {archs!r}; minillm supports "
                f"{', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        family = SUPPORTED_ARCHITECTURES[arch]
        for name in ("hidden_size", "num_attention_heads", "vocab_size", "intermediate_size", "num_hidden_layers"):
            if name not in cfg:
                raise ValueError(f"{source}: missing required field {name!r}")
        size = {name: _positive_int(cfg, name, source) for name in
                ("hidden_size", "num_attention_heads", "vocab_size", "intermediate_size", "num_hidden_layers")}
        heads, hidden = size["num_attention_heads"], size["hidden_size"]
        kv_heads = _positive_int(cfg, "num_key_value_heads", source, default=heads)
        if heads % kv_heads:
            raise ValueError(f"{source}: num_attention_heads ({heads}) must be a multiple of "
                             f"num_key_value_heads ({kv_heads})")
        if cfg.get("head_dim") is None and hidden % heads:
            raise ValueError(f"{source}: hidden_size ({hidden}) must be a multiple of num_attention_heads "
                             f"({heads}) when head_dim is not given")
        head_dim = _positive_int(cfg, "head_dim", source, default=hidden // heads)
        if head_dim % 2:
            raise ValueError(f"{source}: head_dim must be even (rotary embeddings rotate pairs), got {head_dim}")
        if cfg.get("hidden_act", "silu") != "silu":
            raise ValueError(f"{source}: hidden_act {cfg.get('hidden_act')!r} is not supported (only 'silu')")
        if family == "qwen2" and cfg.get("use_sliding_window"):
            raise ValueError(f"{source}: use_sliding_window=true is not supported")
        rope = cls._rope_from(cfg, source)
        attention_bias = _bool(cfg, "attention_bias", source, False)
        return cls(
            architecture=arch,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rms_norm_eps=_positive_float(cfg, "rms_norm_eps", source, default=1e-6),
            max_position_embeddings=_positive_int(cfg, "max_position_embeddings", source, default=2048),
            tie_word_embeddings=_bool(cfg, "tie_word_embeddings", source, False),
            qkv_bias=True if family == "qwen2" else attention_bias,
            o_bias=False if family == "qwen2" else attention_bias,
            mlp_bias=_bool(cfg, "mlp_bias", source, False),
            qk_norm=family == "qwen3",
            rope_theta=rope.pop("rope_theta"),
            rope_scaling=rope,
            bos_token_id=token_id(cfg.get("bos_token_id"), "bos_token_id", source, size["vocab_size"]),
            eos_token_ids=token_ids(cfg.get("eos_token_id"), "eos_token_id", source, size["vocab_size"]),
            torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"),
            **size,
        )

    @staticmethod
    def _rope_from(cfg: dict, source: str) -> dict:
        params = cfg.get("rope_parameters") or {}
        legacy = cfg.get("rope_scaling") or {}
        for name, value in (("rope_parameters", params), ("rope_scaling", legacy)):
            if not isinstance(value, dict):
                raise ValueError(f"{source}: {name} must be an object, got {value!r}")
        params = dict(params) if params else dict(legacy)
        params.setdefault("rope_theta", cfg.get("rope_theta", 10000.0))
        rope_type = params.get("rope_type") or params.get("type") or "default"
        if rope_type not in SUPPORTED_ROPE_TYPES:
            raise ValueError(f"{source}: rope type {rope_type!r} is not supported (supported: "
                             f"{', '.join(SUPPORTED_ROPE_TYPES)})")
        params["rope_type"] = rope_type
        params.pop("type", None)
        params["rope_theta"] = _positive_float(params, "rope_theta", source)
        if rope_type != "default":
            params["factor"] = _positive_float(params, "factor", source)
        if rope_type == "llama3":
            for name, default in (("low_freq_factor", 1.0), ("high_freq_factor", 4.0)):
                params[name] = _positive_float(params, name, source, default=default)
            if params["high_freq_factor"] <= params["low_freq_factor"]:
                raise ValueError(f"{source}: rope high_freq_factor must be > low_freq_factor, got "
                                 f"{params['high_freq_factor']} and {params['low_freq_factor']}")
            if "original_max_position_embeddings" in params:
                params["original_max_position_embeddings"] = _positive_int(
                    params, "original_max_position_embeddings", source)
        return params


# --- field checks: each names the file and the field ----------------------------------------
def _positive_int(cfg: dict, name: str, source: str, default: int | None = None) -> int:
    value = cfg.get(name)
    if value is None and default is not None:
        return default
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{source}: {name} must be a positive integer, got {value!r}")
    limit = SIZE_LIMITS.get(name)
    if limit is not None and value > limit:
        raise ValueError(f"{source}: {name} is {value}, above the limit {limit} (SIZE_LIMITS)")
    return value


def _positive_float(cfg: dict, name: str, source: str, default: float | None = None) -> float:
    value = cfg.get(name)
    if value is None and default is not None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{source}: {name} must be a finite number > 0, got {value!r}")
    return float(value)


def _bool(cfg: dict, name: str, source: str, default: bool) -> bool:
    value = cfg.get(name, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ValueError(f"{source}: {name} must be true or false, got {value!r}")
    return value


def token_id(value, name: str, source: str, vocab_size: int) -> int | None:
    """One token id in [0, vocab_size), or None when absent."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
        raise ValueError(f"{source}: {name} must be a token id in [0, {vocab_size}), got {value!r}")
    return value


def token_ids(value, name: str, source: str, vocab_size: int) -> list[int]:
    """EOS-style fields hold one id or a list of ids; always returned as a list."""
    if value is None:
        return []
    values = value if isinstance(value, list) else [value]
    return [token_id(v, name, source, vocab_size) for v in values]


# --- generation_config.json ---------------------------------------------------------------
# generation_config.json key -> SamplingParams field, for the sampling defaults a model ships
GENERATION_DEFAULT_KEYS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


def load_generation_config(model_dir) -> dict:
    """The raw ``generation_config.json`` of a folder as a dict ({} when the folder has none).

    Instruct checkpoints list extra stop ids there (Qwen2.5 and Qwen3 end a turn with
    ``<|im_end|>`` but name ``<|endoftext|>`` in config.json) and their recommended sampling."""
    path = Path(model_dir) / "generation_config.json"
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path}: must be a JSON object, got a {type(raw).__name__}")
    return raw


def generation_defaults(gen: dict, source: str = "generation_config.json") -> dict:
    """The sampling values a model's authors recommend, as ``SamplingParams`` keyword arguments.

    Like vLLM's ``generation_config="auto"``, only values present are returned and
    ``do_sample`` is not interpreted (a caller's own params always win). A value of the wrong
    type is an error naming the field rather than a silent default."""
    out = {}
    for key, field_name in GENERATION_DEFAULT_KEYS.items():
        value = gen.get(key)
        if value is None:
            continue
        if key in ("top_k", "max_new_tokens"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{source}: {key} must be a non-negative integer, got {value!r}")
            if key == "max_new_tokens" and value == 0:
                continue
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{source}: {key} must be a finite number >= 0, got {value!r}")
        out[field_name] = value
    return out


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """Inverse frequencies of the rotary embedding, with the checkpoint's scaling applied."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling
    kind = scaling.get("rope_type", "default")
    if kind == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif kind == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling.get("low_freq_factor", 1.0))
        high = float(scaling.get("high_freq_factor", 4.0))
        old_len = float(scaling.get("original_max_position_embeddings", config.max_position_embeddings))
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = torch.where(medium, smoothed, scaled)
    return inv_freq
