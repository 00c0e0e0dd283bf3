"""Plots of what the engine itself recorded: KV memory and request states over steps, and the
timings of real engine calls.

Nothing here is simulated. Every number comes from one of three places:

* the engine's trace (``llm.trace``): the ``step`` events carry the pool's used blocks and the
  blocks each request holds, the ``transition`` events carry every state change, the ``token``
  events every sampled token with its time;
* ``llm.cache_stats()``, read live by :class:`CacheMonitor`;
* wall-clock timings of calls the engine really made (``llm.step()`` records each step's
  ``duration``; ``llm.model.full_logits`` is timed directly for the no-cache comparison).

Each plot has two halves: a *data* function that returns plain lists and dicts (checked against
the engine in ``tests/test_viz_plots.py``) and a ``plot_*`` function that draws them and returns a
matplotlib ``Figure``. Figures are built without ``pyplot``, so they work on any backend (Agg
included) and a notebook shows each one exactly once: return it from a cell, or call
``fig.savefig(...)``.

    from minillm import LLM, SamplingParams
    from minillm.viz.plots import kv_timeline, plot_kv_timeline, state_grid, plot_state_timeline

    llm = LLM()
    llm.generate(["Once upon a time", "The little robot"], SamplingParams(max_tokens=30, temperature=0))
    plot_kv_timeline(kv_timeline(llm.trace))      # bytes per request and in total, per step
    plot_state_timeline(state_grid(llm.trace))    # who was WAITING / PREFILL / DECODE when
"""

from __future__ import annotations

import io
import math
import random
import statistics
import time
from typing import Iterable, Sequence

from .. import trace as tracemod
from .fonts import with_cjk_fonts
from .i18n import MONO_STACK, phrase, resolve_lang

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

# One colour per state, shared by every plot (and close to the lifecycle diagram's palette).
STATE_COLORS = {
    "NEW": "#e0e0e0",
    "WAITING": "#b8b8b8",
    "PREFILL": "#f28e2b",
    "DECODE": "#4e79a7",
    "PREEMPTED": "#e15759",
    "FINISHED": "#59a14f",
    "RELEASED": "#222222",
}
# Requests get colours that no state uses (no orange, blue, green, red or grey), so a request's
# band in a memory chart is never mistaken for a state in the timeline next to it.
_REQUEST_COLORS = ["#8e6bbf", "#17a2a2", "#c26b9a", "#8c6d31", "#6b8e23", "#d4a017", "#6a3d9a",
                   "#b5651d", "#66c2a5", "#a05195", "#7a9e9f", "#bc5090"]


# ---------------------------------------------------------------------------------------------
# small helpers
# ---------------------------------------------------------------------------------------------

def _events(source):
    """Accept an ``LLM`` (its trace is read) or a list of events."""
    return source.trace if hasattr(source, "trace") and hasattr(source, "step") else list(source)


def _new_figure(width=8.0, height=3.6, ncols=1, nrows=1, **kw):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def _byte_unit(max_bytes: float) -> tuple[float, str]:
    if max_bytes >= 1024 ** 3:
        return 1024.0 ** 3, "GiB"
    if max_bytes >= 1024 ** 2:
        return 1024.0 ** 2, "MiB"
    if max_bytes >= 1024:
        return 1024.0, "KiB"
    return 1.0, "B"


def _fmt_bytes(n: float) -> str:
    div, unit = _byte_unit(n)
    return f"{n:.0f} B" if unit == "B" else f"{n / div:.1f} {unit}"


