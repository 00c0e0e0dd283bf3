"""Exercises graded instantly in the notebook and by ``minillm grade``.

    from minillm.grading import check
    check("task2_kv_explain")          # reads the variable task2_kv_explain from the notebook
    check("task2", "my answer")         # or grade an answer given directly; a unique prefix works
    show_solution("task2")             # the model answer, on request (recorded in the notebook)

This package is the machinery (the registry and ``check``, the notebook runner and its sandbox,
reports, review, answer extraction, text matching); the chapter's content, its exercises and
their ids, lives in ``ch04/`` and is registered by the one import below (see ``chapter.py``).

Feedback follows the answer's language (a Chinese answer gets Chinese feedback); code, letters
and numbers have none, so they follow the notebook's: ``set_language("zh")`` in the Chinese
notebook's set-up cell (``minillm grade`` reads ``metadata.minillm.lang`` from the file). The
setting is the course-wide one of :mod:`minillm.i18n`.

The engine's model is loaded only by the check that runs it (``task3_kv_bytes``), and
ipywidgets only when ``DiagramEditor`` is first used.
"""

from __future__ import annotations

from . import ch04 as _chapter  # the registration point: the chapter's exercises, answers and texts
from .ch04 import PRESSURE_SCENARIOS, show_scenarios
from .. import _lazy
from ..i18n import get_language, set_language
from .registry import EXERCISES, Marks, NotAttempted, check, check_all, summary
from .result import Feedback, Result, Summary
from .solutions import show_solution

ORDER = list(_chapter.ORDER)
assert sorted(ORDER) == sorted(EXERCISES), "every registered exercise must have its place in ORDER"
_registered = dict(EXERCISES)
EXERCISES.clear()
EXERCISES.update((k, _registered[k]) for k in ORDER)

__all__ = ["check", "check_all", "summary", "EXERCISES", "ORDER", "Result", "Summary", "Feedback", "Marks",
           "NotAttempted", "DiagramEditor", "cli_grade", "PRESSURE_SCENARIOS", "show_scenarios", "show_solution",
           "set_language", "get_language", "build_it"]


def cli_grade(argv: list[str]) -> int:
    """``minillm grade NOTEBOOK|FOLDER [--json PATH] [--review]``: grade submissions (see ``notebook.py``)."""
    from .notebook import cli_grade as run

    return run(argv)


# ipywidgets is imported only when the editor is used; the build-it track on
# ``from minillm.grading import build_it``
__getattr__, __dir__ = _lazy.lazy_names(__name__, {"DiagramEditor": "diagram_editor", "build_it": "ch04"})
