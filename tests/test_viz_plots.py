"""The data behind every plot in minillm.viz.plots, checked against the engine itself.

Each test drives a real engine (a tiny random Llama from conftest) and compares what the plot
functions derive from the trace with what the engine said at the time: ``cache_stats()``,
request objects, ``llm.metrics()``.
"""

from __future__ import annotations

import io
import math

import pytest

from minillm import LLM, SamplingParams
from minillm.viz import plots as P

from conftest import check_block_invariants, run_to_end

GREEDY = dict(temperature=0.0, ignore_eos=True)


def _ids(llm, text):
    return llm.tokenizer.encode(text)


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=50)
    data = buf.getvalue()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return data


def test_kv_timeline_matches_cache_stats_and_formula(tiny_llm):
    llm = tiny_llm
    cfg = llm.model_config
    bpt = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4  # fp32
    prompts = ["Once upon a time there was", "The robot", "Mia and her dog ran to the beach"]
    reqs = [llm.add_request(p, SamplingParams(max_tokens=n, **GREEDY)) for p, n in zip(prompts, (9, 14, 5))]
    live = []  # what the engine said after each step
    while llm.has_unfinished():
        llm.step()
        held = {r.request_id: (len(r.block_table), r.num_computed_tokens) for r in reqs if r.block_table}
        live.append((llm.step_count, llm.cache_stats(), held))
    samples = P.kv_timeline(llm.trace)
    assert [s["kind"] for s in samples] == ["step"] * len(live)
    for s, (step, stats, held) in zip(samples, live):
        assert s["step"] == step and s["x"] == step
        assert s["bytes_per_token"] == stats.bytes_per_token == bpt
        assert s["used_blocks"] == stats.used_blocks
        assert s["used_bytes"] == s["used_blocks"] * s["block_size"] * bpt == stats.used_bytes
        assert s["per_request_blocks"] == {r: b for r, (b, _) in held.items()}
        assert s["per_request_tokens"] == {r: t for r, (_, t) in held.items()}
        for r, tokens in s["per_request_tokens"].items():  # block-granular: ceil(tokens / block_size)
            assert s["per_request_blocks"][r] == math.ceil(tokens / s["block_size"])
            assert s["per_request_bytes"][r] >= tokens * bpt
        assert s["formula_bytes"] == sum(s["per_request_tokens"].values()) * bpt <= s["used_bytes"]
    # the same numbers as the engine's own kv_usage rows
    from minillm.trace import kv_usage

    assert [r["used_bytes"] for r in kv_usage(llm.trace)] == [s["used_bytes"] for s in samples]
    assert samples[-1]["used_blocks"] == 0 and llm.cache_stats().used_blocks == 0


def test_cancelled_request_bytes_drop_to_zero_at_its_cancel_step(tiny_llm):
    llm = tiny_llm
    a = llm.add_request("Once upon a time", SamplingParams(max_tokens=30, **GREEDY))
    b = llm.add_request("The little robot went home", SamplingParams(max_tokens=30, **GREEDY))
    for _ in range(4):
        llm.step()
    held_b = len(b.block_table)
    assert held_b > 0
    llm.cancel(b.request_id)
    after_cancel = llm.cache_stats()
    samples = P.kv_timeline(llm.trace)
    last = samples[-1]
    assert last["kind"] == "cancel" and last["request_id"] == b.request_id
    assert last["step"] == 4 and last["x"] == 4.5
    assert b.request_id not in last["per_request_blocks"] and b.request_id not in last["per_request_bytes"]
    assert samples[-2]["per_request_blocks"][b.request_id] == held_b
    assert last["used_blocks"] == after_cancel.used_blocks == samples[-2]["used_blocks"] - held_b
    assert last["used_bytes"] == after_cancel.used_bytes and last["exact"]
    llm.step()  # the next step's own snapshot agrees
    nxt = P.kv_timeline(llm.trace)[-1]
    assert nxt["kind"] == "step" and nxt["step"] == 5 and b.request_id not in nxt["per_request_blocks"]
    assert nxt["used_bytes"] == llm.cache_stats().used_bytes
    # the state timeline: DECODE up to the cancel step, then CANCELLED and released right after it
    g = P.state_grid(llm.trace)[b.request_id]
    assert g["cells"][-1] == (4, "DECODE")
    assert g["finished"] == (4, "CANCELLED") and g["released"] == 4
    llm.cancel(a.request_id)
    check_block_invariants(llm)


