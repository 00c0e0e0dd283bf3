"""Task 1: the lifecycle diagram grader (data, DOT text) and the DiagramEditor widget."""

from __future__ import annotations

import html
import json

import pytest

from minillm.grading import DiagramEditor, check
from minillm.grading.ch04.lifecycle import _holds_kv, roles_of
from minillm.grading.diagram import DiagramFormatError, parse_dot, to_dot

NOTES = {
    "WAITING": "prompt token ids, sampling params; no KV block yet",
    "PREFILL": "KV blocks for the prompt, a batch slot",
    "DECODE": "KV blocks growing by one token per step, a batch slot",
    "FINISHED": "stop reason; blocks still held",
    "RELEASED": "nothing: blocks back in the pool",
}
CORE = [("WAITING", "PREFILL", "scheduled"), ("PREFILL", "DECODE", "first token"),
        ("DECODE", "DECODE", "next token"), ("DECODE", "FINISHED", "EOS / max_tokens"),
        ("FINISHED", "RELEASED", "release")]


def diagram(states=None, transitions=None):
    return {"states": dict(NOTES if states is None else states), "transitions": list(CORE if transitions is None else transitions)}


def replace(edges, old, new):
    return [new if e[:2] == old else e for e in edges]


DIAGRAM_PASS = {
    "minimal English": diagram(),
    "Chinese names": {
        "states": {"入队": "prompt token 与采样参数，还没有 KV 块", "预填充": "整段 prompt 的 KV 缓存块，一个 batch 槽位",
                   "解码": "KV 缓存块（每步多一个 token），batch 槽位", "完成": "停止原因，缓存块尚未归还",
                   "释放": "无：缓存块已回到池中"},
        "transitions": [("入队", "预填充", "被调度"), ("预填充", "解码", "首个 token"), ("解码", "解码", "下一轮"),
                        ("解码", "完成", "EOS"), ("完成", "释放", "回收")]},
    "decode → sample → decode": diagram(
        {**NOTES, "SAMPLE": "the logits of this step"},
        replace(CORE, ("DECODE", "DECODE"), ("DECODE", "SAMPLE", "logits")) + [("SAMPLE", "DECODE", "append token")]),
    "ACTIVE and DECODING": {
        "states": {"QUEUED": "prompt ids", "PREFILL": "KV blocks for the prompt", "ACTIVE": "KV cache, batch slot",
                   "DECODING": "KV cache growing", "DONE": "stop reason, KV still held", "FREED": "nothing"},
        "transitions": [("QUEUED", "PREFILL"), ("PREFILL", "ACTIVE"), ("ACTIVE", "DECODING"),
                        ("DECODING", "DECODING"), ("DECODING", "DONE"), ("DONE", "FREED")]},
    "states as a list of dicts, transitions as dicts": {
        "states": [{"name": k, "holds": v} for k, v in NOTES.items()],
        "transitions": [{"from": a, "to": b, "label": c} for a, b, c in CORE]},
    "the chapter's long path": {
        "states": {"ARRIVED": "prompt text + params", "TOKENIZE": "prompt token ids",
                   "Waiting queue": "token ids; no blocks", "Prefill phase": "KV blocks for the prompt",
                   "Decode loop": "KV cache, batch slot", "Sampling": "next-token distribution",
                   "Update history": "the new token id", "Finished (stop reason)": "stop reason, KV still held",
                   "Released": "none"},
        "transitions": [("ARRIVED", "TOKENIZE"), ("TOKENIZE", "Waiting queue"), ("Waiting queue", "Prefill phase"),
                        ("Prefill phase", "Decode loop"), ("Decode loop", "Sampling"), ("Sampling", "Update history"),
                        ("Update history", "Decode loop"), ("Sampling", "Finished (stop reason)", "EOS"),
                        ("Finished (stop reason)", "Released")]},
    "(name, holds) tuples and a separate holds dict": {
        "states": [("WAITING", NOTES["WAITING"]), "PREFILL", ("DECODE", NOTES["DECODE"]), "FINISHED", "RELEASED"],
        "holds": {"PREFILL": NOTES["PREFILL"], "FINISHED": NOTES["FINISHED"], "RELEASED": NOTES["RELEASED"]},
        "transitions": CORE},
    "DOT text with holds attributes": """
        digraph lifecycle {
          rankdir=LR; node [shape=box];
          WAITING  [holds="prompt token ids; no KV block"];
          PREFILL  [holds="KV blocks for the prompt, batch slot"];
          DECODE   [holds="KV blocks (growing), batch slot"];
          FINISHED [holds="stop reason; blocks still held"];
          RELEASED [holds="nothing"];
          WAITING -> PREFILL -> DECODE [label="scheduled"];
          DECODE -> DECODE [label="next token"];   // the loop
          DECODE -> FINISHED [label="EOS"]; FINISHED -> RELEASED;
        }""",
    "DOT text with multi-line labels and quoted names": r"""
        digraph {
          "in queue" [label="IN QUEUE\nprompt ids\nno KV yet"];
          prefill [label="PREFILL\nKV blocks for the prompt"];
          "decode step" [label=<DECODE<br/>KV cache + batch slot>];
          finished [label="FINISHED: stop reason"];
          released [label="RELEASED\nnothing held"];
          "in queue" -> prefill -> "decode step" -> "decode step";
          "decode step" -> finished -> released;
        }""",
    "a graphviz.Digraph object": None,  # built in the test
}


