"""The instructor's loop: read what the grader was unsure of, accept or override it, with a reason.

The automatic grade stays what it was; a person's decision is stored beside the gradebook in
``overrides.json`` and applied on top of it, now and on every regrade:

    minillm grade FOLDER/                              gradebook.csv + gradebook.json (+ overrides)
    minillm grade --review FOLDER/gradebook.json       go through the flagged answers one by one
    minillm grade --review G.json --set alice.ipynb:task2_kv_explain=2 --reason "says both ideas"
    minillm grade --review G.json --accept alice.ipynb:task4_sampling

An override is bound to the exact answer it was given for (a hash of the answer's text): if the
student hands in a changed answer, the old decision is not applied, the answer is flagged again,
and the review lists the override as stale. Each exercise's entry in the gradebook then shows
``auto_score`` (the grader's), ``override`` (the person's decision, or null) and ``score`` (the
final one), and the CSV shows the automatic total, the final total and every override.
"""

from __future__ import annotations

import copy
import datetime as _dt
import getpass
import hashlib
import json
import os
import stat
import sys
from pathlib import Path

from .report import as_json, gradebook_csv, safe_text, write_atomic

OVERRIDES = "overrides.json"


def answer_hash(entry: dict) -> str:
    text = entry.get("answer")
    return hashlib.sha256(("" if text is None else str(text)).encode("utf-8")).hexdigest()[:16]


def _key(notebook: str, exercise: str) -> str:
    return f"{Path(str(notebook)).name}:{exercise}"


def load(folder: Path) -> dict:
    """``{"notebook.ipynb:exercise": decision}`` from ``folder/overrides.json`` (empty if none)."""
    path = Path(folder) / OVERRIDES
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return {}
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    items = data.get("overrides", []) if isinstance(data, dict) else []
    return {_key(d["notebook"], d["exercise"]): d for d in items
            if isinstance(d, dict) and isinstance(d.get("notebook"), str) and isinstance(d.get("exercise"), str)
            and isinstance(d.get("score"), (int, float)) and not isinstance(d.get("score"), bool)}


def save(folder: Path, decisions: dict) -> None:
    items = sorted(decisions.values(), key=lambda d: (d["notebook"], d["exercise"]))
    write_atomic(Path(folder) / OVERRIDES, json.dumps({"overrides": items}, indent=2, ensure_ascii=False) + "\n")


def apply(reports: list[dict], decisions: dict) -> list[dict]:
    """The reports with every decision applied (copies; the inputs are left as they were)."""
    out = []
    for report in reports:
        r = copy.deepcopy(report)
        exercises = r.get("exercises", {})
        if not isinstance(exercises, dict) or not exercises:
            out.append(r)
            continue
        auto_total = 0.0
        for ex_id, entry in exercises.items():
            entry.setdefault("auto_score", entry.get("score", 0))
            auto_total += float(entry["auto_score"] or 0)
            _apply_one(entry, decisions.get(_key(r.get("notebook", ""), ex_id)))
        r["auto_total"] = _num(auto_total)
        r["total_score"] = _num(sum(float(e.get("score") or 0) for e in exercises.values()))
        r["needs_review"] = [k for k, e in exercises.items() if e.get("needs_human_review")]
        r["stale_overrides"] = [k for k, e in exercises.items() if e.get("stale_override")]
        out.append(r)
    return out


def _apply_one(entry: dict, decision: dict | None) -> None:
    entry["override"] = None
    entry["score"] = entry["auto_score"]
    entry.pop("stale_override", None)
    if decision is None:
        return
    if decision.get("answer_hash") != answer_hash(entry):
        entry["stale_override"] = True  # the answer changed since the decision: a person looks again
        entry["needs_human_review"] = True
        return
    top = float(entry.get("max") or 0)
    entry["override"] = {k: decision.get(k) for k in ("score", "reason", "by", "at")}
    entry["score"] = _num(min(max(float(decision["score"]), 0.0), top))
    entry["needs_human_review"] = False


def _num(x: float):
    x = round(float(x), 2)
    return int(x) if x == int(x) else x


