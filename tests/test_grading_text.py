"""The heuristic text graders: tasks 2, 3 and 4, the pitfalls and the quiz.

"Must pass" means full marks; "must fail" means less than full marks. Every list mixes English and
Chinese and covers the ways an answer goes wrong: too long, off-topic, a keyword list, one idea
missing, or one of the chapter's misconceptions.
"""

from __future__ import annotations

import pytest

from minillm.grading import EXERCISES, check
from minillm.grading.text import char_count, keyword_list, negated

# =============================================================================================
# Task 2 — the KV cache in at most 100 characters
# =============================================================================================
TASK2_PASS = [
    "The KV cache keeps past tokens' keys and values so decode skips recomputing them, but uses memory.",
    "Stores each token's K/V so later steps reuse them instead of recomputing; memory grows with context.",
    "It caches attention keys/values to avoid recomputation, at the cost of GPU memory per token.",
    "Reusing cached K/V avoids redundant compute, but the cache grows with every token and request.",
    "Saves recomputing the history each step; costs memory that grows with length and concurrency.",
    "Decode reuses stored keys and values rather than recomputing them, which takes more and more VRAM.",
    "Past K/V are kept so only the new token is computed; the price is memory that keeps growing.",
    "KV Cache 保存历史 token 的键值，decode 时不必重复计算，但会占用越来越多的显存。",
    "缓存之前 token 的 K/V，避免每步重新计算；代价是显存随上下文长度和并发增长。",
    "它把注意力的键值存下来复用，减少重复计算，但显存压力会随请求变长变多而增大。",
    "KV 缓存让解码只算新 token，省去重算历史，但占用的显存随序列变长而增长。",
    "KV cache 复用历史 K/V，避免重复计算，但它会占用大量显存。",
]

TASK2_FAIL = {
    "over the limit (EN)": "The KV cache stores the keys and values of every token that has already been processed, "
                           "so that decode does not have to recompute them at every step of the generation loop, but "
                           "it uses a lot of GPU memory, and that memory keeps growing with every token of context, "
                           "with every generated token and with every live request that the engine runs at once.",
    "over the limit (ZH)": "KV Cache 是推理引擎中非常重要的组件，它把每一个已经处理过的 token 在每一层注意力中产生的键和值"
                           "都保存下来，这样在后续每一轮 decode 的时候就不需要从头重新计算整个历史上下文，从而大幅减少重复计算，"
                           "但与此同时它也会随着上下文长度、并发请求数量和输出长度的增加而占用越来越多的显存，带来显存压力。",
    "speed only": "The KV cache makes decoding much faster because the keys and values of past tokens are reused.",
    "memory only": "The KV cache takes a lot of GPU memory that grows with the context length.",
    "keyword list (EN)": "recomputation, memory pressure",
    "keyword list (ZH)": "减少重复计算、增加显存压力",
    "hit/miss misconception (EN)": "Like a web cache: on a hit it reuses the answer and avoids recompute; misses cost memory.",
    "hit/miss misconception (ZH)": "KV Cache 命中时直接返回之前的结果，避免重复计算，但会占用显存。",
    "saves-memory misconception": "The KV cache saves memory and avoids recomputing the keys and values of past tokens.",
    "weights misconception": "It caches the model weights so they are not recomputed, which uses more memory.",
    "off-topic (EN)": "Paris is the capital of France and it has many museums.",
    "off-topic (ZH)": "今天天气很好，我们去公园散步吧。",
    "speed only (ZH)": "KV Cache 让 decode 更快。",
}


@pytest.mark.parametrize("answer", TASK2_PASS)
def test_task2_passes(answer):
    assert char_count(answer) <= 100, "test data: a passing answer must fit the limit"
    r = check("task2_kv_explain", answer)
    assert r.passed, str(r)


@pytest.mark.parametrize("answer", list(TASK2_FAIL.values()), ids=list(TASK2_FAIL))
def test_task2_fails(answer):
    r = check("task2_kv_explain", answer)
    assert r.attempted and not r.passed, str(r)


def test_task2_says_which_idea_is_missing():
    speed = check("task2_kv_explain", "The KV cache makes decode faster, but it uses GPU memory that grows.")
    assert speed.score == 1 and speed.needs_human_review
    assert "say where the speed comes from" in str(speed)
    memory = check("task2_kv_explain", TASK2_FAIL["memory only"])
    assert "Missing: what the cache saves" in str(memory)
    recompute = check("task2_kv_explain", "KV cache stores past keys and values so decode does not recompute them.")
    assert recompute.score == 1 and "Missing: what the cache costs" in str(recompute)


