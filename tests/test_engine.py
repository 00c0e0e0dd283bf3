"""The request lifecycle on the real engine: states, stop reasons, cancel, release, trace."""

from __future__ import annotations

import json

import pytest
import torch

from minillm import LLM, IllegalTransition, RequestState, SamplingParams, StopReason
from minillm.request import TRANSITIONS, Request
from conftest import check_block_invariants, copy_of, run_to_end

S = RequestState


def greedy(n=8, **kw):
    return SamplingParams(max_tokens=n, temperature=0, **kw)


def states_of(llm, rid):
    return [e.data["to"] for e in llm.trace if e.kind == "transition" and e.request_id == rid]


# --- the state machine -----------------------------------------------------------------------
def test_every_illegal_transition_raises():
    for src in S:
        for dst in S:
            req = Request("x", "p", SamplingParams())
            req.state = src
            if dst in TRANSITIONS[src]:
                req.move_to(dst)
                assert req.state == dst
            else:
                with pytest.raises(IllegalTransition, match=f"{src.value} -> {dst.value}"):
                    req.move_to(dst)


def test_one_request_walks_the_whole_diagram(tiny_llm):
    req = tiny_llm.new_request("the fox", greedy(3, ignore_eos=True), auto_release=False)
    assert req.state == S.NEW and req.prompt_token_ids == []
    tiny_llm.enqueue(req)
    assert req.state == S.WAITING and req.prompt_token_ids and not req.block_table
    events = tiny_llm.step()  # prefill: WAITING -> PREFILL -> DECODE, first token sampled
    assert [(e.data["from"], e.data["to"]) for e in events if e.kind == "transition"] == [
        ("WAITING", "PREFILL"), ("PREFILL", "DECODE")]
    assert req.state == S.DECODE and len(req.output_token_ids) == 1 and req.block_table
    tiny_llm.step()
    tiny_llm.step()
    assert req.state == S.FINISHED and req.stop_reason == StopReason.MAX_TOKENS
    held = tiny_llm.cache_stats().used_blocks
    assert held == len(req.block_table) > 0  # finished, but memory still held
    tiny_llm.release(req.request_id)
    assert req.state == S.RELEASED and tiny_llm.cache_stats().used_blocks == 0
    assert states_of(tiny_llm, req.request_id) == ["NEW", "WAITING", "PREFILL", "DECODE", "FINISHED", "RELEASED"]
    assert req.arrival_time <= req.first_scheduled_time <= req.first_token_time <= req.finished_time <= req.released_time


def test_trace_has_tokens_steps_and_metrics(tiny_llm, tmp_path):
    req = tiny_llm.add_request("a bird", greedy(5, ignore_eos=True))
    run_to_end(tiny_llm)
    tokens = [e for e in tiny_llm.trace if e.kind == "token" and e.request_id == req.request_id]
    assert [e.data["token_id"] for e in tokens] == req.output_token_ids
    steps = [e for e in tiny_llm.trace if e.kind == "step"]
    assert len(steps) == 5 and steps[0].data["num_prefill"] == 1 and steps[1].data["num_decode"] == 1
    assert [e.step for e in steps] == sorted(e.step for e in steps)
    m = tiny_llm.metrics(req.request_id)
    assert m["num_output_tokens"] == 5 and m["ttft"] > 0 and m["tpot"] > 0 and m["queue_time"] >= 0
    assert tiny_llm.summary()["output_tokens"] == 5
    doc = tiny_llm.export_chrome_trace(tmp_path / "trace.json")
    loaded = json.loads((tmp_path / "trace.json").read_text())
    assert loaded == json.loads(json.dumps(doc))
    names = {e["name"] for e in loaded["traceEvents"] if e["ph"] == "X"}
    assert {"WAITING", "PREFILL", "DECODE", "FINISHED"} <= names


