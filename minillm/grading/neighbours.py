"""A second reader: how an instructor scored the labelled answers most like this one.

The rule graders (:mod:`concepts`) read ideas from patterns; a fresh class always writes some
paraphrase no pattern has seen, and the rules then disagree with the instructor without knowing
it. This module is a different kind of reader with different blind spots: it compares an answer's
character and word n-grams (Chinese characters one to three at a time, English words and word
pairs) with those of answers an instructor has already scored, and says what the nearest ones got.
Where it and the rules disagree, the grade goes to a person (:func:`second_opinion`); where no
labelled answer is close, the confidence drops a little (new wording is where rules miss most). It
never changes a score, so a learner cannot earn a point by writing like a labelled answer.

The labelled answers are not shipped: ``scripts/build_neighbours.py`` turns the tuning part of
``tests/grading_data/answers.jsonl`` (never its held-out third), and the solved notebooks' answers at
full marks, into hashed n-gram sets, one per answer, with its score (the chapter's ``neighbours.json.gz``). Hashes are CRC-32, so the file, and
every opinion, is the same on every machine.
"""

from __future__ import annotations

import gzip
import json
import math
import re
import zlib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

BUCKETS = 1 << 20  # hashed n-gram ids: collisions are rare among a few thousand n-grams per exercise
K = 5  # neighbours that vote
MIN_SIMILARITY = 0.4  # the nearest answer must be at least this close (cosine of tf-idf vectors) to count
DISAGREE_BY = 0.75  # |nearest answers' weighted score - rule score|, in points, that raises a doubt
SECOND_OPINION_DOUBT = 0.35  # enough, alone, to flag (registry.REVIEW_BELOW)
NOVEL_BELOW = 0.25  # no labelled answer this close: wording the rules have probably not seen either
NOVEL_DOUBT = 0.15  # flags only with another doubt (e.g. partial credit)

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_TOKEN = re.compile(rf"[{_CJK}]+|[a-z0-9]+(?:[/'][a-z0-9]+)*")


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if len(word) > len(suffix) + 2 and word.endswith(suffix):
            return word[: -len(suffix)]
    return word


def grams(text: str) -> list[str]:
    """The n-grams this reader compares: Chinese characters alone, in pairs and in threes, English
    word stems and stem pairs (a pair crosses from one script to the other, as mixed answers do)."""
    from .concepts import expand_abbreviations, normalize

    t = expand_abbreviations(normalize(text)).lower()
    units: list[str] = []  # a Chinese character or an English word stem, in order
    out: list[str] = []
    for tok in _TOKEN.findall(t):
        if re.match(f"[{_CJK}]", tok):
            units.extend(tok)
            out += [tok[i:i + 3] for i in range(len(tok) - 2)]
        else:
            units.append(_stem(tok))
    out += units
    out += [a + " " + b for a, b in zip(units, units[1:])]
    return out


def ids(text: str) -> list[int]:
    """The sorted, distinct hashed ids of :func:`grams` (what the data file stores per answer)."""
    return sorted({zlib.crc32(g.encode("utf-8")) % BUCKETS for g in grams(text)})


def context(ex_id: str, answer: Any) -> str | None:
    """What, besides the written part, decides the score (a quiz letter, a verdict, a policy): a
    neighbour counts only when it chose the same. None where this reader has nothing to say."""
    if ex_id in ("task2_kv_explain", "task4_sampling"):
        return "" if isinstance(answer, str) else None
    if isinstance(answer, (list, tuple)) and len(answer) == 2 and isinstance(answer[1], str):
        choice = answer[0]
        if isinstance(choice, bool):
            return str(choice).lower()
        if isinstance(choice, str) and ex_id.startswith(("quiz", "task5")):
            return re.sub(r"[\W_]+", "", choice).lower()[:12]
    return None


def written(answer: Any) -> str:
    return answer if isinstance(answer, str) else answer[1]


@dataclass(frozen=True)
class Opinion:
    score: float | None  # the close neighbours' similarity-weighted mean score; None: none is close enough
    similarity: float  # cosine similarity of the nearest labelled answer (0: nothing in common)
    n: int  # how many voted


class Reader:
    """The labelled answers of one chapter, as tf-idf vectors per (exercise, context)."""

    def __init__(self, data: dict) -> None:
        self.groups: dict[tuple[str, str], tuple[list[float], dict[int, list[tuple[int, float]]]]] = {}
        self.idf: dict[str, dict[int, float]] = {}
        for ex_id, by_context in data.get("exercises", {}).items():
            rows = [(float(s), g) for group in by_context.values() for s, g in group]
            df: dict[int, int] = {}
            for _, g in rows:
                for i in g:
                    df[i] = df.get(i, 0) + 1
            n = len(rows)
            self.idf[ex_id] = {i: math.log((1 + n) / (1 + c)) + 1 for i, c in df.items()}
            for ctx, group in by_context.items():
                scores = [float(s) for s, _ in group]
                index: dict[int, list[tuple[int, float]]] = {}  # n-gram id -> (answer, weight): only shared n-grams cost time
                for j, (_, g) in enumerate(group):
                    for i, w in self._vector(ex_id, g).items():
                        index.setdefault(i, []).append((j, w))
                self.groups[ex_id, ctx] = (scores, index)

    def _vector(self, ex_id: str, gram_ids) -> dict[int, float]:
        idf = self.idf.get(ex_id, {})
        default = max(idf.values(), default=1.0)
        v = {i: idf.get(i, default) for i in gram_ids}
        norm = math.sqrt(sum(w * w for w in v.values())) or 1.0
        return {i: w / norm for i, w in v.items()}

    def opinion(self, ex_id: str, answer: Any) -> Opinion | None:
        ctx = context(ex_id, answer)
        group = self.groups.get((ex_id, ctx)) if ctx is not None else None
        if not group:
            return None
        v = self._vector(ex_id, ids(written(answer)[:4000]))
        if not v:
            return None
        scores, index = group
        acc = [0.0] * len(scores)
        for i, w in v.items():
            for j, u in index.get(i, ()):
                acc[j] += w * u
        sims = sorted(zip(acc, scores), reverse=True)[:K]
        close = [(sim, s) for sim, s in sims if sim >= MIN_SIMILARITY]
        total = sum(sim * sim for sim, _ in close)
        score = sum(sim * sim * s for sim, s in close) / total if total > 0 else None
        return Opinion(score, sims[0][0] if sims else 0.0, len(close))


def data_file() -> Path | None:
    from .chapter import current

    path = current().neighbours_file
    return Path(path) if path else None


@lru_cache(maxsize=1)
def reader() -> Reader | None:
    path = data_file()
    if path is None or not path.exists():
        return None
    return Reader(json.loads(gzip.decompress(path.read_bytes()).decode("utf-8")))


def second_opinion(ex_id: str, answer: Any, marks) -> None:
    """Doubt the rule's score where the instructor's scores of the nearest labelled answers differ
    from it by :data:`DISAGREE_BY` points or more, or where no labelled answer is even close (new
    wording, where the rules miss most): the answer may go to a person; the score stays."""
    r = reader()
    op = r.opinion(ex_id, answer) if r is not None else None
    if op is None:
        return
    if op.score is not None and abs(op.score - marks.score) >= DISAGREE_BY:
        marks.doubt("similar labelled answers scored differently", SECOND_OPINION_DOUBT)
    elif op.similarity < NOVEL_BELOW:
        marks.doubt("unlike every labelled answer", NOVEL_DOUBT)