def test_timeline_shows_preempted_under_a_tiny_kv_budget(tiny_llama):
    folder = str(tiny_llama[0])
    prompts = ["Once upon a time", "The robot found", "Mia ran", "A small bird sang"]
    params = SamplingParams(max_tokens=14, **GREEDY)
    roomy = LLM(folder, block_size=4, num_kv_blocks=64).generate(prompts, params)
    tight = LLM(folder, block_size=4, num_kv_blocks=12)
    outs = tight.generate(prompts, params)
    assert [o.token_ids for o in outs] == [o.token_ids for o in roomy]  # greedy: same text anyway
    grid = P.state_grid(tight.trace)
    preempted = {r for r, g in grid.items() if g["preempted"]}
    assert preempted, "a 12-block pool should force at least one preemption"
    from_trace = {e.request_id for e in tight.trace if e.kind == "transition" and e.data["to"] == "PREEMPTED"}
    assert preempted == from_trace
    tokens = {}
    for e in tight.trace:
        if e.kind == "token":
            tokens.setdefault(e.request_id, []).append(e.step)
    for rid, g in grid.items():
        states = dict(g["cells"])
        for p in g["preempted"]:
            assert states[p] == "PREEMPTED"
        # a request produces exactly one token in every step where it ran (PREFILL or DECODE)
        ran = [s for s, st in g["cells"] if st in ("PREFILL", "DECODE")]
        assert ran == tokens[rid]
        assert g["finished"][1] == "MAX_TOKENS" and g["released"] == g["finished"][0]
        # after a preemption the request is prefilled again (recomputed) before decoding
        for p in g["preempted"]:
            later = [st for s, st in g["cells"] if s > p and st != "PREEMPTED"]
            assert later[0] == "PREFILL"
    # the KV plot's data never exceeds the pool
    assert max(s["used_blocks"] for s in P.kv_timeline(tight.trace)) <= 12
    _png(P.plot_state_timeline(grid))
    _png(P.plot_kv_timeline(P.kv_timeline(tight.trace)))


def test_state_grid_waiting_and_finished_but_not_released(tiny_llama):
    llm = LLM(str(tiny_llama[0]), block_size=4, num_kv_blocks=64, max_num_seqs=1)
    a = llm.add_request("Once upon a time", SamplingParams(max_tokens=3, **GREEDY), auto_release=False)
    b = llm.add_request("The robot", SamplingParams(max_tokens=2, **GREEDY))
    run_to_end(llm)
    assert a.state.value == "FINISHED" and a.block_table  # still holding its blocks
    held = len(a.block_table)
    llm.step()  # nothing to run: the engine idles, a still holds its memory
    llm.release(a.request_id)
    grid = P.state_grid(llm.trace)
    # max_num_seqs=1: b waits while a runs, then is prefilled in the next step
    assert grid[a.request_id]["cells"][:3] == [(1, "PREFILL"), (2, "DECODE"), (3, "DECODE")]
    assert grid[a.request_id]["finished"] == (3, "MAX_TOKENS")
    assert [st for _, st in grid[a.request_id]["cells"][3:]] == ["FINISHED"] * (llm.step_count - 3)
    assert grid[a.request_id]["released"] == llm.step_count
    assert grid[b.request_id]["cells"] == [(1, "WAITING"), (2, "WAITING"), (3, "WAITING"),
                                           (4, "PREFILL"), (5, "DECODE")]
    assert grid[b.request_id]["prompt_tokens"] == len(_ids(llm, "The robot"))
    samples = P.kv_timeline(llm.trace)
    assert samples[-1]["kind"] == "release" and samples[-1]["request_id"] == a.request_id
    assert samples[-2]["per_request_blocks"] == {a.request_id: held}
    assert samples[-1]["used_blocks"] == 0 == llm.cache_stats().used_blocks