def test_task2_length_limit_counts_chinese_characters_and_latin_letters_fairly():
    from minillm.grading.concepts import length_units

    ok = "KV Cache 保存历史键值，避免重复计算，但占用显存。"
    padded = ok + "真" * int(100 - length_units(ok))
    assert length_units(padded) <= 100 and check("task2_kv_explain", padded).passed
    over = check("task2_kv_explain", padded + "真真")
    assert over.score == 1 and over.needs_human_review and "over the limit" not in str(over)  # Chinese feedback
    assert "超出字数" in str(over)
    english = ("The KV cache stores the keys and values of every token already processed, so decode does not "
               "recompute them, but it uses GPU memory that grows.")  # 150 characters: within 100 字
    assert len(english) > 100 and check("task2_kv_explain", english).passed
    long_en = english + " " + " ".join(["It grows with every token of context and with every live request."] * 3)
    r = check("task2_kv_explain", long_en)
    assert r.score == 1 and "over the limit" in str(r)


def test_task2_misconception_feedback_is_specific_and_negation_is_respected():
    r = check("task2_kv_explain", TASK2_FAIL["hit/miss misconception (EN)"])
    assert "not a hit/miss cache" in str(r)
    fine = check("task2_kv_explain", "Not a hit/miss cache: it keeps past K/V so decode skips recompute, but eats memory.")
    assert fine.passed, str(fine)
    fine_zh = check("task2_kv_explain", "它不是命中缓存：保存历史 K/V 以避免重复计算，但会占用越来越多的显存。")
    assert fine_zh.passed, str(fine_zh)


# =============================================================================================
# Task 3 — three cache-pressure scenarios
# =============================================================================================
TASK3_PASS = [
    [("long context", "Every prompt token keeps its own keys and values in the cache, so a longer context means "
                      "more KV entries held by the request."),
     ("high concurrency", "Each live request holds its own KV blocks at the same time, so the total grows with "
                          "the number of requests."),
     ("long outputs", "Every generated token appends one more K/V entry, and the request holds its cache for "
                      "more decode steps.")],
    {"long prompts (RAG documents)": "More prompt tokens means more keys and values stored per request.",
     "many users at once": "Each request keeps its own cache simultaneously, so memory adds up across requests.",
     "long answers": "The cache grows by one token per decode step, for every step the answer takes."},
    ["multi-turn chat: the history grows every turn, so each token of it keeps K/V in the cache",
     "peak traffic with many concurrent requests: each one holds its own blocks at once",
     "max_tokens set very high: every new token adds keys and values, and the request stays longer"],
    [("长上下文", "上下文越长，每个 token 都要保存 K/V，KV 缓存占用越大。"),
     ("高并发", "每个请求各自持有自己的缓存块，同时存在的请求越多，显存占用越多。"),
     ("长输出", "每生成一个 token 就追加一份键值，缓存随步数不断增长，请求也占用更久。")],
    {"长对话（多轮）": "历史越来越长，每一轮的 token 都留在 KV 缓存里，状态持续增长。",
     "大批量并发请求": "每个请求都有自己的 KV 缓存，同时运行时显存占用叠加。",
     "生成很长的回答": "decode 每一步都会增加一个 token 的键值，缓存线性增长。"},
    [("long context", "A 32k-token prompt stores keys and values for every token, so the cache per request is huge."),
     ("beam search with 8 beams", "Each beam is its own sequence with its own KV blocks, so memory multiplies by the beam count."),
     ("long outputs", "Each generated token adds an entry to the cache, so it keeps growing over many steps.")],
    [("long context", "More tokens in the context means more K/V held for the request."),
     ("high concurrency", "Every request holds its cache at once, so the total is the sum of all of them."),
     ("cancelled requests that are never released", "Their KV blocks stay held even though nobody reads them, "
                                                     "so memory grows with every leaked request.")],
    [("Long documents in the prompt", "Prompt length sets how many tokens' keys and values the cache holds."),
     ("Lots of simultaneous users", "Each user's request keeps its own KV blocks, so they add up."),
     ("Chain-of-thought reasoning", "Thousands of generated tokens each append K/V, so the cache keeps growing.")],
    [("长文档输入", "输入的 token 越多，缓存要保存的键值就越多。"),
     ("高并发", "同时在跑的请求越多，各自的 KV 缓存叠加，显存占用越大。"),
     ("long outputs", "Every decode step appends one more token's K/V, so the request's cache grows step by step.")],
    ["RAG with long retrieved passages: every passage token stores K/V, so each request's cache grows",
     "高并发：每个请求都同时占着自己的缓存块，总量按请求数叠加",
     "long generations: each new token adds keys and values to the cache for as long as the request lives"],
]

