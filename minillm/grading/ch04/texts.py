"""Graders for the chapter's written tasks (2, 3 and 4), its self-check quiz and its pitfalls.

The required ideas and the misconceptions live in ``ideas.py`` and are read by the concept
matcher (``concepts.py``): clause by clause, with negation scoped to its clause, after the
Unicode clean-up (``unicode_clean.py``). Before any idea is read, every written field passes
two gates: it is a statement, not a keyword run, and it is the student's own words, not text
the notebook or its feedback shows (``copies.py``). Where the reading is uncertain the grader
lowers its confidence (``Marks.doubt``), and a low confidence raises ``needs_human_review``.
Feedback names what is missing as a question or a topic, never as a sentence that earns it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..language import Bi, answer_language
from ..copies import PRAISE_EN, PRAISE_ZH
from ..registry import Marks, NotAttempted, is_unanswered, register
from ..text import CLAUSE, W, char_count, compile_all, keyword_list, misconception, normalize

# =============================================================================================
# Task 3's misconceptions (tasks 2 and 4, the quiz and the pitfalls use those of ideas.py)
# =============================================================================================


HIT_MISS = misconception(
    "hit_miss",
    [r"\bhit\s*(/|or|and|-)\s*miss", r"\b(cache|on a|a|the)\s+(hit|miss)(es)?\b", r"\bhit\s+(rate|ratio)",
     rf"\b(look\w*\s+up|lookup)\s+{W}{{0,3}}(answers?|responses?|replies|completions?|queries|questions)",
     rf"(stor|sav|remember|reus|return|serv)\w*\s+{W}{{0,3}}(previous|past|earlier|old|prior|cached)\s+"
     rf"(answers?|responses?|replies|completions?)",
     rf"(same|identical|repeated)\s+(prompts?|questions?|query|queries|requests?)\b{CLAUSE}{{0,40}}"
     rf"(return|serv|answer|skip|fast|instant)",
     r"\blru\b", r"\b(cache[sd]?|fill\w*|stor\w*|remember\w*|keep\w*)\b[^.;]{0,30}\b(answers|responses|replies|completions)\b",
     r"命中|缓存(了)?[^。；;]{0,6}(答案|回答|回复)|(相同|同样|重复)的?(问题|请求|提示)[^。；;]{0,10}(直接|返回)|查表"],
    "the KV cache is not a hit/miss cache of answers: it is execution state (the keys and values "
    "of one live request's tokens) that exists only while that request runs",
)
SAVES_MEMORY = misconception(
    "saves_memory",
    [rf"(sav\w*|reduc\w*|lower\w*|decreas\w*|cut\w*|shrink\w*|conserv\w*|less|lighter)\s+{W}{{0,2}}"
     rf"(gpu\s+)?(memory|vram)\b(?!\s*(traffic|bandwidth|reads|access|transfer))",
     r"(节省|节约|减少|降低|省)[^。；;]{0,3}(显存|内存)(?!带宽)"],
    "the KV cache does not save memory; it spends memory to save compute",
)


# =============================================================================================
# Helpers
# =============================================================================================


class _TypeProblem(Exception):
    """The answer has the wrong type: graded 0 with a message (English, Chinese), never an error."""

    def __init__(self, en: str, zh: str) -> None:
        super().__init__(en)
        self.zh = zh


def _empty(name: str) -> NotAttempted:
    return NotAttempted.key("na.empty", name=name)


def _as_text(answer, name: str) -> str:
    if isinstance(answer, (list, tuple)) and all(isinstance(a, str) for a in answer):
        answer = " ".join(answer)
    if not isinstance(answer, str):
        t = type(answer).__name__
        raise _TypeProblem(f"{name} should be a string (text in quotes), got {t}",
                           f"{name} 应该是一个字符串（用引号括起来的文字），得到的是 {t}")
    text = normalize(answer)
    if not text:
        raise _empty(name)
    return text


def _wrong_type(fn):
    """A grader wrapper that turns a wrong answer type into feedback: in the answer's language when
    it is text with Chinese in it (a bare "对" is a Chinese answer), else in the notebook's."""

    def grader(answer, m: Marks):
        try:
            fn(answer, m)
        except _TypeProblem as exc:
            if isinstance(answer, str) and re.search(r"[\u4e00-\u9fff]", answer):
                m.lang = "zh"
            m.wrong(exc.zh if m.lang == "zh" else str(exc))

    grader.__name__ = fn.__name__
    grader.__doc__ = fn.__doc__
    return grader


def _task3_misconceptions(text: str, m: Marks, lang: str) -> bool:
    """Task 3's reasons: the two misconceptions about what the cache is, said in the answer's language."""
    from . import ideas as I

    zh = {"hit_miss": I.HIT_MISS.feedback_zh, "saves_memory": I.SAVES_MEMORY.feedback_zh}
    found = False
    for item in (HIT_MISS, SAVES_MEMORY):
        phrase = item.find(text)
        if phrase:
            m.wrong(_say(lang, f"misconception ('{phrase.strip()}'): {item.feedback}",
                         f"误解（“{phrase.strip()}”）：{zh[item.key]}"))
            found = True
    return found


# =============================================================================================
# Task 2 — the KV cache in at most 100 characters
# =============================================================================================
TASK2_LIMIT = 100


# the task's own words: an answer that mostly repeats them is not an explanation
TASK2_PROMPTS = [
    "Explain the KV cache in at most 100 characters",
    "it avoids recomputing the keys and values of the tokens already processed (that is where decode's speed "
    "comes from)",
    "it costs memory that grows — with every token of context and every live request (memory pressure)",
    "写一段 100 字以内的 KV Cache 解释",
    "它避免重复计算已经处理过的 token 的 key 和 value（decode 的速度正是从这里来的）",
    "它占用的显存会增长——随上下文里的每个 token、随每个活跃请求增长（显存压力）",
]
TASK3_PROMPTS = [
    "Name three scenarios that make the KV cache grow, each with its reason",
    "for each one, say why it makes requests hold more state — what grows, and because of what",
    "写出三种会让 KV Cache 变大的场景，每种附上理由",
    "每种场景都要解释它为什么会让请求占用更多状态——是什么在增长、因为什么而增长",
]
TASK4_PROMPTS = [
    "Explain why sampling belongs to the request's execution semantics, not to the presentation of its output",
    "the sampled token becomes part of the request's history (its context), and the next decode step is computed "
    "from it",
    "解释 sampling 为什么属于请求执行语义的一部分",
    "采样出的 token 会进入请求的历史（上下文），并且下一轮 decode 是基于它计算的",
]


def _say(lang: str, en: str, zh: str) -> str:
    return zh if lang == "zh" else en


_HINTS = {  # what to think about when an idea is missing; never the idea's wording itself
    "no_recompute": ("Missing: what the cache saves. Without it, what would each decode step have to do again "
                     "for the tokens already seen?",
                     "缺少：缓存省下了什么。如果没有它，每一步解码要对已经处理过的 token 再做什么？"),
    "memory_cost": ("Missing: what the cache costs. What happens to it as the context gets longer and more "
                    "requests run at once?",
                    "缺少：缓存的代价。上下文越来越长、同时运行的请求越来越多时，它会怎样？"),
    "token_to_history": ("Missing: where the sampled token goes. What happens to it after it is picked?",
                         "缺少：采样出的 token 去了哪里。它被选出之后发生了什么？"),
    "next_step_depends": ("Missing: what follows from it. What is the next decode step computed from?",
                          "缺少：它带来的后果。下一步解码是基于什么计算的？"),
    "request_state": ("The reason does not say what the cache is: whose data does it hold, and for how long?",
                      "理由没有说清缓存是什么：它保存的是谁的数据，保存多久？"),
    "sampling_picks": ("The reason does not say what sampling does to the request's next steps.",
                       "理由没有说清采样对请求后续步骤的作用。"),
    "holds_resources": ("The why does not yet say what a live request has that the engine must manage.",
                        "理由还没有说出：一个活跃请求有什么东西需要引擎来管理。"),
    "mixed_states": ("The why does not yet say what a batch is made of, from one step to the next.",
                     "理由还没有说出：一个批次由什么组成，每一步之间又有什么不同。"),
    "prefill_builds": ("The reason does not say how the two phases are connected: what does decode start from?",
                       "理由没有说清两个阶段的联系：decode 从什么开始？"),
}
_TOPIC = {  # what an idea is about, named without stating it (feedback on a negated idea)
    "no_recompute": ("what the cache saves", "缓存省下了什么"),
    "memory_cost": ("what the cache costs", "缓存的代价"),
    "token_to_history": ("where the sampled token goes", "采样出的 token 去了哪里"),
    "next_step_depends": ("what follows from that choice", "这个选择带来的后果"),
}
_WEAK = {
    "no_recompute": ("You say it is faster; say where the speed comes from.", "你说它更快了；请说明快在哪里。"),
    "memory_cost": ("You mention memory; say what happens to it.", "你提到了显存；请说明它会怎样。"),
    "token_to_history": ("You mention the history; say what the sampled token has to do with it.",
                         "你提到了历史；请说明采样出的 token 和它的关系。"),
}


def _hint(key: str, lang: str) -> str:
    en, zh = _HINTS.get(key, ("Missing idea: " + key, "缺少要点：" + key))
    return _say(lang, en, zh)


