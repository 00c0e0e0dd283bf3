"""Build the second reader's data (minillm/grading/ch04/neighbours.json.gz) from the labelled answers.

Only the ``tune`` part of ``tests/grading_data/answers.jsonl`` goes in (``tests/grading_data/split.py``
decides the part by a hash): the held-out third stays unseen, so the agreement measured on it stays
honest. The instructor's own answers (the solved notebooks', ``tests/solved/answers.py``) go in at full marks. Each answer is stored as its sorted hashed n-gram ids (``minillm.grading.neighbours.ids``)
with the instructor's score, never as text. The output is the same on every machine; the agreement
test checks that the shipped file is what this script builds now.

    python scripts/build_neighbours.py          # rewrite the file
    python scripts/build_neighbours.py --check  # exit 1 if the file is out of date
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "grading_data"))

import split  # noqa: E402

from minillm.grading.neighbours import context, ids, written  # noqa: E402

OUT = ROOT / "minillm" / "grading" / "ch04" / "neighbours.json.gz"


def _answer(row: dict):
    a = row["answer"]
    return tuple(a) if isinstance(a, list) and len(a) == 2 and not isinstance(a[0], list) else a


def build(rows: list[dict], references: list[dict] = ()) -> str:
    """The file's text for ``rows`` (tune rows only; a held-out row here is a bug) and the
    instructor's ``references`` (:func:`reference_rows`)."""
    exercises: dict[str, dict[str, list]] = {}
    for row in rows:
        if split.part(row) != "tune":
            raise ValueError(f"a held-out answer must not reach the second reader: {row['id']}")
    for row in list(rows) + list(references):
        answer = _answer(row)
        ctx = context(row["id"], answer)
        if ctx is None:
            continue
        exercises.setdefault(row["id"], {}).setdefault(ctx, []).append([row["score"], ids(written(answer))])
    for by_ctx in exercises.values():
        for group in by_ctx.values():
            group.sort(key=lambda e: (e[0], e[1]))
    n = sum(len(g) for e in exercises.values() for g in e.values())
    data = {"about": "hashed n-gram ids (minillm.grading.neighbours.ids) and the instructor's score of the tune part "
                     "of tests/grading_data/answers.jsonl and of the solved notebooks' answers (full marks); built by "
                     "scripts/build_neighbours.py",
            "answers": n, "exercises": {k: exercises[k] for k in sorted(exercises)}}
    return json.dumps(data, separators=(",", ":"), sort_keys=True) + "\n"


def tune_rows() -> list[dict]:
    return [r for r in split.rows() if r["split"] == "tune"]


def reference_rows() -> list[dict]:
    """The instructor's own answers, at full marks: the solved notebooks' written answers, both
    languages (``tests/solved/answers.py``, read as literals, never imported)."""
    import ast

    from minillm.grading import EXERCISES

    tree = ast.parse((ROOT / "tests" / "solved" / "answers.py").read_text(encoding="utf-8"))
    out = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") in ("SOLVED_ANSWERS", "SOLVED_ANSWERS_ZH"):
            for key, item in zip(node.value.keys, node.value.values):
                if not (isinstance(key, ast.Constant) and isinstance(item, ast.Constant)):
                    continue  # the diagram and the code answers are not written text
                ex_id, code = key.value, item.value
                if ex_id in EXERCISES and isinstance(code, str) and code.startswith(ex_id + " ="):
                    value = ast.literal_eval(ast.parse(code).body[0].value)
                    out.append({"id": ex_id, "answer": value, "score": EXERCISES[ex_id].max_score})
    return out


def main(argv: list[str]) -> int:
    text = build(tune_rows(), reference_rows())
    if "--check" in argv:
        same = OUT.exists() and gzip.decompress(OUT.read_bytes()).decode("utf-8") == text
        print("up to date" if same else f"{OUT} is out of date: run scripts/build_neighbours.py")
        return 0 if same else 1
    OUT.write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))
    print(f"wrote {OUT.relative_to(ROOT)} ({OUT.stat().st_size // 1024} KiB, {json.loads(text)['answers']} answers)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