def _digraph():
    import graphviz

    g = graphviz.Digraph()
    for name, holds in NOTES.items():
        g.node(name, holds=holds)
    for a, b, label in CORE:
        g.edge(a, b, label=label)
    return g


@pytest.mark.parametrize("name", list(DIAGRAM_PASS))
def test_diagrams_that_pass(name):
    answer = DIAGRAM_PASS[name] if DIAGRAM_PASS[name] is not None else _digraph()
    r = check("task1_diagram", answer)
    assert r.passed, str(r)


DIAGRAM_FAIL = {
    "no decode loop": (diagram(transitions=[e for e in CORE if e[:2] != ("DECODE", "DECODE")]),
                       "DECODE has no loop"),
    "release before finish": (diagram(transitions=[("WAITING", "PREFILL", ""), ("PREFILL", "DECODE", ""),
                                                   ("DECODE", "DECODE", ""), ("DECODE", "RELEASED", "stop"),
                                                   ("RELEASED", "FINISHED", "")]),
                              "RELEASED comes before FINISHED"),
    "no resource notes": (diagram(states={k: "" for k in NOTES}), "no resource note on: DECODE, FINISHED"),
    "one state without a note": (diagram(states={**NOTES, "PREFILL": ""}), "no resource note on: PREFILL"),
    "no prefill state": (diagram(states={k: v for k, v in NOTES.items() if k != "PREFILL"},
                                 transitions=[("WAITING", "DECODE", "")] + CORE[2:]), "no state for PREFILL"),
    "no queue state": (diagram(states={k: v for k, v in NOTES.items() if k != "WAITING"}, transitions=CORE[1:]),
                       "no state for WAITING / QUEUED / 入队"),
    "no way out of the loop": (diagram(transitions=[e for e in CORE if e[:2] != ("DECODE", "FINISHED")]),
                               "no transition leaves DECODE for FINISHED"),
    "edge points the wrong way": (diagram(transitions=replace(CORE, ("WAITING", "PREFILL"), ("PREFILL", "WAITING", ""))),
                                  "points the wrong way"),
    "decode before prefill": (diagram(transitions=[("WAITING", "DECODE", ""), ("DECODE", "PREFILL", ""),
                                                   ("DECODE", "DECODE", ""), ("PREFILL", "FINISHED", ""),
                                                   ("DECODE", "FINISHED", ""), ("FINISHED", "RELEASED", "")]),
                              "DECODE comes before PREFILL"),
    "decode note without the KV cache": (diagram(states={**NOTES, "DECODE": "a batch slot"}),
                                         "DECODE's note should say it holds KV blocks"),
    "not a diagram": (42, "should be a DiagramEditor, a dict"),
    "malformed DOT": ("digraph { WAITING -> ; }", "could not read the DOT text"),
    "plain prose": ("the request waits, then runs, then ends", "this string is not DOT text"),
    "bad transition shape": ({"states": NOTES, "transitions": [("WAITING",)]}, "a transition should be (from, to)"),
}


