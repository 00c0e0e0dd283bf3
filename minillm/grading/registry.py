"""The exercise registry and ``check()``.

Every exercise is registered once, under a stable id, with the name of the variable that
holds the student's answer. ``check("task2_kv_explain")`` finds that variable in the
notebook's namespace (or takes the answer as a second argument), runs the grader and returns
a :class:`Result`. No grading data lives in the notebook: the notebook only holds answers.

Graders are written against a small :class:`Marks` builder and may raise
:class:`NotAttempted`. Whatever a grader does — including failing itself — ``check`` returns
a Result; it never raises on a student's answer.
"""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from .result import ERROR, GRADED, NOT_ATTEMPTED, Feedback, Result, Summary

_MISSING = object()
FLAG_DOUBT = 0.5  # an explicit flag: the grader knows it cannot judge this
REVIEW_BELOW = 0.7  # confidence under this raises needs_human_review


class NotAttempted(Exception):
    """Raised by a grader when the answer is still the unanswered placeholder (``zh``: the same
    message in Chinese; ``NotAttempted.key("na.empty", name=...)`` builds both from the table)."""

    def __init__(self, text: str = "", zh: str | None = None) -> None:
        super().__init__(text)
        self.zh = zh

    @classmethod
    def key(cls, key: str, **fields) -> "NotAttempted":
        from .messages import both

        return cls(*both(key, **fields))

    def text(self, lang: str) -> str:
        return self.zh if lang == "zh" and self.zh else str(self)


class CannotGrade(Exception):
    """Raised by a grader when something outside the answer is missing (e.g. the engine)."""


class Marks:
    """Collects points and feedback while a grader runs."""

    def __init__(self) -> None:
        self.score = 0.0
        self.bonus = 0.0
        self.feedback: list[Feedback] = []
        self.review = False
        self.doubts: list[tuple[str, float]] = []  # (why, how much) the grader is unsure: see confidence
        self.lang = "en"  # the language of this check's feedback (a grader may follow the answer's)

    def t(self, key: str, **fields) -> str:
        """Message ``key`` of :mod:`messages` in this check's language."""
        from .messages import msg

        return msg(key, self.lang, **fields)

    def ok(self, text: str, points: float = 0.0) -> None:
        self.score += points
        self.feedback.append(Feedback("ok", text))

    def missing(self, text: str) -> None:
        self.feedback.append(Feedback("missing", text))

    def wrong(self, text: str) -> None:
        self.feedback.append(Feedback("wrong", text))

    def warn(self, text: str) -> None:
        self.feedback.append(Feedback("warn", text))

    def info(self, text: str) -> None:
        self.feedback.append(Feedback("info", text))

    def add_bonus(self, text: str, points: float) -> None:
        self.bonus += points
        self.feedback.append(Feedback("bonus", text))

    def flag(self, text: str | None = None, why: str = "unsure") -> None:
        """Raise ``needs_human_review`` (optionally saying why, to the learner in ``text`` and to
        the instructor in ``why``); the confidence drops below the review line."""
        self.review = True
        self.doubt(why, FLAG_DOUBT)
        if text:
            self.feedback.append(Feedback("warn", text))

    def doubt(self, why: str, amount: float) -> None:
        """Lower the confidence by ``amount`` (0..1) for a reason named ``why``; doubts add up,
        and an answer whose confidence falls below :data:`REVIEW_BELOW` is flagged."""
        self.doubts.append((why, amount))

    @property
    def confidence(self) -> float:
        return round(max(0.0, 1.0 - sum(a for _, a in self.doubts)), 2)


@dataclass
class Exercise:
    id: str
    title: str
    section: str  # the chapter section it belongs to, e.g. "§3 KV cache"
    answer_name: str  # the notebook variable that holds the answer
    max_score: float
    grader: Callable[[Any, Marks], None] = field(repr=False)
    bonus_max: float = 0.0
    kind: str = "text"  # text | diagram | quiz | code | engine
    title_zh: str = ""  # the title in Chinese

    def title_in(self, lang: str) -> str:
        return self.title_zh if lang == "zh" and self.title_zh else self.title


EXERCISES: dict[str, Exercise] = {}


def register(id: str, title: str, section: str, max_score: float, answer_name: str | None = None,
             bonus_max: float = 0.0, kind: str = "text", title_zh: str = ""):
    """Decorator: register ``grader(answer, marks)`` as exercise ``id``."""

    def wrap(fn: Callable[[Any, Marks], None]):
        if id in EXERCISES:
            raise ValueError(f"exercise id {id!r} registered twice")
        EXERCISES[id] = Exercise(id, title, section, answer_name or id, max_score, fn, bonus_max, kind, title_zh)
        return fn

    return wrap


