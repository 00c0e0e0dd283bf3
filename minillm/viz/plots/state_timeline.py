"""Request states over steps: who was WAITING, in PREFILL, in DECODE, PREEMPTED, when.

:func:`state_grid` turns the trace's ``transition`` events (through
``minillm.trace.state_intervals``) into one cell per request per step; the charts draw it as a
Gantt chart, one row per request, so batching, preemption and release can be seen at a glance.
"""

from __future__ import annotations

from ... import trace as tracemod
from ..fonts import with_cjk_fonts
from ..i18n import phrase, resolve_lang
from .figure import STATE_COLORS, events_of, integer_ticks, new_figure

__all__ = ["state_grid", "plot_state_timeline", "shift_grid", "compare_timelines"]


def state_grid(source) -> dict[str, dict]:
    """What every request was doing at every step, from ``minillm.trace.state_intervals``.

    For each request id (in arrival order)::

        cells       [(step, state)] for each step from its arrival to its release:
                    PREFILL  if it was (re)admitted and prefilled in that step,
                    PREEMPTED if it lost its blocks in that step or was still waiting to be
                             recomputed,
                    otherwise the state it was in when the step began (WAITING, DECODE,
                    FINISHED-but-not-released; NEW if never queued)
        finished    (step, stop_reason) or None
        released    step (the request's blocks went back during or just after it) or None
        preempted   steps in which it was preempted
        prompt_tokens

    A request that decoded in step s and then stopped has DECODE at s and ``finished`` at s.
    """
    events = events_of(source)
    intervals = tracemod.state_intervals(events)
    last_step = max((e.step for e in events if e.kind == "step"), default=0)
    last_step = max([last_step] + [e.step for e in events])
    prompt_tokens = {e.request_id: e.data.get("prompt_tokens") for e in events
                     if e.kind == "transition" and e.data.get("to") == "WAITING"}
    stops = {e.request_id: (e.step, e.data.get("stop_reason")) for e in events
             if e.kind == "transition" and e.data.get("to") == "FINISHED"}
    grid: dict[str, dict] = {}
    for rid, spans in intervals.items():
        released = next((a for st, a, _ in spans if st == "RELEASED"), None)
        prefill_steps = {a for st, a, _ in spans if st == "PREFILL"}
        preempt_steps = [a for st, a, _ in spans if st == "PREEMPTED"]
        first = spans[0][1] + 1
        end = released if released is not None else last_step
        cells = []
        for s in range(first, end + 1):
            if s in prefill_steps:
                state = "PREFILL"
            elif s in preempt_steps:
                state = "PREEMPTED"
            else:
                before = [st for st, a, _ in spans if a < s]
                state = before[-1] if before else spans[0][0]
                if state == "RELEASED":
                    break
            cells.append((s, state))
        grid[rid] = {"cells": cells, "finished": stops.get(rid), "released": released,
                     "preempted": preempt_steps, "prompt_tokens": prompt_tokens.get(rid)}
    return grid