@pytest.mark.parametrize("name", list(DIAGRAM_FAIL))
def test_diagrams_that_fail_say_why(name):
    answer, expected = DIAGRAM_FAIL[name]
    r = check("task1_diagram", answer)
    assert r.attempted and not r.passed, str(r)
    assert r.status == "graded"
    assert expected in str(r), str(r)


def test_bonus_for_preemption_and_cancel_and_specific_optional_feedback():
    plain = check("task1_diagram", diagram())
    assert plain.bonus == 0 and "no transition leaves DECODE when the request is cancelled" in str(plain)
    full = diagram({**NOTES, "PREEMPTED": "nothing on the device"},
                   CORE + [("DECODE", "PREEMPTED", "out of KV blocks"), ("PREEMPTED", "WAITING", "requeue"),
                           ("DECODE", "FINISHED", "cancel")])
    r = check("task1_diagram", full)
    assert r.passed and r.bonus == 2, str(r)
    # a cancel that never reaches RELEASED is the chapter's "memory does not drop" scenario
    leaky = diagram({**NOTES, "CANCELLED": "blocks?"}, CORE + [("DECODE", "CANCELLED", "user cancel")])
    assert "never reaches RELEASED" in str(check("task1_diagram", leaky))
    stuck = diagram({**NOTES, "PREEMPTED": "nothing"}, CORE + [("DECODE", "PREEMPTED", "")])
    assert "has no way back" in str(check("task1_diagram", stuck))


def test_notes_that_contradict_the_engine_cost_the_note_point():
    r = check("task1_diagram", diagram({**NOTES, "WAITING": "holds KV blocks for the whole prompt",
                                        "RELEASED": "holds all its KV blocks"}))
    text = str(r)
    assert r.score == 11, text
    assert "WAITING: a waiting request holds no KV block yet" in text
    assert "RELEASED: a released request holds nothing" in text
    no_kv = check("task1_diagram", diagram({**NOTES, "DECODE": "no KV blocks, just the output ids"}))
    assert no_kv.score == 10 and "a decoding request does hold KV blocks" in str(no_kv)
    fine = check("task1_diagram", diagram({**NOTES, "WAITING": "prompt ids; no KV block yet",
                                           "RELEASED": "nothing: the KV blocks are back in the pool"}))
    assert fine.score == 12, str(fine)


def test_the_chapters_merged_finish_and_release_state_is_accepted():
    merged = {"states": {"WAITING": "ids; no KV yet", "PREFILL": "KV blocks for the prompt",
                         "DECODE": "KV blocks, one more per step", "完成释放": "nothing: blocks go back to the pool"},
              "transitions": [("WAITING", "PREFILL"), ("PREFILL", "DECODE"), ("DECODE", "DECODE"),
                              ("DECODE", "完成释放", "EOS")]}
    r = check("task1_diagram", merged)
    assert r.score == 12 and "完成释放" in str(r), str(r)


@pytest.mark.parametrize("names", [
    ("WAITING", "CONTEXT_INIT", "GENERATION_IN_PROGRESS", "GENERATION_COMPLETE", "FREED"),  # TensorRT-LLM
    ("排队", "预填充", "解码", "完成", "释放"),
    ("QUEUED", "PROMPT_PHASE", "RUNNING", "FINISHED_STOPPED", "RELEASED"),
])
def test_other_engines_state_names(names):
    w, p, d, f, r = names
    data = {"states": {w: "prompt ids; no KV block yet", p: "KV blocks for the prompt, a batch slot",
                       d: "its KV blocks (one more token per step)", f: "stop reason; blocks still held",
                       r: "nothing: blocks back in the pool"},
            "transitions": [(w, p), (p, d), (d, d), (d, f, "EOS"), (f, r)]}
    res = check("task1_diagram", data)
    assert res.score == 12, str(res)


