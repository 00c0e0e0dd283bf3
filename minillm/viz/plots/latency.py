"""Latency from the trace: how long each step took, when each token arrived, TTFT and TPOT.

Every number is a clock reading the engine took while it ran: the ``duration`` of each
``step`` event and the time of each ``token`` event, measured from the request's enqueue.
"""

from __future__ import annotations

from typing import Sequence

from ... import trace as tracemod
from ..fonts import with_cjk_fonts
from ..i18n import phrase, resolve_lang
from .figure import STATE_COLORS, events_of, integer_ticks, new_figure

__all__ = ["step_timings", "request_latencies", "token_times", "plot_step_durations", "plot_token_times",
           "plot_ttft_tpot"]


def step_timings(source) -> list[dict]:
    """Each step event's own account: ``{"step", "num_prefill", "num_decode", "num_tokens",
    "duration", "phase"}`` with phase "prefill", "decode" or "mixed" (both in one step)."""
    rows = []
    for e in events_of(source):
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
    events = events_of(source)
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
    for e in events_of(source):
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
        fig, axes = new_figure(8.5, 3.2)
        ax = axes[0][0]
    colors = {"prefill": STATE_COLORS["PREFILL"], "decode": STATE_COLORS["DECODE"], "mixed": "#9c755f",
              "idle": "#cccccc"}
    ax.bar([r["step"] for r in rows], [r["duration"] * 1e3 for r in rows],
           color=[colors[r["phase"]] for r in rows], width=0.85)
    used = [p for p in ("prefill", "decode", "mixed") if any(r["phase"] == p for r in rows)]
    ax.legend(handles=[Patch(color=colors[p], label=phrase(f"steps.{p}", lang)) for p in used], fontsize=8, frameon=False)
    ax.set_xlabel(phrase('plot.engine_step', lang))
    integer_ticks(ax)
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
    events = events_of(source)
    lat = {r["request_id"]: r for r in request_latencies(events)}
    ids = list(request_ids) if request_ids is not None else list(lat)
    fig = None
    if ax is None:
        fig, axes = new_figure(8.5, max(1.6, 0.55 * len(ids) + 1.0))
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
        fig, axes = new_figure(7.5, 3.4)
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
