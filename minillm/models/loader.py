"""Load a Hugging Face folder (config.json, safetensors weights, tokenizer files) into our model.

A model folder is input from strangers, so the loader trusts nothing in it:

* weights come through ``safetensors`` only (never pickle, never remote code), and only from
  ``model.safetensors`` or the shards that ``model.safetensors.index.json`` names: a stale
  extra file in the folder can never replace real weights;
* every file read is resolved inside the folder (no ``..``, no absolute path, no symlink out of
  it; the one exception is the Hugging Face hub cache, whose snapshot files link to the
  repository's own ``blobs/``);
* a tensor name found in two shards, a tensor whose shape disagrees with config.json, a NaN or
  an infinity in the weights, a tokenizer that can emit ids outside the embedding table:
  each is a ``ValueError`` naming the file and the tensor or field.

A ``.gguf`` file is accepted in place of a folder (see ``gguf.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from .config import ModelConfig, generation_defaults, load_generation_config, token_ids
from .llama import LlamaForCausalLM

DEFAULT_MODEL_DIR = Path(__file__).resolve().parent.parent / "assets" / "stories-3m"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
# files transformers may read when it builds a tokenizer from a folder: each must stay inside it
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                   "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja", "chat_template.json")


def is_gguf(path: Path) -> bool:
    return path.suffix.lower() == ".gguf"


def resolve_model_dir(model: str | Path | None) -> Path:
    """The model folder (or ``.gguf`` file) to load; None is the model shipped in the package."""
    if model is not None and not isinstance(model, (str, Path)):
        raise ValueError(f"model must be a path to a folder or a .gguf file, got {type(model).__name__}")
    path = DEFAULT_MODEL_DIR if model is None else Path(model).expanduser()
    if is_gguf(path):
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {str(path)!r} does not exist")
        return path
    if not path.is_dir():
        raise FileNotFoundError(
            f"model folder {str(path)!r} does not exist; pass a local Hugging Face folder with "
            f"config.json, model.safetensors and tokenizer files, or a .gguf file "
            f"(minillm never downloads weights)"
        )
    return path


def inside(folder: Path, name: str, what: str) -> Path:
    """``folder / name``, refusing any name or symlink that leads out of the folder."""
    if not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts:
        raise ValueError(f"{what}: file name {name!r} must be a relative path inside {folder}")
    path = folder / name
    real, root = path.resolve(), folder.resolve()
    allowed = [root]
    if root.parent.name == "snapshots":  # Hugging Face hub cache: snapshots/<rev>/f -> ../../blobs/<hash>
        allowed.append(root.parent.parent / "blobs")
    if not any(real == a or a in real.parents for a in allowed):
        raise ValueError(f"{what}: {name!r} resolves to {real}, outside the model folder {root}")
    return path


def _read_json(path: Path) -> object:
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON ({exc})") from None


def load_config(path: Path) -> ModelConfig:
    """config.json checked field by field, with generation_config.json's EOS ids and sampling
    defaults merged in (instruct models often list their end-of-turn token only there)."""
    if is_gguf(path):
        from .gguf import load_gguf_config

        return load_gguf_config(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        ggufs = sorted(p.name for p in path.glob("*.gguf"))
        hint = f" (found {ggufs[0]}: pass that file itself, LLM('{path / ggufs[0]}'))" if ggufs else ""
        raise FileNotFoundError(f"{cfg_file}: config.json is missing from the model folder{hint}")
    inside(path, "config.json", str(cfg_file))
    config = ModelConfig.from_dict(_read_json(cfg_file), source=str(cfg_file))
    if (path / "generation_config.json").is_file():
        source = str(inside(path, "generation_config.json", str(path / "generation_config.json")))
        gen = load_generation_config(path)
        for eos in token_ids(gen.get("eos_token_id"), "eos_token_id", source, config.vocab_size):
            if eos not in config.eos_token_ids:
                config.eos_token_ids.append(eos)
        config.generation_defaults = generation_defaults(gen, source)
    return config


def safetensors_files(path: Path) -> list[Path]:
    """``model.safetensors``, or the shards the index names; nothing else in the folder."""
    index = path / INDEX_FILE
    if index.is_file():
        inside(path, INDEX_FILE, str(index))
        raw = _read_json(index)
        weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index}: weight_map must be a non-empty object of tensor name -> shard file")
        names = sorted(set(weight_map.values()), key=str)
        files = [inside(path, n, f"{index}: weight_map") for n in names]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise FileNotFoundError(f"{index} names shards that are missing: {', '.join(missing)}")
        return files
    single = path / WEIGHTS_FILE
    if single.is_file():
        return [inside(path, WEIGHTS_FILE, str(single))]
    others = sorted(p.name for p in path.glob("*.safetensors"))
    if others:
        raise FileNotFoundError(
            f"{path}: no {WEIGHTS_FILE} and no {INDEX_FILE}; found {', '.join(others)}, but minillm loads "
            f"only {WEIGHTS_FILE} or the shards an index names (rename the file or add an index)")
    hint = " (found pytorch_model.bin: minillm loads safetensors only)" if any(path.glob("*.bin")) else ""
    raise FileNotFoundError(f"{path}: no {WEIGHTS_FILE} weight file in the model folder{hint}")


def read_state_dict(path: Path, origin: dict[str, Path] | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of every weight file; a name in two shards is an error, not an overwrite.
    ``origin`` (if given) is filled with the file each tensor came from."""
    tensors: dict[str, torch.Tensor] = {}
    origin = {} if origin is None else origin
    for file in safetensors_files(path):
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    if name in tensors:
                        raise ValueError(f"tensor {name!r} appears in both {origin[name]} and {file}")
                    tensors[name] = f.get_tensor(name)
                    origin[name] = file
        except (SafetensorError, OSError, RuntimeError) as exc:
            raise ValueError(f"{file}: not a readable safetensors file (truncated or corrupt?): {exc}") from None
    return tensors


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Shape of every Hugging Face tensor the architecture needs, from config.json alone."""
    h, i, v = config.hidden_size, config.intermediate_size, config.vocab_size
    q, kv, d = config.num_attention_heads * config.head_dim, config.num_key_value_heads * config.head_dim, config.head_dim
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,)}
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (v, h)
    for n in range(config.num_hidden_layers):
        a, m, p = f"model.layers.{n}.self_attn.", f"model.layers.{n}.mlp.", f"model.layers.{n}."
        shapes.update({a + "q_proj.weight": (q, h), a + "k_proj.weight": (kv, h), a + "v_proj.weight": (kv, h),
                       a + "o_proj.weight": (h, q), m + "gate_proj.weight": (i, h), m + "up_proj.weight": (i, h),
                       m + "down_proj.weight": (h, i), p + "input_layernorm.weight": (h,),
                       p + "post_attention_layernorm.weight": (h,)})
        if config.qkv_bias:
            shapes.update({a + "q_proj.bias": (q,), a + "k_proj.bias": (kv,), a + "v_proj.bias": (kv,)})
        if config.o_bias:
            shapes[a + "o_proj.bias"] = (h,)
        if config.qk_norm:
            shapes.update({a + "q_norm.weight": (d,), a + "k_norm.weight": (d,)})
        if config.mlp_bias:
            shapes.update({m + "gate_proj.bias": (i,), m + "up_proj.bias": (i,), m + "down_proj.bias": (h,)})
    return shapes


def check_tensors(config: ModelConfig, hf: dict[str, torch.Tensor], source: str,
                  origin: dict[str, Path] | None = None) -> None:
    """Every needed tensor present, of the shape config.json implies, and finite (checked once).
    Errors name the weight file the tensor came from (``origin``), else ``source``."""
    origin = origin or {}
    for name, shape in expected_shapes(config).items():
        if name not in hf:
            raise ValueError(f"{source}: checkpoint is missing tensor {name!r} needed by {config.architecture}")
        t = hf[name]
        source_of = str(origin.get(name, source))
        if tuple(t.shape) != shape:
            raise ValueError(f"{source_of}: tensor {name!r} has shape {tuple(t.shape)}, but config.json implies "
                             f"{shape}")
        if not t.is_floating_point():
            raise ValueError(f"{source_of}: tensor {name!r} has dtype {t.dtype}, expected a floating-point type")
        if not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise ValueError(f"{source_of}: tensor {name!r} holds {bad} NaN or infinite values")


def _pack(config: ModelConfig, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename Hugging Face tensors to ours, concatenating q/k/v and gate/up for packed matmuls
    (shapes were checked by ``check_tensors``)."""
    out: dict[str, torch.Tensor] = {}
    take = hf.pop
    out["model.embed_tokens.weight"] = take("model.embed_tokens.weight")
    out["model.norm.weight"] = take("model.norm.weight")
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = take("lm_head.weight")
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
    return out


