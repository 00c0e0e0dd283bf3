"""The engine's own answer to a coding task, made unavailable while the learner's function is graded.

``my_top_p_filter`` that returns ``minillm.sampler.top_p_filter(logits, top_p)`` would pass every
case, having written nothing; so would the fast path's filter, a grader's reference, or a copy
of any of them. For the length of one graded call (a chapter names, per answer, the functions
that would answer it: ``Chapter.forbidden``):

* :func:`swapped` swaps the code of each named engine function for code that raises a
  RuntimeError saying so (every reference to the function sees it, however it was imported);
* :func:`watched` installs a profiler that notes, in the calling thread and the threads it
  starts, any call that still reaches the engine: a copy made from ``__code__``; with
  :data:`WHOLE_ENGINE` among the specs, *any* function of the ``minillm`` package (the fast
  path, the grading references, a module loaded a second time from its file), except the
  arguments' own types (:data:`ALLOWED`); code whose instructions are those of a sizeable package
  function (its source run again by ``exec``, pasted, docstring or not); and a thread or process
  started during the call (where the profiler cannot follow).

The code is put back when the call ends. It runs where the call runs: in the sandboxed kernel
for ``minillm grade``, in the learner's kernel for ``check()``. A kernel that rewrites this
module defeats it, as it could any check in its own process; ``minillm grade`` then sends the
notebook to a person (:func:`peeking.engine_references`).
"""

from __future__ import annotations

import builtins
import dis
import functools
import importlib
import os
import sys
import threading
import types
from contextlib import contextmanager

#: a spec meaning "no function of the minillm package may run during the call" (beyond ALLOWED)
WHOLE_ENGINE = "minillm:*"
#: a spec prefix naming engine functions a task's answer may call (with all they call in turn), e.g.
#: "allow:minillm.llm.LLM.cache_stats" for a byte count that reads the block size
ALLOW = "allow:"
#: package files a graded function may run: its arguments' own types (SamplingParams, StopReason),
#: and this guard
ALLOWED = ("params.py", "request.py", os.path.join("grading", "engine_guard.py"))
#: a function with at least this many bytes of bytecode is recognised when copied
MIN_COPY_BYTES = 160
MESSAGE = "is the engine's own answer; the task is to write it yourself"


