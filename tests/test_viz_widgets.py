"""The course widgets drive the real engine: RequestStepper, SamplingExplorer, the lifecycle diagram.

Each stepper is driven twice: through its plain-Python core and through ``button.click()``
on the ipywidgets view (no browser needed). After every action the test checks the engine
itself: the request's state, the KV pool (blocks in use = blocks held), and the events in
the trace. All tests use the model shipped in the package.
"""

from __future__ import annotations

import re

import pytest
import torch

from minillm import SamplingParams
from minillm.request import TRANSITIONS, RequestState
from minillm.sampler import apply_temperature, min_p_filter, processed_logits, top_k_filter, top_p_filter
from conftest import check_block_invariants

S = RequestState
PROMPT = "Once upon a time"


@pytest.fixture
def llm(default_llm_factory):
    """A fresh engine on the shipped model, with the small pool the widgets use by default."""
    return default_llm_factory(block_size=4, num_kv_blocks=64)


@pytest.fixture(scope="module")
def shared_llm(default_llm_factory):
    """One engine for the SamplingExplorer tests (they never add requests to it...
    except the engine comparison, which runs its request to the end)."""
    return default_llm_factory(block_size=4, num_kv_blocks=64)


def transitions(events, rid):
    return [(e.data["from"], e.data["to"]) for e in events if e.kind == "transition" and e.request_id == rid]


def kinds(events, rid):
    return [e.kind for e in events if e.request_id == rid]


def assert_pool_matches(llm, core):
    """The pool's used blocks are exactly the blocks this (only) request holds."""
    stats = llm.cache_stats()
    assert stats.used_blocks == core.blocks_held == len(core.req.block_table)
    assert stats.used_bytes == core.blocks_held * stats.block_size * stats.bytes_per_token
    assert core.kv()["bytes_held"] == stats.used_bytes
    mine = [c["block"] for c in core.pool() if c["kind"] == "mine"]
    assert sorted(mine) == sorted(core.req.block_table)
    check_block_invariants(llm)


def spans(html: str) -> tuple[str, int]:
    state = re.search(r'<span class="minillm-state">([A-Z]+)</span>', html).group(1)
    blocks = int(re.search(r'<span class="minillm-blocks">(\d+)</span>', html).group(1))
    return state, blocks


# ---------------------------------------------------------------------------------------
# package surface and diagram
# ---------------------------------------------------------------------------------------

def test_public_names_import():
    from minillm.viz import RequestStepper, SamplingExplorer, lifecycle_diagram, render_diagram  # noqa: F401
    import minillm.viz as viz

    assert {"RequestStepper", "SamplingExplorer", "lifecycle_diagram"} <= set(viz.__all__)
    with pytest.raises(AttributeError):
        viz.not_a_name  # noqa: B018


def test_diagram_is_the_engine_state_machine():
    from minillm.viz import lifecycle_diagram, lifecycle_edges

    edges = lifecycle_edges()
    assert set(edges) == {(a.value, b.value) for a, bs in TRANSITIONS.items() for b in bs}
    src = lifecycle_diagram("DECODE", ("PREFILL", "DECODE")).source
    for state in RequestState:
        assert re.search(rf"^\s*{state.value} \[", src, re.M), state
    for a, b in edges:
        assert re.search(rf"^\s*{a} -> {b}\b", src, re.M), (a, b)
    lit_nodes = re.findall(r"^\s*(\w+) \[[^\]]*penwidth=3", src, re.M)
    assert lit_nodes == ["DECODE"]
    lit_edges = re.findall(r"^\s*(\w+) -> (\w+) \[[^\]]*penwidth=3", src, re.M)
    assert lit_edges == [("PREFILL", "DECODE")]
    assert re.search(r"^\s*DECODE -> DECODE", src, re.M)  # the decode loop
    with pytest.raises(ValueError, match="current_state"):
        lifecycle_diagram("RUNNING")