def _explain_ideas(reading, ideas, m: Marks, spoiled: set) -> float:
    """One point per idea present and not spoiled by a misconception; feedback for each."""
    lang, points = reading.lang, 0.0
    for item in ideas:
        state = reading.ideas[item.key]
        label = _say(lang, item.label_en, item.label_zh)
        if state == "present" and item.key not in spoiled:
            m.ok(_say(lang, PRAISE_EN + label, PRAISE_ZH + label))
            points += 1
        elif state == "present":
            en, zh = _TOPIC.get(item.key, (item.key, item.key))
            m.missing(_say(lang, f"on {en}: the misconception below cancels your point",
                           f"关于“{zh}”：下面的误解抵消了你的这一点"))
        elif state == "negated":
            en, zh = _TOPIC.get(item.key, (item.key, item.key))
            m.wrong(_say(lang, f"on {en}, your answer says the opposite of the chapter — check it again",
                         f"关于“{zh}”，你的回答与章节说的相反——请再对照一下"))
            m.flag(why="negated idea")
        elif state == "weak":
            en, zh = _WEAK.get(item.key, (_hint(item.key, "en"), _hint(item.key, "zh")))
            m.missing(_say(lang, en, zh))
            m.flag()
        else:
            m.missing(_hint(item.key, lang))
    return points


def _add_doubts(reading, m: Marks) -> None:
    for why, amount in reading.doubts:
        m.doubt(why, amount)


def _report_misconceptions(reading, m: Marks) -> set:
    spoiled = set()
    for item, phrase in reading.misconceptions:
        m.wrong(_say(reading.lang, f"misconception ('{phrase.strip()}'): {item.feedback_en}",
                     f"误解（“{phrase.strip()}”）：{item.feedback_zh}"))
        spoiled.update(item.spoils)
    return spoiled


PARTLY_COPIED_DOUBT = 0.25  # part of the answer is shown text (the chapter's own phrases are natural): with another doubt, a person reads it


def own_words(text: str, m: Marks, lang: str, what: tuple[str, str] = ("this", "这段话")) -> bool:
    """False (this text earns nothing, a person looks) when it is mostly text the course or its
    feedback shows, or a model answer (:mod:`copies`); a partial copy only lowers the confidence."""
    from ..copies import verdict

    found = verdict(text)
    if found == "pasted":
        m.wrong(_say(lang, f"{what[0]} is text the exercise, its options or its feedback show; say it in your own words",
                     f"{what[1]}是题目、选项或反馈里的原文；请用自己的话说"))
        m.doubt("pasted from the course", 0.0)  # certain: named in the flags, no review needed
        return False
    if found in ("copied", "model"):
        m.wrong(_say(lang, f"{what[0]} repeats text the exercise, its options or its feedback show; "
                           f"say it in your own words",
                     f"{what[1]}照搬了题目、选项或反馈里的文字；请用自己的话说"))
        m.flag(why="copied from the course" if found == "copied" else "copy of a model answer")
        return False
    if found == "partly":
        m.doubt("partly copied from the course", PARTLY_COPIED_DOUBT)
    return True


def _short_answer(text: str, m: Marks, ideas, misconceptions, prompts, limit: float, name: str) -> None:
    """Task 2 and task 4: ideas by meaning, misconceptions, salad, copied task text, a length rule."""
    from ..concepts import length_units, read

    r = read(text, ideas, misconceptions, prompts)
    lang = r.lang = m.lang = answer_language(text, m.lang)
    if r.copied:
        m.wrong(_say(lang, "this repeats the task's own words; explain it in yours",
                     "这是在重复题目里的话；请用自己的话解释"))
        m.flag(why="copied from the course")
        return
    if not own_words(text, m, lang):
        _report_misconceptions(r, m)  # a misconception quoted from the notebook is still one
        return
    if r.salad:
        m.wrong(_say(lang, "this is a list of keywords, not a statement: connect them into a sentence "
                           "(what it does, and what follows from it)",
                     "这是一串关键词，不是一句话：请把它们连成句子（它做了什么，带来了什么）"))
        if any(state == "present" for state in r.ideas.values()):
            m.flag()  # terse notes that do carry the ideas: a person decides
        return
    _add_doubts(r, m)
    spoiled = _report_misconceptions(r, m)
    points = _explain_ideas(r, ideas, m, spoiled)
    units = length_units(text)
    if units > limit:
        m.warn(_say(lang, f"over the limit: about {units:.0f} of {limit:g} characters (Chinese characters count one "
                          f"each, Latin letters one per {2.5:g}) — one point off; cut it down",
                    f"超出字数：约 {units:.0f} 字，上限 {limit:g} 字（汉字每个算一字，拉丁字母每 2.5 个算一字）——扣一分，请精简"))
        points = max(0.0, points - 1)
        m.flag()
    m.score += points
    if points == len(ideas) and units < 12:
        m.flag(_say(lang, "very short: a person should confirm this explains the mechanism",
                    "非常短：需要人工确认它确实解释了机制"))


@register("task2_kv_explain", "Task 2 · the KV cache in ≤ 100 characters", "§3 KV cache", 2,
          title_zh="任务 2 · 100 字以内解释 KV Cache")
@_wrong_type
def grade_task2(answer, m: Marks) -> None:
    """Both ideas: it avoids recomputing past tokens, and it costs memory that grows."""
    from . import ideas as I

    text = _as_text(answer, "task2_kv_explain")
    _short_answer(text, m, [I.RECOMPUTE, I.MEMORY], [I.HIT_MISS, I.SAVES_MEMORY, I.STORES_WEIGHTS, I.CACHE_UNREAD],
                  TASK2_PROMPTS, TASK2_LIMIT, "task2_kv_explain")


# =============================================================================================
# Task 3 — three cache-pressure scenarios, each with its reason
# =============================================================================================
TASK3_REASON_LIMIT = 300


@dataclass(frozen=True)
class ScenarioKind:
    key: str
    label: str
    patterns: tuple


def _kind(key, label, patterns):
    return ScenarioKind(key, label, compile_all(patterns))


