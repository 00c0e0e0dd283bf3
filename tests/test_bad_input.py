"""Bad input gets a clear ValueError naming the field and its range, and allocates nothing."""

from __future__ import annotations


import numpy as np
import pytest
import torch

from minillm import LLM, SamplingParams
from conftest import check_block_invariants, copy_of, edit_config

BAD_PARAMS = [
    ("temperature", -0.5, "temperature"), ("temperature", float("nan"), "temperature"),
    ("temperature", float("inf"), "temperature"), ("temperature", "hot", "temperature"),
    ("top_p", 0.0, r"top_p.*\(0, 1\]"), ("top_p", 1.5, r"top_p.*\(0, 1\]"), ("top_p", float("nan"), "top_p"),
    ("top_k", -3, "top_k"), ("top_k", 2.5, "top_k"),
    ("min_p", -0.1, r"min_p.*\[0, 1\]"), ("min_p", 1.1, r"min_p.*\[0, 1\]"),
    ("max_tokens", 0, "max_tokens.*>= 1"), ("max_tokens", 3.0, "max_tokens"), ("max_tokens", True, "max_tokens"),
    ("seed", 1.5, "seed"), ("seed", "7", "seed"),
    ("stop", [""], "stop"), ("stop", "", "stop"), ("stop", [3], "stop"),
    ("stop_token_ids", [-1], "stop_token_ids"), ("stop_token_ids", "2", "stop_token_ids"),
    ("repetition_penalty", 0.0, r"repetition_penalty.*\[1e-4, 1e4\]"), ("repetition_penalty", -1.0, "repetition_penalty"),
    ("repetition_penalty", float("inf"), "repetition_penalty"),
    ("repetition_penalty", 1e-45, r"repetition_penalty.*\[1e-4, 1e4\]"), ("repetition_penalty", 1e5, "repetition_penalty"),
    ("presence_penalty", float("inf"), "presence_penalty"), ("frequency_penalty", float("-inf"), "frequency_penalty"),
    ("frequency_penalty", float("nan"), "frequency_penalty"),
    ("frequency_penalty", 1e39, "frequency_penalty.*float32"), ("presence_penalty", -1e39, "presence_penalty.*float32"),
    ("temperature", 1e39, "temperature"), ("temperature", True, "temperature"), ("top_p", False, "top_p"),
    ("top_k", True, "top_k"), ("seed", True, "seed"), ("logprobs", True, "logprobs"),
    ("logprobs", -1, "logprobs"), ("logprobs", 2.0, "logprobs"), ("logprobs", 21, r"logprobs.*\[0, 20\]"),
    ("ignore_eos", "yes", "ignore_eos"), ("ignore_eos", 1, "ignore_eos"),
    ("skip_special_tokens", "no", "skip_special_tokens"), ("skip_special_tokens", None, "skip_special_tokens"),
    ("include_stop_str_in_output", "yes", "include_stop_str_in_output"),
    ("stop_token_ids", [True], "stop_token_ids"), ("stop_token_ids", [1.0], "stop_token_ids"),
]


@pytest.mark.parametrize("field,value,message", BAD_PARAMS)
def test_bad_sampling_params_name_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**{field: value})


def test_good_edge_values_are_accepted():
    SamplingParams(temperature=0, top_p=1.0, top_k=0, min_p=0.0, max_tokens=1, seed=0, logprobs=0)
    SamplingParams(top_k=-1, min_p=1.0, top_p=1e-9, presence_penalty=-2.0, stop="END", seed=-5)
    assert SamplingParams(stop="END").stop_strings == ["END"]
    # odd but legal: each runs (see tests/test_params.py for these on a real engine)
    SamplingParams(temperature=1e-40, top_k=2**63, seed=2**70, logprobs=20, repetition_penalty=1e-4,
                   presence_penalty=3e38, frequency_penalty=-3e38)


@pytest.mark.parametrize("prompt", ["", None, 42, ["a", "b"], b"bytes"])
def test_bad_prompt_mentions_prompt(tiny_llm, prompt):
    with pytest.raises(ValueError, match="prompt"):
        tiny_llm.add_request(prompt, SamplingParams())
    with pytest.raises(ValueError, match="prompt"):
        tiny_llm.generate([prompt] if prompt is not None else [None])
    assert tiny_llm.cache_stats().used_blocks == 0 and not tiny_llm.has_unfinished()


def test_bad_prompt_in_a_batch_adds_nothing(tiny_llm):
    with pytest.raises(ValueError, match="prompt"):
        tiny_llm.generate(["fine", ""])
    assert not tiny_llm.requests and not tiny_llm.has_unfinished()


def test_bad_prompt_token_ids(tiny_llm):
    for ids in ([], [-1], [10**6], [1.5]):
        with pytest.raises(ValueError, match="prompt_token_ids"):
            tiny_llm.add_request(prompt_token_ids=ids)


def test_prompt_longer_than_context_is_rejected_at_add(tiny_llama):
    llm = LLM(str(tiny_llama[0]), block_size=4, num_kv_blocks=64, max_model_len=16)
    with pytest.raises(ValueError, match=r"prompt has 16 tokens but max_model_len is 16"):
        llm.add_request(prompt_token_ids=[3] * 16)
    assert not llm.requests and llm.cache_stats().used_blocks == 0