def test_step_event_kv_blocks_match_cache_stats(tiny_llm):
    for p in ["a", "the robot found a key", "Mia ran"]:
        tiny_llm.add_request(p, greedy(6, ignore_eos=True))
    while tiny_llm.has_unfinished():
        tiny_llm.step()
        ev = [e for e in tiny_llm.trace if e.kind == "step"][-1]
        assert ev.data["used_blocks"] == tiny_llm.cache_stats().used_blocks == sum(ev.data["kv_blocks"].values())
        check_block_invariants(tiny_llm)


# --- stop reasons ----------------------------------------------------------------------------
def test_stop_max_tokens(tiny_llm):
    out = tiny_llm.generate(["the fox"], greedy(4, ignore_eos=True))[0]
    assert out.stop_reason == StopReason.MAX_TOKENS and len(out.token_ids) == 4


def test_stop_eos_and_stop_token_ids(tiny_llm):
    first = tiny_llm.generate(["the fox"], greedy(12, ignore_eos=True))[0].token_ids
    fresh = [j for j in range(1, len(first)) if first[j] not in first[:j]]
    assert fresh, f"the random model repeats one token: {first}"
    k = fresh[0]
    tiny_llm.eos_token_ids = {first[k]}  # pretend the model's EOS is a token it says at step k
    out = tiny_llm.generate(["the fox"], greedy(12))[0]
    assert out.stop_reason == StopReason.EOS and out.token_ids == first[:k + 1]
    ignored = tiny_llm.generate(["the fox"], greedy(12, ignore_eos=True))[0]
    assert ignored.stop_reason == StopReason.MAX_TOKENS and ignored.token_ids == first
    tiny_llm.eos_token_ids = set()
    out = tiny_llm.generate(["the fox"], greedy(12, stop_token_ids=[first[k]], ignore_eos=True))[0]
    assert out.stop_reason == StopReason.EOS and out.token_ids == first[:k + 1]


def test_stop_string_split_over_two_tokens(tiny_llm):
    ref = tiny_llm.generate(["the fox"], greedy(24, ignore_eos=True))[0]
    tok = tiny_llm.tokenizer
    pieces = [tok.decode(ref.token_ids[:i]) for i in range(len(ref.token_ids) + 1)]
    # a stop string made of the end of one token's text and the start of the next one's
    for k in range(3, len(ref.token_ids) - 1):
        a, b = pieces[k][len(pieces[k - 1]):], pieces[k + 1][len(pieces[k]):]
        stop = a[-1:] + b[:1]
        if len(a) >= 1 and len(b) >= 1 and stop.strip() and stop not in pieces[k - 1] + a[:-1]:
            break
    else:
        pytest.skip("no token boundary with text on both sides")
    out = tiny_llm.generate(["the fox"], greedy(24, stop=[stop], ignore_eos=True))[0]
    assert out.stop_reason == StopReason.STOP_STRING
    assert out.text == ref.text[:ref.text.index(stop)]
    assert stop not in out.text
    assert len(out.token_ids) == k + 1  # stopped on the token that completed the string


def test_stop_context_full(tiny_llama):
    llm = LLM(str(tiny_llama[0]), block_size=4, num_kv_blocks=64, max_model_len=12)
    req = llm.add_request(prompt_token_ids=[5] * 8, params=greedy(50, ignore_eos=True))
    run_to_end(llm)
    assert req.stop_reason == StopReason.CONTEXT_FULL and req.num_tokens == 12
    assert llm.cache_stats().used_blocks == 0


def test_lone_request_larger_than_kv_budget_ends_context_full(tiny_llama):
    llm = LLM(str(tiny_llama[0]), block_size=4, num_kv_blocks=3)
    req = llm.add_request(prompt_token_ids=[7] * 5, params=greedy(40, ignore_eos=True))
    run_to_end(llm)
    assert req.stop_reason == StopReason.CONTEXT_FULL and req.state == S.RELEASED
    assert req.num_tokens == 13  # the 12 slots of the pool, plus the token sampled last
    assert llm.cache_stats().used_blocks == 0


# --- cancel ----------------------------------------------------------------------------------
def _cancel_and_check(llm, req):
    llm.cancel(req.request_id)
    assert req.state == S.RELEASED and req.stop_reason == StopReason.CANCELLED and not req.block_table
    check_block_invariants(llm)
    llm.cancel(req.request_id)  # twice is harmless
    assert req.state == S.RELEASED and req.stop_reason == StopReason.CANCELLED


