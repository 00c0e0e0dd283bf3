"""Which language the grader's feedback is in: the answer's own, or the notebook's (the course-wide
setting of :mod:`minillm.i18n`, re-exported here).

A written answer carries its language (Chinese characters or English words); feedback on it
follows it. Code, a letter or a number carries none, so those are answered in the notebook's
language: the Chinese exercises notebook says ``set_language("zh")`` in its set-up cell (and
``minillm grade`` reads ``metadata.minillm.lang`` from the notebook file). English is the
default.
"""

from __future__ import annotations

from ..i18n import LANGS, Bi, get_language, resolve, set_language, using

__all__ = ["LANGS", "Bi", "answer_language", "get_language", "resolve", "set_language", "using"]


def answer_language(text: str, fallback: str | None = None) -> str:
    """The language of a written answer; ``fallback`` (default: the notebook's) when the text
    has neither Chinese characters nor English words to go by."""
    from .concepts import cjk_chars, language, latin_words

    if not text or not (cjk_chars(text) or latin_words(text)):
        return resolve(fallback)
    return language(text)
