"""A state diagram as data: read from the DiagramEditor, plain Python data or DOT text, drawn back as
DOT or SVG. The chapter's lifecycle grader (``ch04/lifecycle.py``) reads answers through this.

An answer can be a :class:`~minillm.grading.diagram_editor.DiagramEditor`, plain Python data::

    {"states": {"WAITING": "prompt token ids, sampling params; no KV block yet", ...},
     "transitions": [("WAITING", "PREFILL", "scheduled"), ...]}

or DOT text (``digraph { WAITING [holds="..."]; WAITING -> PREFILL [label="scheduled"] }``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# =============================================================================================
# The data model
# =============================================================================================


@dataclass
class Diagram:
    states: dict[str, str] = field(default_factory=dict)  # name -> what the state holds
    transitions: list[tuple[str, str, str]] = field(default_factory=list)  # (from, to, label)
    notes: list[tuple] = field(default_factory=list)  # remarks made while reading it: (message key, fields)
    labels: dict[str, str] = field(default_factory=dict)  # DOT display labels, used to match roles

    def add_state(self, name: str, holds: str = "") -> None:
        if name not in self.states or (holds and not self.states[name]):
            self.states[name] = holds

    def to_data(self) -> dict:
        return {"states": dict(self.states), "transitions": [list(t) for t in self.transitions]}

    @property
    def empty(self) -> bool:
        return not self.states and not self.transitions


def _holds_text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, (list, tuple, set)):
        return ", ".join(str(v).strip() for v in value if str(v).strip())
    return str(value).strip()


class DiagramFormatError(ValueError):
    """The answer cannot be read as a diagram; the message says why."""


def from_data(data: dict) -> Diagram:
    """Read ``{"states": ..., "transitions": ...}`` (several spellings accepted)."""
    d = Diagram()
    states = data.get("states", data.get("nodes", {}))
    holds = data.get("holds", data.get("resources", {})) or {}
    if not isinstance(holds, dict):
        raise DiagramFormatError("'holds' should map a state name to what it holds")
    if isinstance(states, dict):
        for name, h in states.items():
            if isinstance(h, dict):
                h = h.get("holds", h.get("resources", h.get("note", "")))
            d.add_state(str(name).strip(), _holds_text(h))
    elif isinstance(states, (list, tuple)):
        for entry in states:
            if isinstance(entry, str):
                d.add_state(entry.strip(), "")
            elif isinstance(entry, dict) and "name" in entry:
                d.add_state(str(entry["name"]).strip(),
                            _holds_text(entry.get("holds", entry.get("resources", entry.get("note", "")))))
            elif isinstance(entry, (list, tuple)) and len(entry) == 2:
                d.add_state(str(entry[0]).strip(), _holds_text(entry[1]))
            else:
                raise DiagramFormatError(f"a state should be a name, (name, holds) or "
                                         f"{{'name': ..., 'holds': ...}}, got {entry!r}")
    else:
        raise DiagramFormatError(f"'states' should be a dict {{name: holds}} or a list, got {type(states).__name__}")
    for name, h in holds.items():
        d.add_state(str(name).strip(), "")
        if not d.states[str(name).strip()]:
            d.states[str(name).strip()] = _holds_text(h)
    edges = data.get("transitions", data.get("edges", []))
    if not isinstance(edges, (list, tuple)):
        raise DiagramFormatError(f"'transitions' should be a list, got {type(edges).__name__}")
    for e in edges:
        if isinstance(e, dict):
            src = e.get("from", e.get("src", e.get("source")))
            dst = e.get("to", e.get("dst", e.get("target")))
            label = e.get("label", e.get("on", e.get("event", "")))
        elif isinstance(e, (list, tuple)) and len(e) in (2, 3):
            src, dst, label = (*e, "") if len(e) == 2 else e
        else:
            raise DiagramFormatError(f"a transition should be (from, to) or (from, to, label), got {e!r}")
        if src is None or dst is None:
            raise DiagramFormatError(f"a transition needs both ends, got {e!r}")
        _add_edge(d, str(src).strip(), str(dst).strip(), "" if label is None else str(label).strip())
    return d


def _add_edge(d: Diagram, src: str, dst: str, label: str) -> None:
    for end in (src, dst):
        if end not in d.states:
            d.states[end] = ""
            d.notes.append(("dia.only_in_transition", {"name": end}))
    d.transitions.append((src, dst, label))


# =============================================================================================
# DOT: a small reader and writer
# =============================================================================================
_TOKEN = re.compile(r"""
    (?P<ws>\s+|//[^\n]*|\#[^\n]*|/\*.*?\*/)
  | (?P<str>"(?:[^"\\]|\\.)*")
  | (?P<html><(?:[^<>]|<[^<>]*>)*>)
  | (?P<arrow>->|--)
  | (?P<punct>[{}\[\];,=:])
  | (?P<id>[^\s{}\[\];,=:"<>\-]+(?:-(?!>|-)[^\s{}\[\];,=:"<>\-]*)*|-?\d+(?:\.\d+)?)
