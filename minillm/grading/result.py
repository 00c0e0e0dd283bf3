"""What a check returns: a score, the points it was out of, and specific feedback.

A ``Result`` renders itself in a notebook (``_repr_html_``) as a small card, prints as plain
text, and turns into a JSON-ready dict for ``minillm grade``. Its output is deterministic
(no ids, no timings), so a notebook that shows results can be checked by nbval.
"""

from __future__ import annotations

import html
from dataclasses import dataclass, field

NOT_ATTEMPTED = "not attempted"
GRADED = "graded"
ERROR = "error"

# kind of a feedback line -> (text marker, colour)
_KINDS = {
    "ok": ("✓", "#1a7f37"),
    "missing": ("✗", "#cf222e"),
    "wrong": ("✗", "#cf222e"),
    "warn": ("!", "#9a6700"),
    "info": ("·", "#57606a"),
    "bonus": ("+", "#0969da"),
}


@dataclass
class Feedback:
    kind: str  # ok | missing | wrong | warn | info | bonus
    text: str

    def as_text(self) -> str:
        return f"{_KINDS.get(self.kind, ('·',))[0]} {self.text}"


@dataclass
class Result:
    """The outcome of one check.

    ``score`` counts toward ``max_score``; ``bonus`` points (optional extras such as the
    preemption edge of the lifecycle diagram) are reported apart and never push the score
    over the maximum. ``needs_human_review`` is raised when a heuristic grader is unsure:
    ``confidence`` says how sure it is, ``flags`` why not (see :meth:`Marks.doubt`).
    """

    exercise_id: str
    title: str
    score: float
    max_score: float
    status: str = GRADED
    feedback: list[Feedback] = field(default_factory=list)
    needs_human_review: bool = False
    bonus: float = 0.0
    bonus_max: float = 0.0
    lang: str = "en"  # the language of the feedback, and of the card's own words
    confidence: float = 1.0  # how sure the grader is of this score (0..1); low: flagged for review
    flags: list[str] = field(default_factory=list)  # why it is unsure (for the instructor)

    # --- convenience ---------------------------------------------------------------------
    @property
    def attempted(self) -> bool:
        return self.status != NOT_ATTEMPTED

    @property
    def passed(self) -> bool:
        """Full marks (what the tests call 'must pass')."""
        return self.status == GRADED and self.score >= self.max_score

    def as_dict(self) -> dict:
        return {
            "id": self.exercise_id,
            "title": self.title,
            "score": _num(self.score),
            "max": _num(self.max_score),
            "bonus": _num(self.bonus),
            "bonus_max": _num(self.bonus_max),
            "status": self.status,
            "needs_human_review": self.needs_human_review,
            "confidence": self.confidence,
            "flags": list(self.flags),
            "feedback": [f.as_text() for f in self.feedback],
        }

    # --- display -------------------------------------------------------------------------
    def _t(self, key: str, **fields) -> str:
        from .messages import msg

        return msg(key, self.lang if self.lang in ("en", "zh") else "en", **fields)

    def headline(self) -> str:
        if self.status == NOT_ATTEMPTED:
            return self._t("result.not_attempted", id=self.exercise_id, max=_num(self.max_score))
        if self.status == ERROR:
            return self._t("result.error", id=self.exercise_id, max=_num(self.max_score))
        text = f"{self.exercise_id}: {_num(self.score)} / {_num(self.max_score)}"
        if self.bonus_max:
            text += self._t("result.bonus", bonus=_num(self.bonus), of=_num(self.bonus_max))
        if self.needs_human_review:
            text += self._t("result.review")
        return text

    def __str__(self) -> str:
        lines = [self.headline()] + ["  " + f.as_text() for f in self.feedback]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)

    def _repr_pretty_(self, p, cycle) -> None:  # IPython's text/plain
        p.text(str(self))

    def _repr_html_(self) -> str:
        if self.status == NOT_ATTEMPTED:
            colour, badge = "#57606a", self._t("badge.not_attempted")
        elif self.status == ERROR:
            colour, badge = "#cf222e", self._t("badge.error")
        elif self.passed:
            colour, badge = "#1a7f37", self._t("badge.full")
        elif self.score > 0:
            colour, badge = "#9a6700", self._t("badge.partly")
        else:
            colour, badge = "#cf222e", self._t("badge.not_yet")
        score = f"{_num(self.score)} / {_num(self.max_score)}"
        if self.bonus_max:
            score += f" &nbsp;<span style='color:#0969da'>+{_num(self.bonus)} {self._t('badge.bonus')}</span>"
        review = (f"<div style='margin-top:4px;color:#9a6700'>⚑ {html.escape(self._t('badge.review'))}</div>"
                  if self.needs_human_review else "")
        items = "".join(
            f"<li style='list-style:none;margin:2px 0'><span style='color:{_KINDS.get(f.kind, ('·', '#57606a'))[1]};"
            f"font-weight:bold;display:inline-block;width:1.2em'>{_KINDS.get(f.kind, ('·',))[0]}</span>"
            f"{html.escape(f.text)}</li>"
            for f in self.feedback
        )
        return (
            f"<div style='border-left:4px solid {colour};padding:6px 10px;margin:4px 0;"
            f"font-family:system-ui,sans-serif;font-size:13px'>"
            f"<div><b>{html.escape(self.title)}</b> <code>{html.escape(self.exercise_id)}</code> — "
            f"<span style='color:{colour};font-weight:bold'>{badge}</span> &nbsp; {score}</div>"
            f"<ul style='margin:4px 0 0 0;padding-left:0'>{items}</ul>{review}</div>"
        )