SCENARIO_KINDS = [
    _kind("long_context", "long context (long prompts, long chat history)", [
        rf"long\w*\s+{W}{{0,2}}(context|prompt|input|document|docs?\b|history|conversation|chat|dialog\w*|session|"
        r"system prompt|document)s?", rf"(context|prompt|input|history|conversation)s?\s+{W}{{0,3}}"
        r"(very\s+)?(long|large|big|huge|grows?|growing)",
        r"multi-?turn", r"\brag\b", r"retriev\w*", r"large\s+(context|prompt|input)",
        r"(many|thousands of|lots of|more)\s+(prompt|input|context)\s+tokens", r"context\s+(length|window)",
        r"长上下文|长文本|长文档|长提示|长输入|长对话|多轮|上下文[^。；;]{0,4}长|历史[^。；;]{0,4}长|长会话|RAG|检索|长 ?prompt",
        r"\bagents?\b", r"\btool\s+(outputs?|results?|calls?)", r"accumulat\w*\s+(\w+\s+){0,5}(context|history)",
        r"(context|history)\s+(\w+\s+){0,2}(keeps\s+)?grow\w*", r"智能体|工具(调用|输出|结果)|上下文[^。；;]{0,4}(累积|越来越长|增长)",
        r"(huge|big|large|very long|enormous|massive|lengthy|giant|long)\s+(\w+\s+){0,2}(prompts?|context|inputs?|documents?|"
        r"history|pdfs?|codebases?|files?|books?|transcripts?)", r"system\s+prompt", r"(summari[sz]\w*|analy[sz]\w*|read\w*)\s+(\w+\s+){0,3}(pdfs?|documents?|books?|reports?|papers?|transcripts?|codebases?|logs?)\b",
        r"\d+[- ]page", r"\d+\s*页|(几|上|数|成)(十|百|千)\s*页|卷宗",
        # the input's size in tokens: "32k-token contracts", "128k 的上下文", "20 万 token 的文档"
        r"\b\d+\s*k[- ]?tokens?\s+(\w+\s+)?(prompts?|contexts?|inputs?|documents?|docs?|contracts?|files?|pdfs?|papers?|"
        r"transcripts?|codebases?|repos?|histor(y|ies)|conversations?|chats?|manuals?|books?)\b",
        r"\d+\s*(k|K|万)\s*(token)?\s*的?\s*(上下文|prompt|提示|输入|文档|合同|长文|context)",
        # a whole body of text sent in: "the whole repo as context", "整个代码仓库塞进去"
        r"\b(whole|entire|full)\s+(\w+\s+)?(repo|repository|codebase|monorepo|book|manual|handbook|document|thread|transcript)s?\b",
        r"整个\s*(仓库|代码库|代码仓库|repo|项目|文档库)", r"\b(docs?|documents?|pdfs?)\s+(qa|q&a|question[- ]answering)\b", r"(paste|upload)\w*\s+(\w+\s+){0,3}"
        r"(book|novel|document|file|codebase|report)",
        # a whole book put in: "一次丢进去一整本小说让它总结", "(小说|手册)…总结"
        r"(丢|塞|贴|扔|喂|传|输入|粘贴|放)[^。；;]{0,6}(一)?整(本|部|篇|份|个)", r"(小说|手册)[^。；;]{0,6}(总结|摘要|分析|问答)",
        r"超长|长[^。；;]{0,3}(提示|系统提示|prompt)|(提示词|系统提示|prompt)[^。；;]{0,4}(长|大)|大文档|整本书|整份|很长的(文档|输入|提示)",
        r"(聊天|对话|会话)(记录|历史)|(记录|历史)[^。；;]{0,4}(很|太|超|特别)?长|(对话|聊天)[^。；;]{0,4}(很|太|超|特别)长",
        r"长[^。；;]{0,2}(文档|文件|合同|论文|代码库)|(文档|文章|报告|论文|合同|仓库|代码库|代码仓库|日志|书)[^。；;]{0,4}(总结|问答|摘要|分析)|(总结|分析|阅读)[^。；;]{0,6}(文档|文章|报告|论文|合同)"]),
    _kind("high_concurrency", "high concurrency (many live requests at once)", [
        r"concurren\w*", r"parallel\s+(requests|users|sessions)", rf"many\s+{W}{{0,2}}(requests|users|sessions|"
        r"clients|sequences|conversations|chats)", r"high\s+(traffic|load|qps|throughput)", r"(large|big)\s+batch",
        r"batch\s+size", r"\bbatch\w*\s*(of|=|:|to|at|开到|开成|设成|设为|设到|调到|拉到|到)\s*\d{2,}", r"\bbs\s*=\s*\d{2,}",
        r"\b(peak|rush|busy)\s+(hours?|times?|periods?)\b", rf"(lots of|thousands of|hundreds of|multiple|several|more)\s+{W}{{0,1}}(requests|users|sessions|"
        r"sequences|conversations)", r"simultaneous\w*", r"at the same time", r"peak\s+(traffic|load)",
        rf"\b(all|everyone|everybody|\d+\s+{W}{{0,1}}(students|people|users|clients))\s+{W}{{0,2}}(at once|simultaneously|together)\b",
        r"batch[^。；;]{0,4}(很|太|特别|非常)?(大|多)|批(次|量)?[^。；;]{0,2}(很|太|特别)大",
        r"双十一|双11|秒杀|促销|抢购|大促|同一(时间|时刻)|\b(users|requests|clients|people)\s+at\s+once\b|\b\d{2,}\s+(users|requests|clients)\b",
        r"(请求|用户|会话)[^。；;]{0,4}同时|大量(请求|用户|会话)|高峰|高并发|并发|同时[^。；;]{0,6}(请求|用户|会话)|大批量|大 ?batch|多(个)?(用户|请求|会话)|请求[^。；;]{0,2}多|流量(高峰|大)|峰值",
        r"\d{2,}\s*(个|名|位)?\s*(请求|用户|会话|客户|学生|人)(?!数)|(几十|几百|上百|上千|成百上千|数百|数千|上万)\s*(个|名|位)?\s*(请求|用户|会话|人)",
        r"(很多|许多|好多|大量|一堆|一群)(人|学生|客户)|(人|用户)[^。；;]{0,2}(很多|多|一起|同时)|一起(用|访问|请求|提问)"]),
    _kind("long_output", "long outputs (many generated tokens)", [
        rf"long\w*\s+{W}{{0,2}}(outputs?|generations?|answers?|responses?|completions?|replies|essays?|stories|code|"
        r"reasoning|decod\w*)", rf"(output|generation|response|answer|completion)s?\s+{W}{{0,3}}(very\s+)?(long|lengthy)",
        r"max_?tokens", r"(many|more|lots of|thousands of)\s+(output|generated|new|decode)\s+tokens",
        rf"generat\w*\s+{W}{{0,3}}(many|thousands|lots|long|a lot)", r"chain[- ]of[- ]thought",
        r"长输出|长回答|长回复|长生成|生成[^。；;]{0,4}长|输出[^。；;]{0,4}长|max_tokens|生成大量|长篇|长文章|长推理|思维链|推理链|推理过程|\bcot\b",
        r"(writ\w*|generat\w*|produc\w*|draft\w*|compos\w*)\s+(\w+\s+){0,3}(long|lengthy|big|huge|entire|whole|full)",
        r"long\s+(reports?|articles?|essays?|story|stories|novels?|summar\w*|translations?|chapters?)",
        r"(each|every)\s+(generated|new|output|decoded)\s+token",
        r"(写|生成|输出|撰写)[^。；;]{0,6}(长|报告|文章|小说|论文)", r"每生成一个",
        # the output's length as a count to write: "写 5000 字的周报", "a 3000-word essay"
        r"(写|生成|输出|撰写|吐)[^。；;]{0,4}\d{3,}\s*(多)?\s*(个)?\s*(字|词|token)",
        r"\b\d{3,}[- ]?(words?|tokens?)\s+(\w+\s+)?(essays?|reports?|stor(y|ies)|articles?|outputs?|answers?|responses?|replies|summar(y|ies)|novels?)\b",
        # reasoning models: the thinking is generated tokens ("a reasoning model thinking for 8k tokens", "深度思考")
        r"\b(reasoning|thinking)\s+(models?|mode|traces?|tokens?)\b", r"\bthink\w*\s+(for\s+)?(\d+k?\s+tokens|a long time|long)\b",
        r"深度思考|思考模式|思考(过程|链)|长思考",
        r"\b(reasoning|thinking)\s*(模型|模式)", r"\bthink\w*\s*(很久|好久|很长|半天)", r"(思考|想)(很久|好久|半天|很长时间)",
        r"一直(生成|输出|写)|不停(地)?(生成|输出|写)|停不下来", r"max_new_tokens|max_output_tokens|n_predict"]),
    _kind("parallel_sampling", "several sequences per request (beam search, n > 1)", [
        r"beam\s*search", r"parallel\s+sampling", r"\bn\s*>\s*1\b", r"multiple\s+(candidates|samples|completions|beams)",
        r"best[- ]of", r"束搜索|并行采样|多个候选|多路采样|多条序列|多个样本", r"\bn\s*=\s*([2-9]|\d{2,})\b"]),
    _kind("not_released", "requests that are not released (leaks, late release, cancels that never arrive)", [
        rf"(not|never|late|slow\w*|forgot\w*)\s+{W}{{0,2}}(releas\w*|freed|free\w*|clean\w*|reclaim\w*)", r"leak\w*",
        rf"cancel\w*\s+{W}{{0,5}}(api|layer|never|doesn't|does not|not)", r"zombie", r"orphan\w*", r"idle\s+sessions?",
        r"没(有)?取消|未取消|(客户端|用户|连接)[^。；;]{0,4}(断开|断连|掉线|关闭|离开)|泄漏|泄露|没有?释放|未释放|释放[^。；;]{0,2}晚|取消[^。；;]{0,10}(接口|没有|未)|僵尸|残留",
        rf"(never|not)\s+{W}{{0,2}}cancel\w*", r"\btim(e|es|ed|ing)\s*out\b|\btimeouts?\b",
        r"\b(stay|stays|remain|remains|left)\s+allocated\b", r"超时|一直占着|迟迟不释放",
        # a cancel the engine never hears of: "取消没通知引擎", "cancel 没传到 engine", "the engine never learns of it"
        r"(取消|cancel\w*)[^。；;]{0,10}(没|不|未)[^。；;]{0,3}(通知|传|告诉|到达|同步|下发|转发)",
        r"(引擎|engine)[^。；;]{0,3}(不知道|没收到|收不到|不知情)",
        r"\bengine\s+(never|doesn't|does not|didn't|did not)\s+(know|hear|learn|see|get|receive)\w*"]),
    _kind("bigger_model", "a model with more layers or KV heads (more bytes per token)", [
        r"(more|many|deep\w*)\s+layers", r"(more|many)\s+(kv\s+)?heads", r"larger\s+(model|head_dim|hidden)",
        r"\bfp32\b|float32|higher\s+precision", r"\bmha\b|no\s+gqa", r"层数多|更多层|头数多|大模型|精度高|fp32",
        # the model's size said plainly: "模型很大，比如 70B", "a bigger model", "a 70B model" (its weights are no kind:
        # "模型权重很大" names what no scenario makes grow)
        r"模型\s*(很|太|特别|超|更|比较)大", r"\b(bigger|larger|huge|big)\s+models?\b(?!\s*(weights?|params?|parameters))", r"\b\d{2,3}\s*b\s+(models?|params?|parameters?)\b",
        r"(比如|例如|像)\s*\d{2,3}\s*[bB]\b"]),
]

_UNIT = (r"\btokens?\b|length|longer|\bclients?\b|\bcontext\b|\bprompts?\b|\bhistory\b|\boutputs?\b|\bbatch\b|对话|越长|\brequests?\b|\busers?\b|sessions?|sequences?|\bsteps?\b|\brounds?\b|positions?|"
         r"lifetime|\btime\b|\beach\b|\bevery\b|\bper\b|concurren\w*|simultaneous\w*|at once|"
         r"token|长度|(一|每|1)\s*个?\s*字|字数|请求|用户|会话|序列|步|轮|位置|时间|更久|更长|每|各|上下文|历史|并发|同时|生成|输出|解码|\bgenerat\w*|\bdecod\w*")
_STATE = (r"\bkeys?\b|\bvalues?\b|\bkv\b|k/v|\bk\s*(和|与|跟|and|&)\s*v\b|cache|memory|vram|blocks?|\bstate\b|entries|bytes|slots?|\bstor(e|ed|ing|age)\b|"
          r"KV|缓存|显存|内存|键值|块|状态|存储")
