"""The course's language: one setting for the widgets, the plots and the grader's feedback.

    from minillm.i18n import set_language, pick
    set_language("zh")                      # the Chinese edition's set-up cell does this
    pick(en="Prefill", zh="预填充")           # "预填充"; pick(..., lang="en") asks for one language

English is the default until ``set_language`` is called (``minillm.viz.set_language`` and
``minillm.grading.set_language`` are this same function). No environment variable sets it:
``minillm lab --lang zh`` only opens the Chinese edition, whose notebooks call
``set_language("zh")`` themselves. A view or a check given ``lang=...`` uses that one language and
leaves the setting alone. Texts written as a pair sit side by side (:class:`Bi`) so the two
languages cannot drift apart; viz keeps its longer phrase tables in ``viz/i18n.py``.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

LANGS = ("en", "zh")
_current = ["en"]


def check_lang(lang) -> str:
    """``lang`` itself when it is one of :data:`LANGS`; ValueError naming them otherwise."""
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {', '.join(map(repr, LANGS))}, got {lang!r}")
    return lang


def set_language(lang: str) -> None:
    """Make ``lang`` ("en" or "zh") the course-wide language."""
    _current[0] = check_lang(lang)


def get_language() -> str:
    """The course-wide language: "en" until :func:`set_language` changes it."""
    return _current[0]


def resolve(lang: str | None = None) -> str:
    """``lang`` when given (checked), else the course-wide language."""
    return _current[0] if lang is None else check_lang(lang)


@contextmanager
def using(lang: str | None):
    """Within the block, ``lang`` (when given) is the course-wide language; then the old one again."""
    old = _current[0]
    _current[0] = resolve(lang)
    try:
        yield _current[0]
    finally:
        _current[0] = old


def pick(en: str, zh: str, lang: str | None = None) -> str:
    """``zh`` in Chinese, else ``en`` (``lang``: None for the course-wide language)."""
    return zh if resolve(lang) == "zh" else en


@dataclass(frozen=True)
class Bi:
    """One text in both languages; calling it picks one and fills in its ``{fields}``."""

    en: str
    zh: str

    def __call__(self, lang: str | None = None, **fields) -> str:
        text = pick(self.en, self.zh, lang)
        return text.format(**fields) if fields else text
