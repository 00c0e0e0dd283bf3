"""Feedback in the answer's language, built once: every message in both languages, Chinese answers
graded like English ones with Chinese feedback, and the Chinese exercises notebook built from the
same source as the English one."""

from __future__ import annotations

import re
import string

import nbformat
import pytest

from minillm.grading import EXERCISES, check, get_language, set_language
from exercise_builder import SOLVED, SOLVED_ZH, STUDENT, STUDENT_ZH, TARGETS, build
from minillm.grading.language import Bi, answer_language, using
from minillm.grading.messages import MESSAGES, msg
from minillm.grading.ch04.texts import PITFALLS, QUIZ, TASK5_SCENARIO

CJK = re.compile(r"[\u4e00-\u9fff]")


def fields(text: str) -> set[str]:
    return {f for _, f, _, _ in string.Formatter().parse(text) if f}


@pytest.fixture(autouse=True)
def english_afterwards():
    yield
    set_language("en")


# =============================================================================================
# One table, both languages
# =============================================================================================
def test_every_message_key_has_both_languages_with_the_same_fields():
    assert len(MESSAGES) > 100
    for key, text in MESSAGES.items():
        assert isinstance(text, Bi), key
        assert text.en.strip() and text.zh.strip(), key
        assert fields(text.en) == fields(text.zh), key
        if key != "dia.unreadable":  # "{error}" alone in English: the parser's message
            assert CJK.search(text.zh), f"{key}: the Chinese text has no Chinese in it"
            assert text.en != text.zh, key


def test_the_exercises_own_texts_exist_in_both_languages():
    for q in QUIZ:
        for text in [q.text] + [t for o in q.options.values() for t in (o.text, o.why)]:
            assert text.en.strip() and CJK.search(text.zh), (q.id, text)
    for p in PITFALLS:
        for text in (p.statement, p.why):
            assert text.en.strip() and CJK.search(text.zh), (p.id, text)
    assert CJK.search(TASK5_SCENARIO.zh) and not CJK.search(TASK5_SCENARIO.en)
    for ex in EXERCISES.values():
        assert CJK.search(ex.title_zh), ex.id


def test_set_language_is_checked_and_names_the_parameter():
    set_language("zh")
    assert get_language() == "zh"
    for bad in ("fr", "ZH", None, 1):
        with pytest.raises(ValueError, match=r"lang must be one of 'en', 'zh'"):
            set_language(bad)
    assert get_language() == "zh"
    with pytest.raises(ValueError, match="lang"):
        check("code_kv_bytes", lambda *a: 0, lang="de")
    with using("en"):
        assert get_language() == "en"
    assert get_language() == "zh"


def test_the_widgets_and_the_grader_share_one_language_setting():
    """minillm.i18n holds the one setting; viz and grading set and read it."""
    from minillm import i18n
    from minillm.viz import get_language as viz_language
    from minillm.viz import set_language as set_viz_language

    set_language("zh")
    assert viz_language() == i18n.get_language() == "zh"
    set_viz_language("en")
    assert get_language() == "en"
    assert i18n.pick(en="prefill", zh="预填充") == "prefill" and i18n.pick("prefill", "预填充", lang="zh") == "预填充"
    with pytest.raises(ValueError, match="lang must be one of"):
        i18n.pick("a", "b", lang="fr")


def test_the_language_of_an_answer_and_the_fallback_for_none():
    assert answer_language("它避免重复计算", "en") == "zh"
    assert answer_language("it avoids recomputing", "zh") == "en"
    assert answer_language("42 …", "zh") == "zh" and answer_language("", "en") == "en"


# =============================================================================================
# Chinese answers: the same scores, Chinese feedback
# =============================================================================================
def all_chinese(result) -> bool:
    return bool(result.feedback) and all(CJK.search(f.text) for f in result.feedback)


def no_chinese(result) -> bool:
    return not any(CJK.search(f.text) for f in result.feedback)


