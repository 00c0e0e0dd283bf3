"""Chapter 04's exercises: what is graded, in which order, with which model answers.

Exercise ids (stable; the notebook lists them):

    task1_diagram, task2_kv_explain, task3_pressure, task3_kv_bytes, task4_sampling,
    quiz1_live_requests, quiz2_kv_tradeoff, quiz3_sampling_interface, quiz4_states_before_batching,
    quiz5_debug_by_request, quiz6_key_table_decode, quiz7_scheduling_states,
    pitfall1_kv_not_hit_cache, pitfall2_sampling_not_ui, pitfall3_one_lifecycle,
    code_top_p, code_kv_bytes, code_stop_check, code_chat_kv, task5_trim_policy, task6_gpu_capacity

The content lives here: the lifecycle diagram task (``lifecycle``), the written tasks, quiz and
pitfalls (``texts``, ``ideas``), the code graders (``coding``, ``capacity``), the model answers
(``solutions``), the feedback lines (``messages``), the notebook's own text
(``exercise_notebook``) and the build-it track (``build_it``, ``programs``). Importing this
package registers all of it with the machinery in :mod:`minillm.grading` (see ``chapter.py``).
"""

from __future__ import annotations

from pathlib import Path

from .. import chapter
from . import messages as _messages  # noqa: F401  (the chapter's feedback lines join the table)
from . import lifecycle as _lifecycle  # noqa: F401  (registers task 1)
from . import texts as _texts  # noqa: F401  (registers tasks 2-5, quiz, pitfalls)
from . import coding as _coding  # noqa: F401  (registers the coding tasks and task 3's byte count)
from . import capacity as _capacity  # noqa: F401  (registers task 6, requests in GPU memory)
from .coding import FORBIDDEN, PRESSURE_SCENARIOS, prepare, show_scenarios
from .lifecycle import RESOURCE_NOTES
from .solutions import model_answer, model_texts

# the order of the notebook (and of reports)
ORDER = ("task1_diagram", "task2_kv_explain", "task3_pressure", "task3_kv_bytes", "task4_sampling",
         "quiz1_live_requests", "quiz2_kv_tradeoff", "quiz3_sampling_interface", "quiz4_states_before_batching",
         "quiz5_debug_by_request", "quiz6_key_table_decode", "quiz7_scheduling_states",
         "pitfall1_kv_not_hit_cache", "pitfall2_sampling_not_ui", "pitfall3_one_lifecycle",
         "code_top_p", "code_kv_bytes", "code_stop_check", "code_chat_kv", "task5_trim_policy",
         "task6_gpu_capacity")

# where every text a learner reads while answering is written (copy detection reads their literals)
SHOWN_MODULES = tuple(f"{__name__}.{m}" for m in ("texts", "ideas", "messages", "exercise_notebook"))


def idea_labels() -> list[str]:
    """How feedback names an idea the answer already has ("you say that …")."""
    from ..concepts import Idea
    from . import ideas

    return [s for v in vars(ideas).values() if isinstance(v, Idea) for s in (v.label_en, v.label_zh)]


chapter.use(chapter.Chapter(
    name="ch04", order=ORDER, model_answer=model_answer, model_texts=model_texts, shown_modules=SHOWN_MODULES,
    idea_labels=idea_labels, pattern_modules=(f"{__name__}.ideas", f"{__name__}.texts"), prepare=prepare, forbidden=FORBIDDEN,
    diagram_exercise="task1_diagram", diagram_file="ch04_task1_diagram.json", diagram_notes=RESOURCE_NOTES,
    neighbours_file=str(Path(__file__).with_name("neighbours.json.gz"))))

__all__ = ["ORDER", "PRESSURE_SCENARIOS", "show_scenarios"]
