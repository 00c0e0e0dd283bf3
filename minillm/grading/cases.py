"""What every code grader shares: the run's seed for fresh cases, loading the engine piece an
answer is compared with, and the loop over cases (:class:`CaseRun`: call the learner's function
safely, stop at a stub, turn a raise or a timeout into feedback, give points in proportion).
"""

from __future__ import annotations

import random
from typing import Any, Callable, Iterator, NamedTuple

from . import safecall
from .engine_guard import MESSAGE
from .messages import msg
from .registry import CannotGrade, Marks, NotAttempted

_SEED: list[int] = []


def run_seed() -> int:
    """This process's seed for fresh cases: ``MINILLM_GRADE_SEED`` if set, else drawn once at random."""
    import os

    given = os.environ.get("MINILLM_GRADE_SEED", "").strip()
    if given.isdigit():
        return int(given)
    if not _SEED:
        _SEED.append(random.SystemRandom().randrange(2**31))
    return _SEED[0]


def engine_piece(m: Marks, fn, name: str, module: str, load):
    """The preamble every code grader shares: import the engine piece the answer is compared with
    (``load()``; failing is the grader's problem, not the student's) and reject an answer that is
    not a function. Returns the piece, or None after saying why the answer is not a function."""
    try:
        piece = load()
    except Exception as exc:
        raise CannotGrade(m.t("code.cannot_import", module=module, error=f"{type(exc).__name__}: {exc}")) from exc
    if not callable(fn):
        m.wrong(m.t("code.not_a_function", name=name, type=type(fn).__name__))
        return None
    return piece


def _failure(case: str, out: safecall.Outcome) -> str:
    """The feedback line for a call that timed out or raised (in the current language)."""
    if out.timed_out:
        return msg("code.stopped", case=case, error=out.describe())
    return msg("code.raised", case=case, error=out.describe())


def _fraction_points(m: Marks, passed: int, total: int, points: float) -> None:
    """All cases -> all points; otherwise points in proportion, in half-point steps."""
    if passed == total:
        m.score += points
    else:
        m.score += int(2 * points * passed / total) / 2


class Returned(NamedTuple):
    """One call of the learner's function that returned: the case, its name in feedback, the
    arguments it was called with and what came back."""

    case: Any
    label: str
    args: tuple
    value: Any


class CaseRun:
    """One code grader's pass over its cases, the loop every code grader shares.

    Iterating calls the learner's ``fn`` on each case (``args(case)``, ``kwargs(case)``) through
    :func:`safecall.call` with the engine functions ``forbid`` unavailable, and yields a
    :class:`Returned` for every call that returned; the grader judges it and says :meth:`passed`
    or :meth:`fail`. A stub (``NotImplementedError`` on the first case) raises
    :class:`NotAttempted`; a call that raised or timed out becomes a problem line by itself, and a
    timeout ends the run (the rest would time out too). :meth:`report` gives the points.
    """

    def __init__(self, fn, cases, args: Callable[[Any], tuple] = lambda case: (), *, name: str,
                 kwargs: Callable[[Any], dict] = lambda case: {}, label: Callable[[Any], str] = str,
                 forbid: tuple = (), fresh: Callable[[Any], bool] = lambda case: False) -> None:
        self.fn, self.cases, self.args, self.kwargs = fn, list(cases), args, kwargs
        self.name, self.label, self.forbid, self.fresh = name, label, forbid, fresh
        self.passes = 0
        self.misses = {False: 0, True: 0}  # cases not passed: printed ones (False), fresh ones (True)
        self._current: Any = None
        self.problems: list[str] = []  # in the cases' order: what feedback shows first
        self.failed: dict[str, str] = {}  # case label -> why its call did not return
        self.engine_used = False  # a call reached the engine's own answer: a person reads it
        self.unverified: str | None = None  # why a call could not be made in the clean room: a person reads it

    def __iter__(self) -> Iterator[Returned]:
        for i, case in enumerate(self.cases):
            label, args = self.label(case), self.args(case)
            self._current = case
            out = safecall.call(self.fn, *args, forbid=self.forbid, **self.kwargs(case))
            self.unverified = self.unverified or out.unverified
            if i == 0 and out.not_implemented:
                raise NotAttempted.key("code.stub", name=self.name)
            if out.ok:
                yield Returned(case, label, args, out.value)
                continue
            self.fail(_failure(label, out))
            self.failed[label] = self.problems[-1]
            self.engine_used = self.engine_used or out.engine_used or MESSAGE in (out.error or "")
            if out.timed_out:
                break

    @property
    def total(self) -> int:
        return len(self.cases)

    def passed(self) -> None:
        self.passes += 1

    def fail(self, text: str) -> None:
        self.problems.append(text)
        self.misses[bool(self.fresh(self._current))] += 1

    @property
    def looked_up(self) -> bool:
        """Right on every case the learner could have seen, wrong on a fresh one drawn for this run:
        the shape of a lookup table of the printed cases."""
        return self.misses[True] > 0 and self.misses[False] == 0

    def report(self, m: Marks, points: float, all_right: str, some_right: str, show: int = 3) -> bool:
        """Points in proportion to the cases passed; ``all_right`` when every case passed, else
        ``some_right`` and the first ``show`` problems. True when every case passed."""
        if self.engine_used:
            m.flag(why="the engine's own answer")
        if self.unverified:  # the guard in the notebook's own process is all that watched it
            m.flag(why=f"not run apart from the notebook ({self.unverified})")
        if self.looked_up:  # a lookup of the printed cases earns nothing; a person reads it
            m.wrong(m.t("code.fresh_only", n=self.misses[True]))
            m.flag(why="right only on the printed cases")
            for p in self.problems[:show]:
                m.wrong(p)
            return False
        _fraction_points(m, self.passes, self.total, points)
        if self.passes == self.total:
            m.ok(all_right)
            return True
        m.missing(some_right)
        for p in self.problems[:show]:
            m.wrong(p)
        return False