def _resolve(spec: str):
    module, name = spec.split(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except Exception:  # noqa: BLE001 - a piece that is not there cannot be called either
        return None
    return fn if hasattr(fn, "__code__") else None


@functools.lru_cache(maxsize=None)
def _blocked(spec: str):
    """Code that raises, needing no globals or closure of its own (it runs as the engine function).
    Kept once made: a graded call's process makes it before it refuses new code (:func:`refuse_new_code`)."""
    source = f"def blocked(*args, **kwargs):\n    raise RuntimeError({spec.replace(':', '.') + ' ' + MESSAGE!r})\n"
    namespace: dict = {}
    exec(compile(source, "<minillm grading: engine function unavailable>", "exec"), namespace)  # noqa: S102
    return namespace["blocked"].__code__


def _blocked_code(name: str, nfree: int) -> types.CodeType:
    """:func:`_blocked`'s code for a function with ``nfree`` closure cells (a function's code can
    only be swapped for code with as many free variables)."""
    if not nfree:
        return _blocked(name)
    cells = [f"_c{i}" for i in range(nfree)]
    source = (f"def outer():\n    {' = '.join(cells)} = None\n    def blocked(*args, **kwargs):\n"
              f"        {', '.join(cells)}\n        raise RuntimeError({name + ' ' + MESSAGE!r})\n    return blocked\n")
    namespace: dict = {}
    exec(compile(source, "<minillm grading: engine function unavailable>", "exec"), namespace)  # noqa: S102
    return namespace["outer"]().__code__


#: package files the clean room runs itself (besides ALLOWED): :func:`disable_engine` keeps them
CLEAN_ROOM_FILES = (os.path.join("grading", "wire.py"), os.path.join("grading", "export.py"),
                    os.path.join("grading", "_worker.py"))
#: the packages' lazy-attribute hooks (``_lazy.lazy_names``'s ``__getattr__``/``__dir__``), which an
#: import statement asks: :func:`disable_engine` keeps them, as it keeps a module's own hooks
LAZY_HOOKS = "_lazy.py"
#: engine classes a task may let its function read (``allow:``): kept, and noted where not allowed
READABLE_CLASSES = ("minillm.kv_cache.CacheStats.",)


def disable_engine() -> int:
    """In the clean room, which never needs the engine itself: make every function of the package
    raise (its code swapped for :func:`_blocked`'s, for good), except the clean room's own files,
    the arguments' types, :data:`READABLE_CLASSES` and modules' lazy-attribute hooks (an import
    statement asks them; they answer nothing). A graded call that silences the watch (a C
    trampoline such as ``operator.methodcaller`` calls ``sys.setprofile`` with no event to see)
    then still finds no engine to call, and with files closed to it (:mod:`jail`'s call filter)
    cannot load one again. Returns how many functions it disabled; call it again after an import."""
    import gc

    eng = engine()
    keep = tuple(eng.root + f for f in (*ALLOWED, *CLEAN_ROOM_FILES, LAZY_HOOKS))
    done = 0
    for fn in gc.get_objects():
        if type(fn) is not types.FunctionType:
            continue
        code = fn.__code__
        path = code.co_filename
        if not path.startswith(eng.root) or path.startswith(keep):
            continue
        name = f"minillm.{path[len(eng.root):-3].replace(os.sep, '.')}.{code.co_qualname.split('.<locals>')[0]}"
        if not name.startswith(READABLE_CLASSES) and code.co_qualname not in ("__getattr__", "__dir__"):
            fn.__code__ = _blocked_code(name, len(code.co_freevars))
            done += 1
    return done


def copies_in(values) -> list[str]:
    """The engine functions that the code of the functions among ``values`` (and the code nested in
    it) copies, by their instructions. Read before a clean-room call, not watched during it: a call
    that silences its watch and calls a pasted copy is seen all the same."""
    eng, found = engine(), []
    for fn in values:
        if type(fn) is not types.FunctionType:
            continue
        stack = [fn.__code__]
        while stack:
            code = stack.pop()
            stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
            name = None if code.co_filename.startswith(eng.root) else eng.owner(code)
            if name and name not in found:
                found.append(name)
    return found[:3]


# --- what "the engine's code" is ------------------------------------------------------------
_SKIP_OPS = frozenset({"CACHE", "NOP", "RESUME", "EXTENDED_ARG", "PUSH_NULL", "PRECALL", "KW_NAMES",
                       "COPY_FREE_VARS", "MAKE_CELL"})


def fingerprint(code: types.CodeType) -> int:
    """The instructions of ``code`` with what a copy changes left out: line numbers, file name,
    local names, the docstring's slot, how a call or a method is loaded."""
    out = []
    for ins in dis.get_instructions(code):
        op = ins.opname
        if op in _SKIP_OPS:
            continue
        if op == "LOAD_CONST":
            v = ins.argval
            out.append(("C", fingerprint(v) if isinstance(v, types.CodeType) else repr(v)))
        elif op in ("LOAD_ATTR", "LOAD_METHOD", "LOAD_GLOBAL"):
            out.append(("A" if op != "LOAD_GLOBAL" else "G", ins.argval))
        elif "FAST" in op or "DEREF" in op or "CLOSURE" in op:
            out.append((op, ins.arg))
        elif "JUMP" in op or op in ("FOR_ITER", "SEND", "CALL"):
            out.append((op,))
        else:
            out.append((op, ins.argrepr))
    return hash(tuple(out))


class _Engine:
    """The package's folder and the fingerprints of its sizeable functions (computed once)."""

    def __init__(self) -> None:
        import minillm

        for name in minillm.__all__:  # loaded now: a graded call's `from minillm import X` then runs
            getattr(minillm, name)    # no package function (the package imports them on first use)
        self.root = os.path.dirname(os.path.realpath(minillm.__file__)) + os.sep
        self.allowed = tuple(self.root + a for a in ALLOWED)
        self._prints: dict[int, str] | None = None
        self._seen: dict = {}  # code object -> engine function it copies ("" for none)

    def prints(self) -> dict[int, str]:
        if self._prints is None:
            found: dict[int, str] = {}
            for folder, _, files in os.walk(self.root):
                for name in sorted(files):
                    if name.endswith(".py"):
                        self._add_file(os.path.join(folder, name), found)
            self._prints = found
        return self._prints

    def _add_file(self, path: str, found: dict) -> None:
        try:
            with open(path, "rb") as f:
                top = compile(f.read(), path, "exec", dont_inherit=True)
        except (OSError, SyntaxError, ValueError):
            return
        module = os.path.relpath(path, self.root)[:-3].replace(os.sep, ".")
        stack = [top]
        while stack:
            code = stack.pop()
            stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
            if code is not top and len(code.co_code) >= MIN_COPY_BYTES:
                found.setdefault(fingerprint(code), f"minillm.{module}.{code.co_qualname.split('.<locals>')[0]}")

    def owner(self, code: types.CodeType) -> str | None:
        """The engine function ``code`` is (or copies), or None for the learner's own code."""
        name = code.co_filename
        if name.startswith(self.root):
            if name.startswith(self.allowed) or code.co_name == "<module>":
                return None  # the arguments' own types; importing a module is not calling it
            module = name[len(self.root):-3].replace(os.sep, ".")
            return f"minillm.{module}.{code.co_qualname.split('.<locals>')[0]}"
        if len(code.co_code) < MIN_COPY_BYTES:
            return None
        if code not in self._seen:
            self._seen[code] = self.prints().get(fingerprint(code), "")
        return f"{self._seen[code]} (copied)" if self._seen[code] else None


_ENGINE: list[_Engine] = []


def engine() -> _Engine:
    if not _ENGINE:
        _ENGINE.append(_Engine())
    return _ENGINE[0]


def prepare() -> None:
    """Fingerprint the package now (about a second), so that no graded call pays for it."""
    engine().prints()


def _spawners() -> frozenset:
    import _posixsubprocess
    import _thread

    names = ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv", "execve", "execvp", "execvpe")
    found = {getattr(os, n) for n in names if hasattr(os, n)}
    return frozenset(found | {_thread.start_new_thread, _posixsubprocess.fork_exec})


# --- the clean room's stricter watch -----------------------------------------------------------
#: C functions a graded call in the clean room may not call: reaching the guard (the profiler,
#: frames, the garbage collector's lists), any other process or file (the kernel could answer
#: through one), or code made at run time. By module, then by name.
DENIED_C_MODULES = frozenset({"gc", "posix", "nt", "_io", "io", "_socket", "socket", "_ctypes", "_signal", "signal",
                              "select", "mmap", "marshal", "_pickle", "faulthandler", "resource", "fcntl",
                              "_posixsubprocess", "_thread", "termios", "_multiprocessing", "_posixshmem"})
DENIED_C_NAMES = frozenset({"exec", "eval", "compile", "open", "breakpoint", "setattr", "delattr", "__import__",
                            "input", "_getframe", "_current_frames", "getprofile", "setprofile", "gettrace",
                            "settrace", "setrecursionlimit", "setswitchinterval", "addaudithook"})
#: Python files of the standard library a graded call may not run (their functions reach threads,
#: processes, files, sockets, signals, frames or C memory)
DENIED_STDLIB = ("threading.py", "socket.py", "subprocess.py", "os.py", "signal.py", "shutil.py", "tempfile.py",
                 "inspect.py", "pickle.py", "selectors.py", "pty.py", "ctypes" + os.sep, "multiprocessing" + os.sep,
                 "concurrent" + os.sep, "asyncio" + os.sep, "importlib" + os.sep + "__init__.py")


def _denied_c(fn) -> bool:
    """Is the C function ``fn`` one a clean-room call may not call?"""
    module = getattr(fn, "__module__", None)
    if module in DENIED_C_MODULES:
        return True
    owner = getattr(fn, "__self__", None)
    if owner is not None and not isinstance(owner, types.ModuleType):
        kind = type(owner)
        if kind.__module__ in DENIED_C_MODULES or kind in (types.CodeType, types.FrameType):
            return True
    name = getattr(fn, "__name__", "")
    return name in DENIED_C_NAMES and (module in ("builtins", "sys") or owner is sys or owner is builtins)


def _watched_state() -> tuple:
    """Identities of everything the guard and the clean room look up at run time: a graded call
    that changed one (an attribute set on a module needs no call the profiler would see) did so to
    blind the guard."""
    import dis

    from . import export

    mods = (sys.modules[__name__], export, builtins, dis, types, threading)
    out = [(id(m), k, id(v)) for m in mods for k, v in list(vars(m).items())]
    out += [(id(sys), k, id(getattr(sys, k, None))) for k in ("setprofile", "getprofile", "modules", "_getframe")]
    for m in mods[:2]:
        out += [(id(f), "__code__", id(f.__code__)) for f in list(vars(m).values()) if isinstance(f, types.FunctionType)]
    return tuple(out)


def guard_state() -> tuple:
    """Identities of this module's names and functions' code, and of the profiler hooks: the
    kernel takes them before any cell runs and compares them before each graded call it makes
    itself, so a cell that rebinds the guard (even through text it hides from the grader's
    reading) is seen. (A cell can still defeat a check in its own process in deeper ways: that is
    why the code tasks' calls run in the clean room.)"""
    mod = sys.modules[__name__]
    out = [(k, id(v)) for k, v in list(vars(mod).items())]
    out += [(k, id(getattr(v, "__code__", None))) for k, v in list(vars(mod).items()) if isinstance(v, types.FunctionType)]
    out += [(k, id(getattr(m, k, None))) for m, k in ((sys, "setprofile"), (sys, "getprofile"),
                                                     (threading, "setprofile"), (sys, "_current_frames"))]
    return tuple(out)


def _private_owner(eng: "_Engine"):
    """``eng.owner`` from copies held only here: a graded call cannot reach them without a call the
    clean room's watch refuses (the module-level engine object it could simply change)."""
    root, allowed, prints, seen = eng.root, eng.allowed, dict(eng.prints()), {}
    fp, min_bytes = fingerprint, MIN_COPY_BYTES

    def owner(code: types.CodeType) -> str | None:
        name = code.co_filename
        if name.startswith(root):
            if name.startswith(allowed) or code.co_name == "<module>":
                return None
            return f"minillm.{name[len(root):-3].replace(os.sep, '.')}.{code.co_qualname.split('.<locals>')[0]}"
        if len(code.co_code) < min_bytes:
            return None
        if code not in seen:
            seen[code] = prints.get(fp(code), "")
        return f"{seen[code]} (copied)" if seen[code] else None

    return owner


@contextmanager
def clean_room_call(specs, emit):
    """The clean room's guard for one graded call (also while its function is rebuilt and its value
    encoded): :func:`swapped` and a watch that also refuses the calls in ``DENIED_*`` (an ``allow:``
    spec's function is not noted, but unlike :func:`watched` what it calls still is), checks
    :func:`_watched_state` after the call, and sends each finding at once through ``emit(text)`` (a
    write to the grader's pipe: what was sent cannot be taken back by what the call does next).
    Yields the list of findings."""
    stdlib = os.path.dirname(os.__file__) + os.sep
    denied_py = tuple(stdlib + d for d in DENIED_STDLIB)
    allowed = tuple(s[len(ALLOW):] for s in specs if s.startswith(ALLOW))
    with swapped(specs) as originals:
        owner = _private_owner(engine())
        spawners = _spawners()
        reached: list = []

        def note(what: str) -> None:
            if what not in reached and len(reached) < 3:
                reached.append(what)
                emit(what)

        me = sys._getframe().f_code  # this guard's own calls (installing, checking) are not the learner's
        check, check_code = _watched_state, _watched_state.__code__
        getprofile, setprofile, set_threads = sys.getprofile, sys.setprofile, threading.setprofile

        def watch(frame, event, arg):
            if frame.f_code is me or (event == "call" and frame.f_back is not None and frame.f_back.f_code is me):
                return
            if event == "call":
                code = frame.f_code
                if code in originals:
                    note(originals[code])
                elif code.co_filename.startswith(denied_py):
                    note(f"the grader's clean room refuses {code.co_filename[len(stdlib):]} ({code.co_name})")
                else:
                    found = owner(code)
                    if found and not any(found == a or found.startswith(a + ".") for a in allowed):
                        note(found)  # (an allowed function's own code only: what it calls is watched too)
            elif event == "c_call":
                if arg in spawners:
                    note(f"code, or hides it in a new thread or process ({getattr(arg, '__name__', '?')})")
                elif _denied_c(arg):
                    note(f"the grader's clean room refuses {getattr(arg, '__module__', None) or ''}."
                         f"{getattr(arg, '__name__', '?')} during a graded call")

        state = check()
        setprofile(watch)
        set_threads(watch)
        try:
            yield reached
        finally:
            removed = getprofile() is not watch
            setprofile(None)
            set_threads(None)
            if removed:
                note("(the grader's profiler was removed)")
            if check.__code__ is not check_code or check() != state:
                note("(the grader's guard was changed during the call)")


#: audit events of code made from text or bytes at run time: what a copy of the engine hidden in data
#: (a string encoded so that no reading before the call recognises it) needs in order to run
NEW_CODE_EVENTS = frozenset({"exec", "compile", "marshal.loads", "marshal.load", "code.__new__", "function.__new__"})


def refuse_new_code(specs=()) -> None:
    """For the rest of this process (a graded call's own, forked for it): exec, eval, compile,
    marshal and the code and function constructors raise. A learner's function needs none of
    them (the watch already notes them), but with the watch silenced a copy of the engine kept as
    text, decoded during the call, would run unseen. An audit hook, because it cannot be removed;
    the blocked code of ``specs`` (:func:`swapped`'s) is made first, since that uses compile."""
    for spec in specs or ():
        if spec != WHOLE_ENGINE and not spec.startswith(ALLOW):
            _blocked(spec)
    events, message = NEW_CODE_EVENTS, "code made from text or bytes is refused during a graded call"

    def hook(event, args):
        if event in events:
            raise RuntimeError(f"{message} ({event})")

    sys.addaudithook(hook)


# --- the guard ------------------------------------------------------------------------------
@contextmanager
def swapped(specs):
    """Within the block, the engine functions named by ``specs`` raise a RuntimeError saying so. Yields
    ``{original code: spec}`` for :func:`watched` (with the key ``WHOLE_ENGINE`` when every package
    function is off limits). The code is put back by the thread that entered the block, even while a
    timed-out call is still running in another thread."""
    done, originals = [], {}
    for spec in specs or ():
        if spec == WHOLE_ENGINE:
            prepare()
            originals[WHOLE_ENGINE] = WHOLE_ENGINE
            continue
        if spec.startswith(ALLOW):
            originals[ALLOW] = (*originals.get(ALLOW, ()), spec[len(ALLOW):])
            continue
        fn = _resolve(spec)
        if fn is None:
            continue
        originals[fn.__code__] = spec
        if not fn.__code__.co_freevars:  # a closure cannot take other code; the profiler still sees it
            done.append((fn, fn.__code__))
            fn.__code__ = _blocked(spec)
    try:
        yield originals
    finally:
        for fn, code in done:
            fn.__code__ = code


def _other_threads() -> dict:
    """Where every other thread is: its innermost frame and the instruction it is at."""
    me = threading.get_ident()
    return {tid: (frame, frame.f_lasti) for tid, frame in sys._current_frames().items() if tid != me}


def _ran_meanwhile(before: dict) -> bool:
    """Did a thread that was there before run Python code since (or a new one appear)?"""
    after = _other_threads()
    return any(tid not in before or before[tid][0] is not frame or before[tid][1] != frame.f_lasti
               for tid, (frame, _) in after.items())


@contextmanager
def watched(originals: dict, others_idle: bool = False):
    """In this thread (and threads it starts), note calls that reach one of ``originals`` anyway (a
    copy of the engine's code) and, under ``WHOLE_ENGINE``, any engine code or a copy of it and any
    thread or process started. ``others_idle`` (the sandboxed kernel, where nothing else should run):
    also note when another thread ran Python code during the call (a helper the profiler cannot
    follow). Yields the list of what was reached; also notes a removed profiler."""
    reached: list = []
    whole = WHOLE_ENGINE in originals
    eng = engine() if whole else None
    spawners = _spawners() if whole else frozenset()

    allowed = tuple(originals.get(ALLOW, ()))
    inside: list = []  # the frame of an allowed engine call in progress: what it calls is allowed too

    def note(what: str) -> None:  # the first few are enough to say what happened
        if what not in reached and len(reached) < 3:
            reached.append(what)

    def watch(frame, event, arg):
        if inside:
            if event == "return" and frame is inside[-1]:
                inside.pop()
            return
        if event == "call":
            code = frame.f_code
            if code in originals:
                note(originals[code])
            elif eng is not None:
                owner = eng.owner(code)
                if owner and allowed and owner.startswith(allowed):
                    inside.append(frame)
                elif owner:
                    note(owner)
        elif event == "c_call" and whole and arg in spawners:
            note(f"code, or hides it in a new thread or process ({getattr(arg, '__name__', '?')})")

    if not any(not isinstance(k, str) or k == WHOLE_ENGINE for k in originals):
        yield reached
        return
    threads = _other_threads() if whole and others_idle else None
    before = sys.getprofile()
    sys.setprofile(watch)
    threading.setprofile(watch)
    try:
        yield reached
    finally:
        if sys.getprofile() is not watch:
            note("(the grader's profiler was removed)")
        sys.setprofile(before)
        threading.setprofile(None)
        if threads is not None and _ran_meanwhile(threads):
            note("code, or hides it in another thread of the notebook that ran during the call")


@contextmanager
def unavailable(specs):
    """:func:`swapped` and :func:`watched` together, in one thread (the sandboxed kernel's, where no
    other thread of the notebook may run during the call)."""
    with swapped(specs) as originals, watched(originals, others_idle=True) as reached:
        yield reached