def test_prompt_larger_than_kv_budget_is_rejected_at_add(tiny_llama):
    llm = LLM(str(tiny_llama[0]), block_size=4, num_kv_blocks=4)
    with pytest.raises(ValueError, match=r"whole KV budget holds 16 tokens"):
        llm.add_request(prompt_token_ids=[3] * 16)
    llm.add_request(prompt_token_ids=[3] * 15)  # 15 + 1 fits exactly
    check_block_invariants(llm)


def test_params_of_wrong_type(tiny_llm):
    with pytest.raises(ValueError, match="params must be a SamplingParams"):
        tiny_llm.add_request("hi", {"temperature": 0})
    with pytest.raises(ValueError, match="one per prompt"):
        tiny_llm.generate(["a", "b"], [SamplingParams()])


@pytest.mark.parametrize("kwargs,message", [
    ({"block_size": 0}, "block_size"), ({"max_num_seqs": 0}, "max_num_seqs"),
    ({"num_kv_blocks": 0}, "num_kv_blocks"), ({"kv_cache_tokens": -4}, "kv_cache_tokens"),
    ({"num_kv_blocks": 4, "kv_cache_tokens": 16}, "not both"), ({"max_model_len": 10**6}, "max_model_len"),
    ({"dtype": "float8"}, "dtype"), ({"device": "tpu"}, "device|Expected one of"), ({"scheduling": "fifo"}, "scheduling"),
    ({"enable_prefix_caching": "no"}, "enable_prefix_caching must be True or False, got 'no'"),
    ({"enable_chunked_prefill": 0}, "enable_chunked_prefill must be True or False"),
    ({"dtype": torch.int8}, r"dtype must be 'auto', .*got torch\.int8"),
    ({"device": "meta"}, r"device must be 'auto', 'cpu', 'cuda' or 'cuda:N'.*got 'meta'"),
    ({"block_size": 2**20}, r"block_size must be an int in \[1, 65536\]"), ({"block_size": True}, "block_size"),
    ({"max_num_seqs": 2.0}, "max_num_seqs"), ({"seed": 1.5}, "seed"), ({"max_history": -1}, "max_history"),
])
def test_bad_engine_options(tiny_llama, kwargs, message):
    with pytest.raises(ValueError, match=message):
        LLM(str(tiny_llama[0]), **kwargs)


def test_numpy_engine_options_are_accepted_as_ints(tiny_llama):
    llm = LLM(str(tiny_llama[0]), block_size=np.int64(4), num_kv_blocks=np.int32(16), max_num_seqs=np.int64(2),
              seed=np.int64(7), enable_prefix_caching=np.bool_(True))
    assert llm.kv_cache.block_size == 4 and type(llm.kv_cache.block_size) is int
    assert llm.kv_cache.num_blocks == 16
    assert llm.generate(["fox"], SamplingParams(max_tokens=3, temperature=0))[0].stop_reason is not None


def test_block_larger_than_the_cpu_kv_budget_is_refused(tiny_llama, monkeypatch):
    import minillm.engine_args as engine_args

    monkeypatch.setattr(engine_args, "CPU_KV_BUDGET_BYTES", 16 << 10)  # the tiny model: 512 bytes per token
    with pytest.raises(ValueError, match=r"block_size=64 makes one KV block 32.0 KiB, more than the CPU KV budget"):
        LLM(str(tiny_llama[0]), block_size=64)
    assert LLM(str(tiny_llama[0]), block_size=16).kv_cache.num_blocks == 2  # 16 KiB / 8 KiB per block


# --- model folders -------------------------------------------------------------------------
def test_missing_folder(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        LLM(str(tmp_path / "nope"))


def test_missing_config(tiny_llama, tmp_path):
    d = copy_of(tiny_llama, tmp_path)
    (d / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match="config.json"):
        LLM(str(d))


def test_unsupported_architecture_is_named(tiny_llama, tmp_path):
    d = copy_of(tiny_llama, tmp_path)
    edit_config(d, architectures=["GPT2LMHeadModel"])
    with pytest.raises(ValueError, match="GPT2LMHeadModel"):
        LLM(str(d))


def test_unsupported_rope_type_is_named(tiny_llama, tmp_path):
    d = copy_of(tiny_llama, tmp_path)
    edit_config(d, rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0})
    with pytest.raises(ValueError, match="yarn"):
        LLM(str(d))


def test_pickle_weights_are_refused(tiny_llama, tmp_path):
    d = copy_of(tiny_llama, tmp_path)
    (d / "model.safetensors").rename(d / "pytorch_model.bin")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        LLM(str(d))


def test_missing_tokenizer(tiny_llama, tmp_path):
    d = copy_of(tiny_llama, tmp_path)
    (d / "tokenizer.json").unlink()
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        LLM(str(d))


def test_missing_tensor_is_named(tiny_llama, tmp_path):
    from safetensors.torch import load_file, save_file

    d = copy_of(tiny_llama, tmp_path)
    tensors = load_file(d / "model.safetensors")
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, d / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        LLM(str(d))


def test_wrong_shape_is_named(tiny_llama, tmp_path):
    d = copy_of(tiny_llama, tmp_path)
    edit_config(d, intermediate_size=100)
    with pytest.raises(ValueError, match=r"model\.safetensors: tensor .model\.layers\.0\.mlp\.gate_proj\.weight. has shape \(112, 64\), but config\.json implies \(100, 64\)"):
        LLM(str(d))
