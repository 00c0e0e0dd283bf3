"""Which model answers a notebook asked for, whatever name it used.

``show_solution("task2")`` leaves a recorded output, but a learner can clear outputs, or call it
under another name (``from minillm.grading import show_solution as peek``, ``s = show_solution``,
``getattr(grading, "show_" + "solution")``, the ``solutions`` module itself). This reads the
code cells as data, follows such aliases from cell to cell, and returns the exercise ids asked
for — ``"?"`` when the id cannot be read, so that every exercise goes to a person.
"""

from __future__ import annotations

import ast
import re

SOLUTION_NAMES = frozenset({"show_solution", "model_answer", "model_texts", "MODEL_ANSWERS", "close_to_model"})
UNKNOWN = "?"
_FIELD = re.compile(r"\{[^{}]*\}")


def _parse(source: str):
    from .extract import _parse as parse

    return parse(source)


def _first_string(call: ast.Call) -> str:
    if call.args and isinstance(call.args[0], ast.Constant) and isinstance(call.args[0].value, str):
        return call.args[0].value[:80]
    return UNKNOWN


def _mentions_solutions(text: str) -> bool:
    """A name or a path, not prose: ``show_solution``, ``…ch04.solutions``, ``solutions.py``."""
    return any(n in text for n in SOLUTION_NAMES) or (
        "solution" in text.lower() and not any(c.isspace() for c in text))


class _Tracker(ast.NodeVisitor):
    def __init__(self) -> None:
        self.aliases: set[str] = set(SOLUTION_NAMES)
        self.modules: set[str] = set()  # names bound to the solutions module
        self.seen: set[str] = set()

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        from_solutions = (node.module or "").split(".")[-1] == "solutions"
        for a in node.names:
            if from_solutions or a.name in SOLUTION_NAMES:
                self.aliases.add(a.asname or a.name)
            elif a.name == "solutions":
                self.modules.add(a.asname or a.name)

    def visit_Import(self, node: ast.Import) -> None:
        for a in node.names:
            if a.name.endswith(".solutions") and a.asname:
                self.modules.add(a.asname)

    def visit_Assign(self, node: ast.Assign) -> None:
        if self._is_solution_ref(node.value):  # peek = show_solution: follow the new name
            for t in node.targets:
                if isinstance(t, ast.Name):
                    self.aliases.add(t.id)
            return
        self.generic_visit(node)

    def _is_solution_ref(self, node) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.aliases
        if isinstance(node, ast.Attribute):
            return node.attr in SOLUTION_NAMES or (isinstance(node.value, ast.Name) and node.value.id in self.modules)
        return False

    def visit_Call(self, node: ast.Call) -> None:
        if self._is_solution_ref(node.func):  # peek("task2"): that exercise (or "?" when computed)
            self.seen.add(_first_string(node))
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                self.visit(arg)
            return
        self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> None:
        if isinstance(node.ctx, ast.Load) and (node.id in self.aliases or node.id in self.modules):
            self.seen.add(UNKNOWN)  # passed around, not called where we can read the id

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if node.attr in SOLUTION_NAMES or node.attr == "solutions":
            self.seen.add(UNKNOWN)
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if isinstance(node.value, str) and _mentions_solutions(node.value):
            self.seen.add(UNKNOWN)  # getattr(g, "show_solution"), import_module("…solutions")

    def visit_BinOp(self, node: ast.BinOp) -> None:
        folded = _fold(node)
        if folded is not None and _mentions_solutions(folded):
            self.seen.add(UNKNOWN)  # "show_" + "solution"
        self.generic_visit(node)


def _fold(node) -> str | None:
    """The string a ``+`` of string constants makes, or None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _fold(node.left), _fold(node.right)
        return left + right if left is not None and right is not None else None
    return None


def _pieces(tree) -> set[str]:
    """Every string a cell could assemble a name from: its string constants (f-string parts too,
    format fields dropped), each also reversed, and lists of character codes read as text."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and len(node.value) < 200:
            out.add(node.value)
            out.add(_FIELD.sub("", node.value))
            out.update(_FIELD.split(node.value))  # "{}_{}on".format(…): "_" and "on" are parts too
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)) and 3 <= len(node.elts) <= 60 and all(
                isinstance(e, ast.Constant) and type(e.value) is int and 32 <= e.value < 127 for e in node.elts):
            out.add("".join(chr(e.value) for e in node.elts))  # ''.join(map(chr, [115, 104, ...]))
    return out | {p[::-1] for p in out}


