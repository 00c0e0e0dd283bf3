"""Read a GGUF file (llama.cpp's format) into minillm's own model code.

A GGUF holds everything in one file: metadata (the config, the tokenizer, the chat template)
and the tensors, usually quantised (Q4_1, Q8_0, ...). minillm runs in float32 / bfloat16 /
float16, so each tensor is *dequantised* once at load with the ``gguf`` package (the weights
are then exactly the quantised values, as llama.cpp computes with them, only wider).

Two things differ from a Hugging Face folder:

* names: ``blk.3.attn_q.weight`` is ``model.layers.3.self_attn.q_proj.weight``;
* for the Llama architecture, llama.cpp's converter reorders the rows of each q and k head
  (rotary pairs interleaved, (x0, x1), (x2, x3), ...; Hugging Face keeps the two halves
  apart). ``unpermute_rows`` undoes that, so the rotary code is the same for both formats.

The tokenizer is built by transformers from the same metadata (``gguf_file=``), chat
template included. Requires the ``gguf`` package (``pip install 'minillm[gguf]'``).
"""

from __future__ import annotations

import functools
import os
import shutil
import stat
import tempfile
from pathlib import Path

import numpy as np
import torch

from ..fast.kernel_cache import open_private_dir
from . import gguf_header
from .config import ModelConfig

GGUF_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# GGUF tensor name (after "blk.N.") -> Hugging Face name (after "model.layers.N.")
LAYER_TENSORS = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
TOP_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
INSTALL_HINT = "reading GGUF files needs the gguf package: pip install 'minillm[gguf]' (or pip install gguf)"


def _gguf():
    try:
        import gguf
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    return gguf


@functools.lru_cache(maxsize=1)
def _plain_array_reader():
    """The package's reader over a plain ndarray view of its file map: the reader slices the map
    hundreds of thousands of times (the tokenizer's strings), and each slice of an ``np.memmap``
    runs numpy's Python-level ``__array_finalize__``. Same bytes, same fields and tensors; the
    view keeps the map open. SmolLM2-135M's parse: 2.0 -> 0.7 CPU-s."""

    class PlainArrayReader(_gguf().GGUFReader):
        @property
        def data(self):
            return self._data

        @data.setter
        def data(self, value):
            self._data = value.view(np.ndarray) if isinstance(value, np.memmap) else value

    return PlainArrayReader


@functools.lru_cache(maxsize=1)
def _reader_for(path: str, mtime_ns: int, size: int):
    header = gguf_header.scan(Path(path))  # limits and truncation, before the package allocates anything
    try:
        return _plain_array_reader()(path), header
    except (ValueError, OSError, IndexError, KeyError) as exc:  # the reader's own errors on bad files
        raise ValueError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from None


def _read(path: Path):
    st = Path(path).stat()
    return _reader_for(str(path), st.st_mtime_ns, st.st_size)


def reader(path: Path):
    """One parse per file (parsing the tokenizer arrays takes seconds): config and weights share it.
    The header is checked first (``gguf_header.scan``): absurd sizes and truncation are refused."""
    return _read(path)[0]


def header(path: Path) -> gguf_header.GGUFHeader:
    """The checked header of ``path`` (its SHA-256 keys the tokenizer cache)."""
    return _read(path)[1]


def metadata(path: Path) -> dict:
    """Scalar and string metadata; the big tokenizer arrays are left out."""
    out = {}
    for key, f in reader(path).fields.items():
        if key in ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                   "tokenizer.ggml.merges"):
            out[key + ".count"] = len(f.data)
            continue
        try:
            out[key] = f.contents()
        except Exception:  # noqa: BLE001 - a field type the gguf package cannot decode: not one we use
            continue
    return out


def hf_config(path: Path) -> dict:
    """The metadata as a Hugging Face style config dict (what ``ModelConfig.from_dict`` reads)."""
    meta = metadata(path)
    arch = meta.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ValueError(f"{path}: general.architecture {arch!r} is not supported (supported: "
                         f"{', '.join(GGUF_ARCHITECTURES)})")

    def key(name, default=None):
        return meta.get(f"{arch}.{name}", default)

    names = {t.name for t in reader(path).tensors}
    cfg = {
        "architectures": [GGUF_ARCHITECTURES[arch]],
        "hidden_size": key("embedding_length"),
        "intermediate_size": key("feed_forward_length"),
        "num_hidden_layers": key("block_count"),
        "num_attention_heads": key("attention.head_count"),
        "num_key_value_heads": key("attention.head_count_kv"),
        "head_dim": key("attention.key_length"),
        "rms_norm_eps": key("attention.layer_norm_rms_epsilon", 1e-6),
        "rope_theta": key("rope.freq_base", 10000.0),
        "max_position_embeddings": key("context_length", 2048),
        "vocab_size": key("vocab_size", meta.get("tokenizer.ggml.tokens.count")),
        "tie_word_embeddings": "output.weight" not in names,
        "bos_token_id": meta.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": meta.get("tokenizer.ggml.eos_token_id"),
    }
    for field in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
        if cfg[field] is None:
            raise ValueError(f"{path}: GGUF metadata has no {arch}.* value for {field}")
    scaling = key("rope.scaling.type")
    if scaling not in (None, "none"):
        cfg["rope_scaling"] = {"rope_type": scaling, "factor": key("rope.scaling.factor")}
    if cfg["head_dim"] is None:
        del cfg["head_dim"]
    return cfg


