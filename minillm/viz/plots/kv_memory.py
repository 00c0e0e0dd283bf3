"""KV memory over steps: what each request's blocks cost, what the pool held, what the formula says.

The series (:func:`kv_timeline`) is read from the trace alone: every ``step`` event carries
the pool's used blocks and the blocks each request holds, so a chart of it shows the memory
the allocator really reserved, block by block, beside ``tokens x bytes_per_token``.
"""

from __future__ import annotations

from typing import Sequence

from ..fonts import with_cjk_fonts
from ..i18n import phrase, resolve_lang
from .figure import (STATE_COLORS, byte_unit, events_of, fmt_bytes, integer_ticks, new_figure, order_requests,
                     request_color)

__all__ = ["kv_timeline", "plot_kv_timeline", "compare_kv_timelines", "plot_kv_growth", "plot_kv_peaks"]


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
    events = events_of(source)
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
        fig, axes = new_figure(8.5, 3.8)
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
    div, unit = byte_unit(top)
    xs = [s["x"] for s in samples] + [samples[-1]["x"] + 1]
    ids = order_requests(r for s in samples for r in s["per_request_blocks"])
    lower = [0.0] * len(samples)
    for i, rid in enumerate(ids):
        vals = [s["per_request_bytes"].get(rid, 0) / div for s in samples]
        upper = [a + b for a, b in zip(lower, vals)]
        ax.fill_between(xs, lower + lower[-1:], upper + upper[-1:], step="post", color=request_color(i),
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
    integer_ticks(ax)
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
        fig, axes = new_figure(7.0, 3.6)
        ax = axes[0][0]
    pts = [(s["per_request_tokens"][request_id], s["per_request_bytes"][request_id])
           for s in samples if s["per_request_tokens"].get(request_id)]
    if not pts:
        ax.text(0.5, 0.5, phrase('growth.none', lang, rid=request_id), ha="center", va="center",
                transform=ax.transAxes)
        return fig or ax.figure
    bpt, bs = samples[-1]["bytes_per_token"], samples[-1]["block_size"]
    tmax = max(t for t, _ in pts)
    div, unit = byte_unit(max(b for _, b in pts))
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
        fig, axes = new_figure(7.5, 3.4)
        ax = axes[0][0]
    names = list(peaks)
    vals = [peaks[n]["peak_bytes"] for n in names]
    div, unit = byte_unit(max(vals + [1]))
    bars = ax.barh(names, [v / div for v in vals], color=[request_color(i) for i in range(len(names))])
    for bar, n in zip(bars, names):
        note = peaks[n].get("note", "")
        ax.annotate(f" {fmt_bytes(peaks[n]['peak_bytes'])}  {note}", (bar.get_width(), bar.get_y()
                    + bar.get_height() / 2), va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(phrase('peaks.xlabel', lang, unit=unit))
    ax.set_xlim(0, max(vals + [1]) / div * 1.6)
    ax.set_title(title or phrase('peaks.title', lang))
    ax.grid(axis="x", alpha=0.3)
    return fig or ax.figure