def is_unanswered(value: Any) -> bool:
    """None, ``...``, blank strings, empty containers, or containers holding only those."""
    if value is None or value is Ellipsis:
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, dict):
        return all(is_unanswered(v) for v in value.values())
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(is_unanswered(v) for v in value)
    return False


def resolve_id(exercise_id: str) -> str:
    """An exact id, or a unique prefix such as ``"task1"`` or ``"quiz2"``."""
    from .messages import msg

    if not isinstance(exercise_id, str):
        raise KeyError(f"an exercise id is a string such as 'task1_diagram', got {exercise_id!r}")
    key = exercise_id.strip().lower()
    if key in EXERCISES:
        return key
    matches = [k for k in EXERCISES if k.startswith(key + "_") or k.startswith(key)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise KeyError(msg("grade.ambiguous", id=exercise_id, ids=", ".join(matches)))
    raise KeyError(msg("grade.unknown", id=exercise_id, ids=", ".join(EXERCISES)))


def _user_namespace(depth: int = 2) -> dict:
    """The notebook's namespace when running under IPython, else the caller's globals."""
    try:
        from IPython import get_ipython

        ip = get_ipython()
        if ip is not None:
            return ip.user_ns
    except Exception:  # IPython missing or unusable: fall back to the caller's frame
        pass
    return sys._getframe(depth).f_globals


def check(exercise_id: str, answer: Any = _MISSING, *, namespace: dict | None = None,
          lang: str | None = None) -> Result:
    """Grade one exercise.

    ``check("task2_kv_explain")`` reads the variable ``task2_kv_explain`` from the notebook;
    ``check("task2_kv_explain", "my text")`` grades the given answer instead. A unique prefix
    works too (``check("task2")``). Feedback is in the answer's language where it has one, else
    in ``lang`` (default: the notebook's, see :func:`~minillm.grading.set_language`).
    """
    from ..i18n import using
    from .messages import msg

    with using(lang) as lang:
        try:
            ex = EXERCISES[resolve_id(exercise_id)]
        except KeyError as exc:
            text = exc.args[0] if exc.args else str(exc)
            return Result(str(exercise_id), "unknown exercise", 0, 0, ERROR, [Feedback("wrong", text)])
        if answer is _MISSING:
            ns = namespace if namespace is not None else _user_namespace()
            if ex.answer_name not in ns:
                return Result(ex.id, ex.title_in(lang), 0, ex.max_score, NOT_ATTEMPTED, [Feedback(
                    "info", msg("na.no_variable", name=ex.answer_name))], bonus_max=ex.bonus_max, lang=lang)
            answer = ns[ex.answer_name]
        return grade(ex, answer, lang)


def grade(ex: Exercise, answer: Any, lang: str | None = None) -> Result:
    """Run one exercise's grader on an answer; always returns a Result. ``lang`` is the language
    for feedback the answer does not decide (default: the current one)."""
    from ..i18n import using
    from .messages import msg

    with using(lang) as lang:
        marks = Marks()
        marks.lang = lang
        try:
            if is_unanswered(answer):
                raise NotAttempted.key("na.empty", name=ex.answer_name)
            _refuse_huge(ex, answer)
            ex.grader(answer, marks)
        except NotAttempted as exc:
            text = exc.text(lang) or msg("na.empty", name=ex.answer_name)
            return Result(ex.id, ex.title_in(lang), 0, ex.max_score, NOT_ATTEMPTED, [Feedback("info", text)],
                          bonus_max=ex.bonus_max, lang=lang)
        except CannotGrade as exc:
            return Result(ex.id, ex.title_in(lang), 0, ex.max_score, ERROR, marks.feedback + [Feedback("wrong", str(exc))],
                          needs_human_review=True, bonus_max=ex.bonus_max, lang=lang, confidence=0.0,
                          flags=["cannot grade"])
        except Exception as exc:  # a bug in a grader must not take the notebook down
            last = traceback.extract_tb(exc.__traceback__)[-1]
            return Result(ex.id, ex.title_in(lang), 0, ex.max_score, ERROR, marks.feedback + [Feedback(
                "wrong", msg("grade.failed", error=f"{type(exc).__name__}: {exc}",
                             where=f"{last.filename.rsplit('/', 1)[-1]}:{last.lineno}"))],
                needs_human_review=True, bonus_max=ex.bonus_max, lang=lang, confidence=0.0, flags=["grader failed"])
        _flag_copy_of_model(ex, answer, marks)
        _doubt_hidden_characters(ex, answer, marks)
        if ex.kind in ("text", "quiz"):
            from .calibration import near_the_line

            near_the_line(ex.id, answer, marks, ex.max_score)
            _second_opinion(ex, answer, marks)
        score = min(max(marks.score, 0.0), ex.max_score)
        bonus = min(max(marks.bonus, 0.0), ex.bonus_max)
        confidence = marks.confidence
        return Result(ex.id, ex.title_in(lang), score, ex.max_score, GRADED, marks.feedback,
                      marks.review or confidence < REVIEW_BELOW, bonus, ex.bonus_max, lang=lang,
                      confidence=confidence, flags=sorted({why for why, _ in marks.doubts}))


def _flag_copy_of_model(ex: Exercise, answer: Any, marks: Marks) -> None:
    """A text answer that is a near copy of the model answer goes to a person."""
    if ex.kind not in ("text",):
        return
    parts = answer if isinstance(answer, (list, tuple)) else [answer]
    text = " ".join(p if isinstance(p, str) else " ".join(x for x in p if isinstance(x, str))
                    if isinstance(p, (list, tuple)) else "" for p in parts)
    try:
        if close_to_model(ex.id, text):
            marks.flag(marks.t("grade.model_copy"))
    except Exception:  # never let the copy check break grading
        pass


def close_to_model(exercise_id: str, text: str) -> bool:
    """Is ``text`` a near copy of the chapter's model answer to ``exercise_id`` (a full id)?"""
    from rapidfuzz import fuzz

    from .chapter import current

    try:
        models = [current().model_answer(exercise_id, lang) for lang in ("en", "zh")]
    except KeyError:
        return False
    return len(text) >= 30 and any(fuzz.token_set_ratio(text.lower(), model.lower()) >= 88 for model in models)


def _second_opinion(ex: Exercise, answer: Any, marks: Marks) -> None:
    """The instructor's scores of the most similar labelled answers (:mod:`neighbours`): where they
    differ from the rules' score, a person looks. They never change the score."""
    try:
        from .neighbours import second_opinion

        second_opinion(ex.id, answer, marks)
    except Exception:  # a missing or unreadable data file costs the second opinion, never the grade
        pass


HIDDEN_DOUBT = 0.35  # invisible or look-alike characters in a written answer: someone may be hiding a word


#: the most characters a written answer may have before the grader hands it to a person unread:
#: the longest of ~2,300 labelled answers has 583; a 1.4 MB answer cost the grader's own process
#: ~20 CPU-s of matching (per notebook, in a folder run), so one submission could slow every row
MAX_ANSWER_CHARS = 20_000


def _refuse_huge(ex: Exercise, answer: Any) -> None:
    """A written answer longer than ``MAX_ANSWER_CHARS`` is not read: CannotGrade (0, flagged)."""
    if ex.kind in ("text", "quiz", "diagram"):
        from .messages import msg

        size = sum(len(s) for s in _strings(answer))
        if size > MAX_ANSWER_CHARS:
            raise CannotGrade(msg("grade.too_long", chars=size, limit=MAX_ANSWER_CHARS))


def _strings(value, depth: int = 0):
    if isinstance(value, str):
        yield value
    elif depth < 4 and isinstance(value, (list, tuple, dict)):
        for v in (value.items() if isinstance(value, dict) else value):
            yield from _strings(v, depth + 1)


def _doubt_hidden_characters(ex: Exercise, answer: Any, marks: Marks) -> None:
    """Invisible characters or look-alike letters were cleaned out of a written answer before it
    was read: the reading is probably right, but a person should see what was hidden."""
    if ex.kind not in ("text", "quiz", "diagram"):
        return
    from .unicode_clean import tricks

    found = {t for s in _strings(answer) for t in tricks(s[:20000]) if t != "width"}
    if found:
        marks.doubt("hidden characters (" + ", ".join(sorted(found)) + ")", HIDDEN_DOUBT)


def check_all(namespace: dict | None = None, lang: str | None = None) -> Summary:
    """Grade every registered exercise from one namespace (the notebook's by default)."""
    from ..i18n import resolve

    ns = namespace if namespace is not None else _user_namespace()
    return Summary([check(ex_id, namespace=ns, lang=lang) for ex_id in EXERCISES], lang=resolve(lang))


summary = check_all  # the notebook's last cell: summary() shows the table of all exercises