def load_gguf_config(path: Path) -> ModelConfig:
    return ModelConfig.from_dict(hf_config(path), source=str(path))


def unpermute_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp's q/k row order (per head: rotary pairs interleaved) -> Hugging Face's (per
    head: first halves of the pairs, then second halves)."""
    rows, cols = w.shape[0], w.shape[1:]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *cols).transpose(1, 2).reshape(w.shape)


def hf_name(name: str) -> str | None:
    """GGUF tensor name -> Hugging Face name (None: a tensor minillm does not use)."""
    stem, _, kind = name.rpartition(".")
    if stem in TOP_TENSORS:
        return f"{TOP_TENSORS[stem]}.{kind}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in LAYER_TENSORS:
        return f"model.layers.{parts[1]}.{LAYER_TENSORS[parts[2]]}.{kind}"
    return None


def read_gguf_tensors(path: Path, config: ModelConfig) -> dict[str, torch.Tensor]:
    """Every tensor dequantised to float32 under its Hugging Face name, q/k rows in Hugging
    Face order. The loader then checks shapes and finiteness as for any checkpoint."""
    from gguf.quants import dequantize

    llama_order = config.architecture == "LlamaForCausalLM"
    out: dict[str, torch.Tensor] = {}
    for t in reader(path).tensors:
        name = hf_name(t.name)
        if name is None:
            continue
        if name in out:
            raise ValueError(f"{path}: tensor {t.name!r} appears twice")
        try:
            data = dequantize(t.data, t.tensor_type)
        except (NotImplementedError, ValueError) as exc:
            raise ValueError(f"{path}: tensor {t.name!r} of type {t.tensor_type.name} cannot be dequantised "
                             f"({exc})") from None
        data = np.ascontiguousarray(data, dtype=np.float32)
        if not data.flags.writeable:  # an F32 tensor is a view of the read-only file map
            data = data.copy()
        w = torch.from_numpy(data)
        if llama_order and name.endswith(("q_proj.weight", "q_proj.bias")):
            w = unpermute_rows(w, config.num_attention_heads)
        elif llama_order and name.endswith(("k_proj.weight", "k_proj.bias")):
            w = unpermute_rows(w, config.num_key_value_heads)
        out[name] = w
    return out


def tokenizer_cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "minillm" / "gguf-tokenizers"


def tokenizer_cache_dir(path: Path) -> Path:
    """Where the tokenizer built from ``path`` is kept: keyed by the SHA-256 of the file's header
    (every metadata value, tokenizer and chat template included), so two different files never
    share an entry whatever their names, sizes and times."""
    return tokenizer_cache_root() / header(path).sha256


def _private_cache_root() -> Path | None:
    """The cache folder when it is this user's alone (made 0700, or tightened to it when this user
    owns it), else None (no cache used)."""
    root = tokenizer_cache_root()
    try:
        os.close(open_private_dir(root, tighten=True))
    except OSError:
        return None
    return root


def _private_entry(cached: Path) -> bool:
    """Whether a cache entry is a folder of this user's that no one else can enter (as
    ``mkdtemp`` made it): only then are its files (the chat template among them) trusted."""
    try:
        st = os.lstat(cached)
    except OSError:
        return False
    uid = os.geteuid() if hasattr(os, "geteuid") else st.st_uid
    return stat.S_ISDIR(st.st_mode) and st.st_uid == uid and not st.st_mode & 0o077


def load_gguf_tokenizer(path: Path):
    """The tokenizer (and chat template) transformers builds from the GGUF's metadata.

    Building it means parsing ~50k tokens and merges in Python (tens of seconds on a busy
    machine), so the result is saved once as an ordinary tokenizer folder in the user's private
    cache and read from there afterwards; a cache another user could write is not used."""
    _gguf()
    from transformers import AutoTokenizer

    cached = tokenizer_cache_dir(path)
    root = _private_cache_root()
    if root is not None and _private_entry(cached) and (cached / "tokenizer.json").is_file():
        try:
            return AutoTokenizer.from_pretrained(str(cached), local_files_only=True, trust_remote_code=False)
        except Exception:  # noqa: BLE001 - a damaged cache entry: rebuild it below
            shutil.rmtree(cached, ignore_errors=True)
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - name the file whatever the converter raised
        raise ValueError(f"{path}: could not build the tokenizer from the GGUF metadata "
                         f"({type(exc).__name__}: {exc})") from None
    if root is not None:
        _save(tokenizer, cached)
    return tokenizer


def _save(tokenizer, cached: Path) -> None:
    """Write the folder next to its final place, then rename it there in one step: a reader
    never sees a half-written folder; a cache that cannot be written is simply not used."""
    tmp = None
    try:
        tmp = Path(tempfile.mkdtemp(dir=cached.parent, prefix=".building-"))
        tokenizer.save_pretrained(str(tmp))
        os.replace(tmp, cached)
    except OSError:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
