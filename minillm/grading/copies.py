"""Is a written answer the student's own words, or text the course already showed them?

Every text field is checked against everything the learner can read while answering: the
task's wording and its bar, the quiz options and their explanations, the pitfall statements,
and every hint and misconception line the feedback can print. An answer made mostly of
that text earns nothing for the part it fills (the grader still reads the rest), and goes to a
person. A near copy of a model answer (shown only on request, and recorded) goes to a person
with its points: whether it was looked up is for them to judge. This is also what keeps feedback from
being pasted back for points: the feedback is part of what is checked against.

Across a class (``minillm grade FOLDER``), :func:`shared_answers` finds answers that two
students handed in nearly word for word; both are flagged, neither loses points: who copied
from whom is for a person to decide.

A copy is measured as the share of the answer that lies in verbatim stretches of shown text
(five words or more; a Chinese character counts as half a word), after the Unicode clean-up
every grader uses, in lower case, with punctuation ignored: a short phrase every answer shares
("the keys and values") is not a copy, a pasted sentence is.
"""

from __future__ import annotations

import re
from functools import lru_cache

from .unicode_clean import clean

CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
COPIED = 0.7  # at least this share of the answer lies in verbatim stretches of shown text: copied
PARTLY = 0.35  # at least this: partly copied (lower confidence, a person looks)
STRETCH = 5.0  # a verbatim stretch counts from this many words (a Chinese character is half a word)
CJK_WEIGHT = 0.5
MIN_WORDS = 4.0  # an answer shorter than this is too short to judge


def tokens(text: str) -> list[str]:
    """Latin words and single Chinese characters, in order, lower case, punctuation dropped."""
    t = clean(text).lower().replace("’", "'")
    return re.findall(f"[a-z0-9]+(?:'[a-z]+)?|[{CJK}]", t)


def _weight(tok: str) -> float:
    return CJK_WEIGHT if re.match(f"[{CJK}]", tok) else 1.0


def grams(text: str) -> list:
    """Word triples of the Latin words and character triples of the Chinese, in order."""
    t = clean(text).lower().replace("’", "'")
    words = re.findall(r"[a-z0-9]+(?:'[a-z]+)?", t)
    zh = re.findall(f"[{CJK}]", t)
    return [" ".join(words[i:i + 3]) for i in range(len(words) - 2)] + ["".join(zh[i:i + 3]) for i in range(len(zh) - 2)]


_REGEX_HINT = re.compile(r"\\[a-zA-Z]|\(\?|\[\^|\{\d")
SHOWN_MODULES = ("minillm.grading.messages",)  # the machinery's own lines; the chapter names its modules


