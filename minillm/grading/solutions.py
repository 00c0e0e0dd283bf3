"""Model answers, shown only on request: ``show_solution("task2")``.

Feedback never prints a model answer; a learner who wants one asks for it explicitly, and the
request is written into the notebook (the output carries :data:`extract.SOLUTION_MIME`), so
``minillm grade`` reports which solutions were viewed and flags those exercises for a person.
An answer that is a near copy of a model answer is flagged as well.

For the coding tasks the "solution" is the method in words, not code: the reference code is
kept out of the installed package (it lives under ``tests/solved/``).
"""

from __future__ import annotations

import html

from rapidfuzz import fuzz

from .extract import SOLUTION_MIME

MODEL_ANSWERS = {
    "task1_diagram": "WAITING (prompt ids, params; no KV) → PREFILL (KV blocks for the prompt, a batch slot) → DECODE "
                     "(its KV blocks, one more token per step; loops on itself) → FINISHED (stop reason; blocks still "
                     "held) → RELEASED (nothing: blocks back in the pool). Bonus: DECODE → WAITING on preemption, "
                     "and a cancel edge that ends in RELEASED.",
    "task2_kv_explain": "It keeps the keys and values of tokens already processed, so decode computes only the new "
                        "token; the price is memory that grows with context and with live requests.",
    "task3_pressure": "Long context (every prompt token keeps its K/V), high concurrency (every live request holds its "
                      "own cache at once), long outputs (each generated token adds K/V and the request holds it longer).",
    "task3_kv_bytes": "requests × (prompt tokens + output tokens) × 2 (K and V) × layers × KV heads × head_dim × 4 "
                      "bytes; the engine reports whole blocks of block_size tokens per request.",
    "task4_sampling": "The sampled token is appended to the request's history, and the next decode step is computed "
                      "from that history, so each choice steers all later steps; its parameters travel with the request.",
    "code_top_p": "Sort the logits, take the softmax, and keep a token while the probability mass ranked above it is "
                  "still below top_p (the first token always stays); set the rest to -inf in the original order.",
    "code_kv_bytes": "Every token stores one key and one value per layer and per KV head, each head_dim numbers of "
                     "dtype_bytes bytes: multiply the five factors.",
    "code_stop_check": "Check in order: EOS (unless ignore_eos) or a stop token id; a stop string in the text; "
                       "max_tokens output tokens; prompt plus output filling the context.",
}


def model_answer(exercise_id: str) -> str:
    from . import EXERCISES
    from .registry import resolve_id
    from .texts import PITFALLS, QUIZ

    ex_id = resolve_id(exercise_id)
    if ex_id in MODEL_ANSWERS:
        return MODEL_ANSWERS[ex_id]
    for p in PITFALLS:
        if p.id == ex_id:
            return f"{'True' if p.truth else 'False'}. {p.why}"
    for q in QUIZ:
        if q.id == ex_id:
            return f"{q.answer}. {q.options[q.answer][1]}"
    raise KeyError(f"no model answer for {ex_id!r}; the ids are: {', '.join(EXERCISES)}")


def close_to_model(exercise_id: str, text: str) -> bool:
    """Is ``text`` a near copy of the model answer (so a person should look)?"""
    try:
        model = model_answer(exercise_id)
    except KeyError:
        return False
    return len(text) >= 30 and fuzz.token_set_ratio(text.lower(), model.lower()) >= 88


class _Shown:
    def __init__(self, ex_id: str, text: str) -> None:
        self.ex_id, self.text = ex_id, text

    def _repr_mimebundle_(self, include=None, exclude=None):
        plain = f"Model answer for {self.ex_id} (this is recorded in your notebook):\n{self.text}"
        card = (f"<div style='border-left:4px solid #0969da;padding:6px 10px;font-family:system-ui,sans-serif;"
                f"font-size:13px'><b>Model answer</b> <code>{html.escape(self.ex_id)}</code> "
                f"<span style='color:#57606a'>(recorded: <code>minillm grade</code> will list it)</span>"
                f"<div style='margin-top:4px'>{html.escape(self.text)}</div></div>")
        return {"text/plain": plain, "text/html": card, SOLUTION_MIME: {"id": self.ex_id}}

    def __repr__(self) -> str:
        return self._repr_mimebundle_()["text/plain"]


def show_solution(exercise_id: str) -> _Shown:
    """Show the model answer of one exercise. Try first: the feedback of ``check()`` names
    what is missing; this shows a full answer, and the notebook records that you asked."""
    from .registry import resolve_id

    ex_id = resolve_id(exercise_id)
    return _Shown(ex_id, model_answer(ex_id))