def _width(text: str) -> int:
    """Columns a string takes in a terminal: Chinese characters take two."""
    import unicodedata

    return sum(2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def _num(x: float) -> float | int:
    """3.0 -> 3, 2.5 -> 2.5 (JSON and text stay tidy)."""
    x = round(float(x), 2)
    return int(x) if x == int(x) else x


@dataclass
class Summary:
    """Several results as one table (``minillm.grading.summary()`` in a notebook)."""

    results: list[Result]
    lang: str = "en"  # the language of the table's headings

    @property
    def total(self) -> float:
        return sum(r.score for r in self.results)

    @property
    def total_max(self) -> float:
        return sum(r.max_score for r in self.results)

    def as_dict(self) -> dict:
        return {
            "total_score": _num(self.total),
            "total_max": _num(self.total_max),
            "exercises": {r.exercise_id: r.as_dict() for r in self.results},
        }

    def table(self) -> str:
        zh = self.lang == "zh"
        rows = [("练习", "得分", "状态", "复核", "第一个问题") if zh else ("exercise", "score", "status", "review", "first problem")]
        for r in self.results:
            first = next((f.as_text() for f in r.feedback if f.kind in ("missing", "wrong", "warn")), "")
            score = f"{_num(r.score)}/{_num(r.max_score)}" + (f" +{_num(r.bonus)}" if r.bonus else "")
            rows.append((r.exercise_id, score, r.status,
                         ("是" if zh else "yes") if r.needs_human_review else "", first[:70]))
        rows.append(("总分" if zh else "total", f"{_num(self.total)}/{_num(self.total_max)}", "", "", ""))
        widths = [max(_width(row[i]) for row in rows) for i in range(4)]
        out = []
        for i, row in enumerate(rows):
            out.append("  ".join(c + " " * (w - _width(c)) for c, w in zip(row[:4], widths)) + "  " + row[4])
            if i == 0 or i == len(rows) - 2:
                out.append("  ".join("-" * w for w in widths) + "  " + "-" * 14)
        return "\n".join(line.rstrip() for line in out)

    def __str__(self) -> str:
        return self.table()

    __repr__ = __str__

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.table())

    def _repr_html_(self) -> str:
        head = "".join(f"<th style='text-align:left;padding:2px 8px'>{h}</th>"
                       for h in (("练习", "名称", "得分", "状态", "复核") if self.lang == "zh" else
                                 ("exercise", "title", "score", "status", "review")))
        body = "".join(
            f"<tr><td style='padding:2px 8px'><code>{html.escape(r.exercise_id)}</code></td>"
            f"<td style='padding:2px 8px'>{html.escape(r.title)}</td>"
            f"<td style='padding:2px 8px'>{_num(r.score)} / {_num(r.max_score)}</td>"
            f"<td style='padding:2px 8px'>{html.escape(r.status)}</td>"
            f"<td style='padding:2px 8px'>{'⚑' if r.needs_human_review else ''}</td></tr>"
            for r in self.results
        )
        foot = (f"<tr><td style='padding:2px 8px'><b>{'总分' if self.lang == 'zh' else 'total'}</b></td><td></td>"
                f"<td style='padding:2px 8px'><b>{_num(self.total)} / {_num(self.total_max)}</b></td>"
                f"<td></td><td></td></tr>")
        return f"<table style='font-size:13px'><tr>{head}</tr>{body}{foot}</table>"