TEXT_PAIRS = [  # (exercise, English answer, Chinese answer): the same content
    ("task2_kv_explain", "KV cache keeps past tokens' keys and values so decode avoids recomputing them, "
                         "but its memory grows with context.",
     "KV Cache 保存历史 token 的键值，decode 时避免重复计算，但显存占用随上下文增长。"),
    ("task2_kv_explain", "It makes decoding faster.", "它让解码更快。"),
    ("task2_kv_explain", "It stores answers so a cache hit returns them; it saves memory.",
     "缓存命中时直接返回之前的答案，还能节省显存。"),
    ("task4_sampling", "The sampled token is appended to the request's history, and the next decode step is "
                       "computed from it.",
     "采样出的 token 会追加到请求的历史上下文中，下一步 decode 基于它计算。"),
    ("task4_sampling", "Sampling only makes the output more random.", "采样只是让输出更随机一点。"),
    ("quiz2_kv_tradeoff", ("D", "it avoids recomputing past keys and values, but its memory grows with tokens"),
     ("D", "它避免重复计算历史的键值，但显存占用随 token 数增长")),
    ("quiz2_kv_tradeoff", ("A", "because of hits"), ("A", "因为命中率")),
    ("quiz3_sampling_interface", ("C", ""), ("C", "")),
    ("pitfall2_sampling_not_ui", (False, "Sampling picks every token, which joins the history the next step is "
                                         "computed from."),
     (False, "采样选出每个 token，它会进入历史上下文，下一步基于它计算。")),
    ("pitfall3_one_lifecycle", (False, "They are separate."), (False, "它们是分开的。")),
    ("task5_trim_policy", ("summary", "Keeping the last N turns drops turn 1, which every later turn refers to."),
     ("summary", "只保留最近 N 轮会丢掉第 1 轮，而后面每一轮都要引用它。")),
    ("task3_pressure", [("long context", "every prompt token keeps its keys and values in the cache"),
                        ("high concurrency", "each live request holds its own KV blocks at the same time"),
                        ("long outputs", "each generated token adds more K/V entries")],
     [("长上下文", "每个 prompt token 都在缓存里保留自己的键值"), ("高并发", "每个活跃请求同时占着自己的 KV 块"),
      ("长输出", "每生成一个 token 就多一份 K/V")]),
]


@pytest.mark.parametrize("ex_id, en, zh", TEXT_PAIRS, ids=[f"{p[0]}-{i}" for i, p in enumerate(TEXT_PAIRS)])
def test_a_chinese_written_answer_scores_the_same_with_chinese_feedback(ex_id, en, zh):
    for notebook_lang in ("en", "zh"):  # the answer's language decides, whatever the notebook's
        r_en, r_zh = check(ex_id, en, lang=notebook_lang), check(ex_id, zh, lang=notebook_lang)
        assert r_en.score == r_zh.score, (str(r_en), str(r_zh))
        if ex_id == "quiz3_sampling_interface":  # an empty why has no language: the notebook's decides
            assert all_chinese(r_zh) == all_chinese(r_en) == (notebook_lang == "zh"), str(r_zh)
            continue
        assert all_chinese(r_zh), str(r_zh)
        assert no_chinese(r_en), str(r_en)


def test_a_bare_letter_or_an_empty_answer_speaks_the_notebooks_language():
    assert no_chinese(check("quiz1_live_requests", "C", lang="en"))
    zh = check("quiz1_live_requests", "C", lang="zh")
    assert zh.score == 0 and all_chinese(zh), str(zh)
    empty = check("task2_kv_explain", "", lang="zh")
    assert empty.status == "not attempted" and all_chinese(empty) and "not attempted" in empty.headline()
    assert all_chinese(check("task2_kv_explain", 42, lang="zh"))  # a wrong type has no language either


DIAGRAM_EN = {"states": {"WAITING": "prompt token ids; no KV block yet", "PREFILL": "KV blocks for the prompt",
                         "DECODE": "its KV blocks, one more per step", "FINISHED": "stop reason; blocks still held",
                         "RELEASED": "nothing: blocks back in the pool"},
              "transitions": [("WAITING", "PREFILL", "scheduled"), ("PREFILL", "DECODE", "first token"),
                              ("DECODE", "DECODE", "next token"), ("DECODE", "FINISHED", "EOS"),
                              ("FINISHED", "RELEASED", "free"), ("DECODE", "WAITING", "preempt")]}
DIAGRAM_ZH = {"states": {"入队": "prompt token；还没有 KV 块", "预填充": "整段 prompt 的 KV 块",
                         "解码": "自己的 KV 块，每步多一个", "完成": "停止原因；块还占着", "释放": "什么都不占：块回到池中"},
              "transitions": [("入队", "预填充", "被调度"), ("预填充", "解码", "第一个 token"), ("解码", "解码", "下一个 token"),
                              ("解码", "完成", "EOS"), ("完成", "释放", "归还"), ("解码", "入队", "抢占")]}


