"""Model answers, shown only on request: ``show_solution("task2")``.

Feedback never prints a model answer; a learner who wants one asks for it explicitly, and the
request is written into the notebook (the output carries :data:`extract.SOLUTION_MIME`), so
``minillm grade`` reports which solutions were viewed and flags those exercises for a person.
An answer that is a near copy of a model answer is flagged as well.

The answers themselves are the chapter's (``ch04/solutions.py``); this is the machinery.
"""

from __future__ import annotations

import html

from .extract import SOLUTION_MIME
from .registry import EXERCISES, close_to_model, resolve_id

__all__ = ["close_to_model", "model_answer", "show_solution"]


def model_answer(exercise_id: str, lang: str | None = None) -> str:
    """The model answer in ``lang`` (default: the current language), from the chapter's table."""
    from .chapter import current
    from ..i18n import resolve

    ex_id = resolve_id(exercise_id)
    try:
        return current().model_answer(ex_id, resolve(lang))
    except KeyError:
        raise KeyError(f"no model answer for {ex_id!r}; the ids are: {', '.join(EXERCISES)}") from None


class _Shown:
    def __init__(self, ex_id: str, text: str, lang: str = "en") -> None:
        self.ex_id, self.text, self.lang = ex_id, text, lang

    def _repr_mimebundle_(self, include=None, exclude=None):
        zh = self.lang == "zh"
        plain = (f"{self.ex_id} 的参考答案（已记录在你的笔记本里）：\n{self.text}" if zh else
                 f"Model answer for {self.ex_id} (this is recorded in your notebook):\n{self.text}")
        title, note = (("参考答案", "（已记录：<code>minillm grade</code> 会列出它）") if zh else
                       ("Model answer", "(recorded: <code>minillm grade</code> will list it)"))
        card = (f"<div style='border-left:4px solid #0969da;padding:6px 10px;font-family:system-ui,sans-serif;"
                f"font-size:13px'><b>{title}</b> <code>{html.escape(self.ex_id)}</code> "
                f"<span style='color:#57606a'>{note}</span>"
                f"<div style='margin-top:4px'>{html.escape(self.text)}</div></div>")
        return {"text/plain": plain, "text/html": card, SOLUTION_MIME: {"id": self.ex_id}}

    def __repr__(self) -> str:
        return self._repr_mimebundle_()["text/plain"]


def show_solution(exercise_id: str) -> _Shown:
    """Show the model answer of one exercise. Try first: the feedback of ``check()`` names
    what is missing; this shows a full answer, and the notebook records that you asked."""
    from ..i18n import get_language

    ex_id = resolve_id(exercise_id)
    return _Shown(ex_id, model_answer(ex_id), get_language())
