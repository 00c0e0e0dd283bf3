"""Plots of what the engine itself recorded: KV memory and request states over steps, and the
timings of real engine calls. ``from minillm.viz import plots`` gathers them in one namespace.

Nothing here is simulated. Every number comes from one of three places:

* the engine's trace (``llm.trace``): the ``step`` events carry the pool's used blocks and the
  blocks each request holds, the ``transition`` events carry every state change, the ``token``
  events every sampled token with its time;
* ``llm.cache_stats()``, read live by :class:`CacheMonitor`;
* wall-clock timings of calls the engine really made (``llm.step()`` records each step's
  ``duration``; ``llm.model.full_logits`` is timed directly for the no-cache comparison).

One module per thing you look at, each with a *data* function that returns plain lists and
dicts (checked against the engine in ``tests/test_viz_plots.py``) and ``plot_*`` functions that
draw them and return a matplotlib ``Figure``:

==================  ===============================================================
``kv_memory``       KV bytes per request and in the pool, per step, beside the formula
``state_timeline``  which state every request was in at every step (a Gantt chart)
``latency``         step durations, token arrival times, TTFT and TPOT
``experiments``     timed runs on an idle engine: prefill by prompt length, cache vs recompute
``cache_monitor``   ``CacheMonitor``, the KV chart of a live engine with buttons
``figure``          what they share: the state colours, a pyplot-free figure, byte units
==================  ===============================================================

    from minillm import LLM, SamplingParams
    from minillm.viz import plots

    llm = LLM()
    llm.generate(["Once upon a time", "The little robot"], SamplingParams(max_tokens=30, temperature=0))
    plots.plot_kv_timeline(plots.kv_timeline(llm.trace))      # bytes per request and in total, per step
    plots.plot_state_timeline(plots.state_grid(llm.trace))    # who was WAITING / PREFILL / DECODE when
"""

from __future__ import annotations

from .cache_monitor import CacheMonitor
from .experiments import (measure_cache_vs_recompute, measure_prefill, plot_cache_vs_recompute,
                          plot_prefill_times, random_prompt)
from .figure import STATE_COLORS
from .kv_memory import compare_kv_timelines, kv_timeline, plot_kv_growth, plot_kv_peaks, plot_kv_timeline
from .latency import (plot_step_durations, plot_token_times, plot_ttft_tpot, request_latencies, step_timings,
                      token_times)
from .state_timeline import compare_timelines, plot_state_timeline, shift_grid, state_grid

__all__ = [
    # data from the trace
    "kv_timeline", "state_grid", "step_timings", "request_latencies", "token_times",
    # measurements of real engine calls
    "measure_prefill", "measure_cache_vs_recompute", "random_prompt",
    # plots
    "plot_kv_timeline", "compare_kv_timelines", "plot_kv_growth", "plot_kv_peaks",
    "plot_state_timeline", "compare_timelines", "shift_grid",
    "plot_prefill_times", "plot_step_durations", "plot_token_times", "plot_ttft_tpot",
    "plot_cache_vs_recompute",
    # the widget
    "CacheMonitor",
    # constants
    "STATE_COLORS",
]