TASK3_FAIL = {
    "only two scenarios": [("long context", "More tokens means more K/V stored for the request."),
                           ("high concurrency", "Each request holds its own cache at once.")],
    "the same scenario twice": [("long context", "More tokens means more K/V stored per request."),
                                ("long prompts", "Longer prompts store more keys and values per token."),
                                ("long outputs", "Each generated token adds K/V to the cache.")],
    "no reasons": [("long context", ""), ("high concurrency", ""), ("long outputs", "")],
    "keyword reasons": [("long context", "more tokens"), ("high concurrency", "more requests"),
                        ("long outputs", "more steps")],
    "off-topic scenarios": [("slow network", "packets are delayed on the wire"),
                            ("a bad tokenizer", "it splits words badly"),
                            ("cold start", "the server needs to warm up first")],
    "hit-rate misconception": [("long context", "The cache hit rate drops because there are more misses."),
                               ("high concurrency", "Each request holds its own KV blocks at once."),
                               ("long outputs", "Each generated token appends K/V to the cache.")],
    "reasons over the limit": [("long context", "Because " + "the context is very long and " * 15 + "K/V grows."),
                               ("high concurrency", "Each request holds its own KV blocks at once."),
                               ("long outputs", "Each generated token appends K/V to the cache.")],
    "thin reasons": [("long context", "uses more memory"), ("high concurrency", "uses more memory"),
                     ("long outputs", "uses more memory")],
    "thin reasons (ZH)": [("长上下文", "占显存"), ("高并发", "显存更多"), ("长输出", "显存不够")],
    "one string instead of pairs": "long context, high concurrency and long outputs all use more KV cache memory",
    "saves-memory misconception": [("long context", "The KV cache saves memory by reusing tokens."),
                                   ("high concurrency", "Each request holds its own KV blocks at once."),
                                   ("long outputs", "Each generated token appends K/V to the cache.")],
    "ZH duplicate and missing reasons": [("长上下文", "上下文越长缓存越大"), ("长文档", "文档长，键值多"), ("高并发", "")],
}


@pytest.mark.parametrize("answer", TASK3_PASS)
def test_task3_pressure_passes(answer):
    r = check("task3_pressure", answer)
    assert r.passed, str(r)


@pytest.mark.parametrize("answer", list(TASK3_FAIL.values()), ids=list(TASK3_FAIL))
def test_task3_pressure_fails(answer):
    r = check("task3_pressure", answer)
    assert r.attempted and not r.passed, str(r)


def test_task3_feedback_names_the_problem():
    dup = str(check("task3_pressure", TASK3_FAIL["the same scenario twice"]))
    assert "is the same kind of scenario as 'long context'" in dup
    thin = check("task3_pressure", TASK3_FAIL["thin reasons"])
    assert thin.score == 4.5 and thin.needs_human_review and "the reason is thin" in str(thin)
    assert "you give 2 scenario(s)" in str(check("task3_pressure", TASK3_FAIL["only two scenarios"]))
    assert "should be a dict" in str(check("task3_pressure", TASK3_FAIL["one string instead of pairs"]))
    assert not check("task3_pressure", [("", ""), ("", ""), ("", "")]).attempted


# =============================================================================================
# Task 4 — why sampling is part of the request
# =============================================================================================
TASK4_PASS = [
    # (the model answer's own sentence scores 0 since #27: a copy of text the exercise shows; see TASK4_FAIL)
    "The picked token gets added to the request's running context, and the next decode step is computed from that context.",
    "Each chosen token becomes part of the history that every later step conditions on, so sampling steers the path.",
    "Sampling decides which token enters the context; the following forward pass builds on that token.",
    "Whatever token is picked gets fed back as input for the next step, so temperature changes the whole trajectory.",
    "The sampled token is added to the sequence, and later steps attend to it, so the next prediction depends on it.",
    "Because generation is autoregressive, the token picked by sampling is written into the context (and KV cache) "
    "and all subsequent tokens depend on it.",
    "采样选出的 token 会追加到请求的历史上下文中，下一轮 decode 基于它继续计算，所以采样参数必须随请求携带。",
    "sampling 决定下一轮 token 如何进入历史上下文，后续每一步都依赖这个选择。",
    "被选中的 token 不只是输出，它会回到请求的历史状态里，决定后续上下文如何扩展。",
    "每一步采样出的词元都会加入输入序列，之后的生成都建立在它之上，因此它改变了请求的推进路径。",
    "Sampling is not just a UI knob: the token it picks joins the context that the next step reads.",
]