def _composes(target: str, pieces: list[str]) -> bool:
    """Can ``target`` be spelled by joining some of ``pieces`` (each used any number of times)?"""
    ends = {0}
    for i in range(len(target)):
        if i in ends:
            ends |= {i + len(p) for p in pieces if target.startswith(p, i)}
    return len(target) in ends


def _spells(target: str, tree) -> bool:
    """Does the cell hold ``target``'s parts (at least two characters each), however joined?"""
    pieces = [p for p in _pieces(tree) if p and p in target and (len(p) >= 2 or not p.isalnum())]
    return _composes(target, pieces) or any(target in p for p in _pieces(tree))


def _spells_a_solution_name(tree) -> bool:
    """Does the cell hold the parts of a model-answer name, however it joins them at run time
    (``"".join``, an f-string, ``format``, a reversed string, character codes, a name prefix)?"""
    pieces = {p for p in _pieces(tree) if p and not any(c.isspace() for c in p)}
    if any("solution" in p.lower() for p in pieces):
        return True
    for target in SOLUTION_NAMES:  # a prefix that goes past the underscore: k.startswith("show_s")
        if any(target.startswith(p) and len(p) > p.find("_") + 1 > 0 for p in pieces):
            return True
    parts = [p for p in pieces if p in "show_solution" and (len(p) >= 2 or not p.isalnum())]
    return _composes("show_solution", parts)


def solution_lookups(nb) -> set[str]:
    """Exercise ids (or ``"?"``) whose model answer the notebook's code asked for in any way."""
    tracker = _Tracker()
    for cell in nb.get("cells", []):
        if cell.get("cell_type") != "code":
            continue
        source = cell.get("source", "")
        tree = _parse(source if isinstance(source, str) else "".join(source))
        if tree is not None:
            tracker.visit(tree)
            if _spells_a_solution_name(tree):
                tracker.seen.add(UNKNOWN)
    return tracker.seen


_TAMPERING = frozenset({"__code__", "setprofile", "engine_guard", "FORBIDDEN", "WHOLE_ENGINE"})
#: tampering names a cell may assemble at run time ("engine" + "_guard", "".join([...]), reversed…)
_SPELLED = ("engine_guard", "setprofile", "WHOLE_ENGINE")


def _names_in(tree) -> set[str]:
    out = set()
    for sub in ast.walk(tree):
        if isinstance(sub, ast.Name):
            out.add(sub.id)
        elif isinstance(sub, ast.Attribute):
            out.add(sub.attr)
        elif isinstance(sub, (ast.Import, ast.ImportFrom)):
            out.update(part for a in sub.names for part in a.name.split("."))
        elif isinstance(sub, ast.Constant) and isinstance(sub.value, str) and len(sub.value) < 200:
            out.add(sub.value)
    return out


def tampers_with_the_guard(nb) -> bool:
    """Does the notebook's code name (or assemble) the guard that keeps the engine from answering?"""
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            source = cell.get("source", "")
            tree = _parse(source if isinstance(source, str) else "".join(source))
            if tree is not None and (_names_in(tree) & _TAMPERING or any(_spells(t, tree) for t in _SPELLED)):
                return True
    return False


def engine_references(nb, forbidden: dict) -> set[str]:
    """Answer names (keys of ``forbidden``: answer name -> "module:function" specs) whose engine
    function the notebook's code names anywhere, or every one when it touches the guard itself."""
    names: set[str] = set()
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            source = cell.get("source", "")
            tree = _parse(source if isinstance(source, str) else "".join(source))
            if tree is not None:
                names |= _names_in(tree)
                names |= {t for t in _SPELLED if _spells(t, tree)}
    if names & _TAMPERING:
        return set(forbidden)
    return {answer for answer, specs in forbidden.items()
            if any(s.split(":")[1] in names for s in specs if not s.endswith(":*") and not s.startswith("allow:"))}
