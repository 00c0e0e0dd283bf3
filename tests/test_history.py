"""Costs that do not grow with history: bounded request history and trace on request, held
blocks tracked without scanning past requests, metrics from the request's own timestamps."""

from __future__ import annotations

import pytest

from minillm import LLM, SamplingParams, StopReason
from minillm import trace as tracemod


def greedy(n=4):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def folder(model_factory):
    return str(model_factory("llama")[0])


def test_generate_with_max_history_keeps_the_engine_small(folder):
    llm = LLM(folder, block_size=4, num_kv_blocks=64, max_history=5, trace_limit=200)
    for _ in range(30):
        outs = llm.generate(["the fox", "Mia and her dog"], greedy(3))
        assert all(o.stop_reason == StopReason.MAX_TOKENS and o.metrics["ttft"] is not None for o in outs)
    assert len(llm.requests) <= 5 and len(llm.trace) <= 200
    # requests stepped by hand stay, up to max_history released ones
    reqs = [llm.add_request(prompt_token_ids=[5, 6, 7], params=greedy(2)) for _ in range(8)]
    while llm.has_unfinished():
        llm.step()
    assert [r for r in reqs if r.request_id in llm.requests] == reqs[-5:]
    assert llm.output(reqs[-1].request_id).token_ids == reqs[-1].output_token_ids


def test_default_keeps_everything_for_the_course(folder):
    llm = LLM(folder, block_size=4, num_kv_blocks=64)
    for _ in range(3):
        llm.generate(["the fox"], greedy(2))
    assert len(llm.requests) == 3 and isinstance(llm.trace, list)


def test_blocks_held_lists_only_holders_and_matches_the_pool(folder):
    llm = LLM(folder, block_size=4, num_kv_blocks=64)
    llm.generate(["the fox"] * 4, greedy(2))
    kept = llm.add_request(prompt_token_ids=[5, 6, 7, 8, 9], params=greedy(2), auto_release=False)
    live = llm.add_request(prompt_token_ids=[15, 16, 17], params=greedy(20))
    for _ in range(3):
        llm.step()
    held = llm.blocks_held()
    assert set(held) == {kept.request_id, live.request_id}
    assert held == {kept.request_id: len(kept.block_table), live.request_id: len(live.block_table)}
    llm.release(kept.request_id)
    assert set(llm.blocks_held()) == {live.request_id}


def test_metrics_from_timestamps_equal_the_trace_derived_ones(folder):
    llm = LLM(folder, block_size=4, num_kv_blocks=64, max_num_batched_tokens=8)
    outs = llm.generate(["the robot found a shiny key under the old bridge", "the fox"], greedy(6))
    for o in outs:
        from_trace = tracemod.request_metrics(llm.trace, o.request_id)
        assert from_trace["num_output_tokens"] == o.metrics["num_output_tokens"] == 6
        for key in ("queue_time", "ttft", "tpot", "e2e", "release_delay"):
            assert o.metrics[key] == pytest.approx(from_trace[key], abs=1e-9), key  # the same stamps


def test_history_options_are_checked(folder):
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(ValueError, match="max_history"):
            LLM(folder, max_history=bad)
        with pytest.raises(ValueError, match="trace_limit"):
            LLM(folder, trace_limit=bad)
