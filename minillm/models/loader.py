"""Load a Hugging Face folder (config.json, *.safetensors, tokenizer files) into our model.

Weights come through ``safetensors`` only: never pickle, never remote code. A missing or
unsupported piece raises an error that names the file, the tensor or the architecture.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from .config import ModelConfig
from .llama import LlamaForCausalLM, RotaryEmbedding

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "stories-3m"


def resolve_model_dir(model: str | Path | None) -> Path:
    path = DEFAULT_MODEL_DIR if model is None else Path(model).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(
            f"model folder {str(path)!r} does not exist; pass a local Hugging Face folder with "
            f"config.json, *.safetensors and tokenizer files (minillm never downloads weights)"
        )
    return path


def load_config(path: Path) -> ModelConfig:
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{cfg_file}: config.json is missing from the model folder")
    try:
        raw = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{cfg_file}: not valid JSON ({exc})") from None
    return ModelConfig.from_dict(raw, source=str(cfg_file))


def safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        files = [path / n for n in names]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"{index} names shards that are missing: {', '.join(missing)}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        hint = " (found pytorch_model.bin: minillm loads safetensors only)" if any(path.glob("*.bin")) else ""
        raise FileNotFoundError(f"{path}: no *.safetensors weight file in the model folder{hint}")
    return files


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    tensors: dict[str, torch.Tensor] = {}
    for file in safetensors_files(path):
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                tensors[name] = f.get_tensor(name)
    return tensors


def _pack(config: ModelConfig, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename Hugging Face tensors to ours, concatenating q/k/v and gate/up for packed matmuls."""

    def take(name: str) -> torch.Tensor:
        if name not in hf:
            raise KeyError(name)
        return hf.pop(name)

    out: dict[str, torch.Tensor] = {}
    try:
        out["model.embed_tokens.weight"] = take("model.embed_tokens.weight")
        out["model.norm.weight"] = take("model.norm.weight")
        if "lm_head.weight" in hf:
            out["lm_head.weight"] = take("lm_head.weight")
        elif config.tie_word_embeddings:
            out["lm_head.weight"] = out["model.embed_tokens.weight"]
        else:
            raise KeyError("lm_head.weight")
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            out[a + "qkv_proj.weight"] = torch.cat([take(a + f"{x}_proj.weight") for x in "qkv"])
            if config.qkv_bias:
                out[a + "qkv_proj.bias"] = torch.cat([take(a + f"{x}_proj.bias") for x in "qkv"])
            out[a + "o_proj.weight"] = take(a + "o_proj.weight")
            if config.o_bias:
                out[a + "o_proj.bias"] = take(a + "o_proj.bias")
            if config.qk_norm:
                out[a + "q_norm.weight"] = take(a + "q_norm.weight")
                out[a + "k_norm.weight"] = take(a + "k_norm.weight")
            m = p + "mlp."
            out[m + "gate_up_proj.weight"] = torch.cat([take(m + "gate_proj.weight"), take(m + "up_proj.weight")])
            if config.mlp_bias:
                out[m + "gate_up_proj.bias"] = torch.cat([take(m + "gate_proj.bias"), take(m + "up_proj.bias")])
            out[m + "down_proj.weight"] = take(m + "down_proj.weight")
            if config.mlp_bias:
                out[m + "down_proj.bias"] = take(m + "down_proj.bias")
            out[p + "input_layernorm.weight"] = take(p + "input_layernorm.weight")
            out[p + "post_attention_layernorm.weight"] = take(p + "post_attention_layernorm.weight")
    except KeyError as exc:
        raise ValueError(f"checkpoint is missing tensor {exc.args[0]!r} needed by {config.architecture}") from None
    return out


def load_model(path: Path, config: ModelConfig, dtype: torch.dtype, device: torch.device,
               max_positions: int) -> LlamaForCausalLM:
    hf = read_state_dict(path)
    state = _pack(config, hf)
    if config.tie_word_embeddings:
        state.pop("lm_head.weight")
    with torch.device("meta"):
        model = LlamaForCausalLM(config, max_positions)
    model = model.to_empty(device=device).to(dtype)
    for name, tensor in state.items():
        target = model.get_parameter(name)
        if tuple(target.shape) != tuple(tensor.shape):
            raise ValueError(f"tensor {name!r} has shape {tuple(tensor.shape)}, config.json implies "
                             f"{tuple(target.shape)}")
        with torch.no_grad():
            target.copy_(tensor.to(dtype))
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    # rotary tables are computed, not stored: build them in float32 on the target device
    model.rotary = RotaryEmbedding(config, max_positions).to(device)
    model.eval()
    return model


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer

    if not (path / "tokenizer.json").is_file() and not (path / "tokenizer.model").is_file():
        raise FileNotFoundError(f"{path}: tokenizer.json (or tokenizer.model) is missing from the model folder")
    return AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