def build_model(config: ModelConfig, hf: dict[str, torch.Tensor], dtype: torch.dtype, device: torch.device,
                max_positions: int, source: str, origin: dict[str, Path] | None = None) -> LlamaForCausalLM:
    """Our model from checked Hugging Face-named tensors. The module is built on the meta
    device and the checkpoint's tensors become its parameters (cast on the host, then moved):
    the only memory ever allocated on ``device`` is the final weights in ``dtype``, with no
    float32 copy first and no second copy on the host."""
    check_tensors(config, hf, source, origin)
    state = _pack(config, hf)
    for name, tensor in state.items():
        state[name] = tensor.to(dtype=dtype).to(device)
    if config.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    with torch.device("meta"):
        model = LlamaForCausalLM(config, max_positions)
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    left = [n for n, p in model.named_parameters() if p.is_meta]
    if left:  # cannot happen after check_tensors; a loud error beats a silent meta weight
        raise ValueError(f"{source}: no weights loaded for {', '.join(left)}")
    # rotary tables are computed, not stored: built in float32 on the target device
    model.rotary.reset(device)
    model.eval()
    return model


def load_model(path: Path, config: ModelConfig, dtype: torch.dtype, device: torch.device,
               max_positions: int) -> LlamaForCausalLM:
    if is_gguf(path):
        from .gguf import read_gguf_tensors

        return build_model(config, read_gguf_tensors(path, config), dtype, device, max_positions, str(path))
    origin: dict[str, Path] = {}
    hf = read_state_dict(path, origin)
    return build_model(config, hf, dtype, device, max_positions, str(path), origin)


