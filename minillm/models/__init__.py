"""Model code (Llama, Qwen2, Qwen3) and the loader for Hugging Face folders and GGUF files."""

from .config import ModelConfig, generation_defaults, load_generation_config
from .llama import AttentionBatch, DecodeGroup, LlamaForCausalLM, PrefillSeq
from .loader import DEFAULT_MODEL_DIR, is_gguf, load_config, load_model, load_tokenizer, resolve_model_dir

__all__ = ["ModelConfig", "AttentionBatch", "DecodeGroup", "LlamaForCausalLM", "PrefillSeq", "DEFAULT_MODEL_DIR",
           "load_config", "load_model", "load_tokenizer", "resolve_model_dir", "is_gguf", "generation_defaults",
           "load_generation_config"]