def test_step_timings_and_latencies_agree_with_the_engine(tiny_llm):
    llm = tiny_llm
    outs = llm.generate(["Once upon a time there was a little fox", "The robot"],
                        SamplingParams(max_tokens=6, **GREEDY))
    rows = P.step_timings(llm.trace)
    steps = [e for e in llm.trace if e.kind == "step"]
    assert [r["step"] for r in rows] == [e.step for e in steps]
    assert [r["duration"] for r in rows] == [e.data["duration"] for e in steps]
    assert rows[0]["phase"] == "prefill" and rows[0]["num_prefill"] == 2
    assert all(r["phase"] == "decode" and r["num_tokens"] == r["num_decode"] for r in rows[1:])
    lat = P.request_latencies(llm.trace)
    assert [r["request_id"] for r in lat] == [o.request_id for o in outs]
    for r, o in zip(lat, outs):
        assert r["prompt_tokens"] == len(o.prompt_token_ids) and r["output_tokens"] == len(o.token_ids)
        # the trace's event times and the request's own timestamps are taken microseconds apart
        assert r["ttft"] == pytest.approx(o.metrics["ttft"], abs=2e-3)
        assert r["tpot"] == pytest.approx(o.metrics["tpot"], abs=2e-3)
        assert r["stop_reason"] == o.stop_reason.value
        times = P.token_times(llm.trace, o.request_id)
        assert len(times) == len(o.token_ids) and times[0] == pytest.approx(r["ttft"])
        assert times == sorted(times)
    for fig in (P.plot_step_durations(rows), P.plot_ttft_tpot(lat), P.plot_token_times(llm.trace)):
        _png(fig)


def test_measurements_run_real_requests_and_leave_the_engine_clean(tiny_llm):
    llm = tiny_llm
    rows = P.measure_prefill(llm, [4, 24], repeats=2)
    assert [r["prompt_tokens"] for r in rows] == [4, 24]
    for r in rows:
        assert r["cached_tokens"] == 0 and len(r["all"]) == 2 and r["seconds"] == min(r["all"]) > 0
    # every timed step was a real request: prefilled, one token, released
    prompts = [e.data["prompt_tokens"] for e in llm.trace
               if e.kind == "transition" and e.data["to"] == "WAITING"]
    assert prompts == [4, 4, 4, 24, 24]  # a warm-up, then two repeats of each length
    assert llm.cache_stats().used_blocks == 0 and not llm.has_unfinished()

    cmp = P.measure_cache_vs_recompute(llm, [8, 40], decode_steps=3, repeats=1)
    assert [r["context_tokens"] for r in cmp] == [9, 41]
    for r in cmp:  # the cached path and the recompute path agree on the next token
        assert r["same_token"] and r["logprob_diff"] < 1e-3
        assert r["with_cache_s"] > 0 and r["recompute_s"] > 0
    assert llm.cache_stats().used_blocks == 0 and not llm.has_unfinished()
    check_block_invariants(llm)
    _png(P.plot_prefill_times(rows, decode_step_s=0.001))
    _png(P.plot_cache_vs_recompute(cmp))

    llm.add_request("Once upon a time", SamplingParams(max_tokens=3))
    with pytest.raises(ValueError, match="unfinished"):
        P.measure_prefill(llm, [4])


