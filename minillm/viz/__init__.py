"""Widgets, diagrams and plots that look inside the engine.

    from minillm.viz import RequestStepper, SamplingExplorer, lifecycle_diagram
    from minillm.viz import set_language; set_language("zh")   # the Chinese edition

Every widget, diagram and plot takes ``lang=None`` ("en" or "zh"; None = the course-wide
setting from ``set_language``).

Every view reads the engine's own state: request objects, ``llm.trace`` events and
``llm.cache_stats()``. Nothing is simulated. Each widget is a thin ``ipywidgets`` layer over
a plain-Python core (``RequestStepperCore``, ``SamplingExplorerCore``) that tests and
notebooks can drive without a browser.

Names are imported lazily, so ``import minillm.viz`` is cheap and a missing optional
dependency (ipywidgets, matplotlib, graphviz) only matters for the object that needs it.
"""

from __future__ import annotations

from .. import _lazy

_LAZY = {
    # diagram.py
    "lifecycle_diagram": "diagram",
    "render_diagram": "diagram",
    "diagram_html": "diagram",
    "diagram_svg": "diagram",
    "DiagramView": "diagram",
    "lifecycle_edges": "diagram",
    "edges_of_events": "diagram",
    "STATE_HOLDS": "diagram",
    "state_holds": "diagram",
    "edge_labels": "diagram",
    # stepper.py (the widget) over stepper_core.py (plain Python, no ipywidgets)
    "RequestStepper": "stepper",
    "RequestStepperCore": "stepper_core",
    "button_labels": "stepper_core",
    # narration.py (engine events in plain words)
    "describe_event": "narration",
    "summarize_action": "narration",
    # sampling_explorer.py (the widget) over sampling_explorer_core.py (plain Python)
    "SamplingExplorer": "sampling_explorer",
    "SamplingExplorerCore": "sampling_explorer_core",
    # conversation.py (the long-chat scenario)
    "run_chat": "conversation",
    "plot_chat_turns": "conversation",
    "conversation_for_turn": "conversation",
    "chat_summary": "conversation",
    # _common.py
    "token_text": "_common",
    "token_pieces": "_common",
    "TokenPiece": "_common",
    # fonts.py (a CJK font for matplotlib figures)
    "figure_fonts": "fonts",
    "find_cjk_font": "fonts",
    "add_cjk_fallback": "fonts",
    # friendly_errors.py (a sentence instead of a traceback, in a notebook)
    "explain": "friendly_errors",
    # i18n.py (the course-wide language)
    "set_language": "i18n",
    "get_language": "i18n",
    "LANGUAGES": "i18n",
}

__all__ = [name for name in sorted(_LAZY)]

try:  # plots/ (KV memory, state timelines, latency, experiments, CacheMonitor), one namespace
    from .plots import *  # noqa: F401,F403
    from . import plots as _plots

    __all__ += [n for n in getattr(_plots, "__all__", []) if n not in __all__]
except ImportError:  # an optional dependency of the plots is missing
    pass

try:  # in a notebook: a repeated walkthrough cell (IllegalTransition) or Kernel -> Interrupt reads as a sentence
    from .friendly_errors import install as _install_friendly_errors

    _install_friendly_errors()
except ImportError:  # pragma: no cover - the engine itself is missing
    pass

__getattr__, __dir__ = _lazy.lazy_names(__name__, _LAZY)
