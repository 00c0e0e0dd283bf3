"""The instructor's loop: flagged answers reviewed, overrides stored beside the gradebook and kept
across regrades, the gradebook showing the automatic score, the override and the final score."""

from __future__ import annotations

import csv
import json

import pytest

from minillm.grading import EXERCISES, check
from minillm.grading.copies import mark_shared_answers
from minillm.grading.notebook import _write_gradebook, cli_grade
from minillm.grading.review import OVERRIDES, apply, load, run


def _report(name: str, answers: dict) -> dict:
    exercises = {}
    for ex_id, answer in answers.items():
        entry = check(ex_id, answer).as_dict()
        entry["answer"] = answer if isinstance(answer, str) else json.dumps(answer, ensure_ascii=False)
        exercises[ex_id] = entry
    total = sum(e["score"] for e in exercises.values())
    return {"notebook": f"/subs/{name}.ipynb", "status": "graded", "exercises": exercises, "total_score": total,
            "total_max": sum(EXERCISES[k].max_score for k in exercises),
            "needs_review": [k for k, e in exercises.items() if e["needs_human_review"]]}


THIN = "It makes generation faster and uses memory."  # 1/2 by the grader, flagged (a weak idea)


@pytest.fixture
def book(tmp_path):
    reports = [_report("alice", {"task2_kv_explain": THIN}),
               _report("bob", {"task2_kv_explain": "Past K/V are kept so decode never recomputes them; "
                                                   "the memory grows with every token."})]
    assert reports[0]["exercises"]["task2_kv_explain"]["needs_human_review"]
    _write_gradebook(tmp_path / "gradebook.csv", tmp_path / "gradebook.json", reports, done=True)
    return tmp_path


def _entries(folder):
    data = json.loads((folder / "gradebook.json").read_text())
    return {r["notebook"].rsplit("/", 1)[-1]: r for r in data["reports"]}


def test_every_answer_carries_a_confidence_and_why_it_is_unsure():
    sure = check("task2_kv_explain", "Past K/V are kept for reuse at every decode step; the memory grows per token.")
    unsure = check("task2_kv_explain", THIN)
    assert sure.confidence == 1.0 and not sure.needs_human_review and sure.flags == []
    plain_negation = check("task2_kv_explain", "Past K/V are kept so decode never recomputes them; the memory grows per token.")
    assert plain_negation.score == 2 and plain_negation.confidence == 1.0  # the idea said through its negation
    hedged = check("task2_kv_explain", "Past K/V are kept, so nothing old is recomputed; the memory is not freed and "
                                       "grows per token.")
    assert hedged.score == 2 and hedged.needs_human_review and "negation in the answer" in hedged.flags
    unread = check("task2_kv_explain", "The KV cache is the part of the engine that keeps track of where each request "
                                       "is in its conversation.")  # a sentence the rules find nothing in: a person reads it
    assert unread.score == 0 and unread.needs_human_review and "a sentence with nothing found" in unread.flags
    assert unsure.confidence < 0.7 and unsure.needs_human_review and unsure.flags
    hidden = check("task2_kv_explain", "It keeps past K/V so decode does not re\u200bcompute them; memory grows.")
    assert "hidden characters (invisible)" in hidden.flags and hidden.as_dict()["confidence"] < 1