def test_plots_render_without_pyplot_and_handle_an_empty_trace(tiny_llm):
    _png(P.plot_kv_timeline([]))
    _png(P.plot_state_timeline({}))
    _png(P.plot_kv_peaks({"a": {"peak_bytes": 4096, "note": "x"}, "b": {"peak_bytes": 65536}}))
    llm = tiny_llm
    llm.generate(["Once upon a time"], SamplingParams(max_tokens=10, **GREEDY))
    samples = P.kv_timeline(llm.trace)
    _png(P.plot_kv_growth(samples, "0"))
    grid = P.state_grid(llm.trace)
    shifted = P.shift_grid(grid, first_step=101)
    assert shifted["0"]["cells"][0] == (101, "PREFILL") and shifted["0"]["released"] == grid["0"]["released"] + 100
    _png(P.compare_timelines({"one": grid, "two": grid}))
    _png(P.compare_kv_timelines({"a": samples, "b": samples}, marks={"a": [(2.5, "x")]}))


def test_cache_monitor_reads_the_live_engine(tiny_llm):
    llm = tiny_llm
    mon = P.CacheMonitor(llm)
    req = llm.add_request("Once upon a time", SamplingParams(max_tokens=8, **GREEDY))
    llm.step()
    assert mon.stats() == llm.cache_stats()
    assert mon.data() == P.kv_timeline(llm.trace)
    text = mon.summary()
    assert f"{llm.cache_stats().used_blocks} of 64 blocks" in text
    cfg = llm.model_config
    assert f"2 x {cfg.num_hidden_layers} layers x {cfg.num_key_value_heads} kv_heads x {cfg.head_dim}" in text
    _png(mon.figure())
    pytest.importorskip("ipywidgets")
    box = mon.widget
    image = mon._image
    first = bytes(image.value)
    assert first[:4] == b"\x89PNG"
    step_button = mon._buttons["step"]
    assert [b.description for b in box.children[0].children] == ["Add a request", "Step", "Step x10", "Refresh"]
    step_button.click()  # Step: one llm.step(), then a redraw
    assert llm.step_count == 2 and len(mon.data()) == 2
    assert bytes(image.value) != first
    assert mon.refresh() is mon
    llm.cancel(req.request_id)
    mon.refresh()
    assert "0 of 64 blocks" in mon._html.value
    # nothing left to run: Step is greyed out and the monitor says why
    assert step_button.disabled and mon._buttons["step10"].disabled
    assert "Nothing left to run" in mon._note.value and "Add a request" in mon._note.value
    mon._buttons["add"].click()  # a new request with a fresh id: Step works again
    assert not step_button.disabled and "1 request(s) still to run" in mon._note.value
    new = [r for r in llm.requests.values() if r.is_live]
    assert len(new) == 1 and new[0].request_id != req.request_id
    mon._buttons["step10"].click()
    assert llm.step_count == 12 and new[0].num_tokens > len(new[0].prompt_token_ids)
    while llm.has_unfinished():
        step_button.click()
    assert step_button.disabled and llm.cache_stats().used_blocks == 0
    # displayed before any kernel runs: a static snapshot and a readable line, not a raw repr
    bundle = mon._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"].startswith("CacheMonitor: after step") and "VBox(" not in bundle["text/plain"]
    assert "<img" in bundle["text/html"] and "Add a request" in bundle["text/html"]


def test_cache_monitor_makes_its_own_engine_and_rejects_bad_sizes():
    mon = P.CacheMonitor(prompt_tokens=8, max_tokens=3)
    assert mon.stats().total_blocks == 64 and not mon.can_step()
    req = mon.add_request()
    assert len(req.prompt_token_ids) == 8 and mon.can_step()
    assert mon.step(100) == 3 and not mon.can_step() and req.state.value == "RELEASED"
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="max_tokens"):
            P.CacheMonitor(mon.llm, max_tokens=bad)
    with pytest.raises(ValueError, match="prompt_tokens"):
        P.CacheMonitor(mon.llm, prompt_tokens=0)
