"""Which language the grader's feedback is in: the answer's own, or the notebook's.

A written answer carries its language (Chinese characters or English words); feedback on it
follows it. Code, a letter or a number carries none, so those are answered in the notebook's
language: the Chinese exercises notebook says ``set_language("zh")`` in its set-up cell (and
``minillm grade`` reads ``metadata.minillm.lang`` from the notebook file). English is the
default.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

LANGS = ("en", "zh")
_current = ["en"]


def _checked(lang) -> str:
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {', '.join(map(repr, LANGS))}, got {lang!r}")
    return lang


def set_language(lang: str) -> None:
    """Make ``lang`` ("en" or "zh") the language of feedback that has no language of its own
    (code, letters, numbers, empty answers); a written answer is still answered in its own."""
    _current[0] = _checked(lang)


def get_language() -> str:
    return _current[0]


def resolve(lang: str | None) -> str:
    """``lang`` when given (checked), else the notebook's language."""
    return get_language() if lang is None else _checked(lang)


@contextmanager
def using(lang: str | None):
    """Within the block, ``lang`` (when given) is the current language; then the old one again."""
    old = _current[0]
    _current[0] = resolve(lang)
    try:
        yield _current[0]
    finally:
        _current[0] = old


def answer_language(text: str, fallback: str | None = None) -> str:
    """The language of a written answer; ``fallback`` (default: the notebook's) when the text
    has neither Chinese characters nor English words to go by."""
    from .concepts import cjk_chars, language, latin_words

    if not text or not (cjk_chars(text) or latin_words(text)):
        return resolve(fallback)
    return language(text)


@dataclass(frozen=True)
class Bi:
    """One text in both languages, side by side so they cannot drift apart."""

    en: str
    zh: str

    def __call__(self, lang: str | None = None, **fields) -> str:
        text = self.zh if resolve(lang) == "zh" else self.en
        return text.format(**fields) if fields else text