_GROW = (r"grow\w*|increas\w*|\bfill\w*|scal\w*|proportional\w*|linear\w*|\bmore\b|\badd\w*|accumulat\w*|append\w*|multipl\w*|"
         r"\bsums?\b|summ\w*|\bheld\b|\bholds?\b|holding|\bkept\b|\bkeeps?\b|occup\w*|\bstays?\b|remain\w*|longer|larger|bigger|"
         r"\btimes\b|\beach\b|\bevery\b|\bown\b|simultaneous\w*|at once|together|stack\w*|pil(e|es|ing) up|"
         r"增长|增加|变大|越|线性|累加|叠加|翻倍|乘|正比|占用|占着|持有|常驻|更久|更长|更多|各自|同时|每|留|存着|"
         r"不(会|能)?(释放|归还|回收|共用|共享)|没(有)?释放|结束前|直到|(都|各)(要|得|需要)?(有|带|存|保存|保留|留|占|缓存)|\d+\s*(条|份|套|路)|\b(\d+|n|k)\s+(copies|sets|sequences|beams)\b|涨|进(了)?(缓存|KV|显存)|(KV|缓存|显存|内存|状态|块)\s*(就|也|会|都|还)?(很|更|太|越)?(多|大|满)|"
         r"多(出)?\s*(一|1|几)\s*(个|格|份|块|条|行|截)|"
         r"\b(not|never)\s+(\w+\s+){0,2}?(freed|released|returned|shared|reclaimed|dropped|evicted|discarded|deleted)|"
         r"\buntil\b|\bwhile\b|不会?(丢|删)")


# what a request's cache is made of, and the model's weights (which no scenario makes grow)
_CACHE = r"\bkeys?\b|\bvalues?\b|\bkv\b|k/v|cache|blocks?|\bstate\b|KV|缓存|键值|块|状态"
_WEIGHTS = r"\bweights?\b|\bparameters\b|\bparams\b|权重|参数量|模型参数"


def _scenario_kind(scen: str, reason: str, seen: dict, m: Marks):
    """The kind of cache-pressure scenario a name describes (or, for a vague name, its reason); a
    name of two kinds ("code generation of a big file") is read as a kind not given yet, with a doubt."""
    kinds = [k for k in SCENARIO_KINDS if any(p.search(scen) for p in k.patterns)]
    if not kinds:  # the name may be vague; the reason may say it
        kinds = [k for k in SCENARIO_KINDS if any(p.search(f"{scen} {reason}") for p in k.patterns)]
    if len(kinds) > 1:
        m.doubt("a scenario of two kinds", 0.2)
    return next((k for k in kinds if k.key not in seen), kinds[0] if kinds else None)


def _reason_level(reason: str, scenario: str = "") -> str | None:
    """'strong' when the reason says what state grows and from what (the unit may come from the
    scenario's name when the reason is a sentence: "their blocks are never freed"), 'weak' for half."""
    sentence = len(re.findall(r"[A-Za-z]+", reason)) >= 4 or len(re.findall(r"[\u4e00-\u9fff]", reason)) >= 6
    unit_text = f"{scenario} {reason}" if sentence else reason
    has = [bool(re.search(p, text, re.IGNORECASE)) for p, text in ((_UNIT, unit_text), (_STATE, reason), (_GROW, reason))]
    if re.search(_WEIGHTS, reason, re.IGNORECASE) and not re.search(_CACHE, reason, re.IGNORECASE):
        return None  # "权重占了大部分显存": the memory the weights take, not the state a request holds
    if all(has):
        return "strong"
    if has[1]:
        return "weak"  # the state, without what makes it grow; "more users" names no state: not a reason
    return None


def _scenario_items(answer) -> list[tuple[str, str]]:
    """(scenario, reason) pairs from a dict, a list of pairs, or a list of 'scenario: reason' strings."""
    if isinstance(answer, dict):
        items = list(answer.items())
    elif isinstance(answer, (list, tuple)):
        items = []
        for entry in answer:
            if isinstance(entry, (list, tuple)) and len(entry) == 2:
                items.append((entry[0], entry[1]))
            elif isinstance(entry, dict) and len(entry) >= 1:
                scen = entry.get("scenario", entry.get("name", ""))
                reason = entry.get("reason", entry.get("why", ""))
                items.append((scen, reason))
            elif isinstance(entry, str):
                head, sep, tail = entry.partition(":")
                if not sep:
                    head, sep, tail = entry.partition("：")
                items.append((head, tail) if sep else (entry, ""))
            else:
                raise _TypeProblem(f"each scenario should be a (scenario, reason) pair, got {entry!r}",
                                   f"每个场景都应是一个 (场景, 理由) 二元组，得到的是 {entry!r}")
    elif isinstance(answer, str):
        raise _TypeProblem("task3_pressure should be a dict {scenario: reason} (or a list of "
                           "(scenario, reason) pairs), not one string",
                           "task3_pressure 应该是字典 {场景: 理由}（或 (场景, 理由) 二元组的列表），而不是一个字符串")
    else:
        t = type(answer).__name__
        raise _TypeProblem(f"task3_pressure should be a dict {{scenario: reason}}, got {t}",
                           f"task3_pressure 应该是字典 {{场景: 理由}}，得到的是 {t}")
    clean = []
    for scen, reason in items:
        if not isinstance(scen, str) or not isinstance(reason, str):
            raise _TypeProblem(f"scenario names and reasons should be strings, got {scen!r}: {reason!r}",
                               f"场景名和理由都应是字符串，得到的是 {scen!r}: {reason!r}")
        if scen.strip() or reason.strip():
            clean.append((normalize(scen), normalize(reason)))
    return clean


_T3_HINTS = {  # task 3's feedback on a reason (also what copies.py checks reasons against)
    "none": ("no reason given — say why it makes requests hold more state", "没有给出理由——请说明它为什么让请求占用更多状态"),
    "thin": ("the reason is thin — say what grows, and why this scenario makes it grow",
             "理由太单薄——请说明什么在增长，以及这个场景为什么让它增长"),
    "missing": ("the reason does not say why the cache grows: what does this scenario add more of, and what does "
                "the engine keep for each one?", "理由没有说明缓存为什么增长：这个场景让什么变多了？引擎为每一份保存了什么？"),
}
_KIND_ZH = {"long_context": "长上下文（长提示、长对话历史）", "high_concurrency": "高并发（同时有很多活跃请求）",
            "long_output": "长输出（生成很多 token）", "parallel_sampling": "每个请求多条序列（beam search、n > 1）",
            "not_released": "请求没有被释放（泄漏、释放过晚、取消没有传到引擎）",
            "bigger_model": "层数或 KV 头更多的模型（每个 token 字节更多）"}


@register("task3_pressure", "Task 3 · three cache-pressure scenarios, with reasons", "§3 KV cache + key table", 6,
          title_zh="任务 3 · 三种拉高缓存压力的场景及理由")
@_wrong_type
def grade_task3(answer, m: Marks) -> None:
    """2 points per scenario: a recognised, distinct scenario, and a reason that says what state grows."""
    from ..concepts import keyword_run

    items = _scenario_items(answer)
    if not items:
        raise _empty("task3_pressure")
    lang = m.lang = answer_language(" ".join(f"{a} {b}" for a, b in items), m.lang)
    if len(items) < 3:
        m.missing(_say(lang, f"you give {len(items)} scenario(s); the task asks for three",
                       f"你给出了 {len(items)} 个场景；题目要求三个"))
    seen: dict[str, str] = {}
    reasons: list[str] = []
    for scen, reason in items[:3]:
        kind = _scenario_kind(scen, reason, seen, m)
        name = scen or reason[:30]
        if kind is None:
            m.missing(_say(lang, f"'{name}': not a cache-pressure scenario the grader recognises (long context, "
                                 f"high concurrency, long outputs, …)",
                           f"“{name}”：评分器没有识别出这是哪种缓存压力场景（长上下文、高并发、长输出……）"))
            m.flag()
        elif kind.key in seen:
            m.wrong(_say(lang, f"'{name}' is the same kind of scenario as '{seen[kind.key]}' ({kind.label}); "
                               f"give three different ones",
                         f"“{name}”和“{seen[kind.key]}”是同一类场景（{kind.label}）；请给出三种不同的场景"))
        else:
            seen[kind.key] = name
            m.ok(_say(lang, f"'{name}' → {kind.label}", f"“{name}” → {_KIND_ZH.get(kind.key, kind.label)}"), 1)
        if not reason:
            m.missing(_say(lang, f"'{name}': {_T3_HINTS['none'][0]}", f"“{name}”：{_T3_HINTS['none'][1]}"))
            continue
        n = char_count(reason)
        if n > TASK3_REASON_LIMIT:
            m.wrong(_say(lang, f"the reason for '{name}' is {n} characters; the limit is {TASK3_REASON_LIMIT} — cut it down",
                         f"“{name}”的理由有 {n} 字，上限 {TASK3_REASON_LIMIT} 字——请精简"))
            continue
        if not own_words(reason, m, lang, (f"the reason for '{name}'", f"“{name}”的理由")):
            continue
        if _task3_misconceptions(reason, m, lang):
            continue
        if keyword_list(reason) == "list" or keyword_run(reason):
            m.wrong(_say(lang, f"'{name}': the reason is a keyword list; write why as a sentence",
                         f"“{name}”：理由是一串关键词，请写成句子"))
            continue
        level = _reason_level(reason, scen)
        if level == "strong" and kind is not None:
            m.ok(_say(lang, f"'{name}': the reason says what grows and why", f"“{name}”：理由说明了什么在增长、为什么增长"), 1)
        elif level == "strong":
            m.ok(_say(lang, f"'{name}': the reason says what state grows", f"“{name}”：理由说明了什么状态在增长"), 1)
        elif level == "weak":
            m.missing(_say(lang, f"'{name}': {_T3_HINTS['thin'][0]}", f"“{name}”：{_T3_HINTS['thin'][1]}"))
            m.score += 0.5
            m.flag()
        else:
            m.missing(_say(lang, f"'{name}': {_T3_HINTS['missing'][0]}", f"“{name}”：{_T3_HINTS['missing'][1]}"))
        reasons.append(reason.lower())
    if len(reasons) >= 2 and len(set(reasons)) < len(reasons):
        m.flag(_say(lang, "the same reason is repeated for different scenarios", "不同场景重复使用了同一个理由"))
    if len(items) > 3:
        m.info(_say(lang, f"you gave {len(items)} scenarios; the first three were graded",
                    f"你给出了 {len(items)} 个场景；只评了前三个"))