def decide(decisions: dict, report: dict, ex_id: str, score: float | None, reason: str) -> dict:
    """Record a person's decision on one answer (``score=None``: accept the automatic score)."""
    entry = report.get("exercises", {}).get(ex_id)
    if entry is None:
        raise ValueError(f"exercise: {ex_id!r} is not in {report.get('notebook')}; the ids are: "
                         f"{', '.join(report.get('exercises', {}))}")
    top = float(entry.get("max") or 0)
    auto = float(entry.get("auto_score", entry.get("score", 0)) or 0)
    if score is None:
        score = auto
    elif not 0 <= score <= top:
        raise ValueError(f"score: must be between 0 and {_num(top)} for {ex_id}, got {score:g}")
    if score != auto and not reason.strip():
        raise ValueError("reason: an override needs a reason (--reason \"...\")")
    decision = {"notebook": Path(str(report.get("notebook", ""))).name, "exercise": ex_id, "score": _num(score),
                "auto_score": _num(auto), "reason": reason.strip() or "accepted", "answer_hash": answer_hash(entry),
                "by": _who(), "at": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    decisions[_key(decision["notebook"], ex_id)] = decision
    return decision


def _who() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment: the decision is still recorded
        return "?"


# --- the command -----------------------------------------------------------------------------
def _read(path: Path) -> dict:
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise OSError("not a regular file")
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError("not a report or a gradebook")
    return data


def _reports(data: dict) -> list[dict]:
    return [r for r in data.get("reports", [data]) if isinstance(r, dict)]


def _find(reports: list[dict], target: str) -> tuple[dict, str]:
    """``"alice.ipynb:task2_kv_explain"`` (or ``"task2_kv_explain"`` in a one-notebook report)."""
    name, _, ex_id = target.rpartition(":")
    matches = [r for r in reports if not name or Path(str(r.get("notebook", ""))).name == name]
    if len(matches) != 1:
        raise ValueError(f"notebook: {name or '(none given)'!r} matches {len(matches)} reports; give NOTEBOOK:EXERCISE")
    return matches[0], ex_id


def _write(path: Path, data: dict, reports: list[dict]) -> None:
    """The gradebook (or report) at ``path`` with the decisions applied; a gradebook's CSV beside it."""
    from .chapter import current

    if "reports" in data:
        data = dict(data, reports=reports)
        write_atomic(path, as_json(data))
        csv_path = path.with_suffix(".csv")
        if csv_path.exists():
            write_atomic(csv_path, gradebook_csv(reports, list(current().order)))
    else:
        write_atomic(path, as_json(reports[0]))


def pending(reports: list[dict]) -> list[tuple[dict, str]]:
    return [(r, ex_id) for r in reports for ex_id, e in r.get("exercises", {}).items() if e.get("needs_human_review")]


def describe(report: dict, ex_id: str) -> list[str]:
    e = report["exercises"][ex_id]
    lines = [f"{safe_text(Path(str(report.get('notebook', '?'))).name)} · {safe_text(ex_id)} · "
             f"{e.get('auto_score', e.get('score'))}/{e.get('max')} · confidence {e.get('confidence', '?')}"
             + (f" · {safe_text(', '.join(e.get('flags', [])))}" if e.get("flags") else "")
             + (" · STALE OVERRIDE: the answer changed" if e.get("stale_override") else "")]
    if e.get("answer") is not None:
        lines.append("    answer: " + safe_text(e["answer"])[:600])
    lines += ["    " + safe_text(f)[:200] for f in e.get("feedback", [])[:8]]
    return lines


def _interactive(reports, decisions, ask, say) -> int:
    done = 0
    for report, ex_id in pending(reports):
        e = report["exercises"][ex_id]
        say("\n".join(describe(report, ex_id)))
        top = e.get("max")
        reply = ask(f"  [Enter] accept {e.get('auto_score', e.get('score'))} · a score 0..{top} to override · "
                    f"s skip · q quit: ").strip().lower()
        if reply == "q":
            break
        if reply == "s":
            continue
        try:
            score = None if reply in ("", "a") else float(reply)
            reason = ask("  reason: ") if score is not None and score != e.get("auto_score") else ""
            decide(decisions, report, ex_id, score, reason)
            done += 1
        except ValueError as exc:
            say(f"  not recorded: {exc}")
    return done


def run(path: Path, accept: list[str] | None = None, set_: list[str] | None = None, reason: str = "",
        ask=input, say=print, interactive: bool | None = None) -> int:
    """``minillm grade --review PATH``: list, accept or override the flagged answers (exit status)."""
    path = Path(path)
    try:
        data = _read(path)
    except (OSError, ValueError) as exc:
        print(f"minillm grade: cannot read {safe_text(path)}: {safe_text(exc)}", file=sys.stderr)
        return 2
    folder = path.parent
    decisions = load(folder)
    reports = apply(_reports(data), decisions)
    try:
        for target in accept or []:
            report, ex_id = _find(reports, target)
            decide(decisions, report, ex_id, None, reason)
        for target in set_ or []:
            where, _, value = target.partition("=")
            report, ex_id = _find(reports, where)
            try:
                score = float(value)
            except ValueError:
                raise ValueError(f"score: {value!r} is not a number (--set NOTEBOOK:EXERCISE=SCORE)") from None
            decide(decisions, report, ex_id, score, reason)
    except ValueError as exc:
        print(f"minillm grade: {safe_text(exc)}", file=sys.stderr)
        return 2
    if interactive is None:
        interactive = not (accept or set_) and sys.stdin.isatty()
    if interactive:
        _interactive(reports, decisions, ask, say)
    elif not (accept or set_):
        lines = [line for r, ex_id in pending(reports) for line in describe(r, ex_id)]
        say("\n".join(lines) if lines else "nothing is flagged for review")
    if decisions != load(folder):
        save(folder, decisions)
    reports = apply(_reports(data), decisions)
    _write(path, data, reports)
    left = len(pending(reports))
    say(f"{len(decisions)} decision(s) in {safe_text(folder / OVERRIDES)}; {left} answer(s) still flagged")
    return 0
