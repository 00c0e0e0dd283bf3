"""Exercises for chapter 04, graded instantly in the notebook and by ``minillm grade``.

    from minillm.grading import check
    check("task2_kv_explain")          # reads the variable task2_kv_explain from the notebook
    check("task2", "my answer")         # or grade an answer given directly; a unique prefix works
    show_solution("task2")             # the model answer, on request (recorded in the notebook)

Exercise ids (stable; the notebook lists them):

    task1_diagram, task2_kv_explain, task3_pressure, task3_kv_bytes, task4_sampling,
    quiz1_live_requests, quiz2_kv_tradeoff, quiz3_sampling_interface, quiz4_states_before_batching,
    quiz5_debug_by_request, quiz6_key_table_decode, quiz7_scheduling_states,
    pitfall1_kv_not_hit_cache, pitfall2_sampling_not_ui, pitfall3_one_lifecycle,
    code_top_p, code_kv_bytes, code_stop_check, code_chat_kv, task5_trim_policy, task6_gpu_capacity

Feedback follows the answer's language (a Chinese answer gets Chinese feedback); code, letters
and numbers have none, so they follow the notebook's: ``set_language("zh")`` in the Chinese
notebook's set-up cell (``minillm grade`` reads ``metadata.minillm.lang`` from the file).

The engine's model is loaded only by the check that runs it (``task3_kv_bytes``), and
ipywidgets only when ``DiagramEditor`` is first used.
"""

from __future__ import annotations

from . import diagram as _diagram  # noqa: F401  (registers task 1)
from . import texts as _texts  # noqa: F401  (registers tasks 2-4, quiz, pitfalls)
from . import coding as _coding  # noqa: F401  (registers the coding tasks and task 3's byte count)
from . import capacity as _capacity  # noqa: F401  (registers task 6, requests in GPU memory)
from .coding import PRESSURE_SCENARIOS, show_scenarios
from .language import get_language, set_language
from .registry import EXERCISES, Marks, NotAttempted, check, check_all, summary
from .result import Feedback, Result, Summary
from .solutions import show_solution

# the order of the notebook (and of reports)
ORDER = ["task1_diagram", "task2_kv_explain", "task3_pressure", "task3_kv_bytes", "task4_sampling",
         "quiz1_live_requests", "quiz2_kv_tradeoff", "quiz3_sampling_interface", "quiz4_states_before_batching",
         "quiz5_debug_by_request", "quiz6_key_table_decode", "quiz7_scheduling_states",
         "pitfall1_kv_not_hit_cache", "pitfall2_sampling_not_ui", "pitfall3_one_lifecycle",
         "code_top_p", "code_kv_bytes", "code_stop_check", "code_chat_kv", "task5_trim_policy",
         "task6_gpu_capacity"]
assert sorted(ORDER) == sorted(EXERCISES), "every registered exercise must have its place in ORDER"
_registered = dict(EXERCISES)
EXERCISES.clear()
EXERCISES.update((k, _registered[k]) for k in ORDER)

__all__ = ["check", "check_all", "summary", "EXERCISES", "ORDER", "Result", "Summary", "Feedback", "Marks",
           "NotAttempted", "DiagramEditor", "cli_grade", "PRESSURE_SCENARIOS", "show_scenarios", "show_solution",
           "set_language", "get_language"]


def cli_grade(argv: list[str]) -> int:
    """``minillm grade NOTEBOOK|FOLDER [--json PATH] [--review]``: grade submissions (see ``notebook.py``)."""
    from .notebook import cli_grade as run

    return run(argv)


def __getattr__(name: str):
    if name == "DiagramEditor":  # ipywidgets is imported only when the editor is used
        from .diagram_editor import DiagramEditor

        return DiagramEditor
    raise AttributeError(f"module 'minillm.grading' has no attribute {name!r}")