@pytest.mark.parametrize("drop", [None, "释放", "解码"])
def test_a_chinese_diagram_scores_the_same_with_chinese_feedback(drop):
    en, zh = DIAGRAM_EN, DIAGRAM_ZH
    if drop:  # the same state missing from both
        twin = {"释放": "RELEASED", "解码": "DECODE"}[drop]
        zh = {"states": {k: v for k, v in zh["states"].items() if k != drop},
              "transitions": [t for t in zh["transitions"] if drop not in t[:2]]}
        en = {"states": {k: v for k, v in en["states"].items() if k != twin},
              "transitions": [t for t in en["transitions"] if twin not in t[:2]]}
    r_en, r_zh = check("task1_diagram", en), check("task1_diagram", zh)
    assert (r_en.score, r_en.bonus) == (r_zh.score, r_zh.bonus), (str(r_en), str(r_zh))
    assert all_chinese(r_zh), str(r_zh)
    assert not any(re.search(r"\b(the|state|no|path)\b", f.text) for f in r_zh.feedback), str(r_zh)
    assert no_chinese(r_en) or drop is not None, str(r_en)  # names like 入队 appear only in hints


def test_an_unreadable_diagram_says_so_in_the_notebooks_language():
    r = check("task1_diagram", "WAITING PREFILL", lang="zh")
    assert r.score == 0 and r.feedback[0].text.startswith("无法读取这张图")


def top_p_half_right(logits, top_p):
    return logits  # keeps everything: right only where top_p keeps everything


def kv_half(layers, heads, dim, nbytes):
    return layers * heads * dim * nbytes


def stop_never(*args):
    return None


def chat_no_reply(turn, system, user, reply, bpt, keep_last=None):
    earlier = turn - 1 if keep_last is None else min(turn - 1, keep_last)
    return (system + earlier * (user + reply) + user) * bpt


def looping(*args):
    while True:
        pass


CODE_ANSWERS = [("code_top_p", top_p_half_right), ("code_kv_bytes", kv_half), ("code_stop_check", stop_never),
                ("code_chat_kv", chat_no_reply), ("code_kv_bytes", "not a function"), ("code_kv_bytes", looping),
                ("code_kv_bytes", lambda *a: "lots"), ("task3_kv_bytes", "12 MB")]


@pytest.mark.parametrize("ex_id, fn", CODE_ANSWERS, ids=[f"{e}-{i}" for i, (e, _) in enumerate(CODE_ANSWERS)])
def test_code_feedback_follows_the_notebooks_language(ex_id, fn):
    en = check(ex_id, fn)
    set_language("zh")  # what the Chinese notebook's set-up cell does
    zh = check(ex_id, fn)
    assert zh.score == en.score and zh.status == en.status
    assert zh.feedback and all_chinese(zh), str(zh)
    assert no_chinese(en), str(en)
    assert check(ex_id, fn, lang="en").feedback == en.feedback  # an explicit lang wins over the setting


def test_the_chinese_feedback_of_a_code_task_is_specific():
    set_language("zh")
    kv = str(check("code_kv_bytes", kv_half))
    assert "差了 2 倍" in kv and "Llama-3-8B，bf16" in kv
    stop = str(check("code_stop_check", stop_never))
    assert "模型的 EOS token：应为 StopReason.EOS，得到的是 None（继续生成）" in stop
    assert "回复也要算上" in str(check("code_chat_kv", chat_no_reply))
    assert "秒内没有返回" in str(check("code_kv_bytes", looping))


def test_the_result_card_speaks_the_notebooks_language():
    zh = check("code_kv_bytes", kv_half, lang="zh")
    assert zh.title == EXERCISES["code_kv_bytes"].title_zh and "还没答对" in zh._repr_html_()
    assert "not yet" in check("code_kv_bytes", kv_half)._repr_html_()
    from minillm.grading import check_all

    table = check_all({}, lang="zh").table()
    assert table.splitlines()[0].startswith("练习") and "总分" in table


def test_show_solution_follows_the_language():
    from minillm.grading import show_solution

    assert "one key and one value" in show_solution("code_kv_bytes").text
    set_language("zh")
    shown = show_solution("code_kv_bytes")
    assert CJK.search(shown.text) and "参考答案" in repr(shown)
    assert CJK.search(show_solution("quiz2").text)


def test_a_copy_of_the_chinese_model_answer_earns_nothing_and_is_flagged():
    """A verbatim model answer is not the learner's own words: no points, and a person decides
    (the override restores them when the learner wrote it themselves)."""
    from minillm.grading.ch04.solutions import MODEL_ANSWERS

    r = check("task2_kv_explain", MODEL_ANSWERS["task2_kv_explain"][1])
    assert r.score == 0 and r.needs_human_review and "copy of a model answer" in r.flags


