"""Model code (Llama, Qwen2, Qwen3) and the loader for Hugging Face folders."""

from .config import ModelConfig
from .llama import AttentionBatch, DecodeGroup, LlamaForCausalLM, PrefillSeq
from .loader import DEFAULT_MODEL_DIR, load_config, load_model, load_tokenizer, resolve_model_dir

__all__ = ["ModelConfig", "AttentionBatch", "DecodeGroup", "LlamaForCausalLM", "PrefillSeq", "DEFAULT_MODEL_DIR",
           "load_config", "load_model", "load_tokenizer", "resolve_model_dir"]
