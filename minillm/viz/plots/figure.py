"""What every chart shares: one colour per state, a pyplot-free figure, byte units.

The state colours are the same in every chart (and close to the lifecycle diagram's), so a
reader who learned "orange is PREFILL" in one figure can read the next one without a legend.
Figures are built without ``pyplot``: they work on any backend (Agg included) and a notebook
shows each one exactly once.
"""

from __future__ import annotations

from typing import Iterable

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
REQUEST_COLORS = ["#8e6bbf", "#17a2a2", "#c26b9a", "#8c6d31", "#6b8e23", "#d4a017", "#6a3d9a",
                  "#b5651d", "#66c2a5", "#a05195", "#7a9e9f", "#bc5090"]


def events_of(source):
    """Accept an ``LLM`` (its trace is read) or a list of events."""
    return source.trace if hasattr(source, "trace") and hasattr(source, "step") else list(source)


def new_figure(width=8.0, height=3.6, ncols=1, nrows=1, **kw):
    """A Figure and a 2-D grid of axes, made without pyplot (no global state, any backend)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, axes


def byte_unit(max_bytes: float) -> tuple[float, str]:
    """(divisor, unit) that keeps the largest value of an axis readable: B, KiB, MiB or GiB."""
    if max_bytes >= 1024 ** 3:
        return 1024.0 ** 3, "GiB"
    if max_bytes >= 1024 ** 2:
        return 1024.0 ** 2, "MiB"
    if max_bytes >= 1024:
        return 1024.0, "KiB"
    return 1.0, "B"


def fmt_bytes(n: float) -> str:
    """A byte count for a label: '512 B', '1.5 KiB', '3.0 MiB'."""
    div, unit = byte_unit(n)
    return f"{n:.0f} B" if unit == "B" else f"{n / div:.1f} {unit}"


def integer_ticks(ax) -> None:
    """Whole-number ticks on the x axis: engine steps come one at a time."""
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def request_color(i: int) -> str:
    """The i-th request's colour (cycling through the palette)."""
    return REQUEST_COLORS[i % len(REQUEST_COLORS)]


def order_requests(ids: Iterable[str]) -> list[str]:
    """Request ids in a natural order: numbers numerically, then the rest alphabetically."""
    ids = list(dict.fromkeys(ids))
    return sorted(ids, key=lambda r: (0, int(r), "") if str(r).isdigit() else (1, 0, str(r)))