# =============================================================================================
# The Chinese notebook: built from the same source
# =============================================================================================
def test_the_four_committed_notebooks_are_what_the_builder_writes():
    """Edit minillm/grading/ch04/exercise_notebook.py and run scripts/build_exercises.py; do not edit one notebook by hand."""
    assert {p for p, _, _ in TARGETS} == {STUDENT, SOLVED, STUDENT_ZH, SOLVED_ZH}
    for path, solved, lang in TARGETS:
        committed = nbformat.read(path, as_version=4)
        built = build(solved, lang)
        assert [(c.cell_type, c.source) for c in committed.cells] == [(c.cell_type, c.source) for c in built.cells], path
        assert committed.metadata["minillm"]["lang"] == lang


def test_both_editions_share_their_code_ids_and_points():
    en, zh = build(False, "en").cells, build(False, "zh").cells
    assert [c.cell_type for c in en] == [c.cell_type for c in zh]
    differ = [i for i, (a, b) in enumerate(zip(en, zh)) if a.cell_type == "code" and a.source != b.source]
    assert len(differ) == 1 and 'set_language("zh")' in zh[differ[0]].source  # only the set-up cell
    for a, b in zip(en, zh):
        if a.cell_type == "markdown":
            assert a.source != b.source and CJK.search(b.source)
    checks = [c.source for c in zh if c.cell_type == "code" and "check(" in c.source]
    assert [re.search(r'check\("(\w+)"\)', s).group(1) for s in checks] == list(EXERCISES)
    assert sum(ex.max_score for ex in EXERCISES.values()) == 60
    zh_text = "\n".join(c.source for c in zh if c.cell_type == "markdown")
    for term in ("预填充", "解码", "采样", "抢占", "释放"):
        assert term in zh_text, term
    for q in QUIZ:
        assert q.text.zh in zh_text and all(o.text.zh in zh_text for o in q.options.values())
    for p in PITFALLS:
        assert p.statement.zh in zh_text


def test_the_chinese_student_and_solved_notebooks_differ_only_in_answers():
    student, solved = build(False, "zh").cells, build(True, "zh").cells
    differ = [i for i, (a, b) in enumerate(zip(student, solved)) if a.source != b.source]
    assert len(differ) == len(EXERCISES) + 1  # one answer cell per exercise, and the title


def test_the_stored_chinese_student_outputs_say_not_attempted_in_chinese():
    cells = nbformat.read(STUDENT_ZH, as_version=4).cells
    checks = [c for c in cells if c.cell_type == "code" and c.source.strip().endswith('")') and "check(" in c.source]
    assert len(checks) == len(EXERCISES)
    for c in checks:
        text = "".join(o.get("data", {}).get("text/plain", "") for o in c.outputs)
        assert "not attempted" in text and "未作答" in text, c.source
    assert not any(o.output_type == "error" for c in cells if c.cell_type == "code" for o in c.outputs)


def test_the_stored_chinese_solved_outputs_show_full_marks():
    cells = nbformat.read(SOLVED_ZH, as_version=4).cells
    summary = next(c for c in cells if c.cell_type == "code" and c.source == "summary()")
    text = "".join(o.get("data", {}).get("text/plain", "") for o in summary.outputs)
    assert "60/60" in text and "总分" in text
    assert msg("badge.full", "zh") in "".join(o.get("data", {}).get("text/html", "")
                                             for c in cells for o in c.get("outputs", []))


def test_the_diagram_editor_speaks_the_notebooks_language():
    from minillm.grading import DiagramEditor

    en = DiagramEditor()
    assert en.add_state_button.description == "Add / update state"
    set_language("zh")
    zh = DiagramEditor()
    assert zh.lang == "zh" and zh.add_state_button.description == "添加 / 更新状态"
    assert CJK.search(zh.resource_picker.options[1])
    zh.add_transition("入队", "预填充")
    assert "没有状态" in zh.status.value
    zh.add_state("入队", "prompt token；还没有 KV 块")
    assert "已添加状态 入队" in zh.status.value and "1 个状态" in zh._stored_bundle()["text/plain"]
    assert all_chinese(zh.check())
    assert DiagramEditor(lang="en").check_button.description == "Check my diagram"


def test_a_copy_of_the_chinese_task_text_earns_nothing():
    copied = check("task2_kv_explain", "它避免重复计算已经处理过的 token 的 key 和 value（decode 的速度正是从这里来的）；"
                                       "它占用的显存会增长——随上下文里的每个 token、随每个活跃请求增长（显存压力）")
    assert copied.score == 0 and copied.needs_human_review and "重复题目" in str(copied)
    assert check("task4_sampling", "采样出的 token 会进入请求的历史（上下文），并且下一轮 decode 是基于它计算的").score == 0
