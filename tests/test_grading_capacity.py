"""task6_gpu_capacity (requests that fit in a GPU's memory) and the quiz questions for the elements
the first four did not check: a correct formula gets full marks and agrees with hand calculation,
a formula with one slip is told which, and the graders read answers in English and Chinese."""

from __future__ import annotations

import pytest

from minillm.grading import check
from exercise_builder import solved_answers


def _answer(ex_id, lang="en"):
    ns = {}
    exec(solved_answers(lang)[ex_id], ns)
    return ns["max_requests"] if ex_id == "task6_gpu_capacity" else ns[ex_id]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_reference_answer_gets_full_marks_and_matches_hand_calculation(lang):
    fn = _answer("task6_gpu_capacity", lang)
    assert check("task6_gpu_capacity", fn).score == 3
    # Llama-3-8B on 80 GB at 8,192 tokens: (0.9 * 80e9 - 2 * 8,030,261,248) // (8192 * 131072) = 52
    assert fn(32, 8, 128, 8_030_261_248, 80, 8192) == (72 * 10**9 - 2 * 8_030_261_248) // 2**30 == 52
    assert fn(32, 8, 128, 8_030_261_248, 16, 2048) == 0  # the weights alone do not fit


def test_one_slip_is_named():
    def no_weights(layers, kv_heads, head_dim, params, card_gb, context, kv_bytes=2):
        return int(0.9 * card_gb * 10**9) // (-(-context // 16) * 16 * 2 * layers * kv_heads * head_dim * kv_bytes)

    result = check("task6_gpu_capacity", no_weights)
    assert result.score < 3 and "the weights come first" in str(result)


def test_a_stub_is_not_attempted():
    def max_requests(*args):
        raise NotImplementedError("your formula here")

    assert check("task6_gpu_capacity", max_requests).status == "not attempted"


@pytest.mark.parametrize("ex_id, right, wrong", [
    ("quiz5_debug_by_request", "B", "C"), ("quiz6_key_table_decode", "B", "A"), ("quiz7_scheduling_states", "C", "B")])
@pytest.mark.parametrize("lang", ["en", "zh"])
def test_new_quiz_questions(ex_id, right, wrong, lang):
    letter, why = _answer(ex_id, lang)
    assert letter == right and check(ex_id, (letter, why)).score == 2
    assert check(ex_id, (letter, "")).score == 1  # the letter without a why
    assert check(ex_id, (wrong, why)).score == 0


def test_a_chinese_answer_of_the_wrong_shape_gets_chinese_feedback():
    from minillm.grading import set_language

    set_language("en")  # the English notebook: a bare "对" is still a Chinese answer
    assert "应该是一个二元组" in str(check("pitfall3_one_lifecycle", "对"))
    assert "should be a pair" in str(check("pitfall3_one_lifecycle", 5))
