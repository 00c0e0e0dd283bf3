"""A learner's function carried out of the notebook's kernel as data, and rebuilt in the clean room.

The engine guard (:mod:`engine_guard`) runs in the process that ran the notebook's cells, and a cell
can undo anything in its own process: rebind the guard's functions, reach the profiler's state, or
read the grader's command pipe in a thread of its own. So the code tasks' graded calls run in a
*clean room*: a process forked from the sandboxed kernel before any cell ran (:mod:`_worker`), with
its own pipes to the grader and its memory closed to the kernel (not dumpable). It needs the
learner's function without any of the kernel's state:

* :func:`export` (in the kernel) describes the function as data: which ``def`` of the notebook it
  is (a hash of its compiled code, never the code itself), and the globals, defaults and closure
  values it uses — modules and library objects by name, other functions of the notebook the same
  way, plain values through :mod:`wire`. Anything else (an object built by a cell) cannot leave:
  :class:`Unexportable`.
  Two kinds of library objects a cell hands the learner travel by value too: instances of the
  package's dataclasses (``cfg = llm.model_config``), field by field, and the engine itself, as an
  :class:`EngineView` of what a function may read of it (``model_config``, and a snapshot of
  ``cache_stats()`` where the task allows reading it).
* :func:`trusted_code` (in the clean room) compiles the notebook's cells itself, and
  :func:`rebuild` takes a function's code only from there: bytecode the kernel made up (which could
  read or write any memory) never runs in the clean room, only code a ``def`` of the notebook compiles to.

The clean room itself never calls the function: each call runs in a process forked for it
(``_worker._call_apart``), where the engine is disabled and files are closed.
"""

from __future__ import annotations

import builtins
import copy
import dataclasses
import functools
import hashlib
import importlib
import marshal
import sys
import types

from . import wire

#: deepest nesting of exported values (a function's default that is a function, ...)
MAX_DEPTH = 8
#: most functions one export may carry
MAX_FUNCTIONS = 64
#: what an :class:`EngineView` carries of the notebook's engine
VIEW_ATTRS = ("model_config", "cache_stats")
#: the allow spec (:data:`engine_guard.ALLOW`) under which a view's ``cache_stats()`` answers
CACHE_STATS = "minillm.llm.LLM.cache_stats"


class EngineView(types.SimpleNamespace):
    """The notebook's engine (``llm``) as a graded function may read it in the clean room: its
    ``model_config`` and, where the task allows it, ``cache_stats()`` (a copy of the snapshot taken
    when the function was exported). Attribute reads run no code: it has no methods of its own."""


class Unexportable(ValueError):
    """The function uses something that cannot be rebuilt apart from the notebook's kernel."""


def _codes(code: types.CodeType):
    stack = [code]
    while stack:
        c = stack.pop()
        yield c
        stack.extend(k for k in c.co_consts if isinstance(k, types.CodeType))


def _strip(code: types.CodeType) -> types.CodeType:
    consts = tuple(_strip(k) if isinstance(k, types.CodeType) else k for k in code.co_consts)
    return code.replace(co_filename="", co_consts=consts)


def code_key(code: types.CodeType) -> str:
    """The same for the same ``def`` compiled from the same text, wherever it was compiled."""
    return hashlib.sha256(marshal.dumps(_strip(code))).hexdigest()


def _names(code: types.CodeType) -> set[str]:
    return {n for c in _codes(code) for n in c.co_names}


def _ref(value) -> dict | None:
    """``value`` by name when importing its module and following its qualified name gives it back."""
    module, qual = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qual, str) or module == "__main__" or "<" in qual:
        return None
    ref = {"k": "ref", "mod": module, "qual": qual}
    try:
        found = _lookup(ref)
    except Exception:  # noqa: BLE001 - not reachable by name: not a reference
        return None
    return ref if found is value else None


def _library_dataclass(cls) -> bool:
    """A dataclass of the package, which the clean room may build field by field without running it."""
    return (isinstance(cls, type) and dataclasses.is_dataclass(cls) and isinstance(cls.__module__, str)
            and cls.__module__.startswith("minillm.") and "__del__" not in dir(cls))


def _is_engine(v) -> bool:
    llm = sys.modules.get("minillm.llm")  # not imported: no engine can exist
    return llm is not None and type(v) is getattr(llm, "LLM", None)


def _carries_other(data) -> bool:
    """Does a :func:`wire.encode` form hold a value the wire could not carry?"""
    stack = [data]
    while stack:
        d = stack.pop()
        if isinstance(d, dict):
            if d.get("t") == "other":
                return True
            stack.extend(d.values())
        elif isinstance(d, list):
            stack.extend(d)
    return False