def test_cancel_from_new(tiny_llm):
    _cancel_and_check(tiny_llm, tiny_llm.new_request("hi", greedy()))


def test_cancel_from_waiting(tiny_llm):
    _cancel_and_check(tiny_llm, tiny_llm.add_request("hi", greedy()))
    assert not tiny_llm.has_unfinished()


def test_cancel_from_prefill(tiny_llm):
    req = tiny_llm.add_request("the robot", greedy())
    tiny_llm.scheduler.schedule()  # admitted, blocks allocated, forward pass not yet run
    assert req.state == S.PREFILL and req.block_table
    _cancel_and_check(tiny_llm, req)
    assert tiny_llm.cache_stats().used_blocks == 0


def test_cancel_from_decode_frees_memory_at_once(tiny_llm):
    req = tiny_llm.add_request("the robot found", greedy(20, ignore_eos=True))
    other = tiny_llm.add_request("Mia", greedy(20, ignore_eos=True))
    tiny_llm.step()
    tiny_llm.step()
    before = tiny_llm.cache_stats().used_blocks
    assert req.state == S.DECODE
    _cancel_and_check(tiny_llm, req)
    assert tiny_llm.cache_stats().used_blocks == before - tiny_llm.trace[-1].data["blocks"]
    run_to_end(tiny_llm)
    assert other.stop_reason == StopReason.MAX_TOKENS


def test_cancel_from_preempted(tiny_llama):
    llm = LLM(str(tiny_llama[0]), block_size=4, num_kv_blocks=8)
    reqs = [llm.add_request(prompt_token_ids=[9 + i] * 6, params=greedy(30, ignore_eos=True)) for i in range(3)]
    for _ in range(30):
        llm.step()
        pre = [r for r in reqs if r.state == S.PREEMPTED]
        if pre:
            break
    assert pre, "the tiny budget should have preempted someone"
    _cancel_and_check(llm, pre[0])
    run_to_end(llm)
    assert all(r.state == S.RELEASED and r.stop_reason for r in reqs)


def test_cancel_finished_keeps_its_reason_and_releases(tiny_llm):
    req = tiny_llm.add_request("hi", greedy(2, ignore_eos=True), auto_release=False)
    run_to_end(tiny_llm)
    assert req.state == S.FINISHED and req.block_table
    tiny_llm.cancel(req.request_id)
    assert req.state == S.RELEASED and req.stop_reason == StopReason.MAX_TOKENS and not req.block_table


def test_cancel_unknown_id_names_it(tiny_llm):
    with pytest.raises(KeyError, match="no-such-request"):
        tiny_llm.cancel("no-such-request")


def test_release_needs_finished(tiny_llm):
    req = tiny_llm.add_request("hi", greedy())
    with pytest.raises(ValueError, match="only a FINISHED request"):
        tiny_llm.release(req.request_id)


def test_closing_a_stream_cancels_in_the_engine(tiny_llm):
    it = tiny_llm.stream("the fox", greedy(40, ignore_eos=True))
    text = next(it) + next(it)
    assert text
    assert tiny_llm.cache_stats().used_blocks > 0
    it.close()
    assert tiny_llm.cache_stats().used_blocks == 0
    rid = max(tiny_llm.requests, key=int)
    assert tiny_llm.requests[rid].stop_reason == StopReason.CANCELLED


def test_stream_yields_the_generated_text(tiny_llm):
    full = tiny_llm.generate(["the fox"], greedy(16, ignore_eos=True))[0].text
    assert "".join(tiny_llm.stream("the fox", greedy(16, ignore_eos=True))) == full


