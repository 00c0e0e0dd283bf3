"""How close a written answer's grade is to the line: doubts that do not depend on the exercise.

The text graders read ideas with rules, and rules fail where answers are unusual. Measured on
fresh answer sets, the disagreements with an instructor gather in a few places whatever the
exercise: partial credit (one idea found, one not), negation anywhere in the answer, very short or
very long answers, answers in two languages, and wording the grader has no words for. Each of
these lowers the confidence a little (:meth:`Marks.doubt`); two of them together, or one with a
doubt the grader itself raised, put the answer under the review line, so the instructor reads it.

The amounts are set so that the flagged share of a class stays readable (see the README's
grading section for the measured coverage of disagreements and the review load).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

PARTIAL_DOUBT = 0.2  # some points, not all: the grader decided an idea either way
NEGATION_DOUBT = 0.15  # a negator in an answer that earned points: scope is where rules misread most
SHORT_DOUBT = 0.1  # a handful of words: little evidence either way
LONG_DOUBT = 0.1  # near the length limit: more room for a stray match
MIXED_DOUBT = 0.15  # two languages in one answer
UNKNOWN_DOUBT = 0.2  # many words the grader has no pattern or course text for
UNKNOWN_SHARE = 0.35  # … this share of the answer's content words
SHORT_UNITS = 12  # concepts.length_units
LONG_UNITS = {"task2_kv_explain": 80, "task4_sampling": 130}

NOTHING_DOUBT = 0.35  # a real sentence in which no idea was found: the grader may lack the words for it
_DECIDED = {"copied from the course", "copy of a model answer", "pasted from the course", "negated idea",
            "an idea and a misconception", "restates the option"}


def _sentence(text: str) -> bool:
    from .concepts import cjk_chars, is_salad, latin_words

    return (len(latin_words(text)) >= 8 or cjk_chars(text) >= 12) and not is_salad(text)


_SAID_BY_NEGATION = re.compile(r"\bavoid\w*|\bno need\b|\bwithout (re-?)?comput\w*|无需|无须|不必|不用|不需要|避免|免去|省去|省掉",
                               re.IGNORECASE)
_TERMS = set("""kv k v q token tokens decode decoding prefill cache cached batch batching gpu vram prompt prompts
top p temperature sampling sampled sample request requests context history memory step steps llm eos id ids
state states block blocks api ui output input attention key keys value values""".split())


def written_parts(ex_id: str, answer: Any) -> list[str]:
    """The parts of an answer a learner writes in words (not letters, verdicts or policy names)."""
    if isinstance(answer, str):
        if ex_id.startswith("quiz"):
            m = re.match(r"^\W*\w?\W*(because|since|as|因为|由于)?(.*)$", answer, re.I | re.S)
            return [m.group(2)] if m and len(answer) > 3 else []
        return [answer]
    if isinstance(answer, dict):
        return [v for v in answer.values() if isinstance(v, str)] if ex_id == "task3_pressure" else []
    if isinstance(answer, (list, tuple)):
        if ex_id == "task3_pressure":
            return [e[1] for e in answer if isinstance(e, (list, tuple)) and len(e) == 2 and isinstance(e[1], str)]
        if len(answer) == 2 and isinstance(answer[1], str):
            return [answer[1]]
    return []


@lru_cache(maxsize=1)
def _known() -> tuple[frozenset, frozenset]:
    """The Latin words and Chinese characters the grader knows: its patterns and the course's texts."""
    import importlib

    from . import concepts
    from .chapter import current
    from .copies import shown_texts

    sources = list(shown_texts())
    modules = [importlib.import_module(name) for name in current().pattern_modules]
    for module in modules:
        for value in vars(module).values():
            for p in getattr(value, "patterns", ()) or ():
                sources.append(getattr(p, "pattern", str(p)))
            for group in ("parts", "inverted", "standalone", "weak"):
                for p in getattr(value, group, ()) or ():
                    for q in (p if isinstance(p, tuple) else (p,)):
                        sources.append(getattr(q, "pattern", str(q)))
    for module in modules:
        for name in ("_UNIT", "_STATE", "_GROW"):
            sources.append(getattr(module, name, ""))
    words = {w for s in sources for w in re.findall(r"[a-z]{3,}", s.lower())}
    words |= set(concepts.VOCAB) | concepts.COMMON | concepts._GLUE_EN | _TERMS
    chars = {c for s in sources for c in re.findall(f"[{concepts.CJK}]", s)}
    return frozenset(words), frozenset(chars)


def _stem_known(word: str, words: frozenset) -> bool:
    if word in words:
        return True
    for suffix in ("s", "es", "ed", "d", "ing", "ly", "er", "'s"):
        if word.endswith(suffix) and (word[: -len(suffix)] in words or word[: -len(suffix)] + "e" in words):
            return True
    return any(w.startswith(word[:5]) for w in words) if len(word) >= 7 else False


def unknown_share(text: str) -> float:
    """The share of content words (Latin words of 4+ letters, Chinese characters outside the
    common function characters) the grader's patterns and the course's texts never use."""
    from .concepts import CJK, normalize

    words, chars = _known()
    t = normalize(text).lower()
    latin = [w for w in re.findall(r"[a-z][a-z']{3,}", t)]
    zh = [c for c in re.findall(f"[{CJK}]", t)]
    total = len(latin) + len(zh)
    if total < 4:
        return 0.0
    unknown = sum(not _stem_known(w, words) for w in latin) + sum(c not in chars for c in zh)
    return unknown / total


def mixed_language(text: str) -> bool:
    from .concepts import CJK

    latin = [w for w in re.findall(r"[A-Za-z]{2,}", text) if w.lower() not in _TERMS]
    return len(re.findall(f"[{CJK}]", text)) >= 2 and len(latin) >= 2


def near_the_line(ex_id: str, answer: Any, marks, max_score: float) -> None:
    """Lower the confidence of a written answer's grade where, measured on fresh answers, the
    text graders disagree with an instructor most (see the module's docstring)."""
    from .concepts import _NEG_NEAR, _NEG_WIDE, length_units, normalize

    parts = [normalize(p) for p in written_parts(ex_id, answer) if isinstance(p, str) and p.strip()]
    if not parts:
        return
    text = " ".join(parts)
    score = marks.score
    if 0 < score < max_score:
        marks.doubt("partial credit", PARTIAL_DOUBT)
    already = {why for why, _ in marks.doubts}
    plain = _SAID_BY_NEGATION.sub(" ", text)  # "avoids recomputing", "无需重算": how the idea is said, not a hedge
    negation = bool(_NEG_NEAR.search(plain) or _NEG_WIDE.search(plain))
    near = "negation near an idea" in already
    if negation and score > 0 and "negated idea" not in already and (score >= max_score) == near:
        # full marks read through a negation in an idea's clause; partial credit with a negation anywhere
        marks.doubt("negation in the answer", NEGATION_DOUBT)
    units = min(length_units(p) for p in parts)
    if units < SHORT_UNITS and score > 0:
        marks.doubt("very short", SHORT_DOUBT)
    if length_units(text) > LONG_UNITS.get(ex_id, 10 ** 9):
        marks.doubt("near the length limit", LONG_DOUBT)
    if score == 0 and not already & _DECIDED and _sentence(text):
        marks.doubt("a sentence with nothing found", NOTHING_DOUBT)
    if mixed_language(text):
        marks.doubt("two languages", MIXED_DOUBT)
    if unknown_share(text) >= UNKNOWN_SHARE:
        marks.doubt("wording the grader does not know", UNKNOWN_DOUBT)
