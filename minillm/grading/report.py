"""Writing what ``minillm grade`` found: safely on disk, safely on the terminal.

* :func:`safe_text` escapes control characters (C0, C1, DEL) and the invisible Unicode
  format characters that reorder text (bidi overrides), so a student string holding
  ``"\\x1b[2J"`` is printed as that text and cannot clear or rewrite the instructor's terminal.
* :func:`write_atomic` writes a fresh temporary file in the target's folder and renames it
  over the target: a symlink or FIFO at the path is replaced, never followed or opened, and a
  reader never sees half a report. :func:`remove_stale` drops an old report before grading
  starts, so a crashed run cannot leave last week's (or a forged) report behind.
"""

from __future__ import annotations

import csv
import io
import json
import os
import stat
import tempfile
import unicodedata
from pathlib import Path


def safe_text(value, keep_newlines: bool = False) -> str:
    out = []
    for ch in str(value):
        if keep_newlines and ch == "\n":
            out.append(ch)
            continue
        cat = unicodedata.category(ch)
        if cat == "Cc" or (cat == "Cf" and ch not in "\u200d"):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")
        else:
            out.append(ch)
    return "".join(out)


def remove_stale(path: str | os.PathLike) -> None:
    """Remove whatever sits at ``path`` (a file, a symlink, a FIFO), never a folder."""
    p = Path(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(f"{p} is a folder")
    os.unlink(p)


def write_atomic(path: str | os.PathLike, text: str) -> None:
    p = Path(path)
    folder = p.parent if str(p.parent) else Path(".")
    try:
        if stat.S_ISDIR(os.lstat(p).st_mode):
            raise IsADirectoryError(f"{p} is a folder")
    except FileNotFoundError:
        pass
    fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def as_json(report: dict) -> str:
    return json.dumps(report, indent=2, ensure_ascii=False) + "\n"


def _cell(value) -> str:
    """A CSV cell a spreadsheet will not run as a formula (a file named '=cmd|…')."""
    text = safe_text(value)
    return "'" + text if text[:1] in ("=", "+", "-", "@") else text


def gradebook_csv(reports: list[dict], order: list[str]) -> str:
    """One row per notebook: the automatic total, the final total (after an instructor's
    overrides, :mod:`review`), the overrides with their reasons, and each exercise's final score."""
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["notebook", "status", "auto_total", "total", "max", "bonus", "needs_review", "overrides",
                "solutions_viewed", *order])
    for r in reports:
        ex = r.get("exercises", {})
        w.writerow([_cell(r.get("notebook", "")), r.get("status", ""), r.get("auto_total", r.get("total_score", "")),
                    r.get("total_score", ""), r.get("total_max", ""), r.get("bonus_total", ""),
                    ";".join(k for k, v in ex.items() if v.get("needs_human_review")), _cell(_overrides(ex)),
                    ";".join(r.get("solutions_viewed", [])), *[ex.get(k, {}).get("score", "") for k in order]])
    return buf.getvalue()


def _overrides(exercises: dict) -> str:
    """'task2_kv_explain 1→2 (says both ideas); …': the automatic score, the person's, and why."""
    return "; ".join(f"{k} {v.get('auto_score')}→{v['override'].get('score')} ({v['override'].get('reason', '')})"
                     for k, v in exercises.items() if isinstance(v.get("override"), dict))
