"""Call a student's function without letting it hang or crash the grader.

The function runs in a worker thread. If it has not returned after ``timeout`` seconds the
grader stops waiting, asks the thread to stop (an asynchronous exception, which interrupts
pure-Python loops such as ``while True: pass``) and reports the timeout as feedback.
Exceptions become a one-line message naming the line of the student's code. Warnings the
function emits are swallowed: stderr noise never changes a score.

A thread (not a subprocess) keeps the student's function callable as it is — it may be
defined in a notebook cell and close over notebook variables, which cannot be pickled.
"""

from __future__ import annotations

import ctypes
import os
import threading
import traceback
import warnings
from dataclasses import dataclass
from typing import Any

DEFAULT_TIMEOUT = 3.0
_HERE = os.path.dirname(os.path.abspath(__file__))


class StudentTimeout(BaseException):
    """Injected into a worker thread that ran past its time limit."""


@dataclass
class Outcome:
    value: Any = None
    error: str | None = None  # "ZeroDivisionError: division by zero (line 3, in my_top_p_filter)"
    exc_type: type | None = None
    timed_out: bool = False
    error_zh: str | None = None  # the same, in Chinese, where the grader wrote it (not the student's exception)
    engine_used: bool = False  # the call reached the engine's own answer (engine_guard)
    unverified: str | None = None  # why the call could not be made in the clean room (see export)

    @classmethod
    def failed(cls, key: str, *, timed_out: bool = False, exc_type: type | None = None, **fields) -> "Outcome":
        """An outcome whose error is message ``key`` of :mod:`messages`, in both languages."""
        from .messages import both

        en, zh = both(key, **fields)
        return cls(error=en, error_zh=zh, timed_out=timed_out, exc_type=exc_type, engine_used=key == "call.engine_used")

    def describe(self, lang: str | None = None) -> str | None:
        """The error in ``lang`` (default: the current language)."""
        from ..i18n import resolve

        return self.error_zh if resolve(lang) == "zh" and self.error_zh else self.error

    @property
    def ok(self) -> bool:
        return self.error is None and not self.timed_out

    @property
    def not_implemented(self) -> bool:
        return self.exc_type is NotImplementedError


def _where(exc: BaseException) -> str:
    """The innermost frame that belongs to the student (not this package, not a library)."""
    frames = traceback.extract_tb(exc.__traceback__)
    mine = [f for f in frames if not f.filename.startswith(_HERE) and "site-packages" not in f.filename]
    if not mine:
        return ""
    f = mine[-1]
    return f" (line {f.lineno}, in {f.name})"


def call(fn, *args, timeout: float | None = None, forbid: tuple = (), **kwargs) -> Outcome:
    """Run ``fn(*args, **kwargs)`` with a time limit (``DEFAULT_TIMEOUT`` seconds unless given);
    never raises for the student's errors. ``forbid``: engine functions ("module:function") that
    are unavailable during the call (:mod:`engine_guard`); reaching one fails the call."""
    from .engine_guard import swapped, watched

    timeout = DEFAULT_TIMEOUT if timeout is None else timeout
    if isinstance(fn, RemoteFunction):
        return fn.outcome(args, kwargs, timeout, forbid)
    if not callable(fn):
        return Outcome.failed("call.not_function", type=type(fn).__name__, exc_type=TypeError)
    box: dict = {}

    def target():
        try:
            with watched(originals) as reached:
                box["reached"] = reached
                box["value"] = fn(*args, **kwargs)
        except StudentTimeout:
            box["timeout"] = True
        except BaseException as exc:  # SystemExit, KeyboardInterrupt in student code are feedback too
            box["exc"] = exc

    worker = threading.Thread(target=target, name="minillm-grading-student-call", daemon=True)
    with warnings.catch_warnings(), swapped(forbid) as originals:
        warnings.simplefilter("ignore")
        worker.start()
        worker.join(timeout)
        if worker.is_alive():
            _interrupt(worker)
            worker.join(1.0)
            return Outcome.failed("call.timeout", t=timeout, timed_out=True)
    if box.get("reached"):
        return Outcome.failed("call.engine_used", name=", ".join(box["reached"]), exc_type=RuntimeError)
    if "exc" in box:
        exc = box["exc"]
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return Outcome(error=f"{type(exc).__name__}{': ' + text if text else ''}{_where(exc)}",
                       exc_type=type(exc))
    if box.get("timeout"):
        return Outcome.failed("call.timeout_bare", t=timeout, timed_out=True)
    return Outcome(value=box.get("value"))


class RemoteFunction:
    """A student's function that lives in the sandboxed kernel (``minillm grade``): calling it
    sends the arguments there as data and brings back the returned value as data, under a hard
    time limit enforced by killing the kernel (see :mod:`sandbox`)."""

    def __init__(self, session, name: str) -> None:
        self.session = session
        self.name = name

    def __call__(self, *args, **kwargs):
        out = self.outcome(args, kwargs, DEFAULT_TIMEOUT)
        if not out.ok:
            raise RuntimeError(out.error)
        return out.value

    def outcome(self, args, kwargs, timeout: float, forbid: tuple = ()) -> Outcome:
        return self.session.call(self.name, tuple(args), dict(kwargs), timeout, forbid)

    def __repr__(self) -> str:
        return f"<function {self.name} (in the sandboxed kernel)>"


_EXC_BY_NAME = {"NotImplementedError": NotImplementedError, "TypeError": TypeError, "ValueError": ValueError}


def remote_outcome(kind: str, payload) -> Outcome:
    """An :class:`Outcome` from what the kernel sent back."""
    if kind == "unverified":  # made in the notebook's own kernel: its outcome, and why
        inner_kind, inner, why = payload
        out = remote_outcome(inner_kind, inner)
        out.unverified = str(why)
        return out
    if kind == "returned":
        return Outcome(value=payload)
    if kind == "engine_used":
        return Outcome.failed("call.engine_used", name=str(payload)[:200], exc_type=RuntimeError)
    message, exc_name = payload
    return Outcome(error=message, exc_type=_EXC_BY_NAME.get(exc_name, type(exc_name, (Exception,), {})))


def _interrupt(thread: threading.Thread) -> None:
    """Raise StudentTimeout inside ``thread`` at its next Python bytecode."""
    if thread.ident is None:
        return
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(StudentTimeout))
