"""The request lifecycle as a picture, drawn from the engine's own state machine.

Nodes are ``minillm.request.RequestState`` and edges are ``minillm.request.TRANSITIONS``,
so the picture can never disagree with the code: add an edge to the engine and it shows up
here. One extra dashed loop on DECODE stands for the decode -> sample -> append cycle, which
repeats inside the DECODE state without changing it.

    from minillm.viz import lifecycle_diagram, render_diagram
    lifecycle_diagram("DECODE")                         # a graphviz.Digraph (shows as SVG)
    render_diagram("FINISHED", ("DECODE", "FINISHED"))  # SVG (or DOT text) as static output
"""

from __future__ import annotations

import html
import re
from typing import Iterable

from ..request import TRANSITIONS, RequestState
from .i18n import SVG_FONT_STACK, PhraseMapping, phrase, resolve_lang

# What moves a request along each edge (the same words the notebooks use), and what each
# state holds (a tooltip, and used by the notebooks). Both read the course-wide language
# when looked up (``minillm.viz.set_language``); the phrases are in ``i18n.PHRASES``.
_EDGES = [("NEW", "WAITING"), ("NEW", "FINISHED"), ("WAITING", "PREFILL"), ("WAITING", "FINISHED"),
          ("PREFILL", "DECODE"), ("PREFILL", "PREFILL"), ("PREFILL", "WAITING"), ("PREFILL", "PREEMPTED"),
          ("PREFILL", "FINISHED"), ("DECODE", "PREEMPTED"), ("DECODE", "FINISHED"), ("PREEMPTED", "PREFILL"),
          ("PREEMPTED", "FINISHED"), ("FINISHED", "RELEASED")]
EDGE_LABELS = PhraseMapping({e: f"edge.{e[0]}.{e[1]}" for e in _EDGES})
DECODE_LOOP = ("DECODE", "DECODE")
_MAIN_PATH = {("NEW", "WAITING"), ("WAITING", "PREFILL"), ("PREFILL", "DECODE"), ("DECODE", "FINISHED"),
              ("FINISHED", "RELEASED")}
STATE_HOLDS = PhraseMapping({st.value: f"holds.{st.value}" for st in RequestState})


def state_holds(lang=None) -> dict[str, str]:
    """state name -> what a request holds in it, in ``lang`` (None: the course-wide language)."""
    return STATE_HOLDS.in_language(lang)


def edge_labels(lang=None) -> dict[tuple[str, str], str]:
    """(from, to) -> what moves a request along that edge, in ``lang``."""
    return EDGE_LABELS.in_language(lang)


_LIT = "#f59e0b"       # amber: the current state / the edge just taken
_LIT_FILL = "#fde68a"
_FILL = "#eef2ff"
_DONE_FILL = "#f1f5f9"
_LINE = "#64748b"



def _state_name(state) -> str | None:
    if state is None:
        return None
    if isinstance(state, RequestState):
        return state.value
    name = str(state).upper()
    if name.startswith("REQUESTSTATE."):
        name = name.split(".", 1)[1]
    if name not in RequestState.__members__:
        raise ValueError(f"current_state must be one of {', '.join(RequestState.__members__)}, got {state!r}")
    return name


def _edges_to_light(highlight_edge) -> set[tuple[str, str]]:
    """Accept None, one (from, to) pair, or a list of pairs (a step can cross several edges)."""
    if highlight_edge is None:
        return set()
    if (isinstance(highlight_edge, (tuple, list)) and len(highlight_edge) == 2
            and not isinstance(highlight_edge[0], (tuple, list))):
        highlight_edge = [highlight_edge]
    out = set()
    for edge in highlight_edge:
        a, b = edge
        out.add((_state_name(a), _state_name(b)))
    return out


def lifecycle_edges() -> list[tuple[str, str]]:
    """Every legal transition of the engine, in a stable order (from TRANSITIONS)."""
    order = list(RequestState.__members__)
    return [(a.value, b.value) for a in RequestState for b in sorted(TRANSITIONS[a], key=lambda s: order.index(s.value))]