def test_role_matching_is_generous_but_not_sloppy():
    assert roles_of("QUEUED") == {"enqueue"} and roles_of("排队中") == {"enqueue"}
    assert roles_of("PENDING") == {"enqueue"}  # not "end"
    assert roles_of("Decoding") == {"decode"} and roles_of("生成循环") == {"decode"}
    assert roles_of("CANCELLED (stopped)") == {"cancelled"}
    assert roles_of("FINISH_AND_RELEASE") == {"finish", "release"}
    assert roles_of("WaitingQueue") == {"enqueue"}
    assert roles_of("xyz") == set()


def test_dot_reader_and_writer_round_trip():
    d = parse_dot("""strict digraph g { /* comment */ graph [rankdir=LR]; edge [color=red];
        subgraph cluster_live { a [holds="x"]; b; } a -> {b c} [label="go"]; # hash comment
        c -> a:n; }""")
    assert set(d.states) == {"a", "b", "c"} and d.states["a"] == "x"
    assert ("a", "b", "go") in d.transitions and ("a", "c", "go") in d.transitions and ("c", "a", "") in d.transitions
    back = parse_dot(to_dot(d))
    assert back.states == d.states and back.transitions == d.transitions
    weird = parse_dot(to_dot(parse_dot('digraph { "say \\"hi\\"" [holds="a \\"b\\""]; "say \\"hi\\"" -> "x y"; }')))
    assert 'say "hi"' in weird.states and weird.states['say "hi"'] == 'a "b"'
    with pytest.raises(DiagramFormatError):
        parse_dot("digraph { a -> b [label=x ")


# =============================================================================================
# The DiagramEditor, driven the way a learner drives it: values into the boxes, then click
# =============================================================================================
def fill_by_clicking(editor, notes=NOTES, edges=CORE):
    for name, holds in notes.items():
        editor.state_name.value = name
        editor.state_holds.value = holds
        editor.add_state_button.click()
    for src, dst, label in edges:
        editor.from_state.value = src
        editor.to_state.value = dst
        editor.edge_label.value = label
        editor.add_transition_button.click()


def test_editor_buttons_build_a_full_marks_diagram(tmp_path):
    path = tmp_path / "diagram.json"
    ed = DiagramEditor(save_to=path)
    assert not check("task1_diagram", ed).attempted  # empty editor = not attempted
    fill_by_clicking(ed)
    assert ed.state_name.value == "" and ed.edge_label.value == ""  # boxes cleared after adding
    assert list(ed.from_state.options) == list(NOTES)
    assert "Added FINISHED → RELEASED" in ed.status.value
    assert "<svg" in ed.view.value or "<pre" in ed.view.value
    if "<svg" in ed.view.value:  # a full diagram is wide: it scrolls rather than shrink its text to ~7 px
        import re

        natural = float(re.search(r'<svg[^>]* width="([\d.]+)pt"', ed.view.value).group(1)) * 4 / 3
        least = float(re.search(r"min-width:(\d+)px", ed.view.value).group(1))
        assert natural > 1000 and least >= 0.75 * natural and "overflow-x:auto" in ed.view.value
    r = check("task1_diagram", ed)
    assert r.passed, str(r)
    ed.check_button.click()
    assert "full marks" in ed.result_view.value
    # saved on every change, read back by a new editor (how `minillm grade` sees it)
    assert json.loads(path.read_text())["states"] == NOTES
    again = DiagramEditor(save_to=path)
    assert again.to_data() == ed.to_data()


