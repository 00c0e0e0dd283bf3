"""The coding tasks (checked against the engine), the student-call sandbox, and task 3's byte count."""

from __future__ import annotations

import sys
import time
import warnings

import pytest
import torch

from minillm import StopReason
from minillm.grading import EXERCISES, PRESSURE_SCENARIOS, check, safecall
from minillm.grading.ch04 import coding


@pytest.fixture
def quick_timeout(monkeypatch):
    monkeypatch.setattr(safecall, "DEFAULT_TIMEOUT", 0.5)


# =============================================================================================
# The sandbox
# =============================================================================================
def test_safecall_reports_errors_with_the_students_line():
    def broken(x):
        return x / 0

    out = safecall.call(broken, 1)
    assert not out.ok and out.error.startswith("ZeroDivisionError: division by zero (line ")
    assert "in broken" in out.error


def test_safecall_stops_an_endless_loop(quick_timeout):
    def forever():
        while True:
            pass

    t0 = time.monotonic()
    out = safecall.call(forever)
    assert out.timed_out and "did not return within 0.5 s" in out.error
    assert time.monotonic() - t0 < 3
    time.sleep(0.1)
    import threading

    assert not any(t.name == "minillm-grading-student-call" and t.is_alive() for t in threading.enumerate())


def test_safecall_turns_exit_into_feedback():
    out = safecall.call(sys.exit, 3)
    assert out.exc_type is SystemExit and not out.ok


# =============================================================================================
# Top-p
# =============================================================================================
def top_p_right(logits, top_p):
    s, order = logits.sort(-1, descending=True)
    p = s.softmax(-1)
    rm = (p.cumsum(-1) - p) >= top_p
    rm[..., 0] = False
    return logits.masked_fill(torch.zeros_like(rm).scatter(-1, order, rm), float("-inf"))


def top_p_noisy(logits, top_p):  # correct, but chatty on stderr and full of warnings
    print("debug: filtering", file=sys.stderr)
    warnings.warn("this is only a warning", stacklevel=2)
    return top_p_right(logits, top_p)


def top_p_strict_greater(logits, top_p):  # removes the token that crosses top_p: keeps too few
    s, order = logits.sort(-1, descending=True)
    rm = s.softmax(-1).cumsum(-1) > top_p
    return logits.masked_fill(torch.zeros_like(rm).scatter(-1, order, rm), float("-inf"))


def top_p_probs(logits, top_p):  # returns renormalised probabilities, not logits
    out = top_p_right(logits, top_p)
    return out.softmax(-1)


def test_top_p_right_and_noisy_get_full_marks():
    assert check("code_top_p", top_p_right).passed
    noisy = check("code_top_p", top_p_noisy)
    assert noisy.passed, str(noisy)


@pytest.mark.parametrize("fn,expected", [
    (top_p_strict_greater, "the engine keeps"),
    (top_p_probs, "you return probabilities"),
    (lambda logits, p: top_p_right(logits, p) * 2, "the kept entries changed"),
    (lambda logits, p: logits > 0, "you return a mask"),
    (lambda logits, p: None, "return a tensor of filtered logits, got NoneType"),
    (lambda logits, p: logits.flatten()[:3], "the result has shape"),
    (lambda logits, p: logits[1000], "your function raised IndexError"),
    ("not a function", "should be a function"),
])
def test_top_p_mistakes_get_specific_feedback(fn, expected):
    r = check("code_top_p", fn)
    assert r.status == "graded" and not r.passed and expected in str(r), str(r)


def test_top_p_endless_loop_and_stub(quick_timeout):
    def forever(logits, p):
        while True:
            pass

    r = check("code_top_p", forever)
    assert r.score == 0 and "did not return within" in str(r)

    def stub(logits, p):
        raise NotImplementedError("write the filter")

    assert check("code_top_p", stub).status == "not attempted"