def lifecycle_diagram(current_state=None, highlight_edge=None, *, show_loop: bool = True,
                      rankdir: str = "LR", lang=None):
    """A ``graphviz.Digraph`` of the request lifecycle with ``current_state`` lit.

    Args:
        current_state: a RequestState or its name ("DECODE"); None lights nothing.
        highlight_edge: one (from, to) pair, or a list of pairs, to draw in the highlight
            colour: the edges the last action crossed. ("DECODE", "DECODE") is the decode loop.
        show_loop: draw the decode -> sample -> append loop on DECODE.
        rankdir: "LR" (left to right) or "TB" (top to bottom).
        lang: "en" or "zh" for the edge labels and tooltips (None: the course-wide language);
            state names stay the engine's (WAITING, DECODE, ...).

    In a notebook the returned object displays itself as SVG (this needs Graphviz's ``dot``
    program); ``render_diagram`` is the variant that never raises when ``dot`` is missing.
    """
    import graphviz

    lang = resolve_lang(lang)
    holds, labels = state_holds(lang), edge_labels(lang)
    current = _state_name(current_state)
    lit_edges = _edges_to_light(highlight_edge)
    g = graphviz.Digraph("request_lifecycle", format="svg")
    # Fonts are large for a diagram because the picture is shrunk to the notebook's width
    # (about two thirds of its natural size in a 1000 px window): 14 pt labels stay readable.
    g.attr(rankdir=rankdir, bgcolor="transparent", nodesep="0.3", ranksep="0.35", pad="0.1")
    g.attr("node", shape="box", style="rounded,filled", fontname="Helvetica", fontsize="17",
           color=_LINE, fillcolor=_FILL, penwidth="1.4", margin="0.1,0.05")
    g.attr("edge", fontname="Helvetica", fontsize="14", color=_LINE, fontcolor="#334155", arrowsize="0.8")
    for state in RequestState:
        name = state.value
        attrs = {"tooltip": phrase("diag.tooltip", lang, state=name, holds=holds[name]), "id": f"state-{name}"}
        if name in ("FINISHED", "RELEASED"):
            attrs["fillcolor"] = _DONE_FILL
        if name == current:
            attrs.update(fillcolor=_LIT_FILL, color=_LIT, penwidth="3", fontname="Helvetica-Bold")
        if name != "PREEMPTED":
            attrs["group"] = "main"  # the happy path on one straight line
        g.node(name, name, **attrs)
    for a, b in lifecycle_edges():
        attrs = {"label": labels.get((a, b), "")}
        if (a, b) in _MAIN_PATH:
            attrs["weight"] = "10"
        if b == "FINISHED" and a in ("NEW", "WAITING", "PREFILL"):
            if a != "PREFILL":
                attrs.update(style="dashed", fontsize="13")
        if (a, b) in (("PREEMPTED", "FINISHED"), ("PREFILL", "WAITING")):
            attrs.update(style="dashed", fontsize="13")
        if (a, b) in lit_edges:
            attrs.update(color=_LIT, penwidth="3", fontcolor="#92400e")
        if a == "PREEMPTED" and b == "PREFILL":
            attrs["constraint"] = "false"
        g.edge(a, b, **attrs)
    if show_loop:
        attrs = {"label": phrase("edge.loop", lang), "style": "dashed", "dir": "forward"}
        if DECODE_LOOP in lit_edges:
            attrs.update(color=_LIT, penwidth="3", fontcolor="#92400e", style="bold")
        g.edge("DECODE", "DECODE", **attrs)
    return g


# JupyterLab shows a cell's SVG output as an <img> and, unlike PNG, does not cap its width, so the
# SVG's own size must fit: a notebook's output area is about 950 px wide in a 1280 px window
DIAGRAM_MAX_PX = 900
_SIZE = re.compile(r'<svg([^>]*?) width="([\d.]+)pt" height="([\d.]+)pt"')


def _fit_to_width(svg: str) -> str:
    """Let graphviz's fixed-size SVG shrink to its container (``max-width: 100%``, height from the
    aspect ratio), and give it a natural size of at most ``DIAGRAM_MAX_PX`` pixels wide: where the
    SVG is shown as an image (JupyterLab once the cell has run, GitHub, nbviewer) the natural size
    is what is drawn, and the ~1900 px diagram would hide FINISHED and RELEASED off the right edge."""
    m = _SIZE.search(svg)
    if m is not None:
        width, height = float(m.group(2)) * 4 / 3, float(m.group(3)) * 4 / 3  # pt -> CSS px
        scale = min(1.0, DIAGRAM_MAX_PX / width)
        svg = (svg[:m.start()] + f'<svg{m.group(1)} width="{width * scale:.0f}px" height="{height * scale:.0f}px"'
               + svg[m.end():])
    start = svg.find("<svg")
    if start == -1:
        return svg
    cut = start + len("<svg")
    return svg[:cut] + ' style="max-width:100%;height:auto;display:block"' + svg[cut:]


def _font_stack(svg: str) -> str:
    """Graphviz writes ``font-family="Helvetica,sans-Serif"``; give the browser the Chinese fonts
    too (labels are Chinese in the Chinese edition, and a state's tooltip may be)."""
    import re

    return re.sub(r'font-family="Helvetica(?:-Bold)?,sans-Serif"', f'font-family="{SVG_FONT_STACK}"', svg)