# --- sampling through the engine -------------------------------------------------------------
def test_seeded_request_is_independent_of_its_batch(tiny_llm):
    p = SamplingParams(max_tokens=16, temperature=1.0, seed=42, ignore_eos=True)
    alone = tiny_llm.generate(["the fox"], p)[0].token_ids
    noisy = [SamplingParams(max_tokens=n, temperature=1.3, top_k=20, ignore_eos=True) for n in (5, 16, 9)]
    outs = tiny_llm.generate(["Mia", "the fox", "a bird sang", "the robot"], [noisy[0], p, noisy[1], noisy[2]])
    assert outs[1].token_ids == alone
    again = tiny_llm.generate(["the fox"], SamplingParams(max_tokens=16, temperature=1.0, seed=43, ignore_eos=True))
    assert again[0].token_ids != alone


def test_logprobs_report_top_candidates(tiny_llm):
    out = tiny_llm.generate(["the fox"], greedy(3, logprobs=4, ignore_eos=True))[0]
    assert len(out.logprobs) == 3
    for token, entry in zip(out.token_ids, out.logprobs):
        assert len(entry["top"]) == 4 and entry["top"][0][0] == token  # greedy picks the top one
        assert entry["logprob"] == pytest.approx(entry["top"][0][1])
        lps = [lp for _, lp in entry["top"]]
        assert lps == sorted(lps, reverse=True)


def test_generate_keeps_prompt_order_and_batches(tiny_llm):
    prompts = ["a", "the robot found a shiny key", "Mia"]
    outs = tiny_llm.generate(prompts, greedy(5, ignore_eos=True))
    assert [o.prompt for o in outs] == prompts
    singles = [tiny_llm.generate([p], greedy(5, ignore_eos=True))[0].token_ids for p in prompts]
    assert [o.token_ids for o in outs] == singles


def test_static_scheduling_waits_for_the_whole_batch(tiny_llama):
    llm = LLM(str(tiny_llama[0]), block_size=4, num_kv_blocks=64, max_num_seqs=2, scheduling="static")
    reqs = [llm.add_request("hi", greedy(n, ignore_eos=True)) for n in (2, 8, 3)]
    run_to_end(llm)
    third_start = next(e.step for e in llm.trace if e.request_id == reqs[2].request_id and e.data.get("to") == "PREFILL")
    second_end = next(e.step for e in llm.trace if e.request_id == reqs[1].request_id and e.data.get("to") == "FINISHED")
    assert third_start > second_end
    cont = LLM(str(tiny_llama[0]), block_size=4, num_kv_blocks=64, max_num_seqs=2)
    creqs = [cont.add_request("hi", greedy(n, ignore_eos=True)) for n in (2, 8, 3)]
    run_to_end(cont)
    assert cont.step_count < llm.step_count
    assert [r.output_token_ids for r in creqs] == [r.output_token_ids for r in reqs]


def test_garbage_in_free_kv_slots_never_leaks(tiny_llm):
    ref = tiny_llm.generate(["the fox", "a bird"], greedy(10, ignore_eos=True))
    for t in tiny_llm.kv_cache.k + tiny_llm.kv_cache.v:
        t.fill_(1e4)
    again = tiny_llm.generate(["the fox", "a bird"], greedy(10, ignore_eos=True))
    assert [o.token_ids for o in again] == [o.token_ids for o in ref]


def test_cache_stats_bytes_equal_tensor_bytes(tiny_llm):
    s = tiny_llm.cache_stats()
    cfg = tiny_llm.model_config
    assert s.bytes_per_token == 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4
    tensors = tiny_llm.kv_cache.k + tiny_llm.kv_cache.v
    assert s.total_bytes == sum(t.numel() * t.element_size() for t in tensors)
    assert s.total_bytes == s.total_blocks * s.block_size * s.bytes_per_token
    req = tiny_llm.add_request(prompt_token_ids=list(range(2, 12)), params=greedy(3), auto_release=False)
    run_to_end(tiny_llm)
    s = tiny_llm.cache_stats()
    assert s.used_blocks == len(req.block_table) == 3  # 12 tokens cached (10 + 2), 13th sampled: 3 blocks of 4
    block_bytes = sum(t[0].numel() * t.element_size() for t in tensors)
    assert s.used_bytes == s.used_blocks * block_bytes