class _Exporter:
    """:func:`export`'s work: each value the function reaches, as the kind of data the clean room
    can rebuild without running it (or :class:`Unexportable`)."""

    def __init__(self, user_ns: dict) -> None:
        self.user_ns = user_ns
        self.ns: dict[str, dict] = {}
        self.functions = 0
        self.names: set[str] = set()  # every name the exported functions' code uses
        self.engines: list = []  # engines carried as views

    def value(self, v, depth: int) -> dict:
        if depth > MAX_DEPTH:
            raise Unexportable("values nested too deeply")
        if isinstance(v, types.ModuleType):
            return {"k": "mod", "name": v.__name__}
        if type(v) is types.FunctionType and v.__globals__ is self.user_ns:
            return self.function(v, depth)
        ref = _ref(v) if callable(v) or isinstance(v, type) else None
        if ref is not None:
            return ref
        if _is_engine(v):
            self.engines.append(v)
            return {"k": "view", "model_config": self.value(v.model_config, depth + 1),
                    "cache_stats": self.value(v.cache_stats(), depth + 1)}
        data = wire.encode(v)
        if not _carries_other(data):
            return {"k": "data", "v": data}
        cls = type(v)
        if _library_dataclass(cls) and _ref(cls) is not None:
            return {"k": "dc", "cls": _ref(cls),
                    "fields": {f.name: self.value(getattr(v, f.name), depth + 1) for f in dataclasses.fields(cls)}}
        raise Unexportable(f"a {cls.__name__} made by the notebook")

    def check_views(self) -> None:
        """A function that reads more of the engine than a view carries stays in the notebook."""
        for llm in self.engines:
            extra = sorted(n for n in self.names if not n.startswith("_") and n not in VIEW_ATTRS and hasattr(llm, n))
            if extra:
                raise Unexportable(f"it reads the engine's {extra[0]}, which stays in the notebook")

    def function(self, fn: types.FunctionType, depth: int) -> dict:
        self.functions += 1
        if self.functions > MAX_FUNCTIONS:
            raise Unexportable("too many functions")
        self.names |= _names(fn.__code__)
        for name in sorted(_names(fn.__code__)):
            if name in self.ns or name not in self.user_ns or name == "__builtins__":
                continue
            self.ns[name] = {"k": "pending"}  # a function that names itself (recursion)
            self.ns[name] = self.value(self.user_ns[name], depth + 1)
        return {"k": "fn", "key": code_key(fn.__code__), "name": fn.__name__,
                "defaults": [self.value(d, depth + 1) for d in fn.__defaults__ or ()],
                "kwdefaults": {k: self.value(d, depth + 1) for k, d in (fn.__kwdefaults__ or {}).items()},
                "closure": [self.value(c.cell_contents, depth + 1) for c in fn.__closure__ or ()]}


def export(fn, user_ns: dict) -> dict:
    """``fn`` (a function of the notebook, ``user_ns`` its namespace) as JSON-ready data."""
    if type(fn) is not types.FunctionType or fn.__globals__ is not user_ns:
        raise Unexportable(f"not a function defined by a cell ({type(fn).__name__})")
    ex = _Exporter(user_ns)
    root = ex.function(fn, 0)
    ex.check_views()
    return {"fn": root, "ns": ex.ns}


def trusted_code(sources: list[str]) -> dict[str, types.CodeType]:
    """Every code object the cells' sources compile to (IPython's syntax turned into Python first),
    by :func:`code_key`."""
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        transform = TransformerManager().transform_cell
    except Exception:  # noqa: BLE001 - plain Python cells still compile
        transform = None
    found: dict[str, types.CodeType] = {}
    for src in sources:
        for text in {src, transform(src) if transform else src}:
            for top in _compiled(text):
                for code in _codes(top):
                    if code is not top:
                        found.setdefault(code_key(code), code)
    return found


def _compiled(text: str) -> list[types.CodeType]:
    """The cell compiled as IPython compiles it, one top-level statement at a time (a method call
    on a name the same unit imports compiles differently), and whole."""
    import ast

    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # the kernel reported the cell's error
        return []
    units = [ast.Module(body=[node], type_ignores=[]) for node in tree.body] + [tree]
    out = []
    for unit in units:
        try:
            out.append(compile(unit, "<cell>", "exec", dont_inherit=True))
        except (SyntaxError, ValueError, TypeError, RecursionError, MemoryError):
            continue
    return out


