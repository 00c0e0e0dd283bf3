"""The course's language: one setting for every widget, diagram and plot, and one phrase table
per language.

    from minillm.viz import set_language
    set_language("zh")          # every view made after this speaks Chinese
    RequestStepper(lang="en")   # ... except one that asks for English

Every view takes ``lang=None``; None means the course-wide setting (``get_language()``,
"en" until ``set_language`` is called). The words live in ``PHRASES``, one dict per
language with the same keys, so a label is looked up, never translated on the fly; the
engine's own names (states such as WAITING or DECODE, stop reasons, ``SamplingParams``
fields) stay as the engine spells them in every language.
"""

from __future__ import annotations

LANGUAGES = ("en", "zh")
_current = "en"


def _check(lang) -> str:
    if lang not in LANGUAGES:
        raise ValueError(f"lang must be one of {', '.join(repr(x) for x in LANGUAGES)}, got {lang!r}")
    return lang


def set_language(lang: str) -> None:
    """Set the course-wide language ("en" or "zh") used by every view given ``lang=None``."""
    global _current
    _current = _check(lang)


def get_language() -> str:
    """The course-wide language: "en" until ``set_language`` changes it."""
    return _current


def resolve_lang(lang=None) -> str:
    """``lang`` itself when given (checked), else the course-wide setting."""
    return _current if lang is None else _check(lang)


def phrase(key: str, lang=None, **fields) -> str:
    """The phrase ``key`` in ``lang`` (None: the course-wide language), with ``fields`` filled in."""
    text = PHRASES[resolve_lang(lang)][key]
    return text.format(**fields) if fields else text


EN: dict[str, str] = {}
ZH: dict[str, str] = {}
PHRASES = {"en": EN, "zh": ZH}
