"""The checkpoints the benchmarks run on.

``default``: the model shipped in the package (``minillm/assets/stories-3m``).
``135m``: random weights in the shape of SmolLM-135M (hidden 576, 30 layers, 9 query heads,
3 key/value heads, intermediate 1536, vocabulary 49152, tied embeddings, 2048 positions),
built from a ``transformers.LlamaConfig`` and saved with ``save_pretrained`` next to a
locally built byte-level tokenizer padded to the model's vocabulary. Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

SMOLLM_135M_SHAPE = dict(
    vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
    num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
    tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-5,
)
# a small shape for the test suite and for trying the harness out
TINY_SHAPE = dict(
    vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
    tie_word_embeddings=True, rope_theta=10000.0, rms_norm_eps=1e-5,
)
BOS, EOS = "<|bos|>", "<|endoftext|>"


def make_byte_tokenizer(folder: Path, vocab_size: int):
    """A byte-level BPE tokenizer with no merges (every byte is a token), ``<|bos|>`` = 0,
    ``<|endoftext|>`` = 1, and filler tokens ``<|xN|>`` up to ``vocab_size`` so that every id
    the model can produce decodes to something."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {BOS: 0, EOS: 1}
    for ch in pre_tokenizers.ByteLevel.alphabet():
        vocab.setdefault(ch, len(vocab))
    while len(vocab) < vocab_size:
        vocab[f"<|x{len(vocab)}|>"] = len(vocab)
    if len(vocab) > vocab_size:
        raise ValueError(f"vocab_size must be >= {len(vocab)} for a byte-level tokenizer")
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([BOS, EOS])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=BOS, eos_token=EOS, pad_token=EOS)
    fast.save_pretrained(str(folder))
    return fast


def build_random_llama(folder: str | Path, shape: dict | None = None, seed: int = 0,
                       init_std: float = 0.02) -> Path:
    """Save a random-weight ``LlamaForCausalLM`` of ``shape`` (default: SmolLM-135M) and a
    tokenizer into ``folder``; returns the folder. Float32 safetensors."""
    import transformers as tf
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    shape = dict(SMOLLM_135M_SHAPE if shape is None else shape)
    cfg = tf.LlamaConfig(bos_token_id=0, eos_token_id=1, pad_token_id=1, hidden_act="silu",
                         attention_bias=False, mlp_bias=False, initializer_range=init_std, **shape)
    torch.manual_seed(seed)
    model = tf.LlamaForCausalLM(cfg).float().eval()
    model.save_pretrained(str(folder))
    make_byte_tokenizer(folder, shape["vocab_size"])
    return folder


def param_count(folder: str | Path) -> int:
    """Parameters of a saved checkpoint (tied embeddings counted once)."""
    from safetensors import safe_open

    total = 0
    for f in sorted(Path(folder).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                total += _numel(st.get_slice(name).get_shape())
    return total


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def model_shape(folder: str | Path) -> dict:
    cfg = json.loads((Path(folder) / "config.json").read_text())
    keys = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
            "num_key_value_heads", "max_position_embeddings", "tie_word_embeddings")
    return {k: cfg.get(k) for k in keys}
