"""Heuristics for short free-text answers, in English and Chinese.

A text grader asks a few questions of an answer:

* is it over the length limit (:func:`char_count`)?
* is it a list of keywords rather than a sentence (:func:`keyword_list`)?
* which required ideas does it express (read by :mod:`concepts`, clause by clause)?
* does it state one of the chapter's misconceptions (:class:`Misconception`), not negated?

These are regular expressions over common phrasings, not understanding: an unusual but
correct answer can be missed, which is why graders raise ``needs_human_review`` whenever the
evidence is thin. The exercises notebook says so to the learner.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .unicode_clean import clean

CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK_RE = re.compile(f"[{CJK}]")
_WORD_RE = re.compile(r"[A-Za-z][A-Za-z'_-]*|\d+")
_FLAGS = re.IGNORECASE | re.UNICODE


def normalize(text: str) -> str:
    """The text as a reader sees it (NFKC, invisible characters dropped, look-alike letters
    mapped: :mod:`unicode_clean`), whitespace runs collapsed."""
    text = clean(text)
    return re.sub(r"\s+", " ", text).strip()


def normalize_terms(text: str) -> str:
    """``normalize``, and the slash inside a term joined (:func:`concepts.join_term_slashes`: "存 K/V" keeps "K/V"
    one term), for the readers that cut an answer at its separators. (``concepts.normalize_terms`` is the same
    over ``concepts.normalize``, which also straightens curly apostrophes: ``keyword_list`` reads "it’s" as "it".)"""
    from .concepts import join_term_slashes

    return join_term_slashes(normalize(text))


def char_count(text: str) -> int:
    """Characters as a reader counts them: every letter, CJK character, digit, space between
    words and punctuation mark is one; runs of whitespace count once, ends are trimmed."""
    return len(normalize(text))


def cjk_chars(text: str) -> int:
    return len(_CJK_RE.findall(text))


def words(text: str) -> list[str]:
    return _WORD_RE.findall(text)


def compile_all(patterns) -> tuple[re.Pattern, ...]:
    return tuple(re.compile(p, _FLAGS) for p in patterns)


# --- negation --------------------------------------------------------------------------------
_NEG_EN = re.compile(
    r"\b(not|no|never|nor|neither|isn't|aren't|wasn't|doesn't|don't|didn't|won't|cannot|can't|"
    r"unlike|rather than|instead of|without|myth|misconception|wrong(ly)?|mistaken(ly)?|false)\b|n't\b",
    _FLAGS)
_NEG_ZH = re.compile(r"不是|并非|而非|并不|不只|不仅|不单|不能|不要|别把|误区|误以为|错误|不同于|不等于|不会|并没有|不该|非")


def negated(text: str, start: int) -> bool:
    """Is the phrase starting at ``start`` negated by what comes just before it, within the
    same clause (EN: 40 characters; ZH: 8 characters)?"""
    clause_start = max(text.rfind(c, 0, start) for c in ".;!?。；！？\n") + 1
    before_en = text[max(clause_start, start - 40):start]
    before_zh = text[max(clause_start, start - 8):start]
    return bool(_NEG_EN.search(before_en) or _NEG_ZH.search(before_zh))


# --- ideas and misconceptions ----------------------------------------------------------------
@dataclass(frozen=True)
class Misconception:
    key: str
    patterns: tuple[re.Pattern, ...]
    feedback: str
    negatable: bool = True  # a negated mention ("not a hit/miss cache") is fine

    def find(self, text: str) -> str | None:
        """The offending phrase, or None."""
        for p in self.patterns:
            for m in p.finditer(text):
                if self.negatable and negated(text, m.start()):
                    continue
                return m.group(0)
        return None


def misconception(key, patterns, feedback, negatable=True) -> Misconception:
    return Misconception(key, compile_all(patterns), feedback, negatable)


# --- sentence or keyword list? ---------------------------------------------------------------
_SEPARATORS = re.compile(r"\s*(?:[,;/|\n•·+&、，；]|->|=>|→|⇒|↔|\s-\s|\s–\s)\s*")
# words that tie a sentence together: connectives, pronouns, auxiliaries
_GLUE_EN = set("""so because but which that since thus therefore hence while whereas yet then when once
if as by it its they them their this these those is are was were be been being has have had can could
will would must should may might does do did who whose where instead each every than through via
""".split())
_GLUE_ZH = re.compile(r"因为|所以|但|而|从而|因此|这样|它|会(?!话)|能够|可以|让|使|把|由于|不过|同时|却|就|才|"
                      r"用于|通过|是|将(?!来)|需要|于是|并且|导致|带来|如果|当|随|越|被|用来|以便|只有|只要|"
                      # a distributive predicate without a verb: "每个用户一份 KV cache", "每个请求各自的块"
                      r"每(个|一个|位|条|次)[^，。；,;]{1,8}?(一份|各一份|各自|一套|都有)")
_VERBISH_EN = re.compile(r"\b\w+(s|ed|ing)\b", _FLAGS)


def keyword_list(text: str) -> str | None:
    """'list' when the answer is keywords without a sentence, 'telegraphic' when it is short
    fragments that do carry verbs (borderline), None when it reads as a sentence."""
    from .concepts import causal_arrow, clause_marked

    t = normalize_terms(text)
    segments = [s for s in _SEPARATORS.split(t) if s and s.strip(" .。!！?？-–*")]
    if not segments:
        return "list"

    def short(seg: str) -> bool:
        return len(words(seg)) <= 4 and cjk_chars(seg) <= 8

    has_glue = (any(w.lower() in _GLUE_EN for w in words(t)) or bool(_GLUE_ZH.search(t)) or clause_marked(t)
                or causal_arrow(t))
    if has_glue:
        return None
    if all(short(s) for s in segments):
        verbish = bool(_VERBISH_EN.search(t)) or bool(re.search(
            r"减少|增加|避免|占用|保存|存储|复用|降低|提高|加速|消耗|决定|进入|加入|占着|追加|增长|变大|变多|留着|保留|涨|依赖|影响|"
            # a modal before a one-character verb is a predicate: "同一个 prompt 要存 8 条 sequence 的 KV"
            r"(要|得|需|都|也|还|就|各)\s*(存|占|放|留|记|带|吃)|"
            # a product is a predicate: "KV 差不多乘以 5", "翻 4 倍"
            r"乘以|乘上|翻\s*\d*\s*倍|[×*]\s*\d+\b", t))
        if len(segments) == 1 and verbish and (len(words(t)) >= 3 or len(words(t)) + cjk_chars(t) >= 6):
            return "telegraphic"
        return "telegraphic" if verbish and len(segments) > 1 else "list"
    return None


# --- shared vocabulary -------------------------------------------------------------------------
W = r"(?:[\w'/-]+\W+)"  # one word and what follows it
CLAUSE = r"[^.;!?。；！？\n]"  # any character inside one clause