TASK4_FAIL = {
    "the model answer's sentence, copied": "The sampled token is appended to the request's context, and the next "
                                           "decode step is computed from it.",
    "random-only misconception": "Sampling only makes the output more random and creative.",
    "UI-knob misconception": "Temperature is just a UI knob for how creative the text looks.",
    "random-only misconception (ZH)": "采样只是让输出更随机一点。",
    "UI-knob misconception (ZH)": "采样是产品层的 UI 参数，用来调整风格。",
    "keyword list": "token, history, next step",
    "keyword list (ZH)": "历史、上下文、下一轮",
    "appended to the user's text only": "The sampled token is appended to the output text shown to the user.",
    "off-topic": "The KV cache stores keys and values.",
    "over the limit": "The sampled token is appended to the request's context and the next decode step is computed "
                      "from it. " * 5,
    "no history, no next step": "Sampling picks a token from the distribution.",
    "no history, no next step (ZH)": "采样从概率分布中选一个 token 输出给用户。",
    "says it does not affect later steps": "The sampled token is appended to the context, but it does not affect "
                                           "later steps.",
}


@pytest.mark.parametrize("answer", TASK4_PASS)
def test_task4_passes(answer):
    r = check("task4_sampling", answer)
    assert r.passed, str(r)


@pytest.mark.parametrize("answer", list(TASK4_FAIL.values()), ids=list(TASK4_FAIL))
def test_task4_fails(answer):
    r = check("task4_sampling", answer)
    assert r.attempted and not r.passed, str(r)


def test_task4_feedback():
    r = check("task4_sampling", TASK4_FAIL["random-only misconception"])
    assert "misconception" in str(r) and "where the picked token goes" in str(r)
    half = check("task4_sampling", "The picked token gets added to what that request has so far.")
    assert half.score == 1 and "What is the next decode step computed from?" in str(half)


# =============================================================================================
# Pitfalls and quiz
# =============================================================================================
PITFALL_PASS = {
    "pitfall1_kv_not_hit_cache": [
        (False, "It is execution state bound to each live request: the keys and values of that request's own tokens."),
        ("false", "The cache holds one request's own K/V while it runs; nothing is looked up by prompt."),
        (False, "KV Cache 是和每个活跃请求绑定的执行状态，不是查得到就省一次调用的业务缓存。"),
        {"verdict": "错", "reason": "它保存的是该请求自身 token 的键值，是请求的中间状态。"},
    ],
    "pitfall2_sampling_not_ui": [
        (False, "Sampling picks every token, and the picked token is appended to the history the next step reads."),
        ("F", "The chosen token becomes part of the context, so it changes the request's path."),
        (False, "采样参与每一轮 token 选择，选中的 token 会进入历史上下文，改变请求的推进路径。"),
    ],
    "pitfall3_one_lifecycle": [
        (True, "Prefill builds the request's KV cache, and decode continues from that same cache."),
        ("true", "It is the same request: prefill writes the KV state and decode reads and extends it."),
        ("对", "prefill 建立初始状态和缓存，decode 沿着这个状态继续推进，是同一个请求的生命周期。"),
    ],
}
PITFALL_FAIL = {
    "pitfall1_kv_not_hit_cache": [
        (True, "It reuses answers for repeated prompts."),
        (False, ""),
        (False, "Because it is fast."),
        (False, "hit rate, misses"),
        (False, "Because a cache miss means recomputing the answer."),
        ("maybe", "It is execution state bound to each live request."),
    ],
    "pitfall2_sampling_not_ui": [
        (True, "It only makes the output more random."),
        (False, "Because temperature is a UI setting."),
        (False, "采样只是让输出更随机。"),
        (False, "random, creative"),
    ],
    "pitfall3_one_lifecycle": [
        (False, "Prefill and decode are separate systems."),
        (True, "Because they are both phases."),
        (True, "x" * 301),
    ],
}


@pytest.mark.parametrize("ex_id,answer", [(k, a) for k, v in PITFALL_PASS.items() for a in v])
def test_pitfalls_pass(ex_id, answer):
    r = check(ex_id, answer)
    assert r.passed, str(r)


