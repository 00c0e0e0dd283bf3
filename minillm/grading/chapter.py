"""The one seam between the grading machinery and a chapter's content.

The machinery (``check``, ``minillm grade``, the sandbox, copy detection, ``show_solution``) is
the same for any chapter; what differs (the exercises, their order, the model answers, the texts
a learner reads, the engine functions a coding task must not call) is handed over here, once,
by the chapter's package (``ch04/__init__.py`` calls :func:`use`). Nothing in the machinery
imports a chapter: ``minillm/grading/__init__.py`` imports ``ch04`` and that import registers it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable


@dataclass(frozen=True)
class Chapter:
    name: str
    order: tuple[str, ...]  # the exercise ids in the notebook's order (and the reports')
    model_answer: Callable[[str, str], str]  # (exercise id, lang) -> the model answer; KeyError if none
    model_texts: Callable[[], list[str]]  # every model answer, both languages (copy detection)
    shown_modules: tuple[str, ...]  # modules whose string literals the notebook or its feedback show
    idea_labels: Callable[[], list[str]]  # how feedback names an idea an answer already has
    pattern_modules: tuple[str, ...]  # modules whose patterns are the words the text graders know
    prepare: Callable[[bool], None]  # import (and, when asked, load the engine) before student code runs
    diagram_exercise: str  # the exercise the notebook's DiagramEditor answers (its Check button)
    diagram_file: str  # where the notebook's diagram editor saves its drawing, next to the notebook
    diagram_notes: dict[str, tuple[str, ...]]  # lang -> the editor's choices for what a state holds
    forbidden: dict[str, tuple[str, ...]] = field(default_factory=dict)  # answer name -> engine functions
    neighbours_file: str = ""  # the second reader's labelled n-grams (neighbours.py); "" = no second reader


_CHAPTER: list[Chapter] = []


def use(chapter: Chapter) -> None:
    """Make ``chapter`` the one the machinery grades (called once, by the chapter's package)."""
    _CHAPTER[:] = [chapter]


def current() -> Chapter:
    """The registered chapter; importing :mod:`minillm.grading` registers it."""
    if not _CHAPTER:
        raise RuntimeError("no chapter registered: import minillm.grading first")
    return _CHAPTER[0]