def test_prefix_blocks_are_shared_with_refcounts(tiny_llm):
    shared = list(range(20, 32))  # three full blocks
    a = tiny_llm.add_request(prompt_token_ids=shared + [40], params=greedy(4, ignore_eos=True))
    tiny_llm.step()
    b = tiny_llm.add_request(prompt_token_ids=shared + [41, 42], params=greedy(4, ignore_eos=True))
    tiny_llm.step()
    assert b.num_cached_prompt_tokens == 12
    assert a.block_table[:3] == b.block_table[:3]
    alloc = tiny_llm.kv_cache.allocator
    assert all(alloc.ref_count[x] == 2 for x in a.block_table[:3])
    check_block_invariants(tiny_llm)
    run_to_end(tiny_llm)
    assert tiny_llm.cache_stats().used_blocks == 0
    assert tiny_llm.cache_stats().cached_blocks >= 3


def test_device_and_dtype_choices(tiny_llama):
    llm = LLM(str(tiny_llama[0]), device="auto", num_kv_blocks=8)
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert llm.device.type == want
    # dtype="auto": float32 on the CPU; on CUDA bfloat16 where it is native, float16 on older GPUs (a T4)
    native_bf16 = want == "cuda" and torch.cuda.is_bf16_supported(including_emulation=False)
    assert llm.dtype == (torch.float32 if want == "cpu" else torch.bfloat16 if native_bf16 else torch.float16)
    bf = LLM(str(tiny_llama[0]), device="cpu", dtype="bfloat16", num_kv_blocks=8)
    assert bf.kv_cache.k[0].dtype == torch.bfloat16 and bf.cache_stats().bytes_per_token == 2 * 2 * 2 * 16 * 2
    out = bf.generate(["the fox"], greedy(4, ignore_eos=True))[0]
    assert len(out.token_ids) == 4


def test_unreleased_finished_requests_stall_with_a_clear_error(tiny_llama):
    llm = LLM(str(tiny_llama[0]), block_size=4, num_kv_blocks=4)
    held = llm.add_request(prompt_token_ids=[3] * 10, params=greedy(2, ignore_eos=True), auto_release=False)
    run_to_end(llm)
    assert held.state == S.FINISHED and llm.cache_stats().free_blocks == 1
    with pytest.raises(RuntimeError, match=rf"never released \({held.request_id}\)"):
        llm.generate(["the robot found a shiny key"], greedy(4))
    assert llm.cache_stats().used_blocks == len(held.block_table)  # the failed request holds nothing
    llm.release(held.request_id)
    assert llm.generate(["the robot found a shiny key"], greedy(4))[0].stop_reason is not None


# --- stop reasons that tell the truth, and no orphans (issue 10) ------------------------------
def test_finished_unreleased_holders_make_a_lone_request_wait_not_context_full(tiny_llama):
    llm = LLM(str(tiny_llama[0]), block_size=4, num_kv_blocks=6)
    held = llm.add_request(prompt_token_ids=[3] * 7, params=greedy(1, ignore_eos=True), auto_release=False)
    run_to_end(llm)
    assert held.state == S.FINISHED and len(held.block_table) == 2
    lone = llm.add_request(prompt_token_ids=[4] * 5, params=greedy(15, ignore_eos=True))  # 5 blocks of 6
    for _ in range(40):
        llm.step()
    # the pool is full, but of blocks a FINISHED request keeps: the lone request waits
    assert lone.is_live and lone.stop_reason is None and lone.state == S.PREEMPTED
    with pytest.raises(RuntimeError, match=rf"never released \({held.request_id}\)"):
        llm.generate(["the fox"], greedy(2))
    llm.release(held.request_id)
    run_to_end(llm)
    assert lone.stop_reason == StopReason.MAX_TOKENS and len(lone.output_token_ids) == 15
    assert llm.cache_stats().used_blocks == 0


