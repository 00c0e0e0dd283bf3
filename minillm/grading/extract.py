"""Answers read from a notebook's cells as data, without running anything.

Most answers are literals — a string, a letter, a pair ``(False, "why")``, a list of pairs, a
diagram dict or DOT text — so :func:`static_answers` reads them from the source with
``ast.literal_eval``, exactly as the last assignment in the notebook leaves them. What cannot
be read that way (a function with a real body, an answer computed by an expression) is
marked *dynamic* and fetched from the sandboxed kernel. A function whose body only raises
``NotImplementedError`` is the unanswered stub: not attempted, no kernel needed.

The DiagramEditor stores its diagram in its own cell's output (mime type
:data:`DIAGRAM_MIME`), so a lone ``.ipynb`` carries it; ``task1_diagram = editor`` reads it
from there. ``show_solution(id)`` leaves a :data:`SOLUTION_MIME` output; both that output and
the call in the source are collected, so the report can say which solutions were viewed.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

DIAGRAM_MIME = "application/vnd.minillm.diagram+json"
SOLUTION_MIME = "application/vnd.minillm.solution-shown+json"
STUB = "stub"
LITERAL = "literal"
DYNAMIC = "dynamic"


@dataclass
class Extracted:
    answers: dict = field(default_factory=dict)  # answer name -> (kind, value)
    solutions_viewed: set = field(default_factory=set)
    editor_diagram: dict | None = None
    unparsable_cells: list = field(default_factory=list)


def _parse(source: str):
    try:
        return ast.parse(source)
    except SyntaxError:
        pass
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return ast.parse(TransformerManager().transform_cell(source))
    except Exception:
        return None


def _is_stub(fn: ast.FunctionDef) -> bool:
    body = list(fn.body)
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    if len(body) != 1 or not isinstance(body[0], ast.Raise):
        return False
    exc = body[0].exc
    if isinstance(exc, ast.Call):
        exc = exc.func
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def _targets(node) -> list[str]:
    names = []
    for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
        if isinstance(t, ast.Name):
            names.append(t.id)
        elif isinstance(t, (ast.Tuple, ast.List)):
            names += [e.id for e in t.elts if isinstance(e, ast.Name)]
    return names


def _bound_names(node) -> set[str]:
    """Every name a statement could bind (for marking answers dynamic)."""
    out = set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
            out.add(sub.id)
        elif isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(sub.name)
        elif isinstance(sub, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in sub.names)
    return out


def _shown_solutions(tree) -> set[str]:
    out = set()
    for sub in ast.walk(tree):
        if isinstance(sub, ast.Call) and getattr(sub.func, "id", getattr(sub.func, "attr", None)) == "show_solution":
            if sub.args and isinstance(sub.args[0], ast.Constant) and isinstance(sub.args[0].value, str):
                out.add(sub.args[0].value)
            else:
                out.add("?")
    return out


def static_answers(nb, answer_names) -> Extracted:
    """Walk the code cells in order, as execution would, and record each answer's last binding."""
    wanted = set(answer_names)
    ex = Extracted()
    functions: dict[str, str] = {}  # function name -> STUB or DYNAMIC
    for i, cell in enumerate(nb.cells, start=1):
        if cell.get("cell_type") != "code":
            continue
        for out in cell.get("outputs", []) or []:
            data = out.get("data", {}) if isinstance(out, dict) else {}
            if isinstance(data.get(DIAGRAM_MIME), dict):
                ex.editor_diagram = data[DIAGRAM_MIME]
            shown = data.get(SOLUTION_MIME)
            if isinstance(shown, dict) and isinstance(shown.get("id"), str):
                ex.solutions_viewed.add(shown["id"][:80])
        source = cell.get("source", "")
        tree = _parse(source if isinstance(source, str) else "".join(source))
        if tree is None:
            ex.unparsable_cells.append(i)
            continue
        ex.solutions_viewed |= _shown_solutions(tree)
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions[node.name] = STUB if isinstance(node, ast.FunctionDef) and _is_stub(node) else DYNAMIC
                if node.name in wanted:
                    ex.answers[node.name] = (functions[node.name], None)
                continue
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
                names = _targets(node)
                simple = all(isinstance(t, ast.Name)
                             for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))
                for name in names:
                    if name not in wanted:
                        continue
                    if not simple:
                        ex.answers[name] = (DYNAMIC, None)
                    elif isinstance(node.value, ast.Name) and node.value.id in functions:
                        ex.answers[name] = (functions[node.value.id], None)
                    elif isinstance(node.value, ast.Name) and node.value.id == "editor":
                        ex.answers[name] = ("editor", None)
                    else:
                        try:
                            ex.answers[name] = (LITERAL, ast.literal_eval(node.value))
                        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                            ex.answers[name] = (DYNAMIC, None)
                for name in _bound_names(node) - set(names):
                    if name in wanted:
                        ex.answers[name] = (DYNAMIC, None)
                continue
            for name in _bound_names(node):
                if name in wanted:
                    ex.answers[name] = (DYNAMIC, None)
                if name in functions:
                    functions[name] = DYNAMIC
    return ex