def test_render_diagram_svg_and_fallback_without_dot(monkeypatch):
    import graphviz
    from minillm.viz import render_diagram

    view = render_diagram(S.WAITING)
    html = view.value
    assert "<svg" in html and "WAITING" in html
    # static rich output (no widget): the notebook file holds the picture itself, scaled to fit
    svg = view._repr_svg_()
    assert svg.startswith("<svg") and 'style="max-width:100%;height:auto' in svg
    assert 'viewBox="' in svg and ">RELEASED</text>" in svg  # every state, the last one included
    # JupyterLab draws a run cell's SVG as an <img> at its natural size: it must fit the output area
    import re

    width = int(re.search(r'<svg[^>]* width="(\d+)px"', svg).group(1))
    assert 400 <= width <= 900
    assert "WAITING lit" in repr(view)
    assert view._repr_png_()[:8] == b"\x89PNG\r\n\x1a\n" and view._repr_html_() is None

    def no_dot(*args, **kwargs):
        raise graphviz.ExecutableNotFound(("dot",))

    monkeypatch.setattr(graphviz.Digraph, "pipe", no_dot)
    view = render_diagram("FINISHED", ("DECODE", "FINISHED"))
    html = view.value
    assert view._repr_svg_() is None and view._repr_png_() is None and view._repr_html_() == html  # the DOT text shows instead
    assert "<svg" not in html
    assert "dot" in html and "Install Graphviz" in html
    assert "FINISHED -&gt; RELEASED" in html  # the DOT text itself, escaped


# ---------------------------------------------------------------------------------------
# RequestStepper: the core
# ---------------------------------------------------------------------------------------