# =============================================================================================
# Task 4 — why sampling is part of the request's execution semantics
# =============================================================================================
TASK4_LIMIT = 160  # in the units of concepts.length_units (about 70 English words)


@register("task4_sampling", "Task 4 · why sampling is part of the request", "§4 sampling", 2,
          title_zh="任务 4 · 为什么 sampling 属于请求执行语义")
@_wrong_type
def grade_task4(answer, m: Marks) -> None:
    """The sampled token joins the history, and every later step builds on it."""
    from . import ideas as I

    text = _as_text(answer, "task4_sampling")
    _short_answer(text, m, [I.TOKEN_TO_HISTORY, I.NEXT_STEP_DEPENDS], [I.RANDOM_ONLY, I.NO_EFFECT_LATER, I.TOKEN_DROPPED],
                  TASK4_PROMPTS, TASK4_LIMIT, "task4_sampling")


# =============================================================================================
# Self-check quiz (multiple choice) and pitfalls (true/false with a reason)
# =============================================================================================


@dataclass(frozen=True)
class Option:
    text: Bi  # the option as the question shows it
    why: Bi  # why it is right or wrong (shown after a pick)


@dataclass(frozen=True)
class Question:
    """One self-check question; every text in it is in both languages (see :class:`Bi`)."""

    id: str
    section: str
    text: Bi
    options: dict  # letter -> Option
    answer: str


def _opt(en: str, zh: str, why_en: str, why_zh: str) -> Option:
    return Option(Bi(en, zh), Bi(why_en, why_zh))


QUIZ = [
    Question("quiz1_live_requests", "§1 look from the request",
             Bi("Why does an inference engine manage live requests, not just model computation?",
                "为什么说推理引擎管理的是“活跃请求”，而不只是“模型计算”？"), {
                 "A": _opt("Because every request runs the same forward pass, so the engine only has to count how many "
                           "requests it has.",
                           "因为每个请求跑的都是同一次前向计算，引擎只需要数一数有多少个请求。",
                           "The forward pass is shared code, but what each request holds (its tokens, its KV blocks, "
                           "its state) differs, and that is what the engine has to track.",
                           "前向计算的代码是共用的，但每个请求占有的东西（它的 token、KV 块、状态）各不相同，"
                           "引擎要跟踪的正是这些。"),
                 "B": _opt("Because each request holds resources until it is released, and the engine decides who runs, "
                           "who waits, who is freed.",
                           "因为每个请求在释放之前都占着资源，由引擎决定谁运行、谁等待、谁被释放。",
                           "Right: state plus resource occupation. Scheduling is deciding how many of these live, "
                           "resource-holding objects can coexist.",
                           "正确：状态加上资源占用。调度就是决定这些活着、占着资源的对象能同时容纳多少个。"),
                 "C": _opt("Because requests must be processed strictly one at a time, in the order in which they "
                           "arrived at the server.",
                           "因为请求必须严格一个一个地处理，并且按到达服务器的先后顺序。",
                           "Engines run many live requests together (batching); order is a policy, not the reason.",
                           "引擎会把很多活跃请求放在一起跑（batching）；先后顺序只是一种策略，不是原因。"),
                 "D": _opt("Because the model weights are copied into every request, so each request needs its own "
                           "private copy of the model.",
                           "因为模型权重会复制到每个请求里，每个请求都需要一份自己的模型副本。",
                           "Weights are loaded once and shared; what is per request is its context and KV cache.",
                           "权重只加载一次、所有请求共用；每个请求各自拥有的是它的上下文和 KV Cache。"),
             }, "B"),
    Question("quiz2_kv_tradeoff", "§3 KV cache",
             Bi("Why is the KV cache both a benefit and a source of pressure?",
                "KV Cache 为什么既是收益来源，也是压力来源？"), {
                 "A": _opt("It stores the answers to earlier prompts, so that repeated questions are fast, but a low hit "
                           "rate wastes its memory.",
                           "它保存之前 prompt 的答案，重复的问题会很快；但命中率低时会浪费显存。",
                           "This is pitfall 1: the KV cache is not a hit/miss cache of answers, it is the execution "
                           "state of live requests.",
                           "这正是误区 1：KV Cache 不是按命中与否存取答案的缓存，而是活跃请求的执行状态。"),
                 "B": _opt("It makes the prefill of long prompts faster, but it makes every later decode step slower "
                           "than before.",
                           "它让长 prompt 的 prefill 变快，但让之后每一步 decode 都比原来更慢。",
                           "It is decode that it speeds up; prefill writes the cache, decode reads it every step.",
                           "它加速的是 decode：prefill 写入缓存，decode 每一步读取它。"),
                 "C": _opt("It compresses the model weights: memory use goes down, and the accuracy of the model goes "
                           "down a little.",
                           "它压缩模型权重：显存占用下降，模型精度也略有下降。",
                           "That describes quantization. The KV cache holds activations (keys and values), not weights.",
                           "这说的是量化。KV Cache 保存的是激活值（key 和 value），不是权重。"),
                 "D": _opt("It spares decode from redoing past tokens' keys and values, and that storage grows with "
                           "tokens and live requests.",
                           "它让 decode 不必重算历史 token 的 key 和 value，而这份存储随 token 数和活跃请求数增长。",
                           "Right: saved compute is paid for in memory, per token and per live request.",
                           "正确：省下的计算是用显存换来的，按每个 token、每个活跃请求计。"),
             }, "D"),
    Question("quiz3_sampling_interface", "§4 sampling",
             Bi("Why do sampling parameters belong in the service interface and the request's state, not only in "
                "the product layer?",
                "sampling 参数为什么会进入服务接口和请求状态，而不是只留给产品层？"), {
                 "A": _opt("Because they only change how creative the final text looks, which is a choice the user "
                           "should make.",
                           "因为它们只改变最终文字看起来有多“有创意”，这应该由用户来选。",
                           "This is pitfall 2: sampling is not a cosmetic knob, it picks every token.",
                           "这正是误区 2：sampling 不是装饰性的旋钮，每一个 token 都是它选出来的。"),
                 "B": _opt("Because sampling runs once, before prefill, to decide how long the answer to the prompt is "
                           "allowed to be.",
                           "因为 sampling 只在 prefill 之前运行一次，用来决定回答最多能有多长。",
                           "Sampling runs after every forward pass: once after prefill for the first token, then in "
                           "each decode step.",
                           "sampling 在每次前向计算之后都要运行：prefill 之后一次得到第一个 token，之后每一步 decode 各一次。"),
                 "C": _opt("Because each sampled token joins the request's history and conditions every later step, "
                           "inside the decode loop.",
                           "因为每个采样出的 token 都会进入请求的历史，并在 decode 循环中影响之后的每一步。",
                           "Right: sampling moves the request's state forward, so its parameters are part of the "
                           "request's execution semantics.",
                           "正确：sampling 推动请求的状态前进，所以它的参数属于请求执行语义的一部分。"),
                 "D": _opt("Because the API has to validate every parameter before it accepts a request, and that "
                           "happens at the service.",
                           "因为 API 在接受请求之前要校验每个参数，而校验发生在服务层。",
                           "Validation is good practice, but it could happen anywhere; it is not why the engine must "
                           "carry the parameters.",
                           "校验是好习惯，但放在哪里都可以；这不是引擎必须携带这些参数的原因。"),
             }, "C"),
    Question("quiz4_states_before_batching", "§5 scheduling preview",
             Bi("Why must you think in request state machines before studying batching?",
                "后面谈 batching 时，为什么必须先有请求状态机意识？"), {
                 "A": _opt("Because batching only works for requests whose prompts are identical, which the states "
                           "help to detect.",
                           "因为 batching 只适用于 prompt 完全相同的请求，状态可以帮助识别它们。",
                           "Batching mixes requests with different prompts and lengths; that is what makes it hard.",
                           "batching 混合的是 prompt 和长度各不相同的请求；难点正在这里。"),
                 "B": _opt("Because state machines make the model's outputs more accurate, and accurate outputs are what "
                           "batching needs to work.",
                           "因为状态机能让模型输出更准确，而 batching 需要准确的输出才能工作。",
                           "States describe the engine's bookkeeping; they do not change the model's numbers.",
                           "状态描述的是引擎的记账方式，不会改变模型算出的数。"),
                 "C": _opt("Because a batch is a static list of tasks that is fixed once, when all the requests have "
                           "arrived.",
                           "因为一个 batch 是一份静态的任务清单，在所有请求到齐时一次定好。",
                           "With continuous batching the batch changes every step as requests join and finish.",
                           "在 continuous batching 中，随着请求加入和完成，batch 每一步都在变。"),
                 "D": _opt("Because a batch mixes requests in different states, and every scheduling decision moves "
                           "one of them to a new state.",
                           "因为一个 batch 里混着处于不同状态的请求，每一次调度决策都会把其中某个请求推进到新状态。",
                           "Right: batching operates on a set of changing states, not on static tasks.",
                           "正确：batching 操作的是一批不断变化的状态，而不是静态任务。"),
             }, "D"),
    Question("quiz5_debug_by_request", "judgement: debug by the request object",
             Bi("A server's KV cache keeps filling up although traffic is flat, and the forward function is correct. "
                "What do you look at first?",
                "一个服务的流量很平稳，前向函数也没有问题，KV 缓存却越占越满。你首先看什么？"), {
                 "A": _opt("A profile of the forward pass, kernel by kernel, to find the slow layer.",
                           "前向计算的性能剖析，逐个算子找出慢的那一层。",
                           "The forward pass is correct and speed is not the symptom; the question is who holds memory.",
                           "前向计算是对的，症状也不是慢；问题在于谁占着显存。"),
                 "B": _opt("The live request objects: their states, the blocks each holds, and when those change.",
                           "活跃的请求对象：它们的状态、各自占着的块，以及这些何时变化。",
                           "Right: debug by the request object. A request that finished or was cancelled but still "
                           "holds blocks shows up there at once (lifecycle first, capacity second).",
                           "正确：从请求对象出发排查。已经结束或被取消、却还占着块的请求，在这里一眼就能看到（先看生命周期，再看容量）。"),
                 "C": _opt("Store the KV cache in FP8 so that it takes half the memory.",
                           "把 KV 缓存改成 FP8 存储，让它只占一半显存。",
                           "Quantization comes last: it halves a leak's growth but does not stop it.",
                           "量化是最后一步：它让泄漏涨得慢一半，却堵不住泄漏。"),
                 "D": _opt("Buy a card with more memory.", "换一张显存更大的卡。",
                           "A leak fills any card; more memory only delays the moment.",
                           "泄漏能填满任何一张卡；更大的显存只是推迟了那一刻。"),
             }, "B"),
    Question("quiz6_key_table_decode", "key table: decode",
             Bi("In the chapter's key table, which row is Decode's: what it is most sensitive to, and what that "
                "affects later?",
                "本章关键表格里，哪一行属于 Decode：它最敏感的资源或问题是什么，又影响后面的什么？"), {
                 "A": _opt("Input length and first-token latency; it decides whether the request enters decode smoothly.",
                           "输入长度、首 token 延迟；影响请求能否顺利进入 decode。",
                           "That is Prefill's row: the whole prompt is processed before the first token.",
                           "这是 Prefill 那一行：首个 token 之前要先处理完整个提示词。"),
                 "B": _opt("Output length, scheduling policy and throughput; it affects total latency and device "
                           "utilization.",
                           "输出长度、调度策略、吞吐；影响总延迟和设备利用率。",
                           "Right: decode takes one step per output token, so the output's length and how the "
                           "scheduler batches those steps set the total latency and how busy the device is.",
                           "正确：decode 每个输出 token 一步，所以输出有多长、调度器怎样把这些步合批，决定了总延迟和设备有多忙。"),
                 "C": _opt("Memory capacity, bandwidth and memory management; it affects concurrency and cache layout.",
                           "显存容量、带宽、内存管理；影响并发能力和缓存布局设计。",
                           "That is the KV cache's row: how much history fits decides how many requests live together.",
                           "这是 KV 缓存那一行：能放下多少历史，决定了能同时活着多少请求。"),
                 "D": _opt("Generation parameters and request semantics; it affects output style and state advancement.",
                           "生成参数、请求语义；影响输出风格和状态推进。",
                           "That is Sampling's row: the parameters travel with the request and pick each token.",
                           "这是 Sampling 那一行：参数随请求一起走，决定每一个 token。"),
             }, "B"),
    Question("quiz7_scheduling_states", "§5 scheduling + conclusion 2",
             Bi("With many requests in the engine, what does one scheduling step manage?",
                "引擎里有很多请求时，调度器的一步管理的是什么？"), {
                 "A": _opt("One model computation at a time: the next forward pass and nothing else.",
                           "一次一个模型计算：下一次前向，别的不管。",
                           "The forward pass is one part of the step; deciding who is in it is the scheduling.",
                           "前向只是这一步的一部分；决定谁进入这次前向，才是调度。"),
                 "B": _opt("A cache of finished answers, looked up by prompt, that must not grow too large.",
                           "一个按提示词查找的、已完成答案的缓存，不能让它太大。",
                           "That is the hit/miss misunderstanding of the KV cache (pitfall 1), not scheduling.",
                           "这是把 KV 缓存当成命中 / 未命中缓存的误解（误区 1），不是调度。"),
                 "C": _opt("A set of requests whose states keep changing: who prefills, who decodes, who stopped and "
                           "must be released now, who waits.",
                           "一组状态不断变化的请求：谁预填充、谁解码、谁刚满足停止条件必须马上释放、谁还在等待。",
                           "Right: the request lifecycle is state advancement, and scheduling is managing many "
                           "requests whose states change at every step.",
                           "正确：请求生命周期就是状态推进，调度就是管理许多每一步都在变化状态的请求。"),
                 "D": _opt("The order of the tokens inside one request's prompt.", "一个请求的提示词里 token 的顺序。",
                           "The prompt's order is fixed by the user; the scheduler decides between requests.",
                           "提示词的顺序由用户决定；调度器是在请求之间做决定。"),
             }, "C"),
]

