"""LLM(...) options: each bad value is a ValueError naming the option and what is allowed;
NumPy integers are accepted and normalised; switches take booleans only."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from minillm import engine_args as ea
from minillm.engine_args import EngineOptions, check_engine_options, pick_device, pick_dtype, plan_kv_cache
from minillm.models.config import ModelConfig

TINY = ModelConfig.from_dict(dict(architectures=["LlamaForCausalLM"], vocab_size=320, hidden_size=64,
                                  intermediate_size=112, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, max_position_embeddings=256))


@pytest.mark.parametrize("kwargs,message", [
    ({"enable_prefix_caching": "no"}, "enable_prefix_caching must be True or False, got 'no'"),
    ({"enable_prefix_caching": 1}, "enable_prefix_caching must be True or False"),
    ({"enable_chunked_prefill": None}, "enable_chunked_prefill must be True or False"),
    ({"block_size": True}, "block_size must be an int"),
    ({"block_size": 0}, r"block_size must be an int in \[1, 65536\], got 0"),
    ({"block_size": 2**20}, r"block_size must be an int in \[1, 65536\]"),
    ({"block_size": 4.0}, "block_size must be an int"),
    ({"max_num_seqs": np.float64(3)}, "max_num_seqs must be an int"),
    ({"max_num_seqs": False}, "max_num_seqs"),
    ({"max_num_batched_tokens": -1}, "max_num_batched_tokens must be an int >= 1"),
    ({"max_model_len": 1}, r"max_model_len must be None \(the model's maximum\) or an int >= 2"),
    ({"num_kv_blocks": "8"}, "num_kv_blocks must be None"),
    ({"kv_cache_tokens": 0}, "kv_cache_tokens"),
    ({"num_kv_blocks": 4, "kv_cache_tokens": 16}, "not both"),
    ({"scheduling": "fifo"}, r"scheduling must be one of \('continuous', 'static'\)"),
    ({"scheduling": None}, "scheduling"),
    ({"seed": 1.5}, "seed must be an int"),
    ({"seed": True}, "seed must be an int"),
    ({"max_history": -1}, r"max_history must be None \(keep everything\) or an int >= 0"),
    ({"trace_limit": "10"}, "trace_limit"),
    ({"dtype": torch.int8}, r"dtype must be 'auto', 'float32'.*got torch\.int8"),
    ({"dtype": "float8"}, "dtype must be 'auto'.*torch.bfloat16, got 'float8'"),
    ({"dtype": 32}, "dtype must be"),
    ({"device": "meta"}, r"device must be 'auto', 'cpu', 'cuda' or 'cuda:N'.*got 'meta'"),
    ({"device": torch.device("meta")}, "device must be 'auto', 'cpu'"),
    ({"device": "tpu"}, "device must be"),
    ({"device": 0}, "device must be"),
    ({"device": "mps"}, "CPU or CUDA only"),
])
def test_bad_options_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        check_engine_options(**kwargs)


def test_numpy_values_are_normalised():
    o = check_engine_options(block_size=np.int64(8), max_num_seqs=np.int32(4), seed=np.uint8(7),
                             num_kv_blocks=np.int16(32), max_model_len=np.int64(128),
                             enable_prefix_caching=np.bool_(False), max_history=np.int64(0))
    for name in ("block_size", "max_num_seqs", "seed", "num_kv_blocks", "max_model_len", "max_history"):
        assert type(getattr(o, name)) is int, name
    assert (o.block_size, o.max_num_seqs, o.seed, o.num_kv_blocks, o.max_model_len) == (8, 4, 7, 32, 128)
    assert o.enable_prefix_caching is False and type(o.enable_prefix_caching) is bool


def test_defaults_and_names():
    o = check_engine_options()
    assert isinstance(o, EngineOptions)
    assert o.block_size == 16 and o.enable_prefix_caching is True and o.scheduling == "continuous"
    assert pick_dtype("bf16") is torch.bfloat16 and pick_dtype("half") is torch.float16
    assert pick_dtype(torch.float16) is torch.float16
    assert pick_device("cpu") == torch.device("cpu") and pick_device(torch.device("cpu")).type == "cpu"


def test_auto_dtype_on_cpu_is_float32():
    assert pick_dtype("auto", torch.device("cpu")) is torch.float32


def test_auto_dtype_on_cuda_falls_back_to_fp16(monkeypatch):
    """bfloat16 only where the GPU has it natively; fp16 on older GPUs."""
    cuda = torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    assert ea.auto_dtype(cuda) is torch.float16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert ea.auto_dtype(cuda) is torch.bfloat16


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without CUDA")
def test_cuda_without_a_gpu_is_a_clear_error():
    with pytest.raises(ValueError, match="no CUDA device is available; use device='cpu'"):
        check_engine_options(device="cuda")


def test_kv_plan_defaults_to_full_contexts_within_the_cpu_budget():
    plan = plan_kv_cache(check_engine_options(block_size=4, max_num_seqs=2), TINY)
    assert plan.max_model_len == 256 and plan.num_kv_blocks == 2 * 256 // 4
    assert plan.bytes_per_block == 2 * 2 * 2 * 16 * 4 * 4  # K and V, layers, kv heads, head_dim, fp32, tokens


def test_kv_plan_caps_the_default_pool(monkeypatch):
    monkeypatch.setattr(ea, "CPU_KV_BUDGET_BYTES", 10 * 1024)
    plan = plan_kv_cache(check_engine_options(block_size=4), TINY)  # 2 KiB per block of 4
    assert plan.num_kv_blocks == 5 and plan.num_kv_blocks * plan.bytes_per_block <= 10 * 1024


def test_one_block_larger_than_the_budget_is_refused(monkeypatch):
    monkeypatch.setattr(ea, "CPU_KV_BUDGET_BYTES", 4 * 1024)
    with pytest.raises(ValueError, match=r"block_size=64 makes one KV block 32.0 KiB, more than the CPU KV budget "
                                         r"\(4.0 KiB\): use block_size <= 8"):
        plan_kv_cache(check_engine_options(block_size=64), TINY)


def test_block_size_in_range_but_huge_for_a_real_model():
    """block_size=65536 with a 135M-shaped model: one block is 2.8 GiB > 256 MiB."""
    cfg = ModelConfig.from_dict(dict(architectures=["LlamaForCausalLM"], vocab_size=49152, hidden_size=576,
                                     intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                                     num_key_value_heads=3, max_position_embeddings=8192))
    with pytest.raises(ValueError, match="block_size=65536 makes one KV block 2.8 GiB, more than the CPU KV budget \\(256.0 MiB\\)"):
        plan_kv_cache(check_engine_options(block_size=65536), cfg)


def test_explicit_pool_larger_than_memory_is_refused(monkeypatch):
    monkeypatch.setattr(ea, "available_memory", lambda device: 1 << 20)
    with pytest.raises(ValueError, match=r"num_kv_blocks: a pool of 5000 blocks x 16 tokens needs 39.1 MiB but only 1.0 MiB"):
        plan_kv_cache(check_engine_options(num_kv_blocks=5000), TINY)
    with pytest.raises(ValueError, match="kv_cache_tokens"):
        plan_kv_cache(check_engine_options(kv_cache_tokens=80000), TINY)
    assert plan_kv_cache(check_engine_options(kv_cache_tokens=33, block_size=4), TINY).num_kv_blocks == 9


def test_max_model_len_is_checked_against_the_model():
    with pytest.raises(ValueError, match=r"max_model_len must be <= the model's max_position_embeddings \(256\)"):
        plan_kv_cache(check_engine_options(max_model_len=257), TINY)
    assert plan_kv_cache(check_engine_options(max_model_len=100), TINY).max_model_len == 100