def test_top_p_cases_match_the_engine_and_avoid_fragile_boundaries():
    from minillm.sampler import top_p_filter

    for case in coding.top_p_cases():
        assert top_p_filter(case.logits.clone(), case.top_p).shape == case.logits.shape
    names = [c.name for c in coding.top_p_cases()]
    assert len(names) == len(set(names)) >= 10


# =============================================================================================
# KV bytes per token
# =============================================================================================
def test_kv_bytes():
    assert check("code_kv_bytes", lambda layers, h, d, b: 2 * layers * h * d * b).passed
    assert check("code_kv_bytes", lambda layers, h, d, b: float(2 * layers * h * d * b)).passed
    half = check("code_kv_bytes", lambda layers, h, d, b: layers * h * d * b)
    assert half.score == 0 and "every token stores a key AND a value" in str(half)
    elems = check("code_kv_bytes", lambda layers, h, d, b: 2 * layers * h * d)
    assert not elems.passed and "multiply by dtype_bytes" in str(elems)
    assert "return a number of bytes" in str(check("code_kv_bytes", lambda *a: "lots"))

    def stub(*a):
        raise NotImplementedError

    assert not check("code_kv_bytes", stub).attempted


# =============================================================================================
# Stop check
# =============================================================================================
def stop_right(token_id, output_ids, text, params, eos_token_id, prompt_len, max_model_len):
    if (token_id == eos_token_id and not params.ignore_eos) or token_id in params.stop_token_ids:
        return StopReason.EOS
    if any(s in text for s in params.stop_strings):
        return StopReason.STOP_STRING
    if len(output_ids) >= params.max_tokens:
        return StopReason.MAX_TOKENS
    if prompt_len + len(output_ids) >= max_model_len:
        return StopReason.CONTEXT_FULL
    return None


def stop_wrong_order(token_id, output_ids, text, params, eos_token_id, prompt_len, max_model_len):
    if len(output_ids) >= params.max_tokens:
        return StopReason.MAX_TOKENS
    return stop_right(token_id, output_ids, text, params, eos_token_id, prompt_len, max_model_len)


def stop_ignore_all(token_id, output_ids, text, params, eos_token_id, prompt_len, max_model_len):
    if params.ignore_eos and token_id in params.stop_token_ids:
        return None  # wrong: ignore_eos only skips the model's EOS
    return stop_right(token_id, output_ids, text, params, eos_token_id, prompt_len, max_model_len)


def stop_strings_returned(*args):
    r = stop_right(*args)
    return None if r is None else r.name


def test_stop_check():
    assert check("code_stop_check", stop_right).passed
    order = check("code_stop_check", stop_wrong_order)
    assert not order.passed and "EOS and max_tokens at once (EOS comes first): expected StopReason.EOS" in str(order)
    ign = check("code_stop_check", stop_ignore_all)
    assert not ign.passed and "ignore_eos only skips the model's EOS" in str(ign)
    named = check("code_stop_check", stop_strings_returned)
    assert named.passed and "not strings" in str(named)
    bad = check("code_stop_check", lambda *a: 7)
    assert bad.score == 0 and "return a StopReason or None, got 7" in str(bad)


def test_reference_stop_semantics_match_the_engine():
    """The grader's expected answers come from the chapter's order; the engine must agree."""
    from minillm import SamplingParams
    from minillm.scheduler import check_stop

    for case in coding.stop_cases() + [c for seed in range(40) for c in coding.fresh_stop_cases(seed)]:
        params = SamplingParams(**case.params)
        engine = check_stop(case.token_id, len(case.output_ids), case.prompt_len + len(case.output_ids), params,
                            {case.eos_token_id}, case.max_model_len, any(s in case.text for s in params.stop_strings))
        assert engine == coding.expected_stop(case, params), case.name


# =============================================================================================
# Task 3's byte count, on a real engine run
# =============================================================================================
@pytest.fixture
def scenario_engine():
    """The grader's own engine on the shipped model (created once; scenario runs are cached)."""
    return coding.engine()