def _integer_ticks(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _request_color(i: int) -> str:
    return _REQUEST_COLORS[i % len(_REQUEST_COLORS)]


def _order_requests(ids: Iterable[str]) -> list[str]:
    """Request ids in a natural order: numbers numerically, then the rest alphabetically."""
    ids = list(dict.fromkeys(ids))
    return sorted(ids, key=lambda r: (0, int(r), "") if str(r).isdigit() else (1, 0, str(r)))


# ---------------------------------------------------------------------------------------------
# KV memory over steps
# ---------------------------------------------------------------------------------------------

def kv_timeline(source) -> list[dict]:
    """KV memory after every engine step, per request and in total, from the trace alone.

    One sample per ``step`` event (what ``minillm.trace.kv_usage`` reads), plus one for every
    request released *between* steps (``llm.cancel`` or ``llm.release`` called from outside), so
    a cancel shows up at the moment it happened rather than at the next step. Each sample::

        step            the engine step it belongs to (between-step samples: the last step)
        x               where to draw it: the step number, or step + 0.5 between steps
        kind            "step", or "cancel" / "release" for a between-step release
        request_id      the request released (between-step samples), else None
        used_blocks     blocks in use in the pool (what cache_stats().used_blocks said then)
        used_bytes      used_blocks x block_size x bytes_per_token (block-granular)
        per_request_blocks / per_request_bytes   blocks / bytes each request held
        per_request_tokens    tokens whose K and V each request had in the cache (requests that
                        arrived before the trace was last cleared are left out)
        formula_bytes   sum of tokens x bytes_per_token: the formula, without block rounding
        block_size, bytes_per_token, total_blocks
        exact           False only for a between-step sample in a trace with prefix-cache hits:
                        its pool total is the previous total minus the blocks the request held,
                        which is exact unless one of them was shared with a live request (a
                        shared block does not go back to the pool)

    ``per_request_tokens``: after a step, a request has the keys and values of every token
    except the one it just sampled (that one is written by its next decode), so it holds
    ``prompt + outputs - 1`` tokens; its blocks are ``ceil(tokens / block_size)``.
    """
    events = _events(source)
    steps_with_event = {e.step for e in events if e.kind == "step"}
    prompt_tokens: dict[str, int] = {}
    outputs: dict[str, int] = {}
    stop_reason: dict[str, str] = {}
    any_prefix_hit = False
    samples: list[dict] = []
    last: dict | None = None
    for e in events:
        if e.kind == "token":
            outputs[e.request_id] = outputs.get(e.request_id, 0) + 1
        elif e.kind == "transition":
            to = e.data["to"]
            if to == "WAITING":
                prompt_tokens[e.request_id] = e.data.get("prompt_tokens", 0)
            elif to == "PREFILL" and e.data.get("cached_tokens"):
                any_prefix_hit = True
            elif to == "FINISHED":
                stop_reason[e.request_id] = e.data.get("stop_reason")
            elif to == "RELEASED" and last is not None and e.request_id in last["per_request_blocks"] \
                    and (last["step"] == e.step or e.step not in steps_with_event):
                # released after the last step's snapshot, with no step of its own to follow:
                # a between-step release (cancel / release called from outside the engine loop)
                per = dict(last["per_request_blocks"])
                freed = per.pop(e.request_id)
                used = max(last["used_blocks"] - e.data.get("blocks", freed), 0)
                kind = "cancel" if stop_reason.get(e.request_id) == "CANCELLED" else "release"
                last = _kv_sample(e.step, e.step + 0.5, kind, e.request_id, used, per, last,
                                  prompt_tokens, outputs, exact=not any_prefix_hit)
                samples.append(last)
        elif e.kind == "step":
            d = e.data
            last = _kv_sample(e.step, float(e.step), "step", None, d["used_blocks"], dict(d["kv_blocks"]),
                              d, prompt_tokens, outputs, exact=True)
            samples.append(last)
    return samples


def _kv_sample(step, x, kind, request_id, used_blocks, per_blocks, geometry, prompt_tokens, outputs,
               exact):
    bs, bpt = geometry["block_size"], geometry["bytes_per_token"]
    # a request whose WAITING event is not in this trace (it was cleared) has no known token count
    tokens = {r: prompt_tokens[r] + outputs.get(r, 0) - 1 for r, n in per_blocks.items()
              if n > 0 and r in prompt_tokens}
    return {
        "step": step, "x": x, "kind": kind, "request_id": request_id,
        "used_blocks": used_blocks, "used_bytes": used_blocks * bs * bpt,
        "per_request_blocks": per_blocks,
        "per_request_bytes": {r: n * bs * bpt for r, n in per_blocks.items()},
        "per_request_tokens": tokens,
        "formula_bytes": sum(tokens.values()) * bpt,
        "block_size": bs, "bytes_per_token": bpt, "total_blocks": geometry["total_blocks"],
        "exact": exact,
    }


@with_cjk_fonts
def plot_kv_timeline(samples: Sequence[dict], *, ax=None, title: str | None = None,
                     show_formula: bool = True, capacity: bool | None = None, mark_events: bool = True,
                     marks: Sequence[tuple[float, str]] = (), ymax_bytes: int | None = None, lang=None):
    """Stacked KV bytes per request over steps, the pool's total on top, and the formula beside it.

    The coloured bands are the bytes each request's blocks take (what the allocator reserved);
    the black line is the pool's used bytes; the dashed line is tokens x bytes_per_token, what
    the cache would take if memory came in tokens rather than whole blocks. Between-step
    releases (cancel, release) appear half a step after the step they followed.
    ``capacity``: draw the pool's size (default: only when it is less than 4x the peak).
    ``marks``: extra ``(x, label)`` vertical lines. ``ymax_bytes``: fix the y scale (to compare
    several charts)."""
    lang = resolve_lang(lang)
    fig = None
    if ax is None:
        fig, axes = _new_figure(8.5, 3.8)
        ax = axes[0][0]
    ax.set_xlabel(phrase('plot.engine_step', lang))
    if not samples:
        ax.text(0.5, 0.5, phrase('plot.no_steps', lang), ha="center", va="center", transform=ax.transAxes)
        return fig or ax.figure
    peak = max(_kv_peak(samples), ymax_bytes or 0)
    total_bytes = samples[-1]["total_blocks"] * samples[-1]["block_size"] * samples[-1]["bytes_per_token"]
    if capacity is None:
        capacity = total_bytes <= 4 * max(peak, 1)
    top = max(peak, total_bytes if capacity else 0, 1)
    div, unit = _byte_unit(top)
    xs = [s["x"] for s in samples] + [samples[-1]["x"] + 1]
    ids = _order_requests(r for s in samples for r in s["per_request_blocks"])
    lower = [0.0] * len(samples)
    for i, rid in enumerate(ids):
        vals = [s["per_request_bytes"].get(rid, 0) / div for s in samples]
        upper = [a + b for a, b in zip(lower, vals)]
        ax.fill_between(xs, lower + lower[-1:], upper + upper[-1:], step="post", color=_request_color(i),
                        alpha=0.75, linewidth=0, label=phrase('plot.request', lang, rid=rid) if len(ids) <= 12 else None)
        lower = upper
    used = [s["used_bytes"] / div for s in samples]
    ax.step(xs, used + used[-1:], where="post", color="black", linewidth=1.6,
            label=phrase('kv.pool_line', lang))
    if show_formula:
        formula = [s["formula_bytes"] / div for s in samples]
        ax.step(xs, formula + formula[-1:], where="post", color="black", linestyle="--", linewidth=1.1,
                label=phrase('kv.formula_line', lang))
    if capacity:
        ax.axhline(total_bytes / div, color="#999999", linestyle=":", linewidth=1.2,
                   label=phrase('kv.pool_size', lang, n=samples[-1]['total_blocks']))
    if mark_events:
        for s in samples:
            if s["kind"] in ("cancel", "release"):
                ax.axvline(s["x"], color="#e15759" if s["kind"] == "cancel" else "#59a14f",
                           linestyle=":", linewidth=1.3)
                ax.annotate(phrase(f"kv.mark_{s['kind']}", lang, rid=s["request_id"]), (s["x"], top / div), xytext=(3, -10),
                            textcoords="offset points", fontsize=8, va="top")
    for x, label in marks:
        ax.axvline(x, color="#666666", linestyle=":", linewidth=1.0)
        ax.annotate(label, (x, top / div), xytext=(3, -10), textcoords="offset points", fontsize=8, va="top")
    ax.set_ylim(0, top / div * 1.08)
    ax.set_xlim(xs[0] - 0.5 if xs[0] > 0 else 0, xs[-1])
    _integer_ticks(ax)
    ax.set_ylabel(phrase('kv.ylabel', lang, unit=unit))
    ax.set_title(title or phrase('kv.title', lang, bpt=samples[-1]['bytes_per_token'], bs=samples[-1]['block_size']))
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return fig or ax.figure


@with_cjk_fonts
def compare_kv_timelines(runs: dict[str, Sequence[dict]], *, title: str | None = None,
                         marks: Sequence[tuple[float, str]] | dict[str, Sequence[tuple[float, str]]] = (),
                         lang=None, **kwargs):
    """Several KV timelines side by side on one y scale (e.g. a leaky cancel vs a real one).
    ``marks``: ``(x, label)`` lines for every panel, or a dict run name -> marks.
    Extra keyword arguments go to :func:`plot_kv_timeline`."""
    lang = resolve_lang(lang)
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.0 * len(runs) + 1.5, 3.8), layout="constrained")
    axes = fig.subplots(1, len(runs), squeeze=False)[0]
    top = max([_kv_peak(samples) for samples in runs.values()] + [1])
    for ax, (name, samples) in zip(axes, runs.items()):
        run_marks = marks.get(name, ()) if isinstance(marks, dict) else marks
        plot_kv_timeline(samples, ax=ax, title=name, marks=run_marks, ymax_bytes=top, lang=lang, **kwargs)
        legend = ax.get_legend()
        if legend is not None and ax is not axes[-1]:
            legend.remove()
    if title:
        fig.suptitle(title)
    return fig