""", re.VERBOSE | re.DOTALL)


def _tokens(text: str) -> list[tuple[str, str, int]]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if not m:
            line = text.count("\n", 0, pos) + 1
            raise DiagramFormatError(f"could not read the DOT text: unexpected {text[pos]!r} at line {line}")
        kind = m.lastgroup
        if kind != "ws":
            value = m.group(kind)
            if kind == "str":
                value = value[1:-1].replace('\\"', '"')
            elif kind == "html":
                value = re.sub(r"<br\s*/?>", "\n", value[1:-1], flags=re.I)
                value = re.sub(r"<[^>]+>", "", value)
            out.append(("id" if kind in ("str", "html", "id") else kind, value, text.count("\n", 0, pos) + 1))
        pos = m.end()
    return out


def _dot_lines(label: str) -> list[str]:
    parts = re.split(r"\\[nlr]|\n|\|", label)
    return [p.strip(" {}") for p in parts if p.strip(" {}")]


_HOLD_ATTRS = ("holds", "resources", "resource", "xlabel", "tooltip", "comment", "note")


def parse_dot(text: str) -> Diagram:
    """Nodes, edges (chains, ``a -> {b c}``), attributes; subgraphs are flattened."""
    return _DotParser(_tokens(text)).parse()


class _DotParser:
    """A recursive-descent reader for the DOT subset a lifecycle diagram uses."""

    def __init__(self, toks: list):
        self.toks, self.i = toks, 0
        self.d = Diagram()
        self.labels: dict[str, str] = {}

    def peek(self, k=0):
        return self.toks[self.i + k] if self.i + k < len(self.toks) else ("eof", "", -1)

    def expect(self, value):
        kind, v, line = self.peek()
        if v != value:
            raise DiagramFormatError(f"could not read the DOT text: expected {value!r} at line {line}, got {v!r}")
        self.i += 1

    def attrs(self) -> dict:
        out = {}
        while self.peek()[1] == "[":
            self.i += 1
            while self.peek()[1] != "]":
                kind, key, line = self.peek()
                if kind == "eof":
                    raise DiagramFormatError("could not read the DOT text: an attribute list is not closed with ']'")
                self.i += 1
                if self.peek()[1] == "=":
                    self.i += 1
                    out[key.lower()] = self.peek()[1]
                    self.i += 1
                if self.peek()[1] in (",", ";"):
                    self.i += 1
            self.i += 1
        return out

    def operand(self) -> list[str]:
        kind, v, line = self.peek()
        if v == "{" or v.lower() == "subgraph":
            return self.statements_block()
        if kind != "id":
            raise DiagramFormatError(f"could not read the DOT text: expected a state name at line {line}, got {v!r}")
        self.i += 1
        if self.peek()[1] == ":":  # port, e.g. a:n
            self.i += 2
        return [v]

    def statements_block(self) -> list[str]:
        if self.peek()[1].lower() == "subgraph":
            self.i += 1
            if self.peek()[0] == "id" and self.peek()[1] != "{":
                self.i += 1
        self.expect("{")
        names = self.statements("}")
        self.expect("}")
        return names

    def statements(self, end: str) -> list[str]:
        seen: list[str] = []
        while self.peek()[1] != end and self.peek()[0] != "eof":
            kind, v, line = self.peek()
            if v in (";", ","):
                self.i += 1
                continue
            if kind == "id" and v.lower() in ("graph", "node", "edge") and self.peek(1)[1] == "[":
                self.i += 1
                self.attrs()
                continue
            if kind == "id" and self.peek(1)[1] == "=":  # graph attribute a = b
                self.i += 3
                continue
            left = self.operand()
            chain = [left]
            while self.peek()[0] == "arrow":
                self.i += 1
                chain.append(self.operand())
            a = self.attrs()
            if len(chain) == 1:
                for name in left:
                    self.d.add_state(name, "")
                    if len(left) == 1:
                        self._node_attrs(name, a)
            else:
                label = a.get("label", a.get("xlabel", ""))
                for src_group, dst_group in zip(chain, chain[1:]):
                    for s in src_group:
                        for t in dst_group:
                            self.d.add_state(s, "")
                            self.d.add_state(t, "")
                            self.d.transitions.append((s, t, label))
            for group in chain:
                seen.extend(group)
        return seen

    def _node_attrs(self, name: str, a: dict) -> None:
        holds = next((a[k] for k in _HOLD_ATTRS if a.get(k)), "")
        label = a.get("label", "")
        if label:
            lines = _dot_lines(label)
            if lines:
                self.labels[name] = lines[0]
                if not holds and len(lines) > 1:
                    holds = "; ".join(lines[1:])
                elif not holds and ":" in lines[0] and len(lines) == 1:
                    head, _, tail = lines[0].partition(":")
                    self.labels[name], holds = head.strip(), tail.strip()
        if holds:
            self.d.states[name] = holds.strip()

    def parse(self) -> Diagram:
        # header: [strict] (graph|digraph) [id] {
        while self.peek()[0] == "id" and self.peek()[1].lower() in ("strict", "graph", "digraph"):
            self.i += 1
        if self.peek()[0] == "id" and self.peek()[1] != "{":
            self.i += 1
        if self.peek()[1] == "{":
            self.i += 1
            self.statements("}")
            self.expect("}")
        else:
            self.statements("\0")
        if self.peek()[0] != "eof":
            raise DiagramFormatError(f"could not read the DOT text: unexpected {self.peek()[1]!r} at line {self.peek()[2]}")
        self.d.labels = self.labels
        return self.d


def _dot_id(name: str) -> str:
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(d: Diagram, highlight: str | None = None) -> str:
    """DOT text for a diagram: each state shows its name and, below it, what it holds."""
    lines = ["digraph lifecycle {", '  rankdir=LR;', '  node [shape=box, style="rounded,filled", '
             'fillcolor="#f6f8fa", fontname="Helvetica", fontsize=11];',
             '  edge [fontname="Helvetica", fontsize=10];']
    for name, holds in d.states.items():
        label = name + (("\\n" + _wrap(holds).replace('"', '\\"')) if holds else "")
        extra = ', fillcolor="#fff8c5"' if name == highlight else ""
        lines.append(f'  {_dot_id(name)} [label="{label}", holds={_dot_id(holds)}{extra}];')
    for src, dst, label in d.transitions:
        attr = f" [label={_dot_id(label)}]" if label else ""
        lines.append(f"  {_dot_id(src)} -> {_dot_id(dst)}{attr};")
    lines.append("}")
    return "\n".join(lines)


def _wrap(text: str, width: int = 28) -> str:
    out, line = [], ""
    for word in text.replace("\\", "/").split():
        if line and len(line) + 1 + len(word) > width:
            out.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    if line:
        out.append(line)
    return "\\n".join(out)


def render_svg(dot: str) -> tuple[str | None, str | None]:
    """(svg, None) when Graphviz can draw it, else (None, a one-line reason)."""
    try:
        import graphviz
    except ImportError:
        return None, "the Python package 'graphviz' is not installed (pip install graphviz)"
    try:
        svg = graphviz.Source(dot).pipe(format="svg", encoding="utf-8")
    except graphviz.ExecutableNotFound:
        return None, ("Graphviz's 'dot' program is not installed (apt install graphviz, brew install graphviz "
                      "or conda install graphviz) — showing the DOT text instead; grading does not need it")
    except Exception as exc:  # a malformed graph or a crashing dot: show the text, never a traceback
        return None, f"Graphviz could not draw this graph ({type(exc).__name__}); showing the DOT text instead"
    return svg, None


# =============================================================================================
# Reading any answer
# =============================================================================================


def read_answer(answer) -> Diagram:
    """A Diagram from whatever form the answer takes; DiagramFormatError says what is wrong."""
    if isinstance(answer, Diagram):
        return answer
    if hasattr(answer, "to_data") and callable(answer.to_data):  # the DiagramEditor
        return from_data(answer.to_data())
    source = getattr(answer, "source", None)  # a graphviz.Digraph
    if isinstance(source, str):
        return parse_dot(source)
    if isinstance(answer, str):
        if re.search(r"->|--|\bdigraph\b|\bgraph\b", answer):
            return parse_dot(answer)
        raise DiagramFormatError("this string is not DOT text (no edges with '->'); give DOT text, a dict "
                                 "{'states': ..., 'transitions': ...}, or use the DiagramEditor")
    if isinstance(answer, dict):
        return from_data(answer)
    raise DiagramFormatError(f"task1_diagram should be a DiagramEditor, a dict {{'states': ..., 'transitions': ...}} "
                             f"or DOT text, got {type(answer).__name__}")