def test_scenarios_fit_and_the_block_count_matches_the_engine(scenario_engine):
    llm = scenario_engine
    cfg = llm.model_config
    bpt = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4
    assert llm.cache_stats().block_size == 16 and llm.dtype == torch.float32  # what the notebook says
    for s in PRESSURE_SCENARIOS.values():
        got = coding.measure(llm, s)
        bs = got.block_size
        blocks = s.num_requests * -(-(s.prompt_tokens + s.output_tokens - 1) // bs)
        assert got.bytes_per_token == bpt
        assert got.used_bytes == blocks * bs * bpt  # the last sampled token has no slot yet
        assert got.token_bytes == s.num_requests * (s.prompt_tokens + s.output_tokens) * bpt
        assert llm.cache_stats().used_blocks == 0  # everything released afterwards


def test_task3_kv_bytes(scenario_engine):
    cfg = scenario_engine.model_config
    bpt = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4

    def per_token(num_requests, prompt_tokens, output_tokens):
        return num_requests * (prompt_tokens + output_tokens) * bpt

    def per_block(num_requests, prompt_tokens, output_tokens):
        return num_requests * -(-(prompt_tokens + output_tokens - 1) // 16) * 16 * bpt

    exact = check("task3_kv_bytes", per_token)
    assert exact.passed and "the engine reports" in str(exact)
    assert check("task3_kv_bytes", per_block).passed
    as_dict = {name: per_token(**s.as_kwargs()) for name, s in PRESSURE_SCENARIOS.items()}
    assert check("task3_kv_bytes", as_dict).passed

    half = check("task3_kv_bytes", lambda **k: per_token(**k) // 2)
    assert half.score == 0 and "count both K and V" in str(half)
    one = check("task3_kv_bytes", lambda num_requests, prompt_tokens, output_tokens:
                per_token(1, prompt_tokens, output_tokens))
    assert one.score == 2 and "each hold their own cache" in str(one)
    partial = check("task3_kv_bytes", {"long_context": as_dict["long_context"]})
    assert partial.score == 1 and "high_concurrency: no number given" in str(partial)


def test_task3_kv_bytes_without_the_engine_does_not_run_it(monkeypatch):
    def stub(num_requests, prompt_tokens, output_tokens):
        raise NotImplementedError

    monkeypatch.setattr(coding, "_ENGINE", None)
    monkeypatch.setattr(coding, "engine", lambda: pytest.fail("the engine must not load for a stub"))
    assert check("task3_kv_bytes", stub).status == "not attempted"
    assert check("task3_kv_bytes", {"long_context": None}).status == "not attempted"
    assert "should be your function" in str(check("task3_kv_bytes", "12 MB"))


def test_engine_failure_is_reported_not_raised(monkeypatch):
    def broken():
        raise FileNotFoundError("no model here")

    monkeypatch.setattr(coding, "_ENGINE", None)
    monkeypatch.setattr(coding, "engine", broken)
    r = check("task3_kv_bytes", {"long_context": 1, "high_concurrency": 2, "long_output": 3})
    assert r.status == "error" and "could not be loaded" in str(r) and r.needs_human_review


def test_every_grader_survives_hostile_answers(quick_timeout):
    class Weird:
        def __eq__(self, other):
            raise RuntimeError("no comparing me")

        def __len__(self):
            raise RuntimeError("no len")

    for ex_id, ex in EXERCISES.items():
        if ex.kind == "engine":
            continue
        for value in (Weird(), lambda *a, **k: Weird(), float("nan"), -1, {"states": 3}):
            r = check(ex_id, value)
            assert r.status in ("graded", "not attempted"), (ex_id, value, str(r))
            assert not r.passed


def test_the_long_chat_byte_count():
    from minillm.grading import check

    def right(turn, system_tokens, user_tokens, reply_tokens, bytes_per_token, keep_last=None):
        earlier = turn - 1 if keep_last is None else min(turn - 1, keep_last)
        return (system_tokens + (earlier + 1) * (user_tokens + reply_tokens)) * bytes_per_token

    def no_reply(turn, system_tokens, user_tokens, reply_tokens, bytes_per_token, keep_last=None):
        return right(turn, system_tokens, user_tokens, reply_tokens, bytes_per_token, keep_last) - \
            reply_tokens * bytes_per_token

    assert check("code_chat_kv", right).passed
    r = check("code_chat_kv", no_reply)
    assert r.score == 0 and "count the reply too" in str(r)

    def stub(*a, **k):
        raise NotImplementedError

    assert not check("code_chat_kv", stub).attempted


# =============================================================================================
# The preamble every code grader shares (coding._engine_piece)
# =============================================================================================
CODE_IDS = ("code_top_p", "code_kv_bytes", "code_stop_check", "code_chat_kv")


@pytest.mark.parametrize("ex_id", CODE_IDS)
def test_every_code_grader_rejects_a_non_function_the_same_way(ex_id):
    r = check(ex_id, 42)
    name = EXERCISES[ex_id].answer_name
    assert r.status == "graded" and r.score == 0
    assert [f.text for f in r.feedback] == [f"{name} should be a function, got int"]
    zh = check(ex_id, 42, lang="zh")
    assert [f.text for f in zh.feedback] == [f"{name} 应该是一个函数，得到的是 int"]


@pytest.mark.parametrize("ex_id, loader", [("code_top_p", "_load_top_p"), ("code_kv_bytes", "_load_kv_bytes"),
                                           ("code_stop_check", "_load_params"), ("code_chat_kv", "_load_kv_bytes")])
def test_an_engine_piece_that_cannot_be_imported_is_the_graders_problem(ex_id, loader, monkeypatch):
    def broken():
        raise ImportError("no module named minillm.kv_cache")

    monkeypatch.setattr(coding, loader, broken)
    r = check(ex_id, lambda *a: 0)
    assert r.status == "error" and r.needs_human_review and r.score == 0
    assert "could not be imported (ImportError: no module named minillm.kv_cache)" in str(r)
    assert "无法导入引擎的" in str(check(ex_id, lambda *a: 0, lang="zh"))


def _lookup(table: dict, default):
    return lambda *args: table.get(tuple(a if not isinstance(a, list) else tuple(a) for a in args), default)


def test_a_lookup_table_of_the_printed_cases_scores_nothing_and_goes_to_a_person(monkeypatch):
    """Every code task also draws fresh cases from the run's seed; a function right only on the
    cases a learner could have seen (feedback prints their expected values) scores 0 and is flagged."""
    from minillm.grading.ch04 import capacity
    from minillm.kv_cache import kv_bytes_per_token
    from minillm.viz import kv_capacity

    monkeypatch.setenv("MINILLM_GRADE_SEED", "4242")
    configs = list(coding.KV_CONFIGS) + ([coding.shipped_config()] if coding.shipped_config() else [])
    kv = _lookup({c[1:5]: kv_bytes_per_token(*c[1:5]) for c in configs}, 0)
    bpt = kv_bytes_per_token(*coding.shipped_config()[1:]) if coding.shipped_config() else kv_bytes_per_token(4, 4, 32, 4)
    chat = _lookup({(c.turn, c.system_tokens, c.user_tokens, c.reply_tokens, bpt, c.keep_last):
                    coding.expected_chat_tokens(c) * bpt for c in coding.chat_cases()}, 0)

    def shape_args(case):
        s = kv_capacity.PUBLISHED[case[0]]
        return s.num_layers, s.num_kv_heads, s.head_dim, s.num_params, *case[1:4]

    cap = _lookup({shape_args(c): kv_capacity.capacity(kv_capacity.PUBLISHED[c[0]], c[1], c[2], kv_dtype=c[3],
                                                        block_size=capacity.BLOCK,
                                                        utilization=capacity.UTILIZATION).max_requests
                   for c in capacity.CASES}, 0)
    from minillm.grading.registry import grade

    for ex_id, fn in (("code_kv_bytes", kv), ("code_chat_kv", chat), ("task6_gpu_capacity", cap)):
        r = grade(EXERCISES[ex_id], fn)
        assert r.score == 0 and r.needs_human_review, (ex_id, r.feedback)
        assert any("drawn fresh" in f.text for f in r.feedback), r.feedback
    assert coding.fresh_kv_configs(1) != coding.fresh_kv_configs(2) and coding.fresh_stop_cases(3) == \
        coding.fresh_stop_cases(3)


def test_a_byte_count_may_read_the_block_size_but_not_run_the_engine(scenario_engine):
    """Task 3's function may ask the engine its block size (``cache_stats()``), but not measure the
    scenario by running it, nor call the grader's own measurement."""
    from minillm import SamplingParams
    from minillm.grading.ch04.coding import FORBIDDEN, Scenario, measure

    llm, forbid = scenario_engine, FORBIDDEN["scenario_kv_bytes"]
    cfg = llm.model_config

    def honest(num_requests, prompt_tokens, output_tokens):
        block = llm.cache_stats().block_size
        per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4
        return num_requests * -(-(prompt_tokens + output_tokens) // block) * block * per_token

    def measured(num_requests, prompt_tokens, output_tokens):
        return measure(llm, Scenario(num_requests, prompt_tokens, output_tokens, "x")).used_bytes

    def ran(num_requests, prompt_tokens, output_tokens):
        llm.generate([[1] * prompt_tokens] * num_requests, SamplingParams(max_tokens=output_tokens))
        return llm.cache_stats().used_bytes

    assert safecall.call(honest, 2, 10, 5, forbid=forbid).value == honest(2, 10, 5)
    for cheat in (measured, ran):
        out = safecall.call(cheat, 2, 10, 5, forbid=forbid)
        assert not out.ok and out.engine_used, out


def test_task3s_function_leaves_the_notebook_with_its_cfg_and_a_view_of_the_engine(scenario_engine):
    """Task 3's calls run in the clean room: the notebook's ``cfg`` travels by value (built field by
    field, nothing of it run) and ``llm`` as a view that answers ``cache_stats()`` where the task
    allows it; a function that reads more of the engine stays in the notebook."""
    import json

    from minillm.grading import export
    from minillm.grading.ch04.coding import FORBIDDEN
    from minillm.grading.engine_guard import ALLOW, clean_room_call

    cell = ("def scenario_kv_bytes(num_requests, prompt_tokens, output_tokens):\n"
            "    block = llm.cache_stats().block_size\n"
            "    per = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4\n"
            "    return num_requests * -(-(prompt_tokens + output_tokens) // block) * block * per\n"
            "def runs_it(n):\n    return llm.generate([[1]], None)\n")
    ns = {"llm": scenario_engine, "cfg": scenario_engine.model_config}
    exec(compile(cell, "<cell>", "exec", dont_inherit=True), ns)
    payload = json.loads(json.dumps(export.export(ns["scenario_kv_bytes"], ns)))
    trusted = export.trusted_code([cell])
    forbid = FORBIDDEN["scenario_kv_bytes"]
    fn = export.rebuild(payload, trusted, [s[len(ALLOW):] for s in forbid if s.startswith(ALLOW)])
    cfg = fn.__globals__["cfg"]
    assert cfg == scenario_engine.model_config and cfg is not scenario_engine.model_config
    notes: list = []
    with clean_room_call(list(forbid), notes.append) as reached:
        value = fn(3, 40, 9)
    assert value == ns["scenario_kv_bytes"](3, 40, 9) and not reached and not notes, (reached, notes)
    without = export.rebuild(payload, trusted)  # a task that does not allow reading the cache
    with pytest.raises(AttributeError):
        without(3, 40, 9)
    with pytest.raises(export.Unexportable, match="generate"):
        export.export(ns["runs_it"], ns)