def test_listing_then_overriding_with_a_reason(book, capsys):
    assert run(book / "gradebook.json", interactive=False) == 0
    listed = capsys.readouterr().out
    assert "alice.ipynb · task2_kv_explain · 1/2" in listed and "answer: It makes generation" in listed
    # an override needs a reason, and a score in range: each refusal names the field
    assert cli_grade(["--review", str(book / "gradebook.json"), "--set", "alice.ipynb:task2_kv_explain=2"]) == 2
    assert "reason" in capsys.readouterr().err
    assert cli_grade(["--review", str(book / "gradebook.json"), "--set", "alice.ipynb:task2_kv_explain=3",
                      "--reason", "x"]) == 2
    assert "score: must be between 0 and 2" in capsys.readouterr().err
    assert not (book / OVERRIDES).exists()
    assert cli_grade(["--review", str(book / "gradebook.json"), "--set", "alice.ipynb:task2_kv_explain=0",
                      "--reason", "faster is not a mechanism; memory without growth"]) == 0
    alice = _entries(book)["alice.ipynb"]
    entry = alice["exercises"]["task2_kv_explain"]
    assert entry["auto_score"] == 1 and entry["override"]["score"] == 0 and entry["score"] == 0
    assert not entry["needs_human_review"] and alice["total_score"] == 0 and alice["auto_total"] == 1
    rows = {r["notebook"].rsplit("/", 1)[-1]: r for r in csv.DictReader((book / "gradebook.csv").open())}
    assert rows["alice.ipynb"]["auto_total"] == "1" and rows["alice.ipynb"]["total"] == "0"
    assert "task2_kv_explain 1→0 (faster is not a mechanism" in rows["alice.ipynb"]["overrides"]
    assert rows["bob.ipynb"]["overrides"] == "" and rows["bob.ipynb"]["total"] == rows["bob.ipynb"]["auto_total"]


def test_overrides_survive_a_regrade_but_not_a_changed_answer(book):
    run(book / "gradebook.json", set_=["alice.ipynb:task2_kv_explain=2"], reason="both ideas, tersely")
    assert load(book)["alice.ipynb:task2_kv_explain"]["score"] == 2
    again = [_report("alice", {"task2_kv_explain": THIN})]  # a regrade writes fresh automatic scores
    _write_gradebook(book / "gradebook.csv", book / "gradebook.json", again, done=True)
    assert _entries(book)["alice.ipynb"]["exercises"]["task2_kv_explain"]["score"] == 2
    changed = [_report("alice", {"task2_kv_explain": THIN + " Really."})]
    _write_gradebook(book / "gradebook.csv", book / "gradebook.json", changed, done=True)
    alice = _entries(book)["alice.ipynb"]
    entry = alice["exercises"]["task2_kv_explain"]
    assert entry["override"] is None and entry["stale_override"] and entry["needs_human_review"]
    assert alice["stale_overrides"] == ["task2_kv_explain"] and entry["score"] == entry["auto_score"]


def test_interactive_review_accepts_overrides_skips_and_quits(book):
    replies = iter(["", "s"])  # alice: accept; nothing else is flagged
    said = []
    assert run(book / "gradebook.json", ask=lambda prompt: next(replies), say=said.append, interactive=True) == 0
    decision = load(book)["alice.ipynb:task2_kv_explain"]
    assert decision["score"] == 1 and decision["reason"] == "accepted"
    assert not _entries(book)["alice.ipynb"]["exercises"]["task2_kv_explain"]["needs_human_review"]
    assert "0 answer(s) still flagged" in said[-1]


def test_a_decision_applies_to_the_answer_it_was_made_for():
    reports = [_report("alice", {"task2_kv_explain": THIN})]
    decisions = {"alice.ipynb:task2_kv_explain": {"notebook": "alice.ipynb", "exercise": "task2_kv_explain",
                                                  "score": 2, "answer_hash": "not this one"}}
    entry = apply(reports, decisions)[0]["exercises"]["task2_kv_explain"]
    assert entry["score"] == 1 and entry["stale_override"]
    assert reports[0]["exercises"]["task2_kv_explain"].get("auto_score") is None  # the input is left alone


def test_two_students_with_the_same_answer_are_both_sent_to_a_person():
    text = "The cache keeps every past token's keys and values so decode skips recomputing them, at a memory cost."
    reports = [_report("a", {"task2_kv_explain": text}), _report("b", {"task2_kv_explain": text.lower()}),
               _report("c", {"task2_kv_explain": "Stored K/V avoid redoing old tokens; VRAM grows with length."})]
    marked = mark_shared_answers(reports)
    flags = [r["exercises"]["task2_kv_explain"].get("flags", []) for r in marked]
    assert "same answer as b.ipynb" in flags[0] and "same answer as a.ipynb" in flags[1]
    assert not any(f.startswith("same answer") for f in flags[2])
    assert marked[0]["exercises"]["task2_kv_explain"]["score"] == reports[0]["exercises"]["task2_kv_explain"]["score"]