@with_cjk_fonts
def plot_state_timeline(grid: dict[str, dict], *, ax=None, title: str | None = None,
                        show_reasons: bool = True, max_requests: int = 40, lang=None):
    """A Gantt chart: one row per request, one column per step, coloured by state.

    FINISHED shows as a green end cap on the step where the request stopped (green cells
    after it mean it finished but still held its blocks), RELEASED as a black bar where its
    blocks went back, PREEMPTED as red cells. The stop reason is written after the row."""
    lang = resolve_lang(lang)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ids = list(grid)[:max_requests]
    fig = None
    if ax is None:
        fig, axes = new_figure(9.0, max(1.8, 0.38 * len(ids) + 1.2))
        ax = axes[0][0]
    if not ids:
        ax.text(0.5, 0.5, phrase('plot.no_requests', lang), ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel(phrase('plot.engine_step', lang))
        return fig or ax.figure
    xmax = 1
    all_steps = [s for rid in ids for s, _ in grid[rid]["cells"]] or [0]
    span = max(all_steps) - min(all_steps) + 1
    cap = max(0.3, 0.008 * span)  # the FINISHED cap stays visible on long timelines
    for row, rid in enumerate(ids):
        g = grid[rid]
        runs: list[list] = []
        for s, state in g["cells"]:
            if runs and runs[-1][0] == state and runs[-1][2] == s:
                runs[-1][2] = s + 1
            else:
                runs.append([state, s, s + 1])
        for state, a, b in runs:
            ax.broken_barh([(a - 0.5, b - a)], (row - 0.38, 0.76),
                           facecolors=STATE_COLORS.get(state, "#cccccc"), edgecolor="white", linewidth=0.4)
            xmax = max(xmax, b)
        if g["finished"] is not None:
            fs, reason = g["finished"]
            ax.broken_barh([(fs + 0.5 - cap, cap)], (row - 0.38, 0.76), facecolors=STATE_COLORS["FINISHED"])
            if show_reasons and reason:
                end = (g["released"] if g["released"] is not None else fs) + 0.5
                ax.annotate(reason, (end, row), xytext=(4, 0), textcoords="offset points", va="center",
                            fontsize=7, color="#333333")
            xmax = max(xmax, fs + 1)
        if g["released"] is not None:
            x = g["released"] + 0.5
            ax.plot([x, x], [row - 0.45, row + 0.45], color=STATE_COLORS["RELEASED"], linewidth=2.2)
        for p in g["preempted"]:
            ax.plot([p], [row], marker="v", color="white", markersize=4)
    ax.set_yticks(range(len(ids)))
    labels = []
    for rid in ids:
        n = grid[rid]["prompt_tokens"]
        labels.append(phrase('plot.req', lang, rid=rid) + (phrase('plot.n_tok', lang, n=n) if n is not None else ""))
    ax.set_yticklabels(labels, fontsize=8)
    ax.set_ylim(len(ids) - 0.5, -0.5)
    xmin = min(all_steps) - 0.5
    ax.set_xlim(xmin, xmax + 0.5 + (1.5 + 0.12 * (xmax - xmin) if show_reasons else 0))
    integer_ticks(ax)
    ax.set_xlabel(phrase('plot.engine_step', lang))
    ax.grid(axis="x", alpha=0.25)
    ax.set_axisbelow(True)
    handles = [Patch(color=STATE_COLORS[s], label=s) for s in ("WAITING", "PREFILL", "DECODE", "PREEMPTED",
                                                               "FINISHED")]
    handles.append(Line2D([], [], color=STATE_COLORS["RELEASED"], linewidth=2.2, label="RELEASED"))
    ax.legend(handles=handles, fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(title or phrase('states.title', lang))
    return fig or ax.figure


def shift_grid(grid: dict[str, dict], first_step: int = 1) -> dict[str, dict]:
    """The same grid with steps renumbered so that its earliest step is ``first_step``
    (to compare runs made at different points of an engine's life)."""
    steps = [s for g in grid.values() for s, _ in g["cells"]]
    steps += [g["finished"][0] for g in grid.values() if g["finished"]]
    if not steps:
        return grid
    d = first_step - min(steps)
    return {r: {**g, "cells": [(s + d, st) for s, st in g["cells"]],
                "finished": (g["finished"][0] + d, g["finished"][1]) if g["finished"] else None,
                "released": g["released"] + d if g["released"] is not None else None,
                "preempted": [p + d for p in g["preempted"]]}
            for r, g in grid.items()}


@with_cjk_fonts
def compare_timelines(grids: dict[str, dict[str, dict]], *, title: str | None = None, relative: bool = True, lang=None):
    """Several state timelines stacked on one step scale (e.g. static vs continuous batching).
    With ``relative`` (default) each run's steps are counted from its own first step."""
    lang = resolve_lang(lang)
    n_rows = [max(len(g), 1) for g in grids.values()]
    from matplotlib.figure import Figure

    fig = Figure(figsize=(9.0, 0.36 * sum(n_rows) + 1.4 * len(grids)), layout="constrained")
    axes = fig.subplots(len(grids), 1, gridspec_kw={"height_ratios": n_rows}, squeeze=False)[:, 0]
    for ax, (name, grid) in zip(axes, grids.items()):
        plot_state_timeline(shift_grid(grid) if relative else grid, ax=ax, title=name, lang=lang)
        if relative:
            ax.set_xlabel(phrase('states.relative', lang))
    lo = min(ax.get_xlim()[0] for ax in axes)
    hi = max(ax.get_xlim()[1] for ax in axes)
    for ax in axes:
        ax.set_xlim(lo, hi)
    if title:
        fig.suptitle(title)
    return fig