def diagram_svg(current_state=None, highlight_edge=None, **kwargs) -> str:
    """The diagram as an SVG string that scales to its container's width; raises
    graphviz.ExecutableNotFound without ``dot``."""
    svg = lifecycle_diagram(current_state, highlight_edge, **kwargs).pipe(format="svg", encoding="utf-8")
    start = svg.find("<svg")  # drop the XML prolog and doctype so it can sit inside HTML
    return _font_stack(_fit_to_width(svg[start:] if start != -1 else svg))


def _fallback_html(current_state, highlight_edge, **kwargs) -> str | None:
    """The text shown instead of the picture when Graphviz is missing (None when it is there)."""
    lang = kwargs.get("lang")
    try:
        import graphviz
    except ImportError:
        return ("<div class='minillm-diagram minillm-diagram-fallback'><p><em>"
                + phrase("diag.no_package", lang, state=html.escape(str(_state_name(current_state))))
                + "</em></p></div>")
    try:
        diagram_svg(current_state, highlight_edge, **kwargs)
    except (graphviz.ExecutableNotFound, OSError):
        source = lifecycle_diagram(current_state, highlight_edge, **kwargs).source
        return (f"<div class='minillm-diagram minillm-diagram-fallback'><p><em>{html.escape(phrase('diag.no_dot', lang))}</em></p>"
                f"<pre style='font-size:12px'>{html.escape(source)}</pre></div>")
    return None


def diagram_html(current_state=None, highlight_edge=None, **kwargs) -> str:
    """HTML for the diagram: inline SVG, or the DOT text and a one-line hint when Graphviz
    (the ``dot`` program or the ``graphviz`` Python package) is missing."""
    return DiagramView(current_state, highlight_edge, **kwargs).value


class DiagramView:
    """The lifecycle diagram as plain rich output (``_repr_svg_``, ``_repr_html_``).

    Not a widget: the SVG is stored in the notebook file itself, so the picture shows on
    GitHub, in nbviewer and in a notebook that has not been run yet. ``.value`` is the HTML
    (inline SVG, or the DOT-text fallback) for embedding in a widget."""

    def __init__(self, current_state=None, highlight_edge=None, **kwargs):
        kwargs["lang"] = resolve_lang(kwargs.get("lang"))  # fixed now: the SVG and PNG agree
        self.state = _state_name(current_state)
        self._args = (current_state, highlight_edge, kwargs)
        self.fallback = _fallback_html(current_state, highlight_edge, **kwargs)
        self.svg = None if self.fallback is not None else diagram_svg(current_state, highlight_edge, **kwargs)

    @property
    def value(self) -> str:
        return self.fallback if self.svg is None else f"<div class='minillm-diagram'>{self.svg}</div>"

    def _repr_svg_(self):
        return self.svg

    def _repr_png_(self):
        """The same picture as PNG: JupyterLab shows no SVG output of a notebook that is not
        trusted yet (one just downloaded or cloned), but it does show PNG."""
        if self.svg is None:
            return None
        current_state, highlight_edge, kwargs = self._args
        return lifecycle_diagram(current_state, highlight_edge, **kwargs).pipe(format="png")

    def _repr_html_(self):
        return self.fallback  # only without Graphviz: the SVG and PNG above are the picture

    def __repr__(self) -> str:
        lit = f", {self.state} lit" if self.state else ""
        return f"<request lifecycle diagram{lit}: {'SVG' if self.svg else 'Graphviz missing, DOT text'}>"


def render_diagram(current_state=None, highlight_edge=None, **kwargs) -> DiagramView:
    """The diagram as static rich output: SVG scaled to the notebook's width, or its DOT text
    with a hint when Graphviz is not installed; never a traceback."""
    return DiagramView(current_state, highlight_edge, **kwargs)


def edges_of_events(events: Iterable) -> list[tuple[str, str]]:
    """The lifecycle edges a list of engine events crossed, in order; a ``token`` event
    while DECODE counts as one turn of the decode loop."""
    edges: list[tuple[str, str]] = []
    state: dict = {}
    for e in events:
        if e.kind == "transition" and e.data.get("from") is not None:
            edges.append((e.data["from"], e.data["to"]))
            state[e.request_id] = e.data["to"]
        elif e.kind == "transition":
            state[e.request_id] = e.data["to"]
        elif e.kind == "token" and state.get(e.request_id, "DECODE") == "DECODE":
            edges.append(DECODE_LOOP)
    return edges