_CUE = re.compile(r"(answer|option|choice|pick|choose|select|go with|i think|i'd say|it's|it is|is)\s*[:：]?\s*\(?$|"
                  r"(选|选项|答案是?|答|是)\s*[:：]?\s*$", re.I)


def parse_choice(value: str, options, lang: str = "en") -> tuple[str | None, str]:
    """The one option letter an answer names ("B", "Answer: D", "选C", "I think d", "(b)"), or
    (None, why not, in ``lang``): no letter, or more than one ("B or D" is not an answer)."""
    letters = "".join(options)
    t = re.sub(f"(\\bnot\\b|\\brather than\\b|\\binstead of\\b|而不是|不是|不选|排除)\\s*[{letters}{letters.lower()}](?![A-Za-z])",
               " ", normalize(value), flags=re.I)
    upper = {m.group(1) for m in re.finditer(f"(?<![A-Za-z])([{letters}])(?![A-Za-z])", t)}
    if not upper:
        low = [m for m in re.finditer(f"(?<![A-Za-z])([{letters.lower()}])(?![A-Za-z])", t)]
        cued = {m.group(1).upper() for m in low if _CUE.search(t[:m.start()]) or not t[:m.start()].strip(" ([")}
        upper = cued
    if len(upper) == 1:
        return upper.pop(), ""
    if len(upper) > 1:
        return None, _say(lang, f"give one letter, not several ({', '.join(sorted(upper))})",
                          f"只写一个字母，不要写多个（{'、'.join(sorted(upper))}）")
    if re.fullmatch(f"[{letters}{letters.lower()}]{{2,}}", t.strip(" .()[]")):
        return None, _say(lang, "give one letter, not several", "只写一个字母，不要写多个")
    return None, _say(lang, f"answer with one letter, {', '.join(options)}; got {value!r}",
                      f"请用一个字母作答（{'、'.join(options)}）；得到的是 {value!r}")


def _quiz_why_ideas(q: Question):
    from . import ideas as I

    # (ideas, all of them needed, the misconceptions that deny them: said plainly, the why earns nothing)
    return {"quiz1_live_requests": ([I.HOLDS_RESOURCES], False, [I.NO_HOLD]),
            "quiz2_kv_tradeoff": ([I.RECOMPUTE, I.MEMORY], True, [I.CACHE_UNREAD]),
            "quiz3_sampling_interface": ([I.TOKEN_TO_HISTORY, I.NEXT_STEP_DEPENDS], False, [I.TOKEN_DROPPED]),
            "quiz4_states_before_batching": ([I.MIXED_STATES], False, []),
            "quiz5_debug_by_request": ([I.HOLDS_RESOURCES], False, [I.NO_HOLD]),
            "quiz6_key_table_decode": ([I.DECODE_PER_TOKEN], False, []),
            "quiz7_scheduling_states": ([I.MIXED_STATES], False, [])}[q.id]