def test_a_tokenization_failure_leaves_no_request_and_no_event(tiny_llm, monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("tokenizer exploded")

    monkeypatch.setattr(tiny_llm.tokenizer, "encode", broken)
    with pytest.raises(RuntimeError, match="exploded"):
        tiny_llm.add_request("the fox", greedy())
    assert not tiny_llm.requests and not tiny_llm.trace
    monkeypatch.setattr(tiny_llm.tokenizer, "encode", lambda *a, **k: [])
    with pytest.raises(ValueError, match="non-empty"):
        tiny_llm.add_request("the fox", greedy())
    assert not tiny_llm.requests and not tiny_llm.trace and not tiny_llm.has_unfinished()


def test_a_rejected_prompt_leaves_no_new_event(tiny_llama):
    llm = LLM(str(tiny_llama[0]), block_size=4, num_kv_blocks=64, max_model_len=8)
    with pytest.raises(ValueError, match="max_model_len"):
        llm.add_request(prompt_token_ids=[5] * 8, params=greedy())
    assert not llm.requests and not llm.trace


def test_prompt_and_prompt_token_ids_together_are_refused(tiny_llm):
    with pytest.raises(ValueError, match="not both"):
        tiny_llm.add_request("the fox", greedy(), prompt_token_ids=[5, 6])
    assert not tiny_llm.requests and not tiny_llm.trace


def test_numpy_token_ids_are_accepted(tiny_llm):
    np = pytest.importorskip("numpy")
    req = tiny_llm.add_request(prompt_token_ids=np.array([5, 6, 7]), params=greedy(2))
    assert req.prompt_token_ids == [5, 6, 7] and all(type(t) is int for t in req.prompt_token_ids)


def test_detokenisation_failure_ends_only_that_request(tiny_llm, monkeypatch):
    good = tiny_llm.add_request("the fox", greedy(6, ignore_eos=True))
    bad = tiny_llm.add_request("the robot", greedy(6, ignore_eos=True))

    def broken(token_id, *, hidden=False):
        raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "broken tokenizer")

    monkeypatch.setattr(bad._detokenizer, "update", broken)
    run_to_end(tiny_llm)
    assert bad.stop_reason == StopReason.CANCELLED and "broken tokenizer" in bad.error
    assert good.stop_reason == StopReason.MAX_TOKENS and len(good.output_token_ids) == 6
    assert tiny_llm.cache_stats().used_blocks == 0


# --- chat and generation config (issue 11) ---------------------------------------------------
def test_chat_uses_the_template_with_one_bos(default_llm_factory):
    from minillm.chat import encode_conversation

    llm = default_llm_factory(block_size=16, num_kv_blocks=64)
    conv = [{"role": "user", "content": "Tell me a story about a fox."}]
    out = llm.chat(conv, greedy(8))
    assert len(out) == 1 and out[0].prompt_token_ids == encode_conversation(llm.tokenizer, conv)
    bos = llm.tokenizer.bos_token_id
    if bos is not None:
        assert out[0].prompt_token_ids.count(bos) <= 1
    two = llm.chat([conv, [{"role": "user", "content": "Hi"}]], greedy(8))
    assert [o.token_ids for o in two][0] == out[0].token_ids and len(two) == 2
    with pytest.raises(ValueError):
        llm.chat([])


def test_generation_config_eos_stops_greedy_decoding(tiny_llama, tmp_path):
    folder = copy_of(tiny_llama, tmp_path)
    base = LLM(str(folder), block_size=4, num_kv_blocks=64)
    first = base.generate(["the fox"], greedy(12, ignore_eos=True))[0].token_ids
    fresh = [t for t in first[2:] if t not in first[:2] and t != 1]
    assert fresh
    stop = fresh[0]
    (folder / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": [1, stop], "temperature": 0.6, "top_p": 0.9}))
    llm = LLM(str(folder), block_size=4, num_kv_blocks=64)
    out = llm.generate(["the fox"], greedy(12))[0]
    assert out.stop_reason == StopReason.EOS and out.token_ids == first[:first.index(stop) + 1]
    defaults = llm.default_sampling_params(max_tokens=5)
    assert defaults.temperature == 0.6 and defaults.top_p == 0.9 and defaults.max_tokens == 5


def test_python_dash_m_minillm_is_the_cli():
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "minillm", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "generate" in out.stdout