def test_stepper_core_walks_every_state(llm):
    from minillm.viz import RequestStepperCore

    core = RequestStepperCore(llm, PROMPT, SamplingParams(max_tokens=9, temperature=0.8, seed=3, ignore_eos=True))
    assert core.state == S.NEW and core.req is None
    assert [a for a in ("tokenize", "prefill", "decode_one", "run_to_end", "cancel", "release") if core.can(a)] == ["tokenize"]
    with pytest.raises(ValueError, match="Tokenize first"):
        core.prefill()

    ev = core.tokenize()
    rid = core.request_id
    assert core.req.state == S.WAITING
    assert transitions(ev, rid) == [(None, "NEW"), ("NEW", "WAITING")]
    assert core.req.prompt_token_ids == llm.tokenizer.encode(PROMPT)
    assert core.req.params.logprobs == 8  # asked for, so candidates can be shown
    assert core.blocks_held == 0 and llm.cache_stats().used_blocks == 0
    assert core.can("prefill") and core.can("cancel") and not core.can("decode_one")

    ev = core.prefill()
    assert core.req.state == S.DECODE
    assert transitions(ev, rid) == [("WAITING", "PREFILL"), ("PREFILL", "DECODE")]
    assert kinds(ev, rid) == ["transition", "token", "transition"]
    assert [e.kind for e in ev if e.request_id is None] == ["step"]
    n_prompt = len(core.req.prompt_token_ids)
    assert core.blocks_held == -(-n_prompt // 4)
    assert_pool_matches(llm, core)
    assert core.last_edges() == [("WAITING", "PREFILL"), ("PREFILL", "DECODE")]
    cand = core.candidates()
    assert cand["index"] == 0 and cand["chosen"] == core.req.output_token_ids[0]
    assert len(cand["top"]) == 8
    assert all(a[2] >= b[2] for a, b in zip(cand["top"], cand["top"][1:]))  # sorted by probability
    assert core.metrics()["ttft"] > 0

    for i in range(1, 4):
        ev = core.decode_one()
        assert core.req.state == S.DECODE
        assert kinds(ev, rid) == ["token"]
        assert ev[0].data["index"] == i and ev[0].data["token_id"] == core.req.output_token_ids[-1]
        assert len(core.req.output_token_ids) == i + 1
        assert core.last_edges() == [("DECODE", "DECODE")]
        assert_pool_matches(llm, core)
    # the newest token's K/V is written by the next step, so the cache holds one token less
    assert core.kv()["tokens_in_cache"] == core.req.num_tokens - 1
    assert core.blocks_held == -(-(core.req.num_tokens - 1) // 4)

    ev = core.run_to_end()
    assert core.req.state == S.FINISHED and core.req.stop_reason.value == "MAX_TOKENS"
    assert len(core.req.output_token_ids) == 9
    assert transitions(ev, rid)[-1] == ("DECODE", "FINISHED")
    held = core.blocks_held
    assert held > 0  # FINISHED, not yet RELEASED: the memory is still held
    assert_pool_matches(llm, core)
    assert [a for a in ("tokenize", "prefill", "decode_one", "run_to_end", "cancel", "release") if core.can(a)] == ["release"]

    ev = core.release()
    assert core.req.state == S.RELEASED
    assert transitions(ev, rid) == [("FINISHED", "RELEASED")]
    assert ev[0].data["blocks"] == held
    assert core.blocks_held == 0 and llm.cache_stats().used_blocks == 0
    assert core.metrics()["release_delay"] >= 0
    check_block_invariants(llm)
    assert spans(core.status_html()) == ("RELEASED", 0)


@pytest.mark.parametrize("where", ["WAITING", "DECODE"])
def test_stepper_core_cancel_reaches_the_cache(llm, where):
    from minillm.viz import RequestStepperCore

    core = RequestStepperCore(llm, "One day, Mia went to the beach", SamplingParams(max_tokens=30, seed=1))
    core.tokenize()
    if where == "DECODE":
        core.prefill()
        core.decode_one()
        assert llm.cache_stats().used_blocks == core.blocks_held > 0
    assert core.state.value == where
    ev = core.cancel()
    assert transitions(ev, core.request_id) == [(where, "FINISHED"), ("FINISHED", "RELEASED")]
    assert core.req.stop_reason.value == "CANCELLED"
    assert core.state == S.RELEASED and core.blocks_held == 0
    assert llm.cache_stats().used_blocks == 0
    assert not core.can("cancel") and not core.can("release")
    check_block_invariants(llm)


def test_stepper_pool_shows_other_requests(llm):
    from minillm.viz import RequestStepperCore

    other = llm.add_request("The little robot", SamplingParams(max_tokens=20, temperature=0.0))
    core = RequestStepperCore(llm, PROMPT, SamplingParams(max_tokens=5, temperature=0.0))
    core.tokenize()
    core.prefill()  # one step: the other request is prefilled in the same batch
    cells = core.pool()
    assert len(cells) == llm.cache_stats().total_blocks
    assert sorted(c["block"] for c in cells if c["kind"] == "other") == sorted(other.block_table)
    assert sum(c["kind"] == "mine" for c in cells) == core.blocks_held
    assert llm.cache_stats().used_blocks == core.blocks_held + len(other.block_table)
    core.reset()  # a live request is cancelled on reset, so it leaves nothing behind
    assert core.state == S.NEW and core.req is None
    assert llm.cache_stats().used_blocks == len(other.block_table)
    check_block_invariants(llm)


# ---------------------------------------------------------------------------------------
# RequestStepper: the widget, driven by button clicks
# ---------------------------------------------------------------------------------------

LABELS = ["Tokenize", "Prefill", "Decode one step", "Run to end", "Cancel", "Release"]


def enabled(stepper):
    return [label for label in LABELS if not stepper.buttons[label].disabled]


def test_stepper_widget_buttons_drive_the_engine(llm):
    from minillm.viz import RequestStepper

    st = RequestStepper(llm, prompt=PROMPT)
    assert "minillm-stepper" in st._dom_classes
    assert all(label in st.buttons for label in LABELS)
    assert enabled(st) == ["Tokenize"]
    assert spans(st.status.value) == ("NEW", 0)
    assert "<svg" in st.diagram.value

    st.temperature.value = 0.0
    st.max_tokens.value = 12
    st.buttons["Tokenize"].click()
    req = st.core.req
    assert req.state == S.WAITING and req.params.temperature == 0.0 and req.params.max_tokens == 12
    assert st.temperature.disabled and st.prompt_box.disabled  # params now travel with the request
    assert enabled(st) == ["Prefill", "Run to end", "Cancel"]
    assert spans(st.status.value) == ("WAITING", 0)
    assert "Tokens:" in st.tokens.value and str(req.prompt_token_ids[-1]) in st.tokens.value

    st.buttons["Prefill"].click()
    assert req.state == S.DECODE
    assert spans(st.status.value) == ("DECODE", llm.cache_stats().used_blocks)
    assert llm.cache_stats().used_blocks == len(req.block_table) > 0
    assert enabled(st) == ["Decode one step", "Run to end", "Cancel"]
    assert "★ sampled" in st.cands.value
    assert "PREFILL -&gt; DECODE" in st.events_view.value or "PREFILL -> DECODE" in st.events_view.value

    for i in range(5):
        st.buttons["Decode one step"].click()
        assert len(req.output_token_ids) == i + 2
        state, blocks = spans(st.status.value)
        assert state == "DECODE" and blocks == len(req.block_table) == llm.cache_stats().used_blocks
    # greedy: the tokens are the argmax of the raw distribution, so rank 1 is always the one sampled
    assert st.core.candidates()["chosen_rank"] == 0

    st.buttons["Cancel"].click()
    assert req.state == S.RELEASED and req.stop_reason.value == "CANCELLED"
    assert spans(st.status.value) == ("RELEASED", 0)
    assert llm.cache_stats().used_blocks == 0
    assert enabled(st) == []
    assert not st.buttons["New request"].disabled
    check_block_invariants(llm)

    st.buttons["New request"].click()
    assert st.core.req is None and spans(st.status.value) == ("NEW", 0)
    assert enabled(st) == ["Tokenize"] and not st.prompt_box.disabled


def test_stepper_widget_pauses_between_finished_and_released(llm):
    from minillm.viz import RequestStepper

    st = RequestStepper(llm, prompt=PROMPT, params=SamplingParams(max_tokens=6, temperature=0.7, seed=11))
    st.buttons["Tokenize"].click()
    st.buttons["Run to end"].click()
    req = st.core.req
    assert req.state == S.FINISHED
    state, blocks = spans(st.status.value)
    assert state == "FINISHED" and blocks == len(req.block_table) > 0
    assert llm.cache_stats().used_blocks == blocks  # logic done, memory still held
    assert enabled(st) == ["Release"]
    assert "TTFT" in st.timings.value
    st.buttons["Release"].click()
    assert req.state == S.RELEASED and spans(st.status.value) == ("RELEASED", 0)
    assert llm.cache_stats().used_blocks == 0
    # the released blocks are free again, and the full ones still carry a cached prefix
    assert any(c["kind"] == "cached" for c in st.core.pool())
    assert [e.data["to"] for e in llm.trace if e.kind == "transition" and e.request_id == req.request_id] == [
        "NEW", "WAITING", "PREFILL", "DECODE", "FINISHED", "RELEASED"]


def test_stepper_widget_reports_bad_input_without_crashing(llm):
    from minillm.viz import RequestStepper

    st = RequestStepper(llm, prompt=PROMPT)
    st.prompt_box.value = ""
    st.buttons["Tokenize"].click()
    assert "prompt must be a non-empty string" in st.message.value
    assert st.core.req is None and enabled(st) == ["Tokenize"]


# ---------------------------------------------------------------------------------------
# SamplingExplorer
# ---------------------------------------------------------------------------------------

SETTINGS = [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=20),
    dict(temperature=1.3, top_p=0.8),
    dict(temperature=0.9, top_k=50, top_p=0.9, min_p=0.05),
    dict(temperature=0.0, top_k=5),
]


@pytest.mark.parametrize("settings", SETTINGS)
def test_explorer_filters_are_the_engines(shared_llm, settings):
    from minillm.viz import SamplingExplorerCore

    core = SamplingExplorerCore(shared_llm, "Once upon a time, there was a little", **settings)
    raw = shared_llm.next_token_logits(core.context_ids)
    assert torch.equal(core.logits, raw)
    stages = core.stages()
    assert torch.equal(core.final_logits(), processed_logits(raw, core.params))
    if settings["temperature"] == 0.0:
        assert [s.name for s in stages] == ["raw", "greedy"] and stages[-1].kept == 1
        assert set(core.draws(20)) == {int(raw.argmax())} == {core.sample()}
        return
    assert [s.name for s in stages] == ["raw", "temperature", "top-k", "top-p", "min-p"]
    x = apply_temperature(raw, settings["temperature"])
    assert torch.equal(stages[1].logits, x)
    if settings.get("top_k"):
        x = top_k_filter(x, settings["top_k"])
    assert torch.equal(stages[2].logits, x)
    if settings.get("top_p", 1.0) < 1.0:
        x = top_p_filter(x, settings["top_p"])
    assert torch.equal(stages[3].logits, x)
    if settings.get("min_p"):
        x = min_p_filter(x, settings["min_p"])
    assert torch.equal(stages[4].logits, x)
    kept = [s.kept for s in stages]
    assert kept == sorted(kept, reverse=True)  # filters only ever remove tokens
    if settings.get("top_k"):
        assert stages[2].kept == settings["top_k"]
    for s in stages:
        assert abs(float(s.probs.sum()) - 1.0) < 1e-4
    assert all(p > 0 for _, _, p in core.top_tokens(5))


def test_explorer_seeded_draws_are_reproducible(shared_llm):
    from minillm.viz import SamplingExplorerCore

    a = SamplingExplorerCore(shared_llm, "Once upon a time", temperature=1.2, seed=5)
    b = SamplingExplorerCore(shared_llm, "Once upon a time", temperature=1.2, seed=5)
    assert a.draws(300) == b.draws(300)
    assert a.sample() == b.sample()
    c = SamplingExplorerCore(shared_llm, "Once upon a time", temperature=1.2, seed=6)
    assert c.draws(300) != a.draws(300)
    # the histogram follows the distribution: the most likely token is drawn most often
    probs = a.probs()
    draws = a.draws(2000)
    top = int(probs.argmax())
    share = draws.count(top) / len(draws)
    assert abs(share - float(probs[top])) < 0.05


def test_explorer_samples_what_the_engine_samples(shared_llm):
    """Appending the sampled token five times gives the engine's own tokens for that seed."""
    from minillm.viz import SamplingExplorerCore

    settings = dict(temperature=0.9, top_k=40, top_p=0.95, min_p=0.02, seed=1234)
    core = SamplingExplorerCore(shared_llm, "One day, Mia went to the beach", **settings)
    mine = [core.append() for _ in range(5)]
    out = shared_llm.generate(["One day, Mia went to the beach"],
                              SamplingParams(max_tokens=5, ignore_eos=True, **settings))[0]
    assert mine == out.token_ids


def test_explorer_appended_token_becomes_history(shared_llm):
    from minillm.viz import SamplingExplorerCore

    core = SamplingExplorerCore(shared_llm, "Once upon a time", temperature=0.0)
    before_ctx, before_logits = list(core.context_ids), core.logits.clone()
    tok = core.append()
    assert tok == int(before_logits.argmax())
    assert core.context_ids == before_ctx + [tok]
    assert not torch.equal(core.logits, before_logits)
    assert torch.equal(core.logits, shared_llm.next_token_logits(before_ctx + [tok]))
    # a different token in the same place leads to a different next distribution
    after_tok = core.logits.clone()
    other = int(before_logits.topk(2).indices[1])
    core.undo()
    assert core.context_ids == before_ctx
    core.append(other)
    assert core.context_ids == before_ctx + [other]
    assert not torch.equal(core.logits, after_tok)
    core.reset()
    assert core.context_ids == before_ctx
    with pytest.raises(ValueError, match="token_id"):
        core.append(10 ** 9)
    with pytest.raises(ValueError, match="top_p"):
        core.set(top_p=0.0)


def test_explorer_widget(shared_llm):
    from minillm.viz import SamplingExplorer

    ex = SamplingExplorer(shared_llm, "Once upon a time, there was a little")
    assert ex.plot.value[:8] == b"\x89PNG\r\n\x1a\n"
    n0 = len(ex.core.context_ids)
    ex.top_k.value = 10
    ex.temperature.value = 0.8
    assert ex.core.top_k == 10 and ex.core.temperature == 0.8
    assert ex.core.stages()[2].kept == 10
    assert "10</td>" in ex.info.value
    expected = ex.core.sample()
    assert ex.buttons["Undo"].disabled
    ex.buttons["Append sampled token"].click()
    assert ex.core.context_ids[n0:] == [expected]
    assert ex.core.text(expected) in ex.context.value
    assert not ex.buttons["Undo"].disabled
    ex.buttons["Undo"].click()
    assert len(ex.core.context_ids) == n0
    ex.seed.value = 99
    assert ex.core.seed == 99 and ex.core.draws(50) == ex.core.draws(50)


def test_sampling_explorer_draws_panel_shares_tokens_order_and_scale_at_temperature_0(shared_llm):
    from minillm.viz import SamplingExplorerCore

    core = SamplingExplorerCore(shared_llm, temperature=0.0, num_draws=50)
    fig = core.figure(n=8)
    *stages, draws = fig.axes
    assert len(draws.patches) == len(stages[0].patches) == 8  # one row per token of the stage panels
    widths = [p.get_width() for p in draws.patches]
    assert sorted(widths) == [0.0] * 7 + [1.0]  # greedy: every draw is the argmax, the other rows empty
    assert draws.get_xlim() == stages[-1].get_xlim()  # one scale for every panel
