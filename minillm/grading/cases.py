"""What every code grader shares: the run's seed for fresh cases, loading the engine piece an
answer is compared with, and turning a call's outcome into points and feedback.
"""

from __future__ import annotations

import random

from . import safecall
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


def _not_attempted_if_stub(outcome: safecall.Outcome, name: str) -> None:
    if outcome.not_implemented:
        raise NotAttempted.key("code.stub", name=name)


def _engine_piece(m: Marks, fn, name: str, module: str, load):
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