def _literals(module) -> list[str]:
    """Every string a module's code holds (f-strings in their fixed pieces), not its docstrings
    and not its regular expressions: the feedback, options, hints and notebook text it can show."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(module))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            out.append(node.value)
    return [t for t in out if not _REGEX_HINT.search(t) and len(tokens(t)) >= 4]


def shown_texts() -> list[str]:
    """What the exercises notebook and the feedback show a learner while answering: every
    string literal of the modules that write them, less the ideas' labels and the model answers
    (see :func:`_labels`, :func:`model_texts`)."""
    import importlib

    out: list[str] = []
    from .chapter import current

    for name in SHOWN_MODULES + current().shown_modules:
        out += _literals(importlib.import_module(name))
    apart = set(_labels()) | set(model_texts())
    return [t for t in out if t not in apart]


def _labels() -> list[str]:
    """How feedback names an idea the answer already has ("you say that …"): shown only to whoever
    said it, so pasting one back gains nothing, and a right answer may well read like one."""
    from .chapter import current

    return current().idea_labels()


# how feedback praises an idea the answer has ("you say that …"): the frame is the feedback's, not a learner's words
PRAISE_EN, PRAISE_ZH = "you say that ", "你说到了："
_PRAISE = re.compile(r"\byou\s+say\s+that\b|你说到了", re.IGNORECASE)


def praised_texts() -> list[str]:
    """Each idea's label in the frame the feedback praises it with: what a pasted-back praise line is checked against
    (the labels alone stay apart: a right answer may well read like one)."""
    return [frame + label for label in _labels() for frame in (PRAISE_EN, PRAISE_ZH)]


def model_texts() -> list[str]:
    """The model answers, shown only on request (``show_solution``, which the notebook records)."""
    from .chapter import current

    return current().model_texts()


def _index(texts: list[str]) -> tuple:
    """(token lists of the texts, {triple: indexes of the texts holding it})."""
    toks = [tokens(t) for t in texts]
    index: dict = {}
    for i, tt in enumerate(toks):
        for j in range(len(tt) - 2):
            index.setdefault(tuple(tt[j:j + 3]), set()).add(i)
    return toks, index


@lru_cache(maxsize=3)
def _corpus(which: str) -> tuple:
    if which == "praised":
        return _index(shown_texts() + praised_texts())
    return _index(shown_texts() if which == "shown" else model_texts())


def _coverage(text: str, sources="shown", whole: bool = True) -> tuple[float, float]:
    """(share of the answer in verbatim stretches of at least :data:`STRETCH` words of
    ``sources``, share in stretches long enough to be a pasted passage: :data:`LONG_STRETCH`
    words, or the whole answer when ``whole``, or the whole of a shown line); (0, 0) for an answer
    too short to judge. A passage pasted twice counts twice."""
    from difflib import SequenceMatcher

    mine = tokens(text)
    total = sum(_weight(t) for t in mine)
    if total < MIN_WORDS:
        return 0.0, 0.0
    texts, index = _corpus(sources) if isinstance(sources, str) else _index(list(sources))
    near = {i for j in range(len(mine) - 2) for i in index.get(tuple(mine[j:j + 3]), ())}
    covered = [False] * len(mine)
    pasted = [False] * len(mine)
    long_enough = min(LONG_STRETCH, total) if whole else LONG_STRETCH
    for i in sorted(near):
        # all of a shown line is a paste, even one shorter than a stretch (a feedback template's fixed pieces)
        whole_line = max(WHOLE_LINE_MIN, 0.9 * sum(_weight(t) for t in texts[i]))
        left = list(mine)
        for _ in range(4):  # again on what is left: the same hint pasted three times
            found = False
            for block in SequenceMatcher(None, left, texts[i], autojunk=False).get_matching_blocks():
                size = sum(_weight(t) for t in mine[block.a:block.a + block.size])
                if size >= STRETCH or size >= whole_line:
                    covered[block.a:block.a + block.size] = [True] * block.size
                    left[block.a:block.a + block.size] = ["\0"] * block.size
                    found = True
                if size >= long_enough or size >= whole_line:
                    pasted[block.a:block.a + block.size] = [True] * block.size
            if not found:
                break
    share = [sum(_weight(t) for t, c in zip(mine, flags) if c) / total for flags in (covered, pasted)]
    return share[0], share[1]


def copied_share(text: str, sources="shown") -> float:
    """The share of the answer (in words; a Chinese character is half a word) that lies in
    verbatim stretches of at least :data:`STRETCH` words of ``sources``: "shown" (what the
    notebook and its feedback show), "model" (the model answers) or a list of texts. 0 for an
    answer too short to judge."""
    return _coverage(text, sources)[0]


WHOLE_LINE_MIN = 3.0  # words (six Chinese characters): a whole shown line this long counts as a stretch
LONG_STRETCH = 8.0  # a pasted passage: seven words of a short reason can be a phrase every answer shares
PASTED = 0.5  # a copy has at least half of the answer in such passages
WHOLLY = 0.9  # this share in long passages: the answer is a paste, with nothing of its own


_QUOTED = re.compile(r"“[^”]{0,40}”|‘[^’]{0,40}’|(?<![A-Za-z])'[^'\n]{1,60}'(?![A-Za-z])")  # English feedback quotes with '…'


def verdict(text: str) -> str | None:
    """'pasted' (wholly text the notebook or its feedback shows: earns nothing, certain),
    'copied' (mostly such text: earns nothing, a person looks), 'model' (a near
    copy of a model answer: earns nothing either, and a person decides whether it was looked
    up), 'partly' (lower confidence, a person looks) or None. Common phrases of the chapter
    strung together ("the keys and values of one live request's") are not a copy: half of a
    copy lies in passages of :data:`LONG_STRETCH` words or more."""
    text = _QUOTED.sub(" ", text)  # feedback quotes the learner's own names back: not shown text
    # an answer in the feedback's praise frame ("you say that …") is checked against the praised labels too
    share, pasted = _coverage(text, "praised" if _PRAISE.search(text) else "shown")
    if share >= WHOLLY and pasted >= WHOLLY:
        return "pasted"  # nothing of the learner's own in it: no one needs to look
    if share >= COPIED and pasted >= PASTED:
        return "copied"
    model, model_pasted = _coverage(text, "model", whole=False)  # a short reason may say it as the model does
    if model >= COPIED and model_pasted >= PASTED:
        return "model"
    if share >= PARTLY or model >= PARTLY:
        return "partly"
    return None


def _content(text: str) -> list[str]:
    """Latin content words and Chinese character pairs (a single character says too little)."""
    toks = [t for t in tokens(text) if t not in _FILLER]
    out, run = [], []
    for t in toks + [""]:
        if re.match(f"[{CJK}]", t):
            run.append(t)
            continue
        out += ["".join(run[i:i + 2]) for i in range(len(run) - 1)] or run
        run = []
        if t:
            out.append(t)
    return out


def option_share(text: str, option: str) -> float:
    """The share of ``text``'s content words (or Chinese character pairs) that are ``option``'s own
    (0 for a why of fewer than three)."""
    mine, theirs = _content(text), set(_content(option))
    if len(mine) < 3:
        return 0.0
    return sum(t in theirs for t in mine) / len(mine)


def restates(text: str, option: str) -> bool:
    """Does ``text`` say little beyond the words of ``option`` (a quiz why that paraphrases the
    chosen option: most of its content words, or character pairs, are the option's own)?"""
    return option_share(text, option) >= RESTATES


RESTATES = 0.85  # this share of a why's content words in the option's own text: a restatement (a paraphrase is not)
NEAR_OPTION = 0.8  # this share: close to the option's words, a person looks (the course's own solved whys reach 0.78)
_FILLER = set("because since as it its the a an of to and is are this that so 因 为 的 了 是 所 以 它 这 那".split())


def _similar(a: list, b: list) -> float:
    if len(a) < 6 or len(b) < 6:
        return 0.0
    sa, sb = set(a), set(b)
    return len(sa & sb) / min(len(sa), len(sb))


def shared_answers(answers: dict, threshold: float = 0.8) -> dict:
    """``{student: [students whose answer is nearly the same]}`` for one exercise's answers
    (``{student: text}``): most of the shorter answer's triples are in the other one."""
    g = {who: grams(text) for who, text in answers.items() if isinstance(text, str)}
    found: dict[str, list[str]] = {}
    names = sorted(g)
    for i, a in enumerate(names):
        for b in names[i + 1:]:
            if _similar(g[a], g[b]) >= threshold:
                found.setdefault(a, []).append(b)
                found.setdefault(b, []).append(a)
    return found


def mark_shared_answers(reports: list[dict]) -> list[dict]:
    """The reports (copies) with every written answer that another notebook of the class also
    handed in nearly word for word flagged for review, naming the other notebooks."""
    import copy
    from pathlib import Path

    from .registry import EXERCISES

    out = copy.deepcopy(reports)
    for ex_id, ex in EXERCISES.items():
        if ex.kind not in ("text", "quiz"):
            continue
        answers = {i: r["exercises"][ex_id].get("answer") for i, r in enumerate(out)
                   if isinstance(r.get("exercises"), dict) and ex_id in r["exercises"]}
        for i, others in shared_answers(answers).items():
            entry = out[i]["exercises"][ex_id]
            names = ", ".join(Path(str(out[j].get("notebook", "?"))).name for j in others)
            entry["needs_human_review"] = True
            entry["flags"] = sorted(set(entry.get("flags", [])) | {f"same answer as {names}"})
    return out