def _kv_peak(samples: Sequence[dict]) -> int:
    return max([max(s["used_bytes"], sum(s["per_request_bytes"].values())) for s in samples] + [0])


@with_cjk_fonts
def plot_kv_growth(samples: Sequence[dict], request_id: str, *, ax=None, title: str | None = None, lang=None):
    """One request's KV bytes against the tokens it holds: the formula's straight line
    (tokens x bytes_per_token) and the allocator's staircase (whole blocks)."""
    lang = resolve_lang(lang)
    fig = None
    if ax is None:
        fig, axes = _new_figure(7.0, 3.6)
        ax = axes[0][0]
    pts = [(s["per_request_tokens"][request_id], s["per_request_bytes"][request_id])
           for s in samples if s["per_request_tokens"].get(request_id)]
    if not pts:
        ax.text(0.5, 0.5, phrase('growth.none', lang, rid=request_id), ha="center", va="center",
                transform=ax.transAxes)
        return fig or ax.figure
    bpt, bs = samples[-1]["bytes_per_token"], samples[-1]["block_size"]
    tmax = max(t for t, _ in pts)
    div, unit = _byte_unit(max(b for _, b in pts))
    ax.plot([0, tmax], [0, tmax * bpt / div], color="black", linestyle="--", linewidth=1.2,
            label=phrase('growth.formula', lang, bpt=bpt))
    ts = [t for t, _ in pts]
    bs_measured = [b / div for _, b in pts]
    ax.step(ts, bs_measured, where="pre", color=STATE_COLORS["DECODE"], linewidth=2,
            label=phrase('growth.measured', lang, bs=bs, bpt=bpt))
    ax.plot(ts, bs_measured, "o", color=STATE_COLORS["DECODE"], markersize=2.5)
    ax.set_xlabel(phrase('growth.xlabel', lang))
    ax.set_ylabel(phrase('growth.ylabel', lang, unit=unit))
    ax.set_xlim(0, tmax * 1.02)
    ax.set_ylim(0, None)
    ax.set_title(title or phrase('growth.title', lang, rid=request_id))
    ax.legend(fontsize=8, loc="upper left", frameon=False)
    ax.grid(alpha=0.3)
    return fig or ax.figure


