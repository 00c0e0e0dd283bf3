"""Chunked prefill with vLLM v1's budget: running requests first, then waiting ones; a prompt
longer than the budget left is prefilled over several steps (PREFILL -> PREFILL), is never
sampled from before its last chunk, and gives exactly the unchunked tokens."""

from __future__ import annotations

import pytest

from minillm import LLM, RequestState, SamplingParams, StopReason
from conftest import check_block_invariants

S = RequestState
LONG = [5 + (7 * j) % 290 for j in range(150)]


def greedy(n=8):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def folder(model_factory):
    return str(model_factory("llama")[0])


def _run(llm, prompts, params):
    reqs = [llm.add_request(prompt_token_ids=p, params=sp) for p, sp in zip(prompts, params)]
    steps = 0
    while llm.has_unfinished():
        llm.step()
        steps += 1
        check_block_invariants(llm)
    return [r.output_token_ids for r in reqs]


def test_long_prompt_mid_decode_gets_its_first_token_within_four_steps(folder):
    llm = LLM(folder, block_size=4, num_kv_blocks=200, max_num_batched_tokens=64)
    decoding = [llm.add_request(prompt_token_ids=[9 + i, 20, 30], params=greedy(60)) for i in range(3)]
    llm.step()
    assert all(r.state == S.DECODE for r in decoding)
    long = llm.add_request(prompt_token_ids=LONG, params=greedy(5))
    short = llm.add_request(prompt_token_ids=[11, 12, 13, 14, 15], params=greedy(5))
    steps = 0
    while not long.output_token_ids:
        events = llm.step()
        steps += 1
        step = [e for e in events if e.kind == "step"][0]
        assert step.data["num_tokens"] <= 64 and step.data["num_decode"] == 3
    assert steps <= 4
    assert short.output_token_ids  # the short prompt behind it did not wait for it either
    chunks = [e for e in llm.trace if e.request_id == long.request_id and e.kind == "transition"
              and e.data["to"] == "PREFILL"]
    assert [e.data["from"] for e in chunks] == ["WAITING", "PREFILL", "PREFILL"]
    assert sum(e.data["chunk_tokens"] for e in chunks) == 150
    tokens = [e for e in llm.trace if e.request_id == long.request_id and e.kind == "token"]
    assert len(tokens) == 1  # one token, after the last chunk only


@pytest.mark.parametrize("budget", [5, 16, 33])
def test_chunked_greedy_tokens_equal_unchunked_and_a_huge_budget(folder, budget):
    prompts = [LONG[:70], LONG[10:31], [3, 4, 5], LONG[:70] + [7, 7]]  # the last shares 17 blocks with the first
    params = [greedy(10)] * len(prompts)
    huge = _run(LLM(folder, block_size=4, num_kv_blocks=200, max_num_batched_tokens=100_000), prompts, params)
    chunked = _run(LLM(folder, block_size=4, num_kv_blocks=200, max_num_batched_tokens=budget), prompts, params)
    unchunked = _run(LLM(folder, block_size=4, num_kv_blocks=200, max_num_batched_tokens=budget,
                         enable_chunked_prefill=False), prompts, params)
    assert chunked == huge == unchunked


def test_a_partial_prefill_draws_nothing_from_its_generator(folder):
    prompts = [LONG[:60], LONG[60:90]]
    params = [SamplingParams(max_tokens=8, temperature=1.0, seed=s, ignore_eos=True) for s in (1, 2)]
    whole = _run(LLM(folder, block_size=4, num_kv_blocks=200), prompts, params)
    chunked = _run(LLM(folder, block_size=4, num_kv_blocks=200, max_num_batched_tokens=7), prompts, params)
    assert chunked == whole


def test_without_chunking_a_long_prompt_waits_for_the_decodes(folder):
    llm = LLM(folder, block_size=4, num_kv_blocks=200, max_num_batched_tokens=64, enable_chunked_prefill=False)
    for i in range(3):
        llm.add_request(prompt_token_ids=[9 + i, 20, 30], params=greedy(20))
    llm.step()
    long = llm.add_request(prompt_token_ids=LONG, params=greedy(5))
    steps = 0
    while not long.output_token_ids:
        llm.step()
        steps += 1
    assert steps > 4  # the contrast the course shows: it runs alone, after the decodes finished
    assert not any(e.data.get("from") == "PREFILL" and e.data.get("to") == "PREFILL" for e in llm.trace)


def test_cancel_and_preempt_in_the_middle_of_a_chunked_prefill(folder):
    llm = LLM(folder, block_size=4, num_kv_blocks=200, max_num_batched_tokens=16)
    req = llm.add_request(prompt_token_ids=LONG, params=greedy(3))
    llm.step()
    assert req.state == S.PREFILL and req.num_computed_tokens == 16 and req.block_table
    llm.cancel(req.request_id)
    assert req.stop_reason == StopReason.CANCELLED and llm.cache_stats().used_blocks == 0
    # a pool too small for both: one is preempted and recomputed, the tokens do not change
    llm = LLM(folder, block_size=4, num_kv_blocks=26, max_num_batched_tokens=16)
    a = llm.add_request(prompt_token_ids=LONG[:40], params=greedy(50))
    b = llm.add_request(prompt_token_ids=LONG[40:90], params=greedy(30))
    alone = _run(LLM(folder, block_size=4, num_kv_blocks=200), [LONG[:40], LONG[40:90]], [greedy(50), greedy(30)])
    while llm.has_unfinished():
        llm.step()
        check_block_invariants(llm)
    assert a.num_preemptions + b.num_preemptions > 0
    assert [a.output_token_ids, b.output_token_ids] == alone
    assert llm.cache_stats().used_blocks == 0


def test_chunked_prefill_option_is_checked(folder):
    with pytest.raises(ValueError, match="enable_chunked_prefill"):
        LLM(folder, enable_chunked_prefill="yes")


def test_a_budget_smaller_than_the_batch_starves_nobody(folder):
    llm = LLM(folder, block_size=4, num_kv_blocks=200, max_num_batched_tokens=3, max_num_seqs=8)
    reqs = [llm.add_request(prompt_token_ids=[9 + i, 20], params=greedy(6)) for i in range(6)]
    long = llm.add_request(prompt_token_ids=LONG[:20], params=greedy(3))
    for _ in range(200):
        if not llm.has_unfinished():
            break
        llm.step()
        check_block_invariants(llm)
    assert all(r.stop_reason == StopReason.MAX_TOKENS for r in reqs + [long])
