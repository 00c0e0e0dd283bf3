"""Two errors a learner meets in a notebook, told as a sentence instead of a traceback.

* ``IllegalTransition``: running a walkthrough cell again repeats its engine call, e.g.
  ``llm.enqueue(req)`` on a request that is already WAITING. The engine is right to refuse
  (WAITING -> WAITING is not an edge of the lifecycle diagram); the traceback just hides why.
* ``KeyboardInterrupt`` (Kernel -> Interrupt): thirty lines of frames inside the engine, when the
  one thing to know is that the engine is consistent and the cell can be run again.

``install()`` registers an IPython custom exception handler (``set_custom_exc``) for these two;
``import minillm.viz`` calls it when it runs inside IPython. The cell still ends in an error, so
Run All stops there as before; only what is shown changes. Any other error keeps its traceback.
"""

from __future__ import annotations

import sys

from minillm.request import IllegalTransition

from .i18n import resolve_lang

TEXTS = {
    "en": {
        "illegal": ("{who} is already {old}, so it cannot move to {new}: the lifecycle diagram has no "
                    "{old} → {new} edge (from {old} it can go to: {allowed}). Running a cell again repeats "
                    "its engine call{hint}. To start over, run the cell that creates the request again."),
        "enqueue_hint": " (enqueue moves a request NEW → WAITING, once)",
        "release_hint": " (release moves a request FINISHED → RELEASED, once)",
        "request": "Request {rid!r}",
        "a_request": "The request",
        "nowhere": "nowhere, it is the end",
        "interrupt": ("Interrupted. If an engine step was running, it was rolled back or completed: the engine "
                      "is exactly as before or after that step, with no request half-way and no block lost. "
                      "Run the cell again, or go on."),
    },
    "zh": {
        "illegal": ("{who}已经处在 {old}，不能再变成 {new}：生命周期状态图里没有 {old} → {new} 这条边"
                    "（从 {old} 出发只能到：{allowed}）。把单元格再运行一遍，就是把其中的引擎调用再做一遍{hint}。"
                    "想从头来，请重新运行创建这个请求的那个单元格。"),
        "enqueue_hint": "（enqueue 把请求从 NEW 变成 WAITING，只能做一次）",
        "release_hint": "（release 把请求从 FINISHED 变成 RELEASED，只能做一次）",
        "request": "请求 {rid!r} ",
        "a_request": "这个请求",
        "nowhere": "无处可去，这就是终点",
        "interrupt": ("已中断。如果当时有一个引擎步正在运行，它已被回滚或做完：引擎的状态和那一步之前或之后完全一样，"
                      "没有做了一半的请求，也没有丢失的 KV 块。可以重新运行这个单元格，或者继续往下。"),
    },
}


def explain(exc: BaseException, lang=None) -> str | None:
    """The sentence for ``exc`` in ``lang`` (None: the course-wide language), or None for an
    error this module does not explain."""
    t = TEXTS[resolve_lang(lang)]
    if isinstance(exc, KeyboardInterrupt):
        return t["interrupt"]
    if not isinstance(exc, IllegalTransition) or exc.old is None or exc.new is None:
        return None
    from minillm.request import TRANSITIONS

    old, new = exc.old.value, exc.new.value
    allowed = ", ".join(sorted(s.value for s in TRANSITIONS[exc.old])) or t["nowhere"]
    hint = {"WAITING": t["enqueue_hint"], "RELEASED": t["release_hint"]}.get(new, "")
    who = t["request"].format(rid=exc.request_id) if exc.request_id is not None else t["a_request"]
    return t["illegal"].format(who=who, old=old, new=new, allowed=allowed, hint=hint)


def _handler(shell, etype, value, tb, tb_offset=None):
    text = explain(value)
    if text is None:  # not ours after all: the usual traceback
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
        return None
    name = getattr(etype, "__name__", "Error")
    stb = [f"\x1b[0;31m{name}\x1b[0m: {text}"]
    shell._showtraceback(etype, value, stb)
    return stb


def install(shell=None) -> bool:
    """Register the handler with the running IPython shell; False when there is none, or when
    another package's handler is already registered (it is left alone)."""
    if shell is None:
        ipython = sys.modules.get("IPython")
        shell = ipython.get_ipython() if ipython is not None else None
    if shell is None or not hasattr(shell, "set_custom_exc"):
        return False
    current = getattr(shell, "custom_exceptions", ())
    if current and getattr(shell, "_minillm_friendly_errors", False) is False:
        return False
    shell.set_custom_exc((IllegalTransition, KeyboardInterrupt), _handler)
    shell._minillm_friendly_errors = True
    return True