def _quiz_answer(answer, q: Question) -> tuple:
    """(letter text, why text) from "D", ["D"], ("D", "because …") or "D, because …"."""
    if isinstance(answer, (list, tuple)) and len(answer) == 2 and all(isinstance(a, str) or a is None for a in answer):
        return answer[0] or "", answer[1] or ""
    if isinstance(answer, (list, tuple, set)) and len(answer) == 1:
        answer = next(iter(answer))
    if not isinstance(answer, str):
        raise _TypeProblem(f"{q.id} should be a letter such as \"B\", or (\"B\", \"why, in one sentence\"), "
                           f"got {answer!r}",
                           f"{q.id} 应该是一个字母，如 \"B\"，或 (\"B\", \"一句话理由\")，得到的是 {answer!r}")
    t = normalize(answer)
    m = re.match(r"^\W*(?:answer|option|选项?|答案是?)?\W*([A-Da-d])(?![A-Za-z])[\s,，.。:：;；—-]*(because\b|since\b|"
                 r"as\b|因为|由于)(.*)$", t, re.I)
    if m:
        return m.group(1), m.group(2) + m.group(3)
    return t, ""


NEAR_OPTION_DOUBT = 0.3  # a why mostly in the chosen option's words: a restatement or a paraphrase, a person decides


def _register_question(q: Question) -> None:
    @register(q.id, f"Self-check · {q.text.en[:48].rstrip()}…", q.section, 2, kind="quiz",
              title_zh=f"自测 · {q.text.zh[:24].rstrip()}…")
    @_wrong_type
    def grader(answer, m: Marks, q=q) -> None:
        from ..concepts import is_salad, length_units, read
        from ..copies import NEAR_OPTION, option_share, restates

        letter_text, why = _quiz_answer(answer, q)
        # the why carries the answer's language; a bare letter has none, so the notebook's decides
        lang = m.lang = answer_language(why, m.lang) if why.strip() else m.lang
        if is_unanswered(letter_text) and is_unanswered(why):
            raise _empty(q.id)
        letter, problem = parse_choice(letter_text, q.options, lang)
        if letter is None:
            m.wrong(f"{q.id}: {problem}")
            return
        if letter == q.answer:
            why_right = re.sub(r"^(Right: |正确：)", "", q.options[letter].why(lang))
            m.ok(_say(lang, f"{letter} is right: {why_right}", f"{letter} 正确：{why_right}"), 1)
            for other, option in q.options.items():
                if other != letter:
                    m.info(f"{other}{'：' if lang == 'zh' else ': '}{option.why(lang)}")
        else:
            m.wrong(_say(lang, f"{letter} is not the best answer: {q.options[letter].why(lang)} Try again.",
                         f"{letter} 不是最佳答案：{q.options[letter].why(lang)}再试一次。"))
            return
        if not why.strip():
            m.missing(_say(lang, "add why, in one sentence: answer (\"B\", \"because …\") for the second point",
                           "请用一句话说明理由：写成 (\"B\", \"因为……\") 可得第二分"))
            return
        if length_units(why) > 80 or length_units(why) < 3 or is_salad(why):
            m.wrong(_say(lang, "the why should be one sentence (not a keyword list, not a paragraph)",
                         "理由应是一句话（不是关键词列表，也不是一大段）"))
            m.flag()
            return
        if not own_words(why, m, lang, ("the why", "理由")):
            return
        if restates(why, q.options[letter].text.en) or restates(why, q.options[letter].text.zh):
            m.wrong(_say(lang, "the why repeats the option you chose; say what makes it true",
                         "理由只是复述了所选的选项；请说明它为什么成立"))
            m.flag(why="restates the option")
            return
        if max(option_share(why, q.options[letter].text.en), option_share(why, q.options[letter].text.zh)) >= NEAR_OPTION:
            m.doubt("close to the option's words", NEAR_OPTION_DOUBT)
        wanted, need_all, denials = _quiz_why_ideas(q)
        r = read(why, wanted, denials)
        _add_doubts(r, m)
        spoiled = _report_misconceptions(r, m)
        found = [i for i in wanted if r.ideas[i.key] == "present" and i.key not in spoiled]
        if (need_all and len(found) == len(wanted)) or (not need_all and found):
            m.ok(_say(lang, "the why names the mechanism", "理由说清了机制"), 1)
        else:
            missing = [i for i in wanted if i not in found]
            m.missing(_hint(missing[0].key, lang) if missing[0].key in _HINTS else
                      _say(lang, "the why does not yet name the mechanism", "理由还没有说清机制"))
            m.flag()


for _q in QUIZ:
    _register_question(_q)


@dataclass(frozen=True)
class Pitfall:
    """A statement to judge true or false; its texts are in both languages (see :class:`Bi`)."""

    id: str
    statement: Bi
    truth: bool
    why: Bi


PITFALLS = [
    Pitfall("pitfall1_kv_not_hit_cache",
            Bi("The KV cache works like a web cache: when a new prompt hits it, the stored answer is reused; "
               "on a miss the model computes the answer.",
               "KV Cache 和网页缓存一样：新的 prompt 命中时直接复用存好的答案，未命中时才让模型去算。"), False,
            Bi("It is execution state: the keys and values of one live request's tokens, written at prefill, read "
               "and extended every decode step, freed when the request is released.",
               "它是执行状态：一个活跃请求自己的 token 的 key 和 value，在 prefill 时写入，每一步 decode 读取并追加，"
               "请求释放时归还。")),
    Pitfall("pitfall2_sampling_not_ui",
            Bi("Sampling parameters such as temperature and top-p are a UI knob: they make the final text more or "
               "less random but do not change what the engine computes at each step.",
               "temperature、top-p 这类采样参数只是 UI 旋钮：它们让最终文字更随机或更稳定，但不改变引擎每一步算什么。"),
            False,
            Bi("Sampling picks every token, and each picked token becomes part of the context that all later steps "
               "are computed from, so it changes the request's path.",
               "每一个 token 都由采样选出，选中的 token 会成为之后每一步计算所依据的上下文，所以它改变请求的推进路径。")),
    Pitfall("pitfall3_one_lifecycle",
            Bi("Prefill and decode are two phases of one request's lifecycle: decode continues from the state (the "
               "KV cache) that prefill built for the same request.",
               "prefill 和 decode 是同一个请求生命周期里的两个阶段：decode 接着 prefill 为这个请求建立的状态"
               "（KV Cache）继续往前走。"), True,
            Bi("Prefill builds the request's initial state (its KV cache and first token); decode moves forward "
               "from exactly that state. Seeing them as one path is what makes scheduling make sense later.",
               "prefill 建立请求的初始状态（它的 KV Cache 和第一个 token），decode 正是从这个状态继续前进。"
               "把它们看成一条链路，后面的调度才讲得通。")),
]

_TRUE = {"true", "t", "yes", "y", "1", "对", "正确", "是", "真", "√", "✓"}
_FALSE = {"false", "f", "no", "n", "0", "错", "错误", "否", "假", "不对", "×", "✗"}
PITFALL_REASON_LIMIT = 120  # concepts.length_units (about 55 English words)


def _verdict(value) -> bool | None:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        v = normalize(value).lower().strip(" .。!！")
        if v in _TRUE:
            return True
        if v in _FALSE:
            return False
    return None


def _pitfall_answer(answer, name: str) -> tuple[bool | None, str]:
    if isinstance(answer, dict):
        verdict = answer.get("verdict", answer.get("true", answer.get("answer")))
        reason = answer.get("reason", answer.get("why", ""))
    elif isinstance(answer, (list, tuple)) and len(answer) == 2:
        verdict, reason = answer
    elif isinstance(answer, (list, tuple)) and len(answer) == 1:
        verdict, reason = answer[0], ""
    else:
        raise _TypeProblem(f"{name} should be a pair (True or False, \"your reason\"), got {answer!r}",
                           f"{name} 应该是一个二元组 (True 或 False, \"你的理由\")，得到的是 {answer!r}")
    if is_unanswered(verdict) and is_unanswered(reason):
        raise _empty(name)
    if reason is None:
        reason = ""
    if not isinstance(reason, str):
        t = type(reason).__name__
        raise _TypeProblem(f"the reason in {name} should be a string, got {t}", f"{name} 中的理由应是字符串，得到的是 {t}")
    return _verdict(verdict), normalize(reason)


def _pitfall_reason(p: Pitfall, reason: str):
    """(reading, present) for a pitfall's reason, by the concept matcher."""
    from . import ideas as I
    from ..concepts import read

    wanted = {"pitfall1_kv_not_hit_cache": [I.REQUEST_STATE],
              "pitfall2_sampling_not_ui": [I.TOKEN_TO_HISTORY, I.NEXT_STEP_DEPENDS, I.SAMPLING_PICKS],
              "pitfall3_one_lifecycle": [I.PREFILL_BUILDS, I.DECODE_CONTINUES]}[p.id]
    bad = [I.HIT_MISS, I.RANDOM_ONLY] + {"pitfall2_sampling_not_ui": [I.NO_EFFECT_LATER, I.TOKEN_DROPPED],
                                         "pitfall3_one_lifecycle": [I.CACHE_UNREAD]}.get(p.id, [])
    r = read(reason, wanted, bad)
    # one idea named is enough, unless another is denied: "sampling picks each token, and the next step never sees it"
    denied = any(r.ideas[i.key] == "negated" for i in wanted)
    return r, wanted, any(r.ideas[i.key] == "present" for i in wanted) and not denied


_PITFALL_HINT = {"pitfall1_kv_not_hit_cache": "request_state", "pitfall2_sampling_not_ui": "sampling_picks",
                 "pitfall3_one_lifecycle": "prefill_builds"}


