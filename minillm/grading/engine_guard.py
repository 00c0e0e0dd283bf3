"""The engine's own answer to a coding task, made unavailable while the learner's function is graded.

``my_top_p_filter`` that returns ``minillm.sampler.top_p_filter(logits, top_p)`` would pass every
case, having written nothing (a chapter names, per answer, the functions that would answer it:
``Chapter.forbidden``). For the length of one graded call, :func:`unavailable` swaps the
code of each engine function that answers the task for code that raises a RuntimeError saying so
(every reference to the function sees it, however it was imported or renamed), and a profiler
notes any call that still reaches the original code (a copy made from ``__code__``). The code is
put back when the call ends. It runs where the call runs: in the sandboxed kernel for
``minillm grade``, in the learner's kernel for ``check()``.
"""

from __future__ import annotations

import importlib
import sys
import threading
from contextlib import contextmanager

def _resolve(spec: str):
    module, name = spec.split(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except Exception:  # noqa: BLE001 - a piece that is not there cannot be called either
        return None
    return fn if hasattr(fn, "__code__") else None


MESSAGE = "is the engine's own answer; the task is to write it yourself"


def _blocked(spec: str):
    """Code that raises, needing no globals or closure of its own (it runs as the engine function)."""
    source = f"def blocked(*args, **kwargs):\n    raise RuntimeError({spec.replace(':', '.') + ' ' + MESSAGE!r})\n"
    namespace: dict = {}
    exec(compile(source, "<minillm grading: engine function unavailable>", "exec"), namespace)  # noqa: S102
    return namespace["blocked"].__code__


@contextmanager
def swapped(specs):
    """Within the block, the engine functions named by ``specs`` raise a RuntimeError saying so. Yields
    ``{original code: spec}`` for :func:`watched`. The code is put back by the thread that entered the
    block, even while a timed-out call is still running in another thread."""
    done, originals = [], {}
    for spec in specs or ():
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


@contextmanager
def watched(originals: dict):
    """In this thread (and threads it starts), note calls that reach one of ``originals`` anyway (a
    copy of the engine's code). Yields the list of specs reached; also notes a removed profiler."""
    reached: list = []

    def watch(frame, event, arg):
        if event == "call" and frame.f_code in originals and originals[frame.f_code] not in reached:
            reached.append(originals[frame.f_code])

    if not originals:
        yield reached
        return
    before = sys.getprofile()
    sys.setprofile(watch)
    threading.setprofile(watch)
    try:
        yield reached
    finally:
        if sys.getprofile() is not watch:
            reached.append("(the grader's profiler was removed)")
        sys.setprofile(before)
        threading.setprofile(None)


@contextmanager
def unavailable(specs):
    """:func:`swapped` and :func:`watched` together, in one thread (the sandboxed kernel's)."""
    with swapped(specs) as originals, watched(originals) as reached:
        yield reached