def rebuild(payload: dict, trusted: dict[str, types.CodeType], allowed=()):
    """The function :func:`export` described, its code taken from ``trusted`` only. Runs no code of
    the learner's: modules are imported and library objects looked up by name, package dataclasses
    filled in field by field, nothing more. ``allowed``: the engine functions the task lets the
    function call (an engine view answers ``cache_stats()`` only under :data:`CACHE_STATS`)."""
    builder = _Builder(trusted, tuple(allowed))
    for name, v in payload.get("ns", {}).items():
        if isinstance(v, dict) and v.get("k") != "pending":
            builder.ns[str(name)] = builder.build(v)
    fn = builder.build(payload.get("fn"))
    _import_ahead([fn, *builder.ns.values()])
    return fn


class _Builder:
    """:func:`rebuild`'s work: one method per kind of exported value."""

    def __init__(self, trusted: dict[str, types.CodeType], allowed: tuple) -> None:
        self.trusted, self.allowed = trusted, allowed
        self.ns: dict = {"__builtins__": builtins, "__name__": "__main__"}

    def build(self, v, depth: int = 0):
        if not isinstance(v, dict) or depth > MAX_DEPTH + 2:
            raise Unexportable("malformed export")
        kind = v.get("k")
        if kind == "mod":
            return importlib.import_module(str(v["name"]))
        if kind == "ref":
            return _lookup(v)
        if kind == "data":
            return wire.decode(v["v"])
        if kind == "fn":
            return self.function(v, depth)
        if kind == "dc":
            return self.dataclass(v, depth)
        if kind == "view":
            return self.view(v, depth)
        raise Unexportable("malformed export")

    def function(self, v: dict, depth: int) -> types.FunctionType:
        code = self.trusted.get(str(v.get("key")))
        if code is None:
            raise Unexportable(f"{str(v.get('name'))[:60]} is not code a cell of the notebook defines")
        cells = tuple(types.CellType(self.build(c, depth + 1)) for c in v.get("closure", []))
        if len(cells) != len(code.co_freevars):
            raise Unexportable("malformed closure")
        defaults = tuple(self.build(d, depth + 1) for d in v.get("defaults", [])) or None
        f = types.FunctionType(code, self.ns, str(v.get("name", code.co_name)), defaults, cells or None)
        f.__kwdefaults__ = {str(k): self.build(d, depth + 1) for k, d in v.get("kwdefaults", {}).items()} or None
        return f

    def dataclass(self, v: dict, depth: int):
        """A package dataclass, made without calling it (no ``__init__``, no ``__post_init__``) and
        given exactly its declared fields."""
        cls = _lookup(v.get("cls"))
        fields = v.get("fields")
        if not _library_dataclass(cls) or not isinstance(fields, dict):
            raise Unexportable("malformed export")
        names = [f.name for f in dataclasses.fields(cls)]
        if sorted(fields) != sorted(names):
            raise Unexportable("malformed export")
        try:
            obj = object.__new__(cls)
        except TypeError:
            raise Unexportable(f"a {cls.__name__} cannot be carried by value") from None
        for name in names:
            object.__setattr__(obj, name, self.build(fields[name], depth + 1))
        return obj

    def view(self, v: dict, depth: int) -> EngineView:
        from ..kv_cache import CacheStats
        from ..models.config import ModelConfig

        cfg, stats = self.build(v.get("model_config"), depth + 1), self.build(v.get("cache_stats"), depth + 1)
        if type(cfg) is not ModelConfig or type(stats) is not CacheStats:
            raise Unexportable("malformed export")
        view = EngineView(model_config=cfg)
        if CACHE_STATS in self.allowed:
            view.cache_stats = functools.partial(copy.copy, stats)
        return view


def _lookup(v):
    """The library object a ``ref`` names (by importing its module and following its qualified name)."""
    if not isinstance(v, dict) or v.get("k") != "ref":
        raise Unexportable("malformed export")
    found = importlib.import_module(str(v["mod"]))
    for part in str(v["qual"]).split("."):
        found = getattr(found, part)
    return found


def _import_ahead(values) -> None:
    """Import now the modules the functions import when they run: an import during the graded call
    reads files, which the clean room's guard refuses."""
    import dis

    for f in [v for v in values if type(v) is types.FunctionType]:
        for code in _codes(f.__code__):
            for ins in dis.get_instructions(code):
                if ins.opname == "IMPORT_NAME" and isinstance(ins.argval, str):
                    try:
                        importlib.import_module(ins.argval)
                    except Exception:  # noqa: BLE001 - its own ImportError comes in the call
                        pass
