"""The long-chat scenario's helper: one request per turn, measured from the engine's own trace."""

from __future__ import annotations

import math

import pytest

from minillm import SamplingParams
from minillm.viz import conversation as C

MESSAGES = ["Tell me about a fox.", "What did it find?", "Where did it go?", "How does it end?", "One more?"]
PARAMS = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def test_conversation_for_turn_policies():
    history = []
    for i in range(4):
        history += [{"role": "user", "content": f"u{i}"}, {"role": "assistant", "content": f"a{i}"}]
    full = C.conversation_for_turn(history, "new")
    assert full == history + [{"role": "user", "content": "new"}]
    last = C.conversation_for_turn(history, "new", policy="last_turns", keep_turns=2)
    assert [m["content"] for m in last] == ["u2", "a2", "u3", "a3", "new"]
    assert C.conversation_for_turn(history, "new", policy="last_turns", keep_turns=9) == full  # nothing to drop
    summ = C.conversation_for_turn(history, "new", policy="summary", keep_turns=1, summary="so far: foxes")
    assert summ[0] == {"role": "system", "content": "so far: foxes"} and [m["content"] for m in summ[1:]] == ["u3", "a3", "new"]
    assert C.conversation_for_turn(history[:2], "new", policy="summary", keep_turns=1, summary="s") == \
        history[:2] + [{"role": "user", "content": "new"}]  # nothing dropped yet: no summary either
    with pytest.raises(ValueError, match="policy"):
        C.conversation_for_turn(history, "new", policy="window")
    with pytest.raises(ValueError, match="keep_turns"):
        C.conversation_for_turn(history, "new", policy="last_turns", keep_turns=-1)
    with pytest.raises(ValueError, match="summary"):
        C.conversation_for_turn(history, "new", policy="summary")


def test_run_chat_measures_every_turn_and_leaves_nothing_allocated(tiny_llm):
    llm = tiny_llm
    rows = C.run_chat(llm, MESSAGES, params=PARAMS)
    assert [r["turn"] for r in rows] == [1, 2, 3, 4, 5]
    assert all(rows[i + 1]["prompt_tokens"] > rows[i]["prompt_tokens"] for i in range(4))  # history re-sent
    block, per_token = llm.cache_stats().block_size, llm.cache_stats().bytes_per_token
    for r in rows:
        assert r["prefilled_tokens"] == r["prompt_tokens"] - r["cached_tokens"] >= 1
        assert r["output_tokens"] == 6 and r["ttft"] > 0
        assert r["kv_blocks"] == math.ceil((r["prompt_tokens"] + r["output_tokens"] - 1) / block)
        assert r["kv_bytes"] == r["kv_blocks"] * block * per_token
    assert rows[0]["cached_tokens"] == 0 and rows[-1]["cached_tokens"] > 0  # earlier turns found in the cache
    # the cached_tokens come from the PREFILL transition events of the trace
    admitted = [e.data["cached_tokens"] for e in llm.trace if e.kind == "transition" and e.data.get("to") == "PREFILL"]
    assert admitted[-5:] == [r["cached_tokens"] for r in rows]
    assert llm.cache_stats().used_blocks == 0 and not llm.has_unfinished()
    s = C.chat_summary(rows)
    assert s["last_prompt_tokens"] == rows[-1]["prompt_tokens"] and s["peak_kv_bytes"] >= s["last_kv_bytes"]
    assert s["total_prefilled_tokens"] + s["total_cached_tokens"] == sum(r["prompt_tokens"] for r in rows)


def test_trimming_bounds_the_prompt(tiny_llm):
    full = C.run_chat(tiny_llm, MESSAGES, params=PARAMS)
    trimmed = C.run_chat(tiny_llm, MESSAGES, params=PARAMS, policy="last_turns", keep_turns=1)
    assert trimmed[-1]["prompt_tokens"] < full[-1]["prompt_tokens"]
    assert max(r["prompt_tokens"] for r in trimmed[1:]) < full[-1]["prompt_tokens"]
    fig = C.plot_chat_turns({"full": full, "last 1": trimmed}, title="t")
    assert len(fig.axes) == 4


def test_run_chat_rejects_bad_input(tiny_llm):
    with pytest.raises(ValueError, match="messages"):
        C.run_chat(tiny_llm, "one string")
    with pytest.raises(ValueError, match="messages"):
        C.run_chat(tiny_llm, [])
    with pytest.raises(ValueError, match="policy"):
        C.run_chat(tiny_llm, MESSAGES, policy="all")
    req = tiny_llm.add_request("busy", PARAMS)
    with pytest.raises(ValueError, match="unfinished"):
        C.run_chat(tiny_llm, MESSAGES)
    tiny_llm.cancel(req.request_id)
    with pytest.raises(ValueError, match="runs"):
        C.plot_chat_turns({})