def check_tokenizer(tokenizer, vocab_size: int, source: str) -> None:
    """A tokenizer that can emit an id outside the embedding table would fail inside a step
    (and take the step's other requests with it): refuse it at load."""
    vocab = tokenizer.get_vocab()
    top = max(vocab.values(), default=-1)
    if top >= vocab_size:
        name = next(t for t, i in vocab.items() if i == top)
        raise ValueError(f"{source}: the tokenizer can emit token id {top} ({name!r}), but the model's "
                         f"vocab_size is {vocab_size} (ids must be < vocab_size)")


# AutoTokenizer builds transformers' generic fast tokenizer for a folder whose tokenizer_config.json names
# one of these classes (and no remote code), when config.json's model_type is one of these (a type it
# does not map to a class of its own): tests/test_loader.py checks that it still does
GENERIC_TOKENIZER_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")
GENERIC_TOKENIZER_MODEL_TYPES = ("llama", "qwen3")


def _generic_tokenizer_class(path: Path):
    """transformers' generic fast tokenizer class where AutoTokenizer would pick it too, else None.
    Going to it directly skips AutoConfig, whose import of the model family's config module (it pulls
    in torch.distributed) costs about 2 CPU-seconds in every process that loads a model: each
    notebook kernel, each ``minillm serve`` start."""
    try:
        tok_cfg = json.loads((path / "tokenizer_config.json").read_text())
        model_type = json.loads((path / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(tok_cfg, dict) or "auto_map" in tok_cfg or model_type not in GENERIC_TOKENIZER_MODEL_TYPES \
            or tok_cfg.get("tokenizer_class") not in GENERIC_TOKENIZER_CLASSES:
        return None
    try:
        from transformers import TokenizersBackend
    except ImportError:  # an older transformers: AutoTokenizer decides
        return None
    return TokenizersBackend


def load_tokenizer(path: Path, vocab_size: int | None = None):
    """The folder's tokenizer (or the GGUF's), checked against the model's ``vocab_size``
    (read from config.json when not given)."""
    if is_gguf(path):
        from .gguf import load_gguf_tokenizer

        tokenizer = load_gguf_tokenizer(path)
    else:
        if not (path / "tokenizer.json").is_file() and not (path / "tokenizer.model").is_file():
            raise FileNotFoundError(f"{path}: tokenizer.json (or tokenizer.model) is missing from the model folder")
        for name in TOKENIZER_FILES:
            if (path / name).exists() or (path / name).is_symlink():
                inside(path, name, str(path / name))
        try:
            generic = _generic_tokenizer_class(path)
            if generic is not None:
                tokenizer = generic.from_pretrained(str(path), local_files_only=True)
            else:  # imported only here: it loads transformers' table of every model family (~1.3 CPU s)
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True, trust_remote_code=False)
        except Exception as exc:  # noqa: BLE001 - tokenizer parsers raise many kinds; name the folder
            raise ValueError(f"{path}: the tokenizer files could not be read ({type(exc).__name__}: {exc})") from None
    if vocab_size is None:
        vocab_size = load_config(path).vocab_size
    check_tokenizer(tokenizer, vocab_size, str(path))
    return tokenizer
