"""What ``minillm.grading.solutions`` and ``minillm.grading.ch04.solutions`` are inside the grader's
jail: no model answers at all.

:mod:`jail` mounts this file over both (``jail.BLINDED``) where a submission's code runs, so a cell
that imports the model answers (under any name) finds none, and ``show_solution`` only says so.
"""

from __future__ import annotations

MODEL_ANSWERS: dict = {}


def model_answer(exercise_id: str, lang: str | None = None) -> str:
    raise KeyError(f"no model answers while a submission is graded ({exercise_id!r})")


def close_to_model(exercise_id: str, text: str) -> bool:
    return False


def show_solution(exercise_id: str) -> str:
    """Model answers are not available to code being graded."""
    return "model answers are not available while a submission is graded / 评分时不提供参考答案"


def model_texts() -> list:
    return []