@with_cjk_fonts
def plot_kv_peaks(peaks: dict[str, dict], *, ax=None, title: str | None = None, lang=None):
    """Bars of peak KV bytes, one per scenario: ``{name: {"peak_bytes": int, "note": str}}``."""
    lang = resolve_lang(lang)
    fig = None
    if ax is None:
        fig, axes = _new_figure(7.5, 3.4)
        ax = axes[0][0]
    names = list(peaks)
    vals = [peaks[n]["peak_bytes"] for n in names]
    div, unit = _byte_unit(max(vals + [1]))
    bars = ax.barh(names, [v / div for v in vals], color=[_request_color(i) for i in range(len(names))])
    for bar, n in zip(bars, names):
        note = peaks[n].get("note", "")
        ax.annotate(f" {_fmt_bytes(peaks[n]['peak_bytes'])}  {note}", (bar.get_width(), bar.get_y()
                    + bar.get_height() / 2), va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(phrase('peaks.xlabel', lang, unit=unit))
    ax.set_xlim(0, max(vals + [1]) / div * 1.6)
    ax.set_title(title or phrase('peaks.title', lang))
    ax.grid(axis="x", alpha=0.3)
    return fig or ax.figure


# ---------------------------------------------------------------------------------------------
# states over steps
# ---------------------------------------------------------------------------------------------

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
    events = _events(source)
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
        fig, axes = _new_figure(9.0, max(1.8, 0.38 * len(ids) + 1.2))
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
    _integer_ticks(ax)
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


# ---------------------------------------------------------------------------------------------
# timings from the trace
# ---------------------------------------------------------------------------------------------

def step_timings(source) -> list[dict]:
    """Each step event's own account: ``{"step", "num_prefill", "num_decode", "num_tokens",
    "duration", "phase"}`` with phase "prefill", "decode" or "mixed" (both in one step)."""
    rows = []
    for e in _events(source):
        if e.kind != "step":
            continue
        d = e.data
        phase = ("mixed" if d["num_prefill"] and d["num_decode"]
                 else "prefill" if d["num_prefill"] else "decode" if d["num_decode"] else "idle")
        rows.append({"step": e.step, "num_prefill": d["num_prefill"], "num_decode": d["num_decode"],
                     "num_tokens": d["num_tokens"], "duration": d["duration"], "phase": phase})
    return rows


def request_latencies(source) -> list[dict]:
    """Per request, from the trace: prompt and output tokens, queue time, TTFT, TPOT, e2e and
    the stop reason (``minillm.trace.request_metrics`` plus the counts)."""
    events = _events(source)
    prompt_tokens, reasons, order = {}, {}, []
    for e in events:
        if e.kind == "transition" and e.request_id is not None:
            if e.request_id not in prompt_tokens and e.data["to"] == "WAITING":
                prompt_tokens[e.request_id] = e.data.get("prompt_tokens")
                order.append(e.request_id)
            elif e.data["to"] == "FINISHED":
                reasons[e.request_id] = e.data.get("stop_reason")
    rows = []
    for rid in order:
        m = tracemod.request_metrics(events, rid)
        rows.append({"request_id": rid, "prompt_tokens": prompt_tokens[rid],
                     "output_tokens": m["num_output_tokens"], "queue_time": m["queue_time"],
                     "ttft": m["ttft"], "tpot": m["tpot"], "e2e": m["e2e"], "stop_reason": reasons.get(rid)})
    return rows


def token_times(source, request_id: str) -> list[float]:
    """Seconds from the request's enqueue (WAITING) to each of its tokens."""
    enq, times = None, []
    for e in _events(source):
        if e.request_id != request_id:
            continue
        if e.kind == "transition" and e.data["to"] == "WAITING" and enq is None:
            enq = e.time
        elif e.kind == "token":
            times.append(e.time)
    if enq is None:
        return []
    return [t - enq for t in times]


@with_cjk_fonts
def plot_step_durations(rows: Sequence[dict], *, ax=None, title: str | None = None, lang=None):
    """Bars of each step's duration, coloured by what it did (prefill, decode, both)."""
    lang = resolve_lang(lang)
    from matplotlib.patches import Patch

    fig = None
    if ax is None:
        fig, axes = _new_figure(8.5, 3.2)
        ax = axes[0][0]
    colors = {"prefill": STATE_COLORS["PREFILL"], "decode": STATE_COLORS["DECODE"], "mixed": "#9c755f",
              "idle": "#cccccc"}
    ax.bar([r["step"] for r in rows], [r["duration"] * 1e3 for r in rows],
           color=[colors[r["phase"]] for r in rows], width=0.85)
    used = [p for p in ("prefill", "decode", "mixed") if any(r["phase"] == p for r in rows)]
    ax.legend(handles=[Patch(color=colors[p], label=phrase(f"steps.{p}", lang)) for p in used], fontsize=8, frameon=False)
    ax.set_xlabel(phrase('plot.engine_step', lang))
    _integer_ticks(ax)
    ax.set_ylabel(phrase('steps.ylabel', lang))
    ax.set_title(title or phrase('steps.title', lang))
    ax.grid(axis="y", alpha=0.3)
    return fig or ax.figure


@with_cjk_fonts
def plot_token_times(source, request_ids: Sequence[str] | None = None, *, ax=None,
                     title: str | None = None, lang=None):
    """When each token arrived, one row per request, measured from its enqueue; the first
    gap is the TTFT, the even spacing after it is the TPOT."""
    lang = resolve_lang(lang)
    events = _events(source)
    lat = {r["request_id"]: r for r in request_latencies(events)}
    ids = list(request_ids) if request_ids is not None else list(lat)
    fig = None
    if ax is None:
        fig, axes = _new_figure(8.5, max(1.6, 0.55 * len(ids) + 1.0))
        ax = axes[0][0]
    for row, rid in enumerate(ids):
        ts = [t * 1e3 for t in token_times(events, rid)]
        if not ts:
            continue
        ax.plot([0, ts[0]], [row, row], color=STATE_COLORS["PREFILL"], linewidth=5, solid_capstyle="butt")
        ax.plot(ts, [row] * len(ts), "|", color=STATE_COLORS["DECODE"], markersize=11, markeredgewidth=1.6)
        m = lat.get(rid, {})
        text = f"TTFT {m['ttft'] * 1e3:.1f} ms" if m.get("ttft") is not None else ""
        if m.get("tpot") is not None:
            text += f", TPOT {m['tpot'] * 1e3:.1f} ms"
        ax.annotate(text, (ts[-1], row), xytext=(6, 0), textcoords="offset points", va="center", fontsize=8)
    ax.set_yticks(range(len(ids)))
    ax.set_yticklabels([phrase('plot.req', lang, rid=r) + (phrase('plot.n_tok', lang, n=lat[r]['prompt_tokens']) if r in lat else "") for r in ids],
                       fontsize=8)
    ax.set_ylim(len(ids) - 0.5, -0.5)
    ax.set_xlabel(phrase('times.xlabel', lang))
    lo, hi = ax.get_xlim()
    ax.set_xlim(0, hi * 1.3)
    ax.set_title(title or phrase('times.title', lang))
    ax.grid(axis="x", alpha=0.3)
    return fig or ax.figure


@with_cjk_fonts
def plot_ttft_tpot(rows: Sequence[dict], *, ax=None, title: str | None = None, lang=None):
    """TTFT and TPOT of each request side by side (ms), requests labelled by prompt length."""
    lang = resolve_lang(lang)
    fig = None
    if ax is None:
        fig, axes = _new_figure(7.5, 3.4)
        ax = axes[0][0]
    rows = [r for r in rows if r["ttft"] is not None]
    xs = list(range(len(rows)))
    w = 0.38
    ax.bar([x - w / 2 for x in xs], [r["ttft"] * 1e3 for r in rows], width=w, color=STATE_COLORS["PREFILL"],
           label=phrase('lat.ttft', lang))
    ax.bar([x + w / 2 for x in xs], [(r["tpot"] or 0) * 1e3 for r in rows], width=w,
           color=STATE_COLORS["DECODE"], label=phrase('lat.tpot', lang))
    ax.set_xticks(xs)
    ax.set_xticklabels([phrase('lat.xtick', lang, rid=r['request_id'], n=r['prompt_tokens']) for r in rows], fontsize=8)
    ax.set_ylabel("ms")
    ax.set_title(title or phrase('lat.title', lang))
    ax.legend(fontsize=8, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    return fig or ax.figure


# ---------------------------------------------------------------------------------------------
# measurements: real engine calls, timed
# ---------------------------------------------------------------------------------------------

def _require_idle(llm) -> None:
    if llm.has_unfinished():
        raise ValueError("the engine still has unfinished requests; run them to the end (or cancel "
                         "them) before timing, so that every timed step does only the work measured")


def _random_ids(rng: random.Random, n: int, vocab: int, avoid: set[int]) -> list[int]:
    ids = []
    while len(ids) < n:
        t = rng.randrange(vocab)
        if t not in avoid:
            ids.append(t)
    return ids


def _special_ids(llm) -> set[int]:
    ids = set(getattr(llm, "eos_token_ids", set()))
    ids.update(getattr(llm.tokenizer, "all_special_ids", []) or [])
    return ids


def random_prompt(llm, num_tokens: int, seed: int = 0) -> list[int]:
    """``num_tokens`` random token ids (no special tokens), for timing experiments: the model does
    the same arithmetic whatever the ids are, and random prompts never share a cached prefix."""
    if num_tokens >= llm.max_model_len:
        raise ValueError(f"num_tokens must be < max_model_len ({llm.max_model_len}), got {num_tokens}")
    return _random_ids(random.Random(seed), num_tokens, llm.model_config.vocab_size, _special_ids(llm))


def measure_prefill(llm, lengths: Sequence[int], *, repeats: int = 3, seed: int = 0) -> list[dict]:
    """Time the prefill of prompts of exactly ``lengths`` tokens on the engine.

    Each measurement is one real request (``prompt_token_ids=`` random ids, so no two prompts
    share a cached prefix) with ``max_tokens=1``: one ``llm.step()`` prefills it, samples its
    only token and releases it. The time is that step's own ``duration`` from the trace.
    Returns ``[{"prompt_tokens", "seconds" (the fastest of the repeats), "all", "cached_tokens"}]``.
    """
    from ..params import SamplingParams

    _require_idle(llm)
    rng = random.Random(seed)
    vocab = llm.model_config.vocab_size
    avoid = _special_ids(llm)
    params = SamplingParams(max_tokens=1, temperature=0.0)

    def one(n: int) -> tuple[float, int]:
        req = llm.add_request(prompt_token_ids=_random_ids(rng, n, vocab, avoid), params=params)
        events = llm.step()
        step = next(e for e in events if e.kind == "step")
        pre = next(e for e in events if e.request_id == req.request_id and e.kind == "transition"
                   and e.data["to"] == "PREFILL")
        if req.is_live:  # cannot happen with max_tokens=1, but never leave blocks behind
            llm.cancel(req.request_id)
        return step.data["duration"], pre.data.get("cached_tokens", 0)

    one(min(lengths))  # warm-up: first calls pay one-off allocation costs
    rows = []
    for n in lengths:
        runs = [one(n) for _ in range(repeats)]
        rows.append({"prompt_tokens": n, "seconds": min(t for t, _ in runs), "all": [t for t, _ in runs],
                     "cached_tokens": max(c for _, c in runs)})
    return rows


def measure_cache_vs_recompute(llm, context_lengths: Sequence[int], *, decode_steps: int = 4,
                               repeats: int = 3, seed: int = 0) -> list[dict]:
    """The cost of one new token at each context length, with and without the KV cache.

    With the cache: a real request whose prompt has ``L`` tokens is prefilled, then decoded for
    ``decode_steps`` steps; each decode step feeds one token and reads the cached keys and values
    of all the others. Its time is the median ``duration`` of those steps in the trace.
    Without it: ``llm.model.full_logits(context)`` recomputes every position of the same context
    (prompt + the first token), which is what every step would cost if nothing were kept.

    Both paths predict the next token from the same context, so they must agree: ``same_token``
    says whether the argmax of the recomputed logits is the token the engine produced (greedy)
    and ``logprob_diff`` how far apart the two computations put that token's log-probability.
    Returns ``[{"context_tokens", "with_cache_s", "recompute_s", "same_token", "logprob_diff"}]``.
    """
    import torch

    from ..params import SamplingParams

    _require_idle(llm)
    rng = random.Random(seed)
    vocab = llm.model_config.vocab_size
    avoid = _special_ids(llm)
    params = SamplingParams(max_tokens=decode_steps + 1, temperature=0.0, ignore_eos=True, logprobs=0)
    rows = []
    for i, n in enumerate([min(context_lengths)] + list(context_lengths)):  # the first is a warm-up
        if n + decode_steps + 1 > llm.max_model_len:
            raise ValueError(f"context length {n} + {decode_steps + 1} new tokens exceeds max_model_len "
                             f"({llm.max_model_len})")
        prompt = _random_ids(rng, n, vocab, avoid)
        req = llm.add_request(prompt_token_ids=prompt, params=params)
        durations = []
        while req.is_live:
            events = llm.step()
            step = next((e for e in events if e.kind == "step"), None)
            if step is not None and step.data["num_prefill"] == 0:
                durations.append(step.data["duration"])
        context = prompt + req.output_token_ids[:1]
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            logits = llm.model.full_logits(context)[-1]
            if logits.is_cuda:  # kernels run asynchronously: wait for them before reading the clock
                torch.cuda.synchronize(logits.device)
            best = min(best, time.perf_counter() - t0)
        engine_token = req.output_token_ids[1]
        same = int(torch.argmax(logits)) == engine_token
        recomputed = float(torch.log_softmax(logits, -1)[engine_token])
        diff = abs(recomputed - req.logprobs[1]["logprob"])
        if i == 0:
            continue
        rows.append({"context_tokens": n + 1, "with_cache_s": statistics.median(durations),
                     "recompute_s": best, "same_token": same, "logprob_diff": diff})
    return rows


@with_cjk_fonts
def plot_prefill_times(rows: Sequence[dict], *, decode_step_s: float | None = None, title: str | None = None, lang=None):
    """Left: prefill time against prompt length. Right: the same time per prompt token, with
    (optionally) one decode step's time per token beside it."""
    lang = resolve_lang(lang)
    fig, axes = _new_figure(10.0, 3.6, ncols=2)
    ax, ax2 = axes[0]
    ns = [r["prompt_tokens"] for r in rows]
    ms = [r["seconds"] * 1e3 for r in rows]
    ax.plot(ns, ms, "o-", color=STATE_COLORS["PREFILL"])
    ax.set_xlabel(phrase('pre.xlabel', lang))
    ax.set_ylabel(phrase('pre.ylabel', lang))
    ax.set_title(phrase('pre.title', lang))
    ax.set_xlim(0, None)
    ax.set_ylim(0, None)
    ax.grid(alpha=0.3)
    per = [m / n for m, n in zip(ms, ns)]
    ax2.plot(ns, per, "o-", color=STATE_COLORS["PREFILL"], label=phrase('pre.per_token', lang))
    if decode_step_s is not None:
        ax2.axhline(decode_step_s * 1e3, color=STATE_COLORS["DECODE"], linestyle="--",
                    label=phrase('pre.decode', lang))
    ax2.set_yscale("log")
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax2.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax2.yaxis.set_minor_formatter(NullFormatter())
    ax2.set_xlabel(phrase('pre.xlabel', lang))
    ax2.set_ylabel(phrase('pre.ylabel2', lang))
    ax2.set_title(phrase('pre.title2', lang))
    ax2.legend(fontsize=8, frameon=False)
    ax2.grid(alpha=0.3, which="both")
    if title:
        fig.suptitle(title)
    return fig


@with_cjk_fonts
def plot_cache_vs_recompute(rows: Sequence[dict], *, title: str | None = None, lang=None):
    """Cost of one new token against context length: decode with the KV cache (an engine step)
    vs recomputing the whole context (``full_logits``)."""
    lang = resolve_lang(lang)
    fig, axes = _new_figure(8.0, 3.6)
    ax = axes[0][0]
    ns = [r["context_tokens"] for r in rows]
    ax.plot(ns, [r["with_cache_s"] * 1e3 for r in rows], "o-", color=STATE_COLORS["DECODE"],
            label=phrase('cvr.with', lang))
    ax.plot(ns, [r["recompute_s"] * 1e3 for r in rows], "s-", color=STATE_COLORS["PREEMPTED"],
            label=phrase('cvr.without', lang))
    last = rows[-1]
    ratio = last["recompute_s"] / last["with_cache_s"]
    ax.annotate(f"{ratio:.0f}x", (ns[-1], last["recompute_s"] * 1e3), xytext=(-10, 6),
                textcoords="offset points", ha="right", fontsize=9)
    ax.set_xlabel(phrase('cvr.xlabel', lang))
    ax.set_ylabel(phrase('cvr.ylabel', lang))
    ax.set_xlim(0, ns[-1] * 1.08)
    ax.set_ylim(0, last["recompute_s"] * 1e3 * 1.15)
    ax.set_title(title or phrase('cvr.title', lang))
    ax.legend(fontsize=8, frameon=False, loc="upper left")
    ax.grid(alpha=0.3)
    return fig


# ---------------------------------------------------------------------------------------------
# the widget
# ---------------------------------------------------------------------------------------------

def _bytes_formula(llm, lang=None) -> tuple[str, int]:
    cfg = llm.model_config
    import torch

    elem = torch.empty((), dtype=llm.dtype).element_size()
    value = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * elem
    text = phrase("mon.formula", lang, layers=cfg.num_hidden_layers, heads=cfg.num_key_value_heads,
                  dim=cfg.head_dim, elem=elem, value=value)
    return text, value


class CacheMonitor:
    """KV memory of a live engine: per request and in total, over steps, beside the formula.

    ``CacheMonitor()`` makes its own small engine (64 blocks of 16 tokens), so it is a toy you
    can play with however the rest of the notebook used its engine; ``CacheMonitor(llm)`` watches
    an engine you pass. It shows a summary line from ``llm.cache_stats()`` and the
    :func:`plot_kv_timeline` chart of ``llm.trace``, with buttons **Add a request** (a random
    prompt of ``prompt_tokens`` tokens, ``max_tokens`` output tokens), **Step**, **Step x10**
    and **Refresh**. Step is greyed out, with a note saying why, when nothing is left to run.
    Without ipywidgets it still works: ``add_request()``, ``step()``, ``data()``, ``stats()``,
    ``figure()`` and ``summary()`` are plain Python.
    """

    def __init__(self, llm=None, *, controls: bool = True, title: str | None = None,
                 prompt_tokens: int = 24, max_tokens: int = 40, lang=None):
        for name, value in (("prompt_tokens", prompt_tokens), ("max_tokens", max_tokens)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if llm is None:
            from ..llm import LLM

            llm = LLM(device="cpu", num_kv_blocks=64)
        self.llm = llm
        self.lang = resolve_lang(lang)
        self.title = title
        self.controls = controls
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self._added = 0
        self._widget = None
        self._image = None
        self._html = None
        self._note = None
        self._buttons = {}

    # --- plain data ------------------------------------------------------------------------
    def data(self) -> list[dict]:
        return kv_timeline(self.llm.trace)

    def stats(self):
        return self.llm.cache_stats()

    def add_request(self):
        """Queue one more request (a fresh id, a random prompt that shares no prefix) and redraw."""
        from ..params import SamplingParams

        self._added += 1
        seed = 7919 * self._added + self.llm.step_count
        req = self.llm.add_request(prompt_token_ids=random_prompt(self.llm, self.prompt_tokens, seed=seed),
                                   params=SamplingParams(max_tokens=self.max_tokens, temperature=0.0,
                                                         ignore_eos=True))
        self.refresh()
        return req

    def can_step(self) -> bool:
        return self.llm.has_unfinished()

    def step(self, n: int = 1) -> int:
        """Up to ``n`` engine steps (fewer when everything finished first); returns how many ran."""
        done = 0
        for _ in range(n):
            if not self.llm.has_unfinished():
                break
            self.llm.step()
            done += 1
        self.refresh()
        return done

    def summary(self) -> str:
        """One line of text: where the pool stands now, and the bytes-per-token formula."""
        s = self.stats()
        formula, bpt = _bytes_formula(self.llm, self.lang)
        held = self.llm.blocks_held()
        tokens = sum(r.num_computed_tokens for r in self.llm.requests.values() if r.block_table)
        return phrase("mon.summary", self.lang, step=self.llm.step_count, used=s.used_blocks, total=s.total_blocks,
                      bs=s.block_size, bpt=s.bytes_per_token, used_bytes=_fmt_bytes(s.used_bytes), held=len(held),
                      tokens=tokens, formula_bytes=_fmt_bytes(tokens * bpt), formula=formula)

    def note(self) -> str:
        if self.can_step():
            live = sum(r.is_live for r in self.llm.requests.values())
            return phrase("mon.live", self.lang, n=live)
        return phrase("mon.idle", self.lang)

    @with_cjk_fonts
    def figure(self):
        lang = self.lang
        if not self.data():
            fig, axes = _new_figure(8.0, 2.2)
            ax = axes[0][0]
            ax.text(0.5, 0.5, phrase('mon.empty', lang), ha="center", va="center",
                    fontsize=12, transform=ax.transAxes)
            ax.set_axis_off()
            return fig
        return plot_kv_timeline(self.data(), title=self.title, lang=lang)

    # --- widget ----------------------------------------------------------------------------
    @property
    def widget(self):
        if self._widget is None:
            import ipywidgets as w

            self._html = w.HTML()
            self._note = w.HTML()
            self._image = w.Image(format="png", layout=w.Layout(max_width="100%"))
            parts = [self._html, self._image]
            L = lambda key: phrase(key, self.lang)  # noqa: E731
            if self.controls:
                b = self._buttons = {
                    "add": w.Button(description=L("mon.add"),
                                    tooltip=phrase("mon.add_tip", self.lang, n=self.prompt_tokens, m=self.max_tokens)),
                    "step": w.Button(description=L("mon.step"), tooltip=L("mon.step_tip")),
                    "step10": w.Button(description=L("mon.step10"), tooltip=L("mon.step10_tip")),
                    "refresh": w.Button(description=L("mon.refresh"), tooltip=L("mon.refresh_tip")),
                }
                b["add"].on_click(lambda _b: self.add_request())
                b["step"].on_click(lambda _b: self.step(1))
                b["step10"].on_click(lambda _b: self.step(10))
                b["refresh"].on_click(lambda _b: self.refresh())
                parts[0:0] = [w.HBox(list(b.values())), self._note]
            self._widget = w.VBox(parts)
            self._widget.add_class("minillm-cache-monitor")
            self.refresh()
        return self._widget

    def _step(self, n: int) -> None:  # kept for callers of the old name
        self.step(n)

    def refresh(self) -> "CacheMonitor":
        """Re-read the trace and ``cache_stats()`` and redraw. Returns self (so a cell can end
        with ``monitor.refresh()`` and show it)."""
        if self._widget is None and self._image is None:
            return self  # not displayed yet: nothing to redraw, data() is always fresh
        buf = io.BytesIO()
        self.figure().savefig(buf, format="png", dpi=90)
        self._image.value = buf.getvalue()
        import html as _html

        self._html.value = (f"<code style='font-size:12px;font-family:{_html.escape(MONO_STACK)}'>"
                            f"{_html.escape(self.summary())}</code>")
        if self._buttons:
            idle = not self.can_step()
            self._buttons["step"].disabled = idle
            self._buttons["step10"].disabled = idle
            colour = "#64748b" if idle else "#334155"
            self._note.value = f"<div style='font-size:13px;color:{colour}'>{_html.escape(self.note())}</div>"
        return self

    def _repr_mimebundle_(self, include=None, exclude=None):
        try:
            widget = self.widget
        except ImportError:  # no ipywidgets: a static picture and the summary line
            buf = io.BytesIO()
            self.figure().savefig(buf, format="png", dpi=90)
            return {"text/plain": self.summary(), "image/png": buf.getvalue()}
        from ._common import widget_bundle

        return widget_bundle(widget, widget._repr_mimebundle_(), f"CacheMonitor: {self.summary()}", lang=self.lang)

    def __repr__(self) -> str:
        return f"CacheMonitor({self.summary()})"
