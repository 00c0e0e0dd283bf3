"""Which labelled answers the grader may be tuned on, and which are held out.

An answer's part is decided by a hash of its exercise id and its text, not by whoever adds it:
about one answer in three is ``holdout``. Whoever tunes the text graders looks only at the
``tune`` part (the agreement test prints the disagreements of that part alone); the held-out
agreement is measured, reported and asserted, never read answer by answer. Adding answers
later never moves an old one from one part to the other.

    python tests/grading_data/split.py      # how many answers each part has, by exercise
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

DATA = Path(__file__).with_name("answers.jsonl")
HOLDOUT_EVERY = 3  # one answer in three


def key(row: dict) -> str:
    return row["id"] + "\0" + json.dumps(row["answer"], ensure_ascii=False, sort_keys=True)


def part(row: dict) -> str:
    """'holdout' or 'tune', the same on every machine and in every run."""
    digest = hashlib.sha256(key(row).encode("utf-8")).digest()
    return "holdout" if int.from_bytes(digest[:8], "big") % HOLDOUT_EVERY == 0 else "tune"


def rows() -> list[dict]:
    out = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines() if line.strip()]
    for row in out:
        row["split"] = part(row)
    return out


if __name__ == "__main__":
    from collections import Counter

    counts = Counter((r["id"], r["split"]) for r in rows())
    for ex in sorted({i for i, _ in counts}):
        print(f"{ex:32} tune {counts[ex, 'tune']:3}  holdout {counts[ex, 'holdout']:3}")