def _register_pitfall(p: Pitfall) -> None:
    @register(p.id, f"Pitfall · {p.statement.en[:44].rstrip()}…", "pitfalls", 2, kind="text",
              title_zh=f"误区 · {p.statement.zh[:22].rstrip()}…")
    @_wrong_type
    def grader(answer, m: Marks, p=p) -> None:
        from ..concepts import is_salad, length_units

        verdict, reason = _pitfall_answer(answer, p.id)
        lang = m.lang = answer_language(reason, m.lang) if reason else m.lang
        if verdict is None:
            m.wrong(_say(lang, f"the first item of {p.id} should be True or False",
                         f"{p.id} 的第一项应为 True 或 False"))
        elif verdict == p.truth:
            m.ok(_say(lang, f"{'true' if p.truth else 'false'} is right", f"判断正确：{'对' if p.truth else '错'}"), 1)
        else:
            m.wrong(_say(lang, f"the statement is not {'true' if verdict else 'false'}: read it again, clause by clause",
                         f"这个说法并不是{'对' if verdict else '错'}的：请逐句再读一遍"))
        if not reason:
            m.missing(_say(lang, "give the reason, in a sentence", "请用一句话给出理由"))
            m.flag()
            return
        if length_units(reason) > PITFALL_REASON_LIMIT:
            m.warn(_say(lang, "the reason is over the limit; keep it to a sentence or two", "理由超出字数，请控制在一两句话"))
            m.flag()
            return
        if is_salad(reason):
            m.wrong(_say(lang, "the reason is a keyword list; write it as a sentence", "理由是一串关键词，请写成句子"))
            return
        if not own_words(reason, m, lang, ("the reason", "理由")):
            return
        r, wanted, ok = _pitfall_reason(p, reason)
        _add_doubts(r, m)
        spoiled = _report_misconceptions(r, m)
        if verdict != p.truth or spoiled:
            return
        if ok:
            m.ok(_say(lang, "the reason names the mechanism", "理由说清了机制"), 1)
        else:
            m.missing(_hint(_PITFALL_HINT[p.id], lang))
            m.flag()


for _p in PITFALLS:
    _register_pitfall(_p)


# =============================================================================================
# Task 5 — the long chat: which trimming policy
# =============================================================================================
TRIM_POLICIES = {"last_n": ("last_n", "last n", "keep the last n turns", "keep_last", "最近n轮", "保留最近n轮", "截断"),
                 "summary": ("summary", "summarize", "summarise", "replace old turns with a summary", "摘要", "总结")}
TASK5_SCENARIO = Bi("A tutoring chat runs for 40 turns. In turn 1 the student pastes the exercise they are stuck "
                    "on (about 300 tokens); in almost every later turn they refer back to it (\"as the exercise "
                    "says …\"). The server must keep each request under a fixed KV budget.",
                    "一段辅导对话持续 40 轮。第 1 轮，学生把卡住的那道题贴了进来（约 300 个 token）；之后几乎每一轮"
                    "都要回头引用它（“题目里说……”）。服务端必须把每个请求的 KV 占用控制在固定预算之内。")


_LAST_N = re.compile(r"最近|最后|\blast\b|\brecent\b|window|窗口|\bN\s*(轮|turns?)|last[_ -]?n", re.I)
_SUMMARY = re.compile(r"摘要|总结|summar\w*", re.I)
_LOSES = re.compile(r"(留|保|记)不住|存不下|丢|忘|截掉|删|扔|挤掉|挤出|裁掉|去掉|找不到|看不到|\blos[et]\w*|\bdrop\w*|\bforg[eo]t\w*|"
                    r"\bcut\w*|\bevict\w*|\b(throw\w*|threw|thrown)\s+(\w+\s+)?(away|out)\b|\bdiscard\w*|\bget\s+rid\s+of\b", re.I)
_KEEPS = re.compile(r"(保留|留住|留下|保住|\bkeep\w*|\bkept\b|\bretain\w*|\bpreserv\w*)\s*(\w+\s+)?"
                    r"(第一轮|第 ?1 ?轮|最早|开头|题目|它|\bturn\s*(1|one)\b|\bfirst\b|\bexercise\b|\bproblem\b|\bit\b)|"
                    # the object first, in a 把 phrase: "把题目压缩进摘要里一直带着"
                    r"把\s*(第一轮|第 ?1 ?轮|最早的?|开头的?|题目|它)[^，。；,;]{0,12}?"
                    r"(带着|带上|留着|留住|留下|保留|保住|记着|存着|放进|压缩进|写进|装进)", re.I)
# both policies in one clause, joined, with one claim for the two ("summary 和 last_n 都会丢掉第一轮")
_BOTH = re.compile(r"(都|两种|两个|二者|两者|\bboth\b|\beither\b|\bneither\b)", re.I)
_JOINED = re.compile(r"(和|与|跟|或|还是|以及|、|/|\band\b|\bor\b|\bnor\b)", re.I)


def _policy_claims(why: str) -> tuple[bool, bool]:
    """(right, wrong) claims about what each policy does with the early turn, clause by clause: a
    last-N window that keeps it ("最近N轮不会丢掉第一轮") or a summary that loses it is wrong, read
    through its negation; "last-N would drop it" and "摘要不会丢掉它" are right."""
    from ..concepts import clauses, negated_at

    right = wrong = False
    for _, clause in clauses(normalize(why)):
        last, summary = _LAST_N.search(clause), _SUMMARY.search(clause)
        if last and summary:  # one claim for both cannot tell them apart: never right, wrong if wrong for one
            lo, hi = sorted((last.end(), summary.end()))
            if _BOTH.search(clause) and _JOINED.search(clause[lo - 1:hi]):
                wrong = wrong or any(rx.search(clause) for rx in (_LOSES, _KEEPS))
            continue
        if not (last or summary):
            continue
        for rx, keeps in ((_LOSES, False), (_KEEPS, True)):
            for m in rx.finditer(clause):
                says_kept = keeps != negated_at(clause, m.start())
                ok = says_kept if summary else not says_kept
                right, wrong = right or ok, wrong or not ok
    return right, wrong


def _policy(value: str) -> str | None:
    v = normalize(value).lower().replace("-", " ").replace("_", " ")
    found = {k for k, names in TRIM_POLICIES.items() if any(n.replace("_", " ") in v for n in names)}
    return found.pop() if len(found) == 1 else None


@register("task5_trim_policy", "Task 5 · the long chat: pick a trimming policy", "§3 scenario 1 (long chat)", 2,
          title_zh="任务 5 · 长对话：选一种裁剪历史的策略")
@_wrong_type
def grade_task5(answer, m: Marks) -> None:
    """1 point: the summary policy (the last-N window would drop turn 1, which every later turn needs);
    1 point: a reason that says what each policy keeps or loses."""
    from . import ideas as I
    from ..concepts import is_salad, read

    if not (isinstance(answer, (list, tuple)) and len(answer) == 2):
        raise _TypeProblem('task5_trim_policy should be a pair ("summary" or "last_n", "why, in a sentence")',
                           'task5_trim_policy 应该是一个二元组 ("summary" 或 "last_n", "一句话理由")')
    choice, why = answer
    if is_unanswered(choice) and is_unanswered(why):
        raise _empty("task5_trim_policy")
    if not isinstance(choice, str) or not isinstance(why, str):
        raise _TypeProblem("both items of task5_trim_policy should be strings", "task5_trim_policy 的两项都应是字符串")
    lang = m.lang = answer_language(why, m.lang) if why.strip() else answer_language(choice, m.lang)
    policy = _policy(choice)
    if policy is None:
        m.wrong(_say(lang, 'the first item should name one policy: "summary" or "last_n"',
                     '第一项应只写一种策略："summary" 或 "last_n"'))
        return
    if policy == "summary":
        m.ok(_say(lang, "summary is the better policy here", "这里摘要策略更合适"), 1)
    else:
        m.wrong(_say(lang, "last_n is not the best policy here: look at which turn the later turns keep needing",
                     "这里 last_n 不是最佳策略：看看后面的轮次一直需要哪一轮的内容"))
        return
    if not why.strip():
        m.missing(_say(lang, "give the reason, in a sentence", "请用一句话给出理由"))
        return
    if is_salad(why):
        m.wrong(_say(lang, "the reason is a keyword list; write it as a sentence", "理由是一串关键词，请写成句子"))
        return
    if not own_words(why, m, lang, ("the reason", "理由")):
        return
    r = read(why, [I.EARLY_TURN_MATTERS, I.BOUNDED_KV], [])
    _add_doubts(r, m)
    right, wrong = _policy_claims(why)
    if wrong and not right:
        m.wrong(_say(lang, "the reason gets wrong what one of the policies does with the early turn: read the scenario "
                           "again", "理由把某个策略对早期内容的处理说反了：请再读一遍场景"))
        m.flag(why="negated idea")
    elif r.ideas["early_turn"] == "present":
        m.ok(_say(lang, "the reason says what a last-N window would lose", "理由说明了只保留最近 N 轮会丢掉什么"), 1)
        if r.ideas["bounded_kv"] != "present":
            m.info(_say(lang, "worth adding: both policies bound the KV each turn holds",
                        "还可以补充：两种策略都能限制每轮占用的 KV"))
    else:
        m.missing(_say(lang, "the reason does not say which part of the history the later turns need, and what "
                             "each policy does with it",
                       "理由没有说明后面的轮次需要历史中的哪一部分，以及两种策略如何处理它"))
        m.flag()
