"""The KV-capacity calculator (minillm.viz.kv_capacity): its numbers match hand calculation for
the published models, and the engine's own bytes-per-token formula matches the pool the engine
really allocates for the shipped model."""

from __future__ import annotations

import pytest
import torch

from minillm.viz import kv_capacity as kc


def test_bytes_per_token_by_hand():
    # 2 (K and V) x layers x KV heads x head_dim x 2 bytes (bf16)
    assert kc.PUBLISHED["Llama-3-8B"].kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2 == 128 * 1024
    assert kc.PUBLISHED["Qwen2.5-7B"].kv_bytes_per_token() == 2 * 28 * 4 * 128 * 2 == 56 * 1024
    assert kc.PUBLISHED["Qwen3-0.6B"].kv_bytes_per_token() == 2 * 28 * 8 * 128 * 2 == 112 * 1024
    assert kc.PUBLISHED["Llama-3-8B"].kv_bytes_per_token("fp8") == 64 * 1024


@pytest.mark.parametrize("name, published", [("Llama-3-8B", 8.03e9), ("Qwen2.5-7B", 7.61e9), ("Qwen3-0.6B", 0.596e9)])
def test_parameter_counts_match_the_model_cards(name, published):
    assert abs(kc.PUBLISHED[name].num_params - published) / published < 0.005


def test_requests_on_a_card_by_hand():
    # Llama-3-8B on an 80 GB card, 8k context: 0.9 x 80e9 bytes minus 2 bytes per weight, divided by
    # 8192 tokens x 128 KiB = 1 GiB per request
    weights = 2 * 8_030_261_248
    budget = 72 * 10**9 - weights
    row = kc.capacity("Llama-3-8B", 80, 8192)
    assert row.kv_budget_bytes == budget
    assert row.bytes_per_request == 8192 * 131072 == 2**30
    assert row.max_requests == budget // 2**30 == 52
    # a context that is not a whole number of blocks is rounded up to whole blocks of 16 tokens
    assert kc.capacity("Llama-3-8B", 80, 8193).bytes_per_request == 8208 * 131072


def test_fp8_or_half_the_history_doubles_the_requests():
    bought = kc.what_buys("Qwen2.5-7B", 24, 8192)
    budget = int(24 * 10**9 * 0.9) - 2 * kc.PUBLISHED["Qwen2.5-7B"].num_params
    assert bought == {"baseline": budget // (8192 * 57344), "fp8_kv": budget // (8192 * 28672),
                      "half_history": budget // (4096 * 57344)}
    assert bought["fp8_kv"] >= 2 * bought["baseline"]


def test_weights_that_do_not_fit_leave_no_room():
    row = kc.capacity("Llama-3-8B", 16, 1024)
    assert row.kv_budget_bytes < 0 and row.max_requests == 0


def test_table_covers_every_model_and_card():
    rows = kc.capacity_table()
    assert {(r.model, r.card_gb) for r in rows} == {(m, c) for m in kc.PUBLISHED for c in kc.CARDS_GB.values()}
    # more memory never fits fewer requests
    for m in kc.PUBLISHED:
        counts = [r.max_requests for r in rows if r.model == m]
        assert counts == sorted(counts)


@pytest.mark.parametrize("call, field", [
    (lambda: kc.capacity("GPT-5", 80, 1024), "model"),
    (lambda: kc.capacity("Qwen3-0.6B", 0, 1024), "card_gb"),
    (lambda: kc.capacity("Qwen3-0.6B", 80, -1), "context_tokens"),
    (lambda: kc.capacity("Qwen3-0.6B", 80, 1024, kv_dtype="int3"), "kv_dtype"),
    (lambda: kc.capacity("Qwen3-0.6B", 80, 1024, block_size=0), "block_size"),
    (lambda: kc.capacity("Qwen3-0.6B", 80, 1024, utilization=1.5), "utilization"),
])
def test_bad_input_names_the_field(call, field):
    with pytest.raises(ValueError, match=field):
        call()


def test_the_engine_formula_matches_the_shipped_models_measured_pool():
    from minillm import LLM

    llm = LLM(block_size=4, num_kv_blocks=64)
    shape = kc.ModelShape.from_config("shipped", llm.model_config)
    cache = llm.kv_cache
    measured = sum(t.numel() * t.element_size() for t in cache.k + cache.v)
    blocks = cache.num_blocks + (cache.scratch_slot is not None)
    dtype_bytes = torch.empty((), dtype=cache.dtype).element_size()
    assert measured == blocks * 4 * shape.kv_bytes_per_token(dtype_bytes)
    assert llm.cache_stats().bytes_per_token == shape.kv_bytes_per_token(dtype_bytes)
    assert shape.num_params == sum(p.numel() for p in llm.model.parameters())