def test_editor_edits_removes_and_reports_mistakes(tmp_path):
    ed = DiagramEditor(save_to=tmp_path / "d.json")
    fill_by_clicking(ed)
    # typing an existing name fills in what it holds; add/update changes it
    ed.state_name.value = "DECODE"
    assert ed.state_holds.value == NOTES["DECODE"]
    ed.state_holds.value = ""
    ed.resource_picker.value = "a batch slot"
    ed.resource_picker.value = "KV blocks (one more token per step)"
    assert ed.state_holds.value == "a batch slot, KV blocks (one more token per step)"
    assert ed.resource_picker.value == ed.resource_picker.options[0]
    ed.add_state_button.click()
    assert ed.to_data()["states"]["DECODE"] == "a batch slot, KV blocks (one more token per step)"
    # duplicate transition
    ed.from_state.value, ed.to_state.value, ed.edge_label.value = "DECODE", "DECODE", "next token"
    ed.add_transition_button.click()
    assert "already there" in ed.status.value and len(ed.to_data()["transitions"]) == len(CORE)
    # remove the loop through the transition list
    ed.transition_list.value = [v for label, v in ed.transition_list.options if label.startswith("DECODE → DECODE")][0]
    ed.remove_transition_button.click()
    assert "DECODE has no loop" in str(check("task1_diagram", ed))
    # removing a state removes its transitions
    ed.state_name.value = "PREFILL"
    ed.remove_state_button.click()
    data = ed.to_data()
    assert "PREFILL" not in data["states"] and all("PREFILL" not in t[:2] for t in data["transitions"])
    # empty name
    ed.state_name.value = ""
    ed.add_state_button.click()
    assert "Type a state name first" in ed.status.value


def test_editor_without_graphviz_binary_shows_dot_text(monkeypatch):
    import graphviz

    def missing(*args, **kwargs):
        raise graphviz.ExecutableNotFound(("dot",))

    monkeypatch.setattr(graphviz.Source, "pipe", missing)
    ed = DiagramEditor(states={"WAITING": "ids"}, transitions=[("WAITING", "WAITING", "")])
    shown = html.unescape(ed.view.value)
    assert "'dot' program is not installed" in shown and "<svg" not in shown
    assert '"WAITING" -> "WAITING"' in shown and "Traceback" not in shown