@pytest.mark.parametrize("ex_id,answer", [(k, a) for k, v in PITFALL_FAIL.items() for a in v])
def test_pitfalls_fail(ex_id, answer):
    r = check(ex_id, answer)
    assert r.attempted and not r.passed, str(r)


def test_quiz_right_wrong_and_bad_input():
    letter_only = check("quiz2_kv_tradeoff", "d")
    assert letter_only.score == 1 and "add why" in str(letter_only)
    right = check("quiz2_kv_tradeoff", ("d", "it spares recomputing past tokens, but that memory grows with context"))
    assert right.passed and "A:" in str(right) and "pitfall 1" in str(right)  # every option explained
    thin = check("quiz2_kv_tradeoff", ("D", "it is the best option"))
    assert thin.score == 1 and thin.needs_human_review
    zh = check("quiz3_sampling_interface", ("选C", "因为采样出的 token 会加入历史，后续每一步都基于它"))
    assert zh.passed and "正确" in str(zh)
    for letter in "ABC":
        wrong = check("quiz2_kv_tradeoff", letter)
        assert wrong.score == 0 and "Try again" in str(wrong)
        assert "Right" not in str(wrong)  # a wrong pick does not give the answer away
    assert check("quiz1", "(B)").score == 1 and check("quiz3", ["C"]).score == 1
    for text, letter in (("Answer: D", 1), ("I think D", 1), ("选D", 1), ("B or D", 0), ("BD", 0),
                         ("I'd say D, not B", 1), ("选D而不是A", 1)):
        assert check("quiz2", text).score == letter, text
    assert "one letter, A, B, C, D" in str(check("quiz4", "E"))
    assert "a letter such as" in str(check("quiz4", 4))
    assert not check("quiz4", None).attempted


# =============================================================================================
# The building blocks
# =============================================================================================
def test_keyword_list_detection():
    assert keyword_list("recompute, memory") == "list"
    assert keyword_list("历史、上下文、下一轮") == "list"
    assert keyword_list("avoids recomputation; uses more memory") == "telegraphic"
    assert keyword_list("It avoids recomputation but uses memory.") is None
    assert keyword_list("KV Cache 避免重复计算，但会占用显存。") is None


def test_negation_window_stays_in_the_clause():
    text = "It is not slow. It is a hit/miss cache."
    assert not negated(text, text.index("hit"))
    text2 = "It is not a hit/miss cache."
    assert negated(text2, text2.index("hit"))


def test_text_graders_survive_any_input_type():
    for ex_id, ex in EXERCISES.items():
        if ex.kind in ("text", "quiz"):
            for value in (42, 3.5, object(), b"bytes", {"x": 1}, ["a", 2], (1, 2, 3), True):
                r = check(ex_id, value)
                assert r.status in ("graded", "not attempted"), (ex_id, value, str(r))
                assert not r.passed, (ex_id, value)


@pytest.mark.parametrize("blank", [None, ..., "", "   ", [], {}])
def test_unanswered_is_not_attempted(blank):
    for ex_id in ("task2_kv_explain", "task3_pressure", "task4_sampling", "quiz1_live_requests",
                  "pitfall1_kv_not_hit_cache", "task1_diagram"):
        r = check(ex_id, blank)
        assert r.status == "not attempted" and r.score == 0, (ex_id, str(r))


def test_ids_prefixes_and_missing_variables():
    assert check("task2", "x").exercise_id == "task2_kv_explain"
    ambiguous = check("task3", "x")
    assert ambiguous.status == "error" and "task3_pressure" in str(ambiguous) and "task3_kv_bytes" in str(ambiguous)
    unknown = check("task9")
    assert unknown.status == "error" and "the ids are: task1_diagram" in str(unknown)
    absent = check("task4_sampling", namespace={})
    assert absent.status == "not attempted" and "no variable named task4_sampling" in str(absent)
    assert check("task4", namespace={"task4_sampling": TASK4_PASS[0]}).passed


def test_result_rendering_is_deterministic_and_escaped():
    r = check("task2_kv_explain", "<script>alert(1)</script> KV cache, recompute")
    html_out = r._repr_html_()
    assert "<script>" not in html_out and html_out == check("task2_kv_explain", "<script>alert(1)</script> KV cache, recompute")._repr_html_()
    d = r.as_dict()
    assert set(d) >= {"id", "score", "max", "status", "feedback", "needs_human_review"}
