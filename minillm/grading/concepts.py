"""A small concept matcher for short answers in English, Chinese, or both at once.

An answer is cut into clauses (at punctuation and at "but / so / 但 / 所以 …"). An *idea* is
found in a clause when the clause holds a word from each of its parts — for "it costs memory",
a memory word (memory, VRAM, 显存, 内存…) and a cost word (uses, grows, pressure, 占用, 增长…) —
in either language and in any order, so "memory 占用随 context 增长" counts. Typos are
forgiven by snapping unknown English words to the domain vocabulary with ``rapidfuzz``
("memroy" → "memory") before matching.

Negation is read per clause. A plain negator (not, n't, no, 不, 没, 未…) negates the idea whose
predicate follows it closely; a wide one (without, instead of, no need, never, 无需, 不必, 不用…)
reaches over the whole rest of the clause. Some ideas are themselves negative: "no
recomputation", "never redone", "无需重算" *express* the idea of not recomputing, so an idea
may have an *inverted* part that counts only when negated. Each idea reports ``present``,
``negated`` (the answer says the opposite) or ``absent``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rapidfuzz import fuzz, process
from rapidfuzz.distance import DamerauLevenshtein, Levenshtein

from .unicode_clean import clean

CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_CJK_RE = re.compile(f"[{CJK}]")
_LATIN_WORD = re.compile(r"[a-z][a-z'’]*")
_I = re.IGNORECASE

# --- text basics ---------------------------------------------------------------------------------


def normalize(text: str) -> str:
    """The text as a reader sees it (:func:`unicode_clean.clean`), one space between words."""
    text = clean(text).replace("’", "'")
    return re.sub(r"\s+", " ", text).strip()


def cjk_chars(text: str) -> int:
    return len(_CJK_RE.findall(text))


def latin_words(text: str) -> list[str]:
    return _LATIN_WORD.findall(text.lower())


def language(text: str) -> str:
    """'zh' when Chinese characters outnumber English words, else 'en' (feedback follows it)."""
    return "zh" if cjk_chars(text) >= max(2, len(latin_words(text))) else "en"


LATIN_PER_UNIT = 2.5


def length_units(text: str) -> float:
    """Length as the chapter's 字 count it: one per Chinese character, one per 2.5 Latin
    letters or digits (so 100 units hold about 45 English words); spaces and punctuation free."""
    t = normalize(text)
    latin = len(re.findall(r"[A-Za-z0-9]", t))
    return cjk_chars(t) + latin / LATIN_PER_UNIT


# --- typos ----------------------------------------------------------------------------------------
VOCAB = sorted(set("""
memory memories vram context contexts recompute recomputes recomputing recomputed recomputation
recalculate recalculates recalculating recalculated recalculation calculate calculating calculated calculation
compute computes computing computed computation previous history histories sampled sample samples sampling
append appends appended appending token tokens cache cached caching values value keys length lengths
sequence sequences decode decoding decoded next later step steps grows growing increase increases increasing
increased reuse reuses reused reusing avoid avoids avoided avoiding skip skips skipped redundant attention
conversation prompt prompts becomes become depends depend dependent conditioned conditions following
subsequent generation generated generates concurrency concurrent requests request throughput footprint
occupies occupy consumes consume proportional linearly linear chosen selected picked added appended
earlier already processed process processing again twice scratch pressure expensive because instead
storage space capacity
without doesn't don't never nothing output outputs input inputs future every store stores stored keeps
kept storing sequence prefill release released finished waiting running
""".split()))
_VOCAB_SET = set(VOCAB)
COMMON = set("""
the and that this with from have will would should could there their they them then than what when which
while where about after before other some such only also into over more most much many very just your
yours ours here each every does done make makes made like want need needs uses used using time times
same different way ways less least because since until each both either whose first last long short large
small big huge high low fast faster slow slower speed quick quickly model models engine user users answer
text word words part parts thing things work works world every cost costs price pay pays still keep
redo redoes redoing redone redid rerun reruns rerunning reread refill refills reload reloads reuse reusing
decide decides decided deciding stop stops stopped stopping progress repeated complete completed attend attends
layer layers write writes writing written spare spared sparing reduce reduces choose chooses chose
""".split())


_VOWELS = set("aeiou")


def _typo_of(word: str, target: str) -> bool:
    """Is ``word`` a slip of the keyboard for ``target``: letters dropped, doubled or swapped,
    or a vowel for a vowel in a long word ("memery")? A consonant for a consonant makes another
    English word ("stop" / "step", "spare" / "space", "reduces" / "reuses"): not a typo."""
    ops = Levenshtein.editops(word, target)
    replaced = [(i, j) for kind, i, j in ops if kind == "replace"]
    k = 0
    while k < len(replaced):
        i, j = replaced[k]
        if k + 1 < len(replaced) and replaced[k + 1] == (i + 1, j + 1) and word[i] == target[j + 1] \
                and word[i + 1] == target[j]:
            k += 2  # two letters swapped
            continue
        if not (len(word) >= 6 and word[i] in _VOWELS and target[j] in _VOWELS):
            return False
        k += 1
    return True


def fix_typos(text: str) -> str:
    """Snap misspelt domain words to the vocabulary ('memroy' -> 'memory'); others stay."""

    def repl(m: re.Match) -> str:
        w = m.group(0)
        low = w.lower()
        if low in _VOCAB_SET or low in COMMON or len(low) < 3:
            return w
        max_edits = 1 if len(low) <= 6 else 2
        same_start = [v for v in VOCAB if v[0] == low[0]]
        hits = process.extract(low, same_start, scorer=DamerauLevenshtein.distance, score_cutoff=max_edits, limit=3)
        hit = next((h for h in hits if _typo_of(low, h[0])), None)
        return w if hit is None else hit[0]

    return re.sub(r"[A-Za-z][A-Za-z']*", repl, text)


# --- clauses and negation ---------------------------------------------------------------------------
_CLAUSE_SPLIT = re.compile(
    r"\.(?=\s|$|[\u4e00-\u9fff])|[;!?。；！？:：\n,，()（）\[\]—–•▪●◦‣]|\s-\s|(?:(?<=\s)|^)(?:#+|//)\s(?!of\b)|\bbut\b|\bwhereas\b|\bwhile\b|\bthough\b|\balthough\b|\bhowever\b|"
    r"\bso that\b|\bso\b(?!\s+(far|much|many|long)\b)|\bthus\b|\bhence\b|\btherefore\b|\bbecause\b|\bsince\b|\band then\b|\band it\b|\band its\b|"
    r"(?=\bdownsides?\b|\bthe catch\b|\bdrawbacks?\b)|但是|但|而是|不过|然而|所以|因此|因为|从而|于是|而且|并且|同时|(?=否则)|可是|只是(?=让)", _I)


def clauses(text: str) -> list[tuple[int, str]]:
    """(offset, clause) pairs; the separators themselves are dropped."""
    out, last = [], 0
    for m in _CLAUSE_SPLIT.finditer(text):
        head = text[last:m.start()]
        if m.group(0) in ":：" and len(re.findall(r"\w+", head)) <= 2 and len(head.strip()) <= 12 \
                and not re.search(r"是|不|没|非|\bnot\b|n't\b|\bis\b|\bare\b", head, _I):
            continue  # "Downside: it eats memory", "代价：显存": a label, not a clause of its own
        if m.start() > last:
            out.append((last, text[last:m.start()]))
        last = m.end()
    if last < len(text):
        out.append((last, text[last:]))
    return [(o, c) for o, c in out if c.strip()]


_NEG_WIDE = re.compile(r"\b(is|are|was|it's)\s+(not|n't)\s+(a|an|the|some|any)\b|\bisn't\s+(a|an|the)\b|"
                       r"\bnot\s+(a|an)\s+(\w+\s+){0,2}?(cache|store|lookup|table|kind|sort|type)\b|"
                       r"不是|并非|并不是|不属于|不算是?|\bwithout\b|\binstead of\b|\brather than\b|\bno need\b|\bnever\b|\bneedn't\b|"
                       r"\bno longer\b|\bnothing\b|\bnone\b|\bnor\b|\bneither\b|\bavoid(?:s|ed|ing)?\b|"
                       r"无需|无须|不必|不用|不需要|无需再|不再|免去|免得|以免|省得|省去|省掉|省了|避免|没有必要|从不|永远不|与其说?", _I)
_NEG_NEAR = re.compile(r"\bnot\b(?!\s+(just|only|merely|simply|solely|small|little|negligible|cheap|free|trivial|minor)\b)|n't\b(?!\s+(just|only|merely|simply)\b)|\bno\b|\bdont\b|\bdoesnt\b|\bisnt\b|\barent\b|\bwont\b|\bcant\b|\bdidnt\b|"
                       r"\bcannot\b|\bhardly\b|\bbarely\b|\bfails? to\b|"
                       r"(?<!得)(?<!离)不(?!断|同|少|小|低|便宜|过|仅|只|止|单|管|停|久|然|但|论|得不|够|一样|相同|如|住|消|下(?![降来去]))|没|(?<!无)无(?!论|限|数)|并非|未(?!来)|非(?!常)|别", _I)
_NOT_JUST = re.compile(r"\b(not|n't)\s+(just|only|merely|simply|solely)\b|不只|不仅|不单|不止", _I)
_OR = re.compile(r"or|或者|或", _I)
_DISJUNCT = re.compile(r"\s*((again|even|ever|just|also|simply|really|otherwise)\s+)?", _I)  # the next verb right after "or", no subject of its own
NEAR_WINDOW_EN = 24  # characters before the predicate (about four words)
NEAR_WINDOW_ZH = 5


# a negated verb with an object of its own: the negation ends at the object ("不读它重算", "跳过缓存重新算",
# "without reading the cache it recomputes": what is denied is the reading, not the recomputing). 不用 + the cache
# + a verb of computing is "needn't … recompute" ("不用 KV 重新算"): left to the negation.
_CACHE_OBJECT_ZH = r"\s*(这份|那份|之前的?|已有的?|存好的?|prefill\s*的?)?\s*(KV\s*(cache|缓存)?|缓存|cache|它们?)"
_NEG_VERB_OBJECT = re.compile(
    r"(不|没有?|并不|从不|不会)\s*(再|去)?\s*(读取?|查|看|碰|访问|复用|利用|拿)(到|过|了|上)?" + _CACHE_OBJECT_ZH + "|"
    r"(不|没有?|并不|从不|不会)\s*(再|去)?\s*(使用|用)(到|过|了|上)?" + _CACHE_OBJECT_ZH +
    r"(?!\s*(重新|重复|再|从头)?\s*(算|计算|生成|推理))|"
    r"(跳过|绕过|无视|忽略|抛开)" + _CACHE_OBJECT_ZH + r"|(读|用|查|拿)不(到|着|上)" + _CACHE_OBJECT_ZH + "|"
    r"\b(without|instead\s+of|rather\s+than|not|never|n't)\s+(\w+\s+)?(read|us|touch|check|consult|look\w*\s+at|skip|bypass|"
    r"ignor)\w*\s+(\w+\s+){0,2}?(kv\s+)?(cache|it|them)\b|\b(skip\w*|bypass\w*|ignor\w*)\s+(the\s+)?(kv\s+)?cache\b", _I)


def object_closes(before: str) -> int:
    """Where the last negated verb with its own object ends in ``before`` (0 if none): a negation before it is spent."""
    return max([0] + [m.end() for m in _NEG_VERB_OBJECT.finditer(before)])


def negated_at(clause: str, pos: int) -> bool:
    """Is the word at ``pos`` in ``clause`` negated (a wide negator anywhere before it in the
    clause, or a plain one just before it)?"""
    before = clause[:pos]
    found = list(re.finditer(r"\band\b|\bor\b|和|并且|而且|、|或者|或(?!许)", before, _I))
    joins = [m.end() for m in found] + [object_closes(before)]
    if found and _OR.fullmatch(found[-1].group(0)) and _DISJUNCT.fullmatch(before[found[-1].end():]):
        return negated_at(clause, found[-1].start())  # "don't re-read or redo": the negation governs both verbs
    if _NEG_WIDE.search(before[max(joins):]):  # "avoids X and costs Y": the scope ends at "and"
        return True
    window_start = max(0, pos - (NEAR_WINDOW_ZH if _CJK_RE.search(clause[max(0, pos - 1):pos + 1]) else NEAR_WINDOW_EN))
    near = clause[max([window_start] + joins):pos]  # "is not small and rises": the "not" stays with "small"
    return bool(_NEG_NEAR.search(near))


NEG_AFTER_EN = 18
# verbs that deny their subject a part in what follows: said after "later steps", they negate it
_IGNORES = re.compile(r"\s+(\w+\s+){0,1}?(ignor\w*|disregard\w*|discard\w*|throw\w*\s+(it\s+)?away|never\s+(use|see|read)\w*)\b", _I)
_IGNORES_ZH = re.compile(r"[^，。；,;]{0,2}(忽略|无视|丢弃|扔掉|不管|不看|不用)|[^，。；,;]{0,4}(无关|没关系|没有关系|不相关|没有影响)")
NEG_AFTER_ZH = 4


# a negator before a verb of ignoring is a yes: "later steps can't ignore it", "后面的步骤不能忽略它", "离不开它"
_CANNOT_IGNORE = re.compile(r"\s*(\w+\s+){0,1}?(can't|cannot|can\s+not|couldn't|won't|don't|doesn't|never|do\s+not|does\s+not)\s+"
                            r"(\w+\s+)?(ignor|disregard|overlook|skip|escape|do\s+without)\w*|"
                            r"[^，。；,;]{0,2}((不能|不会|没法|无法|不可能|不可|不)(忽略|无视|不管|绕开|跳过|丢开)|离不开)", _I)


def negated_after(clause: str, end: int) -> bool:
    """A subject followed by its negated verb: "later steps do not depend on it", "后续计算不依赖它"."""
    if _CANNOT_IGNORE.match(clause, end):
        return False
    after_zh = clause[end:end + NEG_AFTER_ZH]
    if _CJK_RE.search(after_zh[:1] or "") and _NEG_NEAR.search(after_zh):
        return True
    after = clause[end:end + NEG_AFTER_EN]
    if _IGNORES.match(after) or _IGNORES_ZH.match(clause[end:end + 2 * NEG_AFTER_ZH]):  # "later steps ignore it", "后续计算忽略它"
        return True
    return bool(re.match(r"\s+(\w+\s+){0,1}?(do|does|did|is|are|was|were|will|would|can|could|should)\s*(not|n't)\b"
                         r"(?!\s+(small|little|negligible|cheap|free|trivial|minor)\b)"
                         r"|\s+(\w+\s+){0,1}?(never|don't|doesn't|won't|can't|isn't|aren't)\b", after, _I))


def _rx(words) -> re.Pattern:
    return re.compile("|".join(words), _I)


# --- ideas ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Idea:
    """``present`` when a clause holds a match of every part of ``parts`` (the last one is the
    predicate that negation attaches to), or a match of ``inverted`` that *is* negated."""

    key: str
    parts: tuple = ()  # tuple of tuples of compiled patterns: any of each group
    inverted: tuple = ()  # patterns that express the idea only under negation ("not recomputed")
    standalone: tuple = ()  # phrases that express the idea alone ("reuse", "复用")
    weak: tuple = ()  # phrasings that only hint at the idea
    label_en: str = ""
    label_zh: str = ""
    inverted_by: re.Pattern | None = None  # verbs that negate an inverted phrase ("spares … recomputing")
    polar: bool = True  # False: a negation does not turn the idea around ("won't keep turn 1" still names it)
    opposite: bool = False  # True: ``inverted`` denies the idea's opposite ("doesn't save memory"), a weaker way to say it
    across: tuple = ()  # phrases that run from one clause into the next, whose subject stays in the first

    def find(self, text: str) -> str:
        """'present', 'negated', 'weak' or 'absent'."""
        state, prev = "absent", ""
        for _, clause in clauses(text):
            s = self._in_clause(clause, prev)
            prev = clause
            if s == "present":
                return "present"
            if s == "negated":
                state = "negated"
            elif s == "weak" and state == "absent":
                state = "weak"
        return state

    def _negated(self, clause: str, m: re.Match) -> bool:
        if not self.polar:
            return False
        inside = m.group(0)[2:]  # "占用也不会增长": a negator inside the phrase (not one it starts with)
        after = negated_after(clause, m.end()) and not _contrast(clause, m) and not self._said_again(clause, m.end())
        if negated_at(clause, m.start()) or after or _NEG_NEAR.search(inside):
            return not double_negative(clause, m)
        return False

    def _said_again(self, clause: str, end: int) -> bool:
        """"KV 直接读不用再算": the negator after the phrase opens the idea said by negation (an
        inverted phrase, negated), which agrees with the phrase; it does not deny it."""
        for p in self.inverted:
            for m in p.finditer(clause):
                if end <= m.start() <= end + NEG_AFTER_ZH and (
                        _NEG_NEAR.search(m.group(0)[:3]) or negated_at(clause, m.start())):
                    return True
        return False

    def _in_clause(self, clause: str, prev: str = "") -> str:
        said = [not self._negated(clause, m) for pattern in self.standalone for m in pattern.finditer(clause)]
        if not said and prev:  # "有的刚进来、有的快结束", "some …, some …"; "缓存放显存里，聊得越久越多"
            joined = prev + "，" + clause
            patterns = self.across + (self.standalone if _LIST_PAIR.search(joined) else ())
            said = [not self._negated(joined, m) for pattern in patterns for m in pattern.finditer(joined)
                    if m.start() < len(prev) < m.end()]
        if said:  # "only computes the new token instead of reusing …": one plain mention is enough
            return "present" if any(said) else "negated"
        state = self._parts_state(clause)
        if state == "present" and without_it(prev):
            return "negated"  # "without a cache, memory would grow": said of the world without it
        if state != "absent":
            return state
        for p in self.inverted:
            for m in p.finditer(clause):
                if negated_at(clause, m.start()) or _NEG_NEAR.search(m.group(0)) or counterfactual(clause[:m.start()], prev) or (
                        self.inverted_by is not None and self.inverted_by.search(clause[object_closes(clause[:m.start()]):m.start()])):
                    return "present"
        return "weak" if any(p.search(clause) for p in self.weak) else "absent"

    def _parts_state(self, clause: str) -> str:
        """All parts in the clause: 'present', or 'negated' when any of its predicates is negated
        ("the memory it uses doesn't grow", "uses no extra memory")."""
        if not self.parts:
            return "absent"
        hits = []
        spent = [m.span() for m in _NEG_VERB_OBJECT.finditer(clause)]  # "skips the cache": its verb has another object
        for k, group in enumerate(self.parts):
            ms = [m for p in group for m in p.finditer(clause)
                  if k < len(self.parts) - 1 or not any(a <= m.start() < b for a, b in spent)]
            if not ms:
                return "absent"
            hits.append(ms)
        if any(self._negated(clause, m) for m in hits[-1]):
            return "negated"
        if any(_NO_OBJECT.search(clause[:m.start()]) and not any(p.search(m.group(0)) for p in self.inverted)
               for ms in hits[:-1] for m in ms):
            return "negated"  # "saves no compute", "uses zero memory": the object itself is denied
        return "present"


def _contrast(clause: str, m: re.Match) -> bool:
    """"存的是中间结果不是答案", "it is X, not Y": the negation that follows denies Y, not X."""
    return bool(re.search(r"(是|\bis|\bare)\s*$", clause[:m.start()], re.IGNORECASE)
                and re.match(r"\s*(而)?(不是|并非|而非)|\s*,?\s*not\b", clause[m.end():], re.IGNORECASE))


_NO_OBJECT = re.compile(r"\b(no|zero)\s+$", re.IGNORECASE)
_LIST_PAIR = re.compile(r"有的[^。；]{0,16}有的|一些[^。；]{0,16}一些|既有[^。；]{0,24}(也有|又有|还有)|\bsome\b[^.;]{0,40}\b(some|others?)\b", re.IGNORECASE)
_WITHOUT_ZH = (r"(?:(如果|若|要是|假如|假设)?(没有|不用|去掉|关掉)\s*(它|这个|缓存|KV|cache)"  # "没有 KV cache 的话"
               # a negated verb as the condition: "不缓存的话", "没存 KV 的话", "要是不开 cache 的话"
               r"|(如果|若|要是|假如|假设)?(不|没)有?\s*(缓存|存|开|用|保存|留)\s*(它|这个|缓存|KV|kv|cache)?\s*的话)")
_COUNTERFACTUAL = re.compile(r"\bwould\b|\bwithout (it|the cache|a cache|caching|them)\b|\botherwise\b|否则|不然|"
                             r"要不然|" + _WITHOUT_ZH, re.IGNORECASE)
_WITHOUT_IT = re.compile(r"^\s*(without\s+(it|the|a|any|kv|caching)\b|如果没有|若没有|否则|不然|otherwise|" + _WITHOUT_ZH + ")",
                         re.IGNORECASE)


# "否则 / 不然 / otherwise" followed by its own predicate is a whole counterfactual ("不然每个 step 都要从头算"): the
# clause after it is about the real world again ("…；memory 随 token 数涨"). Only a bare one reaches the next clause.
_SAID_IN_FULL = re.compile(r"^\s*(否则|不然|要不然|otherwise)(的话)?\s*\S", re.IGNORECASE)


def without_it(prev: str) -> bool:
    """Is the clause before a condition without the cache ("without it", "如果没有 KV cache 的话", a bare "否则") whose
    consequence is the clause that follows?"""
    m = _WITHOUT_IT.search(prev)
    if m and re.search(f"的话\\s*([{CJK}]{{2}}|[A-Za-z]{{2}})", prev):
        return False  # "不缓存的话每步都要重算": the condition has its consequence in its own clause
    return bool(m) and not _SAID_IN_FULL.search(prev)


def counterfactual(before: str, prev: str) -> bool:
    """"Without it, each step would recompute …", "否则每一步都要重算": what the cache spares is
    named by what would happen without it."""
    return bool(_COUNTERFACTUAL.search(before) or without_it(prev))


_DOUBLE_AFTER = re.compile(r"\b(without|unless|except)\b|离不开|都(要|得|会)", re.IGNORECASE)


def double_negative(clause: str, m: re.Match) -> bool:
    """"No later step is computed without it", "没有哪一步不依赖它": two negations make a yes."""
    if _DOUBLE_AFTER.search(clause[m.end():m.end() + 60]):
        return bool(re.search(r"\b(no|not|never|none)\b|没有|没", clause[max(0, m.start() - 24):m.start()], re.IGNORECASE))
    before = clause[:m.start()]
    if re.search(r"(没有|没)[^，。；,;]{0,6}不\s*$", before) or re.search(
            r"\b(no|none|nothing)\b[^.;]{0,30}\b(doesn't|does not|isn't|is not|not)\s+$", before, re.IGNORECASE):
        return True  # "没有哪一步不依赖它", "no step that does not depend on it"
    return bool(re.search(r"没有[^，。；,;]{0,8}$", before)) and "不" in clause[m.end():m.end() + 8]


def idea(key, label_en, label_zh, parts=(), inverted=(), standalone=(), weak=(), inverted_by=(), polar=True,
         opposite=False, across=()) -> Idea:
    """``parts``: a list of groups, each a list of alternative patterns (the last group is the
    predicate); ``inverted``, ``standalone``, ``weak``, ``inverted_by``, ``across``: lists of patterns."""
    return Idea(key, tuple((_rx(g),) for g in parts), tuple(_rx([p]) for p in inverted),
                tuple(_rx([p]) for p in standalone), tuple(_rx([p]) for p in weak), label_en, label_zh,
                _rx(inverted_by) if inverted_by else None, polar, opposite, tuple(_rx([p]) for p in across))


@dataclass(frozen=True)
class Misconception:
    key: str
    patterns: tuple
    spoils: tuple = ()  # the ideas whose point it cancels
    feedback_en: str = ""
    feedback_zh: str = ""
    hypothetical_ok: bool = False  # True: said of a world without the cache ("if decode didn't read it, …") it is no claim
    true_of: re.Pattern | None = None  # a subject of whom the phrase is true ("prefill 不读缓存": it writes it), read in
    # the clause before the phrase and the clause before that ("once it is released, it holds no blocks")

    def find(self, text: str) -> str | None:
        """The offending phrase when stated (not negated), else None."""
        prev = ""
        for at, clause in clauses(text):
            before_clause, prev = prev, clause
            for p in self.patterns:
                for m in p.finditer(clause):
                    if retracted(clause[:m.start()], text[at + len(clause):]):
                        continue
                    # a pattern that names its subject first negates at its verb, group "v": "decode 不用每步重算"
                    at_verb = m.start("v") if "v" in p.groupindex and m.start("v") >= 0 else m.start()
                    if self.hypothetical_ok and hypothetical(clause, at_verb, m.end(), before_clause):
                        continue
                    if self.true_of is not None and self.true_of.search(before_clause + "，" + clause[:m.start()]):
                        continue
                    if compared_and_denied(clause[:m.start()], clause[m.end():]):
                        continue
                    # "not just a UI knob" denies the misconception even though "not just" affirms an idea
                    if not negated_at(clause, at_verb) and not _NOT_JUST.search(clause[max(0, m.start() - 30):m.start()]):
                        return m.group(0)
        return None


# "at first I thought it was just a UI thing, but …", "我一开始以为只是调随机性，其实……": a belief the answer reports
# and then takes back is not its claim
_BELIEVED = re.compile(r"\b(i|we)\s+(\w+\s+){0,2}?(thought|believed|assumed|figured|used\s+to\s+(think|believe))\b|以为", _I)
_TAKEN_BACK = re.compile(r"\bbut\b|\bactually\b|\bturns?\s+out\b|\bin fact\b|\bhowever\b|其实|但|后来|实际上|才(发现|知道|明白)", _I)


def retracted(before: str, after: str) -> bool:
    """Is the phrase the content of a belief the student reports ("I thought …", "以为 …") and then contradicts?"""
    return bool(_BELIEVED.search(before) and _TAKEN_BACK.search(after))


# the misconception named as what the thing is compared with and denied: "跟“同样问题直接给答案”的缓存不是一回事",
# "不像网页缓存那样直接返回答案", "unlike a web cache that returns stored answers"
_COMPARED_WITH = re.compile(r"(跟|和|与|同)\s*[“\"「『'‘]?\s*$", _I)
_DENIED_AFTER = re.compile(r"^[^，。；,;]{0,14}?(不是一回事|是两回事|两码事|不一样|不相同|不同|无关|没有?关系|不相干|不是一个东西)", _I)
_UNLIKE = re.compile(r"不像|不同于|有别于|区别于|\bunlike\b|\b(different|distinct)\s+from\b|\bnot\s+(the\s+same\s+as|like)\b|"
                     r"\bisn't\s+like\b", _I)


# the misconception as what the thing must not be taken for: "不能把它当成后处理", "don't treat it as post-processing"
_NOT_TAKEN_FOR = re.compile(r"(别|不能|不要|不该|不应该?|千万别|不可以)\s*(再)?\s*(把\s*[^，。；,;]{0,8}?)?(当成|当作|当做|看成|看作|理解成|理解为|视为)\s*[“\"「『'‘]?\s*$|"
                            r"\b(don't|do\s+not|never|shouldn't|should\s+not|can't|cannot)\s+(treat|see|think\s+of|view|regard|mistake)\s+"
                            r"(\w+\s+){0,2}?(as|for)\s+(a\s+|an\s+|the\s+|just\s+)?$", _I)
# the misconception phrase as what is spared: "它省的是 decode 时对前文的重新计算", "避免了 decode 重算"
_SPARED = re.compile(r"(省|省掉|省去|省下|免去|免掉|避免|避开|跳过|消除)(了|掉|下)?\s*(的(就)?是)?\s*$", _I)


def compared_and_denied(before: str, after: str) -> bool:
    """Is the phrase what the answer says the thing is *not like* (a comparison it denies), not to be taken for, or
    what it spares?"""
    return bool((_COMPARED_WITH.search(before) and _DENIED_AFTER.search(after)) or _UNLIKE.search(before)
                or _NOT_TAKEN_FOR.search(before) or _SPARED.search(before))


_IF = re.compile(r"\b(if|unless|suppose|supposing|imagine)\b|如果|若|要是|假如|假设|一旦|倘若", _I)
_THEN = re.compile(r"^\s*(的话|时|的时候|就|则|便|也(能|可以|行)|那)", _I)


def hypothetical(clause: str, start: int, end: int, prev: str) -> bool:
    """Is the phrase (``clause[start:end]``, from its verb) said of a world that is not the answer's claim: under
    "if" ("如果 decode 不读缓存"), as the condition of what follows ("不读缓存的话", "不用 KV 就得重算"), or in a
    counterfactual ("would", "否则", "without it")?"""
    before = clause[:start]
    return bool(_IF.search(before) or _THEN.match(clause[end:]) or counterfactual(before, prev)
                or re.search(r"\bcould\b", before, _I))


def misconception(key, patterns, spoils, feedback_en, feedback_zh, hypothetical_ok=False, true_of=None) -> Misconception:
    return Misconception(key, tuple(_rx([p]) for p in patterns), tuple(spoils), feedback_en, feedback_zh, hypothetical_ok,
                         _rx([true_of]) if true_of else None)


# --- sentence or salad? -------------------------------------------------------------------------------
_GLUE_EN = set("""the a an is are was were be been being it its it's they them their this that these those so
because but and or of to for with by in on at as from which when while than then if has have had does do did
can could will would must should may might we you each every instead without not no never only just per into
there here what who whose how one ones once until since yet thus hence therefore whatever whichever""".split())
_GLUE_ZH = re.compile(r"的|了|是|会|把|让|但|所以|因为|就|时|也|不|没|而|被|在|从|随|要|能|可以|很|越|得|它|这|那|和|与|并|使|"
                      r"将|以|只|都|每|再|还|又|才|即|则|若|如果|由于|因此|于是|需要|之|其|着|过|给|对|后|成|到|为|后|前|里|上|中")


_VERB_ZH = re.compile(f"[{CJK}]{{2}}(决定|影响|依赖|进入|加入|追加|占用|占着|增加|避免|复用|需要|导致|变成|保存|释放|继续)[{CJK}]")

# nouns of the chapter that contain a glue character (上下文, 并发…): not glue
_ZH_TERMS = re.compile(r"上下文|并发|并行|中间|成本|时间|前缀|上限|在线|以前|之前|之后|以后|后续|后面|前面|对话|会话")
_SEGMENT_SPLIT = re.compile(r"\s*(?:[,;|\n•·、，；→⇒]|->|=>|\s/\s|(?<=\w{2})/(?=\w{2})|\s[-–]\s)\s*"
                            f"|(?<=[{CJK}])\\s+(?=[{CJK}])")
# what links parts of a statement (stricter than glue: "no", "of", "的" do not)
_LINK_EN = set("""because so but which that since thus therefore hence while whereas then when if instead it its
they is are was were be been has have had can could will would does do did must should""".split())
_LINK_ZH = re.compile(r"有的[^。；]{0,10}有的|谁[^。；]{0,10}谁|因为|所以|但|而|从而|因此|由于|于是|如果|就|才|让|使|会|能|(?<!不)是|把|被|随|越|导致|需要|可以|要")


# what makes a Chinese piece a clause rather than a term: an aspect particle, an adverb of degree, time or scope,
# or a modal negation ("下次不用算了", "prompt 很长", "都要存"). Pieces chained by commas with one of these are a
# sentence; the enumeration marks (、 / → …) still make a list whatever the pieces hold.
CLAUSE_ZH = re.compile(r"了|着|都|也|还|再|又|各|已经|一直|直接|很|太|非常|特别|更|挺|比较|不用|不必|无需|不需要|不会|没有|下次|每次")
LIST_MARKS = re.compile(r"[、/|•·→⇒]|->|=>")

# A slash inside one term is no list mark: an abbreviation spelt letter by letter ("K/V", "Q/K/V", "I/O") or one
# pair of Latin words coordinated inside a phrase ("prefill/decode 都要读它", "top-k/top-p"), as an instructor reads
# "存 K/V" as "存 KV". A chain of three words or more ("prefill/decode/KV"), a slash next to Chinese ("KV/显存") or
# one with spaces round it ("KV / memory") still separates keywords.
_TERM_SLASH = re.compile(r"(?<![A-Za-z0-9_/-])(?:[A-Za-z](?:/[A-Za-z])+|[A-Za-z][\w-]*/[A-Za-z][\w-]*)(?![A-Za-z0-9_/-])",
                         re.ASCII)
TERM_SLASH = "\u2044"  # the fraction slash: not a separator, and left alone by NFKC


def join_term_slashes(text: str) -> str:
    """The text with the slash inside a term ("K/V", "prefill/decode") written as a fraction slash, so that
    keyword-run readers do not split the term; slashes between keywords are kept."""
    return _TERM_SLASH.sub(lambda m: m.group(0).replace("/", TERM_SLASH), text)


def normalize_terms(text: str) -> str:
    """``normalize``, and the slash inside a term joined (``join_term_slashes``): the text as every reader that
    cuts an answer at its separators must see it, so that none of them splits "K/V"."""
    return join_term_slashes(normalize(text))


def list_marked(text: str) -> bool:
    """Whether ``text`` holds an enumeration mark (``LIST_MARKS``), the slash inside a term not counted."""
    return bool(LIST_MARKS.search(join_term_slashes(text)))


# English verbs that make a short piece a predicate ("saves compute", "memory grows"): pieces that have
# one are telegraphic statements, not keywords
_VERBS_EN = set("""avoids saves skips spares costs uses takes eats needs grows holds keeps stores reuses prevents
reduces increases consumes adds appends becomes feeds joins conditions depends decides picks steers changes
affects occupies requires fills scales rises climbs goes enters""".split())


def predicates(segments: list[str]) -> bool:
    """Two pieces or more, at least half of them (two words or more) with a verb: statements written tersely."""
    said = sum(len(latin_words(s)) >= 2 and any(w in _VERBS_EN for w in latin_words(s)) for s in segments)
    return len(segments) >= 2 and said >= 1 and 2 * said >= len(segments)  # one run of words is no statement


_ONE_ARROW = re.compile(r"^[^→⇒]+(→|⇒|->|=>)[^→⇒]+$")


def causal_arrow(text: str) -> bool:
    """One arrow between two pieces is "leads to" ("上下文长 → KV 多"): a statement. A chain of them
    ("token → history → next step") is still a list."""
    return bool(_ONE_ARROW.match(text.strip())) and text.count(">") <= 1


_VO_PIECE = re.compile(f"^((缺点|代价|坏处|好处|优点|作用|收益|开销)\\s*[:：是]?\\s*)?"
                       f"(节省|节约|减少|避免|省去|省掉|免去|增加|占用|消耗|降低|提高|提升|加快|加速|缩短|减轻|复用|重用|保存|需要|占|省|费|耗|换)"
                       f"[{CJK}]{{2,}}")  # "缺点：占显存": a piece under its label is still a verb and its object


def verb_object_pieces(text: str) -> bool:
    """Comma-chained Chinese pieces that each open with a verb and its object ("节省计算量，增加显存占用",
    "省计算，费显存"): a sentence with its subject left out. Enumeration marks and semicolons still make a list."""
    if list_marked(text) or re.search(r"[；;]", text):
        return False
    pieces = [p.strip(" .。!！") for p in re.split(r"[，,]", text) if p.strip(" .。!！")]
    return len(pieces) >= 2 and all(_VO_PIECE.match(p) for p in pieces)


def clause_marked(text: str) -> bool:
    """Chinese pieces that carry a clause marker and no list marks ("存K和V，下次不用算了，占内存")."""
    return not list_marked(text) and bool(CLAUSE_ZH.search(_ZH_TERMS.sub("", text)))


def keyword_run(text: str) -> bool:
    """Short pieces between separators and nothing linking them into a clause: three or more
    ("避免重算；显存增长；长上下文"), or two bare terms ("requests, memory")."""
    t = normalize_terms(text)
    segments = [s for s in _SEGMENT_SPLIT.split(t) if s and s.strip(" .。!！?？")]
    if len(segments) < 2:
        return False
    words_each, cjk_each = (3, 6) if len(segments) >= 3 else (2, 4)  # two pieces: both must be bare terms
    short = all(len(latin_words(s)) <= words_each and cjk_chars(s) <= cjk_each for s in segments)
    linked = (any(w in _LINK_EN for w in latin_words(t)) or bool(_LINK_ZH.search(_ZH_TERMS.sub("", t))) or clause_marked(t)
              or predicates(segments) or causal_arrow(t) or verb_object_pieces(t))
    return short and not linked


# A terse sentence of one clause and no glue word ("KV cache saves compute", "requests hold KV blocks",
# "采样 token 影响下一步"): a finite verb between a short subject and its object. A run of nouns around a verb
# ("keys values cache memory grows recompute avoided") has too long a subject or a second predicate after it;
# 显存占用 is a noun ("memory use"), not a verb and its subject.
_FINITE_EN = _VERBS_EN | set("""reads writes shapes drives determines influences caches frees releases limits doubles
accumulates explodes matters returns""".split())
_BASE_EN = set("""hold keep store reuse skip avoid save need grow take eat read feed join occupy consume affect determine
decide depend change steer use cost fill condition become enter""".split())  # after a plural subject: "requests hold KV"
_INTRANSITIVE_EN = {"grows", "rises", "climbs", "increases", "scales", "accumulates", "explodes", "doubles", "matters",
                    "grow", "rise", "increase", "scale", "accumulate", "double"}
_TERM_EN = re.compile(rf"[A-Za-z][\w'{TERM_SLASH}-]*")
_SVO_ZH = re.compile(rf"(?!(?i:显存|内存|memory|vram)\s*占用)(?:[{CJK}]{{2}}|(?<![A-Za-z])[A-Za-z][\w{TERM_SLASH}-]*)\s*"
                     rf"(决定|影响|依赖|进入|加入|追加|占用|占着|增加|避免|复用|需要|导致|变成|保存|释放|节省|减少|读取|写入|存下|"
                     rf"省掉|省去|喂给|接到|拼到|省|占|吃|费(?!用)|进(?!程|度|行|展)|涨)\s*(?:[{CJK}]|[A-Za-z])")


def _verb_at(words: list[str], i: int) -> bool:
    w = words[i].lower()
    plural_subject = i > 0 and re.fullmatch(r"[a-z]+[^s]s", words[i - 1].lower()) is not None
    return w in _FINITE_EN or (plural_subject and w in _BASE_EN)


def terse_clause(text: str) -> bool:
    """One clause, no glue word, whose verb stands between a subject of one to three words and an object of at most
    six (or ends it, if it takes none: "cache memory grows"), with no second predicate after it."""
    t = normalize_terms(text).strip(" .。!！")
    if len([s for s in _SEGMENT_SPLIT.split(t) if s and s.strip(" .。!！?？")]) != 1:
        return False
    if cjk_chars(t):
        return bool(_SVO_ZH.search(t))
    words = _TERM_EN.findall(t)
    i = next((k for k in range(len(words)) if _verb_at(words, k)), None)
    if i is None or not 1 <= i <= 3:
        return False
    after = [w.lower() for w in words[i + 1:]]
    if not after:
        return words[i].lower() in _INTRANSITIVE_EN
    second = any(w in _FINITE_EN for w in after) or (len(after[-1]) > 4 and after[-1].endswith("ed"))
    return len(after) <= 6 and not second


def is_salad(text: str) -> bool:
    """Key words strung together with nothing to tie them into a statement, in either language
    or both: no glue word at all, or a run of short pieces between separators with no link."""
    t = normalize(text)
    if keyword_run(t):
        return True
    en = latin_words(t)
    if any(w in _GLUE_EN for w in en) or predicates([s for s in _SEGMENT_SPLIT.split(t) if s and s.strip(" .。!！?？")]):
        return False
    zh = "".join(_CJK_RE.findall(_ZH_TERMS.sub("", t)))
    if zh and _GLUE_ZH.search(zh):
        return False
    if _VERB_ZH.search(t) or verb_object_pieces(t) or terse_clause(t):
        return False  # "输出长度决定步数", "KV cache saves compute": a verb between two nouns is a statement
    return len(en) + (len(re.findall(f"[{CJK}]+", t))) >= 2


def _grams(text: str) -> list:
    t = normalize(text).lower()
    words = re.findall(r"[a-z0-9']+", t)
    zh = re.findall(f"[{CJK}]", t)
    return [tuple(words[i:i + 3]) for i in range(len(words) - 2)] + ["".join(zh[i:i + 3]) for i in range(len(zh) - 2)]


def copied_from(text: str, prompts) -> bool:
    """Does the answer mostly repeat the task's own words (75 % of its word triples, or a
    near-verbatim stretch)?"""
    t = normalize(text).lower()
    if len(t) < 12:
        return False
    mine = _grams(t)
    theirs = {g for p in prompts for g in _grams(p)}
    if len(mine) >= 4 and sum(g in theirs for g in mine) >= 0.75 * len(mine):
        return True
    for p in list(prompts) + [" ".join(prompts)]:
        q = normalize(p).lower()
        if fuzz.partial_ratio(t, q) >= 90 and len(t) <= len(q) * 1.15:
            return True
    return False


@dataclass
class Reading:
    """What the matcher found in one answer."""

    text: str
    lang: str
    ideas: dict = field(default_factory=dict)  # key -> state
    misconceptions: list = field(default_factory=list)  # (Misconception, phrase)
    salad: bool = False
    copied: bool = False
    doubts: list = field(default_factory=list)  # (why, how much): see Marks.doubt


# what learners abbreviate in a hurry ("mem grows w/ seq len", "w/o the cache"): read as the words
_ABBREVIATIONS = [(re.compile(p, _I), w) for p, w in (
    (r"\bw/o\b", "without"), (r"\bw/(?=\s|$)", "with"), (r"\bb/c\b", "because"), (r"\bmem\b", "memory"),
    (r"\bctx\b", "context"), (r"\bseqs\b", "sequences"), (r"\bseq\b", "sequence"), (r"\btoks\b", "tokens"),
    (r"\btok\b", "token"), (r"\bprev\b", "previous"), (r"\brecomp\b", "recompute"), (r"\s&\s", " and "))]


# Chinese input-method slips (a homophone typed for the word meant) that carry no other meaning in an answer
_ZH_SLIPS = [(re.compile(p), w) for p, w in (
    (r"从新(?=[^，。；,;]{0,2}(计算|算|生成|处理|跑|做|来|投影|编码))", "重新"), (r"站用", "占用"), (r"上下问", "上下文"),
    (r"线存", "显存"), (r"显村", "显存"),
    # 重负/重付 for 重复 only before a verb of computing ("不堪重负" stays); 家入/价入 for 加入 before what it joins
    (r"重[负付](?=\s*(计算|算|运算|处理|生成))", "重复"),
    # 家入/家到/家进 for 加入/加到/加进 (价 likewise) before what it joins; 大家, 回家, 国家 … stay themselves
    (r"(?<![大回国专作])[家价](?=(入|到|进)\s*(上下文|历史|序列|输入|缓存|context|kv|KV))", "加"))]


def expand_abbreviations(text: str) -> str:
    for rx, word in _ABBREVIATIONS + _ZH_SLIPS:
        text = rx.sub(word, text)
    return text


# "它避免的不是显存，而是重复计算": a cleft whose verb stands before the denied part; what follows 而是 is its
# object. Read as "它避免的是重复计算，不是显存", so the verb and its real object share a clause.
_CLEFT_ZH = re.compile(r"(?P<verb>[^，。；,;的]{1,12})的(并)?不是(?P<a>[^，。；,;]{1,24}?)[，,]?\s*而是(?P<b>[^，。；,;]{1,24})")


def unfold_cleft(text: str) -> str:
    return _CLEFT_ZH.sub(lambda m: f"{m['verb']}的是{m['b']}，不是{m['a']}", text)


MAX_READ = 4000  # characters the matcher looks at: a pasted novel cannot stall the grader


# a short gloss in brackets is part of its clause: "the shelves (VRAM) fill up", "锅（显存）越来越满"; one with a negation
# or a verb of its own stays an aside
# (a bracket right after a letter is code or a formula: "O(n)", "llama_decode(ctx)")
_GLOSS = re.compile(r"(?:\s+|(?<=[\u4e00-\u9fff])|^)[(（]\s*([^()（）,，;；:：。.!?！？]{1,24}?)\s*[)）]\s*")
_GLOSS_CLAUSE = re.compile(r"它|其|这|那|是|会|要|把|被|让|了|\b(it|this|that|they|which|is|are|was|were|will|can|does|do)\b", _I)


def unwrap_gloss(text: str) -> str:
    def repl(m: re.Match) -> str:
        inner = m.group(1)
        if len(latin_words(inner)) > 3 or cjk_chars(inner) > 8 or _NEG_NEAR.search(inner) or _NEG_WIDE.search(inner) \
                or _GLOSS_CLAUSE.search(inner):  # "（它反而吃显存）" has a subject of its own: an aside
            return m.group(0)
        return f" {inner} "

    return _GLOSS.sub(repl, text)


# a negative question that expects "yes" is a statement: "不就拼回序列里了吗？" (就拼回序列里了), "下一步不也是基于它算的吗？",
# "isn't the sampled token the next step's input?" (the sampled token is …); a why/how question stays a question
_RHETORICAL_ZH = re.compile(r"(难道)?不(就|也|都|正|还|是)([^，。；,;？?！!]{1,30}?)(吗|么|嘛)\s*(?=[？?]|$)")
_NP_EN = (r"(it|they|this|that|(?:the|a|each|every|this|that)\s+(?:[\w'-]+\s+){0,2}?"
          r"(?:token|tokens|output|id|sample|choice|cache|kv|step|pass|request|memory|result|one))")
_RHETORICAL_EN = re.compile(r"(?<![\w?])(?P<pre>[^.?!;]*?)\b(?P<aux>is|are|was|does|do|did|will|would|can)(?:n't|\s+not)\s+"
                            rf"(?P<np>{_NP_EN})\s+(?P<rest>[^?.;!]{{2,80}})\?", _I)


def unfold_rhetorical(text: str) -> str:
    text = _RHETORICAL_ZH.sub(lambda m: ("是" if m.group(2) == "是" else m.group(2)) + m.group(3), text)

    def en(m: re.Match) -> str:
        if re.search(r"\b(why|how|what|when|where|which|who)\b", m["pre"], _I):
            return m.group(0)
        aux = m["aux"].lower()
        verb = "" if aux in ("does", "do", "did") else f" {aux}"
        return f"{m['pre']}{m['np']}{verb} {m['rest']}."

    return _RHETORICAL_EN.sub(en, text)


# a tensor's shape written as a list, "[batch, max_len, heads, dim]", is the product of its sizes: read as one
# phrase "batch × max_len × heads × dim", so that its commas do not cut it into clauses of one word each
_SHAPE = re.compile(r"\[\s*([A-Za-z_][\w.]*|\d+)((?:\s*,\s*(?:[A-Za-z_][\w.]*|\d+)){1,7})\s*\]")


def shape_as_product(text: str) -> str:
    return _SHAPE.sub(lambda m: " " + " × ".join(x.strip() for x in m.group(0)[1:-1].split(",")) + " ", text)


def read(text: str, ideas, misconceptions=(), prompts=()) -> Reading:
    t = normalize(text)[:MAX_READ]
    fixed = shape_as_product(unwrap_gloss(unfold_rhetorical(unfold_cleft(expand_abbreviations(t)))))
    fixed = re.sub(r"\bO\(([\w^*]{1,12})\)", r"O_of_\1", fix_typos(fixed))  # "O(n)" is a growth rate, not a clause break
    r = Reading(t, language(t), salad=is_salad(t), copied=copied_from(t, prompts))
    for i in ideas:
        r.ideas[i.key] = i.find(fixed)
    for m in misconceptions:
        phrase = m.find(fixed)
        if phrase:
            r.misconceptions.append((m, phrase))
    r.doubts = _doubts(fixed, ideas, r)
    return r


HEDGED_DOUBT = 0.2  # an idea found in a clause that also holds a negator: the scope may be misread
MIXED_DOUBT = 0.3  # an idea and a misconception in one answer: which one the student means is unclear


def _doubts(text: str, ideas, r: Reading) -> list:
    """Where the reading may be wrong even though every rule fired cleanly."""
    out = []
    present = [i for i in ideas if r.ideas[i.key] == "present"]
    for i in present:
        for _, clause in clauses(text):
            if i._in_clause(clause) != "present":
                continue
            spans = [m.span() for p in i.standalone for m in p.finditer(clause)]  # "没有归还" may *be* the idea
            negators = len({m.start() for rx in (_NEG_NEAR, _NEG_WIDE) for m in rx.finditer(clause)
                            if not any(a <= m.start() < b for a, b in spans)}
                           - {m.start() + 1 for m in re.finditer("无[需须]", clause)})  # one negator, counted once
            said_by_negation = any(p.search(clause) for p in i.inverted)  # "avoids recomputing": one is expected
            if negators > (1 if said_by_negation else 0):
                out.append(("negation near an idea", HEDGED_DOUBT))
                break
    if present and r.misconceptions:
        out.append(("an idea and a misconception", MIXED_DOUBT))
    for i in ideas:
        if r.ideas[i.key] == "absent" and _partly_there(i, text):
            out.append((f"part of an idea ({i.key})", PARTLY_DOUBT))
    if any(i.opposite and _only_inverted(i, text) for i in present):
        out.append(("said only by denying its opposite", OPPOSITE_DOUBT))
    if present and len(present) < len(ideas) and _unread_clause(text, ideas):
        out.append(("a clause the grader could not read", UNREAD_DOUBT))
    return out


OPPOSITE_DOUBT = 0.35  # "it does NOT reduce memory": the cost is implied, not said; instructors differ


def _only_inverted(i: Idea, text: str) -> bool:
    """The idea is present only where its opposite is denied (no clause, or pair of clauses, says it outright)."""
    prev = ""
    for _, clause in clauses(text):
        if i._parts_state(clause) == "present" or any(p.search(clause) for p in i.standalone):
            return False
        if prev and any(m.start() < len(prev) < m.end() for p in i.across for m in p.finditer(prev + "，" + clause)):
            return False
        prev = clause
    return True


UNREAD_DOUBT = 0.15  # one idea found, one not, and a whole clause in which nothing matched: the other may be there


def _unread_clause(text: str, ideas) -> bool:
    """A clause of some length (three words, four Chinese characters) in which no pattern of any
    idea matches: a paraphrase the grader has no words for may be in it."""
    for _, clause in clauses(text):
        if len(latin_words(clause)) < 3 and cjk_chars(clause) < 4:
            continue
        patterns = [p for i in ideas for group in (i.standalone, i.inverted, i.weak) for p in group]
        patterns += [p for i in ideas for group in i.parts for p in group]
        if not any(p.search(clause) for p in patterns):
            return True
    return False


PARTLY_DOUBT = 0.35  # an idea not found, but some of its words are there: a paraphrase may have been missed


def _partly_there(i: Idea, text: str) -> bool:
    """Some of the idea's words without the rest: a plain mention of what only counts negated
    ("重算" with no "avoid"), or one part of a two-part idea in a clause ("占用" without "显存")."""
    for _, clause in clauses(text):
        if any(p.search(clause) for p in i.inverted):
            return True
        if len(i.parts) > 1 and any(any(p.search(clause) for p in group) for group in i.parts[-1:]):
            return True
    return False