def test_editor_survives_a_corrupt_save_file(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text("{not json")
    ed = DiagramEditor(save_to=path)
    assert ed.to_data() == {"states": {}, "transitions": []}
    assert "Could not read" in ed.status.value


def test_a_chinese_diagram_gets_chinese_feedback():
    zh = {"states": {"入队": "prompt token 与采样参数，还没有 KV 块", "预填充": "整段 prompt 的 KV 块",
                     "解码": "KV 块（每步多一个 token）", "完成": "停止原因", "释放": "无：KV 块归还"},
          "transitions": [["入队", "预填充", "调度"], ["预填充", "解码", ""], ["解码", "完成", "EOS"], ["完成", "释放", ""]]}
    r = check("task1_diagram", zh)
    text = str(r)
    assert r.score == 11 and "没有循环" in text and "路径 入队 → 预填充" in text, text


def _five_states(names, notes, labels):
    """A diagram of five states in the lifecycle's order (waiting, prefill, decode, finished, released): each
    with its note, the path through them with decode's loop, the transitions labelled in that order."""
    w, p, d, f, r = names
    return {"states": dict(zip(names, notes)),
            "transitions": [(w, p, labels[0]), (p, d, labels[1]), (d, d, labels[2]), (d, f, labels[3]), (f, r, labels[4])]}


def test_a_state_the_chapter_has_no_word_for_entered_on_a_stop_condition_is_the_finished_state():
    # a diagram told as a restaurant: "买单" (paying the bill) is reached from decode on EOS only
    names = ("排队等位", "点菜上桌（prefill）", "边吃边加菜（decode）", "买单", "翻台（释放）")
    notes = ("只有菜单（prompt 和采样参数）", "整段 prompt 的 KV 块", "KV 块，每步多一个 token", "停止原因，块还没还", "块都还回池子")
    data = _five_states(names, notes, ("有空桌", "第一个 token", "下一个 token", "EOS", "free"))
    assert check("task1_diagram", data).score == 12
    # entered on something else than a stop condition, it stays an unknown step (no finished state)
    data = _five_states(names, notes, ("有空桌", "第一个 token", "下一个 token", "上菜", "free"))
    assert check("task1_diagram", data).score < 12


def test_a_state_the_chapter_has_no_word_for_entered_from_finished_on_a_release_is_the_released_state():
    # a diagram told as an airport: "下机清舱" (everyone off, cabin cleaned) is reached from the finished state on a release
    names = ("值机排队", "登机（prefill）", "巡航（decode）", "落地", "下机清舱")
    notes = ("只有行程单（prompt 和采样参数）", "整段 prompt 的 KV 块", "KV 块，每步多一个 token", "停止原因，块还没还")
    labels = ("叫号", "第一个 token", "下一个 token", "EOS")
    assert check("task1_diagram", _five_states(names, notes + ("块都还回池子，什么都不占",), labels + ("归还块",))).score == 12
    # entered on something else than a release, with a note that gives nothing back, it stays an unknown step (no
    # released state); a note that gives the blocks back says it (c28: test_a_released_state_…_is_read_from_its_note)
    assert check("task1_diagram", _five_states(names, notes + ("乘客下机，机组检查客舱",), labels + ("下一位",))).score < 12
    assert check("task1_diagram", _five_states(names, notes + ("块都还回池子，什么都不占",), labels + ("下一位",))).score == 12


def test_states_the_chapter_has_no_word_for_are_read_from_the_path_and_the_notes():
    # a diagram told as a hospital: the loop that holds KV is decode, the state that enters it with the prompt's KV is
    # prefill, the state the diagram starts from (holding nothing yet, "还没分到床位（KV 块）") is the waiting state
    w, p, d, f, r = "挂号候诊", "入院检查", "住院", "出院结算", "床位清理"
    data = {"states": {w: "只有病历（prompt 和采样参数），还没分到床位（KV 块）", p: "把整段病史（prompt）的 KV 写进块里",
                       d: "KV 块，每住一天（每步）多一个 token", f: "停止原因定了，床位还没退", r: "块全部归还，什么都不占"},
            "transitions": [(w, p, "叫号"), (p, d, "第一个 token"), (d, d, "下一个 token"), (d, f, "EOS"), (f, r, "归还")]}
    assert check("task1_diagram", data).score == 12
    # without the loop nothing says which state decodes: the roles are not guessed
    data["transitions"] = [(w, p, "叫号"), (p, d, "第一个 token"), (d, f, "EOS"), (f, r, "归还")]
    assert check("task1_diagram", data).score < 6


def test_a_gloss_is_read_with_the_word_it_glosses():
    assert not _holds_kv("还没分到床位（KV 块）")
    assert _holds_kv("分到了床位（KV 块）")


def test_a_released_state_the_chapter_has_no_word_for_is_read_from_its_note():
    # a diagram told as a restaurant: the state after the finished one whose note gives the blocks back is released
    names = ("取号", "点菜", "上菜", "买单", "翻台")
    notes = ("只有号码单（prompt 和参数）", "整份菜单（prompt）的 KV 写进块", "KV 块，每道菜（token）多一格", "停止原因，桌子还占着")
    labels = ("叫到号", "第一道菜", "下一道", "EOS", "清桌")
    assert check("task1_diagram", _five_states(names, notes + ("桌子（块）全部让出",), labels)).score == 12
    # a note that still holds the blocks: no released state
    assert check("task1_diagram", _five_states(names, notes + ("桌子（块）还占着",), labels)).score < 12


def test_a_gloss_is_the_subject_of_what_follows_it():
    assert not _holds_kv("桌子（块）全部让出")
    assert _holds_kv("桌子（块）还占着")
