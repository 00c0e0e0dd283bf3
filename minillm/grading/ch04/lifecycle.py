"""Task 1: the request lifecycle state diagram, graded on its structure (never its picture).

The answer is read by :mod:`minillm.grading.diagram` (editor, data or DOT). State names are
matched generously, in English or Chinese (QUEUED / WAITING / 入队 …), to the roles the chapter
asks for: enqueue, prefill, decode (the active request), finish, release.
"""

from __future__ import annotations

import re
from collections import deque

from ..diagram import Diagram, DiagramFormatError, read_answer
from ..registry import Marks, NotAttempted, register

#: what the DiagramEditor offers as a state's note (what it holds), per language
RESOURCE_NOTES = {
    "en": ("prompt text", "prompt token ids", "sampling params", "KV blocks for the prompt",
           "KV blocks (one more token per step)", "a batch slot", "output token ids", "stop reason",
           "nothing on the device (blocks freed)"),
    "zh": ("prompt 文本", "prompt token", "采样参数", "整段 prompt 的 KV 块", "KV 块（每步多一个 token）", "一个 batch 槽位",
           "已生成的输出 token", "停止原因", "设备上什么都不占（块已释放）"),
}

# =============================================================================================
# Roles: which state is which, in English or Chinese
# =============================================================================================
ROLES: dict[str, tuple[str, str]] = {
    # role: (regex over the normalised name, how feedback names it)
    "new": (r"\bnew\b|\barriv\w*|\breceiv\w*|\bsubmit\w*|\bincoming\b|\bcreated\b|\brequest in\b|"
            r"进入请求|新请求|到达|接收|提交|进入系统", "NEW / ARRIVED"),
    "tokenize": (r"tokeni[sz]\w*|分词", "TOKENIZE"),
    "enqueue": (r"\bqueue\w*|\benqueue\w*|\bwait\w*|\bpending\b|\badmi\w*|入队|排队|等待|等候|队列|待调度|待处理", "WAITING / QUEUED / 入队"),
    "prefill": (r"pre-?\s?fill\w*|prompt process\w*|process\w* (the )?prompt|context encod\w*|context[ _]?init\w*|"
                r"context (phase|stage)|prompt (phase|stage)|first token|encode prompt|预填充|预填|首 ?token|提示处理|"
                r"prompt ?(处理|计算)|上下文(阶段|计算|编码)|首轮", "PREFILL"),
    "decode": (r"\bdecod\w*|\bactive\b|\brunning\b|\bgenerat\w*|in[ _]progress|活跃|解码|生成|运行中|运行|逐 ?token|增量",
               "DECODE / ACTIVE"),
    "sample": (r"\bsampl\w*|采样", "SAMPLE"),
    "update": (r"update\w* (the )?(history|context)|\bappend\w*|更新历史|更新上下文|追加", "UPDATE HISTORY"),
    "preempted": (r"preempt\w*|\bswapp?\w*|\bevict\w*|抢占|换出", "PREEMPTED"),
    "cancelled": (r"\bcancel\w*|\babort\w*|取消|中止", "CANCELLED"),
    "finish": (r"\bfinish\w*|\bdone\b|\bcomplet\w*|\bstop\w*|\bend(ed)?\b|\bterminat\w*|完成|结束|停止|终止", "FINISHED"),
    "release": (r"\breleas\w*|\bfree[sd]?\b|\bclean\w*|\breclaim\w*|\bdealloc\w*|回收|释放|清理", "RELEASED"),
}
_ROLE_RE = {k: re.compile(v[0], re.IGNORECASE) for k, v in ROLES.items()}
REQUIRED = ("enqueue", "prefill", "decode", "finish", "release")
_ROLE_NAME_ZH = {"enqueue": "入队", "prefill": "预填充", "decode": "解码", "finish": "完成", "release": "释放"}
LOOP_OK = {"decode", "sample", "update", None}  # roles a decode loop may pass through
_KV = re.compile(r"\bkv\b|cache|blocks?|\bkeys?\b|\bvalues?\b|k/v|显存|缓存|键值|块|KV", re.IGNORECASE)
_NEGATOR = re.compile(r"\b(no|not|none|nothing|zero|never|without)\b|n't|无|没|不|未|零", re.IGNORECASE)
_NONE_AFTER = re.compile(r"\s*(blocks?\s*)?[:：=]?\s*(none|nothing|no\b|0\b|zero|无|没有|零)", re.IGNORECASE)
_ZERO = re.compile(r"(\b(0|zero)\s+(\w+\s+)?|零个?\s*)$", re.IGNORECASE)
_CANCEL = re.compile(r"cancel|abort|user stop|取消|中止|用户停止", re.IGNORECASE)
_PREEMPT = re.compile(r"preempt|evict|swap|out of (kv|blocks|memory)|抢占|换出|显存不足", re.IGNORECASE)


def _plain(name: str) -> str:
    from ..unicode_clean import clean

    name = clean(name)  # "DЕCODE" with a Cyrillic Е, "WAIT\u200bING": the name a reader sees
    name = re.sub(r"([a-z])([A-Z])", r"\1 \2", name)  # WaitingQueue -> Waiting Queue
    return re.sub(r"[_\-./]+", " ", name).strip()


def roles_of(name: str, label: str = "") -> set[str]:
    text = _plain(name) + " " + _plain(label)
    found = {r for r, rx in _ROLE_RE.items() if rx.search(text)}
    if "cancelled" in found:
        found.discard("finish")  # "CANCELLED (stopped)" is a cancel state
    if "enqueue" in found and "preempted" in found:
        found.discard("enqueue")  # "preempted, waiting" is a preemption state
    if "decode" in found and "prefill" in found and not re.search(r"\band\b|/|\+|&|和|与", text):
        found.discard("decode")  # "prefill (generate the first token)"
    if "finish" in found and "decode" in found and re.search(r"stop condition|停止条件|complet|\bdone\b|finish|完成", text, re.I) \
            and not re.search(r"\band\b|/|\+|&|和|与", text):
        found.discard("decode")  # TensorRT-LLM's GENERATION_COMPLETE
    return found


# =============================================================================================
# The grader
# =============================================================================================


_STOP_EDGE = re.compile(r"\beos\b|<eos>|\bstop\w*|\bmax_?(new_)?tokens\b|\bend of (sequence|text)\b|\bfinish\w*|\bdone\b|"
                        r"停止|结束|终止|完成|输出完|生成完", re.IGNORECASE)


def stopped_states(d: Diagram, roles: dict) -> list[str]:
    """States named by something the chapter has no word for ("买单" in a diagram told as a restaurant) that every
    way in reaches from a decode state on a stop condition (EOS, max tokens): the finished state, whatever its name."""
    return _entered_only(d, roles, "decode", _STOP_EDGE)


_RELEASE_EDGE = re.compile(ROLES["release"][0] + r"|归还|还回|交还|\breturn\w*", re.IGNORECASE)


# a note that says the state gives everything back: "桌子（块）全部让出", "nothing held"
_GIVES_BACK = re.compile(_RELEASE_EDGE.pattern + r"|让出|腾出|空出|还掉|什么都不占|都不占|\bnothing\b|\bempty\b", re.IGNORECASE)


def released_states(d: Diagram, roles: dict) -> list[str]:
    """States the chapter has no word for ("下机清舱" in a diagram told as an airport, "翻台" as a restaurant) that
    every way in reaches from the finished state on a release (release, free, 归还), or whose note says it gives
    everything back while the diagram has no released state: the released state, whatever its name."""
    found = _entered_only(d, roles, "finish", _RELEASE_EDGE)
    if not found and not any("release" in r for r in roles.values()):
        found = [s for s in _entered_only(d, roles, "finish", re.compile(""))
                 if _GIVES_BACK.search(d.states.get(s, "")) and not _holds_kv(d.states.get(s, ""))]
    return found


def _entered_only(d: Diagram, roles: dict, role: str, edge: re.Pattern) -> list[str]:
    """The states with no role of their own whose every way in comes from a state of ``role`` on an
    edge whose label matches ``edge``."""
    out = []
    for s in d.states:
        if roles[s]:
            continue
        ins = [(src, label) for src, dst, label in d.transitions if dst == s and src != s]
        if ins and all(role in roles.get(src, ()) and edge.search(label or "") for src, label in ins):
            out.append(s)
    return out


_FIRST_TOKEN = re.compile(r"first\s+token|第一个\s*token|首\s*个?\s*token|首字", re.IGNORECASE)
_PROMPT = re.compile(r"\bprompt|提示|输入", re.IGNORECASE)


def told_by_structure(d: Diagram, roles: dict) -> dict[str, str]:
    """Roles for states the chapter has no word for (a diagram told as a hospital: 挂号候诊, 入院检查, 住院 …), read
    from the path and the notes as an instructor reads them, only where the diagram has no state of that role:
    a state that loops on itself and whose note holds KV is the decode state; the one whose edge enters it and whose
    note holds the prompt's KV (or whose edge is the first token) is prefill; the state the diagram starts from,
    holding no KV, that enters prefill is the waiting state."""
    found: dict[str, str] = {}
    plain = [s for s in d.states if not roles[s]]
    has = {r for rs in roles.values() for r in rs}

    def edges_into(targets):
        return [(src, label) for src, dst, label in d.transitions if dst in targets and src != dst]

    if "decode" not in has:
        for s in plain:
            if any(src == dst == s for src, dst, _ in d.transitions) and _holds_kv(d.states.get(s, "")):
                found[s] = "decode"
    decode = [s for s in d.states if "decode" in roles[s] or found.get(s) == "decode"]
    if "prefill" not in has and decode:
        for src, label in edges_into(decode):
            note = d.states.get(src, "")
            if src in plain and src not in found and (_FIRST_TOKEN.search(label or "") or (_PROMPT.search(note) and _holds_kv(note))):
                found[src] = "prefill"
    prefill = [s for s in d.states if "prefill" in roles[s] or found.get(s) == "prefill"]
    if not has & {"enqueue", "new"} and prefill:
        for src, _ in edges_into(prefill):
            starts = not any(dst == src and s != src for s, dst, _ in d.transitions)
            if src in plain and src not in found and starts and not _holds_kv(d.states.get(src, "")):
                found[src] = "enqueue"
    return found


class _Graph:
    def __init__(self, d: Diagram):
        self.d = d
        self.roles = {s: roles_of(s, d.labels.get(s, "")) for s in d.states}
        for s, role in told_by_structure(d, self.roles).items():
            self.roles[s] = {role}
        self.out: dict[str, list[tuple[str, str]]] = {s: [] for s in d.states}
        for src, dst, label in d.transitions:
            self.out[src].append((dst, label))
        for s in stopped_states(d, self.roles):
            self.roles[s] = {"finish"}
        for s in released_states(d, self.roles):
            self.roles[s] = {"release"}

    def with_role(self, role: str) -> list[str]:
        return [s for s, r in self.roles.items() if role in r]

    def reach(self, starts, goals, avoid_roles=()) -> bool:
        """Is some goal reachable from some start, never entering a state with an avoided role
        (the goal itself may have one)?"""
        goals = set(goals)
        seen, todo = set(), deque(starts)
        while todo:
            s = todo.popleft()
            for t, _ in self.out.get(s, ()):
                if t in goals:
                    return True
                if t in seen or self.roles[t] & set(avoid_roles):
                    continue
                seen.add(t)
                todo.append(t)
        return False

    def has_loop(self, node: str) -> bool:
        """A cycle back to ``node`` through loop-safe states only (decode, sample, update, unnamed)."""
        seen, todo = set(), deque([node])
        while todo:
            s = todo.popleft()
            for t, _ in self.out.get(s, ()):
                if t == node:
                    return True
                ok = not self.roles[t] or self.roles[t] <= LOOP_OK
                if ok and t not in seen:
                    seen.add(t)
                    todo.append(t)
        return False


def _holds_kv(note: str) -> bool:
    """Does the note say the state holds KV (and not that it holds none)?"""
    from ..concepts import clauses, negated_at
    from ..unicode_clean import clean

    text, prev = clean(note), ""
    for at, clause in clauses(text):
        # a gloss is read with the word it glosses: "还没分到床位（KV 块）" holds none
        glossed = at > 0 and text[at - 1] == "(" and prev and negated_at(prev, max(0, len(prev) - 2))
        prev = clause
        m = _KV.search(clause)  # the clause's first mention decides: "还没有 KV 块" is one negated mention
        if glossed:
            continue
        if at > 0 and text[at - 1] == "(" and _GIVEN_BACK.search(text[at + len(clause):].lstrip(")").split(",")[0]):
            continue  # "桌子（块）全部让出": the gloss is the subject of what follows it
        if m and (_ZERO.search(clause[:m.start()]) or _NONE_AFTER.match(clause[m.end():])):
            continue  # "0 KV blocks", "zero blocks", "零个块", "KV: none": a count of none
        if m and not negated_at(clause, m.start()) and not _GIVEN_BACK.search(clause):
            return True
    return False


_GIVEN_BACK = re.compile(r"\b(freed|released|returned|back in|back to|given back|to the pool|in the pool)\b|释放|归还|回收|还回|"
                         r"回到|放回|池中|池里|还给|交还|退还|还到|池子|让出|腾出|空出|还掉|"
                         r"(?<![没不未])(回|还|退|归)\s*(到\s*)?(the\s+)?(pool|free ?list|allocator)\b", re.I)  # "blocks 回 pool"


def _contradictions(d: Diagram, have: dict, dec: list, merged: list, m: Marks) -> list[str]:
    """Notes that contradict the engine: KV held while waiting or after release, none while decoding."""
    out = []
    for s in have["enqueue"]:
        if s in have["preempted"] or s in dec or s in have["prefill"]:
            continue
        if _holds_kv(d.states.get(s, "")):
            out.append(m.t("dia.waiting_kv", name=s))
    for s in have["release"]:
        if s not in merged and _holds_kv(d.states.get(s, "")):
            out.append(m.t("dia.released_kv", name=s))
    for s in dec:
        h = d.states.get(s, "")
        if h and not _holds_kv(h) and (_KV.search(h) or re.search(r"^\s*(nothing|none|无|没有)", h, re.I)):
            out.append(m.t("dia.decoding_no_kv", name=s))
    return out


def _names(states) -> str:
    return ", ".join(sorted(states))


@register("task1_diagram", "Task 1 · the request lifecycle state diagram", "§1 + lifecycle diagram", 12,
          bonus_max=2, kind="diagram", title_zh="任务 1 · 请求生命周期状态图")
def grade_task1(answer, m: Marks) -> None:
    """States (5), enqueue→prefill→decode (2), the decode loop (1), the way out to FINISH (1),
    FINISH before RELEASE (1), resource notes (2); bonus: preemption (1), cancel (1).
    Feedback is in the diagram's language (its names and notes), else in the notebook's."""
    from ..language import answer_language

    try:
        d = read_answer(answer)
    except DiagramFormatError as exc:
        m.wrong(m.t("dia.unreadable", error=str(exc)))
        return
    m.lang = answer_language(" ".join(list(d.states) + list(d.states.values())), m.lang)
    _grade_task1(d, m)


def _grade_task1(d: Diagram, m: Marks) -> None:
    if d.empty:
        raise NotAttempted.key("dia.empty")
    g = _Graph(d)
    for key, fields in d.notes[:3]:
        m.info(m.t(key, **fields))

    have, merged = _grade_states(d, g, m)
    enq = have["enqueue"] or have["new"]
    pre, dec, fin, rel = have["prefill"], have["decode"], have["finish"], have["release"]
    terminal = ("finish", "release", "cancelled")

    _grade_admission(g, m, enq, pre, dec, terminal)
    _grade_loop(g, m, dec)
    _grade_ending(g, m, dec, fin, rel, merged)
    _grade_notes(d, m, have, dec, merged)
    _grade_bonus(g, m, have, enq, pre, dec, rel, terminal)


def _grade_states(d: Diagram, g: _Graph, m: Marks) -> tuple[dict, list]:
    # --- 1. the five states ------------------------------------------------------------------
    have = {r: g.with_role(r) for r in ROLES}
    merged = [s for s in d.states if {"finish", "release"} <= g.roles[s]]
    for role in REQUIRED:
        if have[role] and not (role == "release" and merged and set(have["release"]) <= set(merged)):
            m.ok(m.t("dia.state", role=_ROLE_NAME_ZH[role] if m.lang == "zh" else ROLES[role][1].split(' / ')[0],
                     names=_names(have[role])), 1)
        elif role == "enqueue" and have["new"]:
            m.missing(m.t("dia.no_queue", names=_names(have['new'])))
            m.score += 0.5
        elif role == "release" and merged:
            m.ok(m.t("dia.merged_release", names=_names(merged)), 1)
            m.info(m.t("dia.two_moments"))
        else:
            m.missing(m.t("dia.no_state", role=ROLES[role][1]))
    for s, r in g.roles.items():
        if not r:
            m.info(m.t("dia.unknown_state", name=s))

    return have, merged


def _grade_admission(g: _Graph, m: Marks, enq, pre, dec, terminal) -> None:
    # --- 2. enqueue -> prefill -> decode -----------------------------------------------------
    if enq and pre:
        if g.reach(enq, pre, avoid_roles=("decode",) + terminal):
            m.ok(m.t("dia.path", src=_names(enq), dst=_names(pre)), 1)
        elif g.reach(pre, enq, avoid_roles=terminal):
            m.wrong(m.t("dia.wrong_way", src=_names(enq), dst=_names(pre)))
        else:
            m.missing(m.t("dia.no_admit", src=_names(enq), dst=_names(pre)))
    if pre and dec:
        if g.reach(pre, dec, avoid_roles=terminal + ("enqueue",)):
            m.ok(m.t("dia.path", src=_names(pre), dst=_names(dec)), 1)
        elif g.reach(dec, pre, avoid_roles=terminal):
            m.wrong(m.t("dia.decode_first", dec=_names(dec), pre=_names(pre)))
        else:
            m.missing(m.t("dia.no_first_token", src=_names(pre), dst=_names(dec)))


def _grade_loop(g: _Graph, m: Marks, dec) -> None:
    # --- 3. the decode loop ------------------------------------------------------------------
    if dec:
        looped = [s for s in dec if g.has_loop(s)]
        if looped:
            m.ok(m.t("dia.loops", names=_names(looped)), 1)
        else:
            m.missing(m.t("dia.no_loop", names=_names(dec), d=dec[0]))


def _grade_ending(g: _Graph, m: Marks, dec, fin, rel, merged) -> None:
    # --- 4. out of the loop to FINISHED, then RELEASED -----------------------------------------
    if dec and fin:
        if g.reach(dec, fin, avoid_roles=("release", "enqueue", "prefill")):
            m.ok(m.t("dia.stops", dec=_names(dec), fin=_names(fin)), 1)
        else:
            m.missing(m.t("dia.no_stop", dec=_names(dec), fin=_names(fin)))
    if merged and (not rel or set(rel) <= set(merged)) and dec and g.reach(dec, merged):
        m.ok(m.t("dia.merged_ends", names=_names(merged)), 1)
    if fin and rel and not set(rel) <= set(merged):
        sep_fin = [s for s in fin if s not in merged] or fin
        sep_rel = [s for s in rel if s not in merged] or rel
        forward = g.reach(sep_fin, sep_rel)
        backward = g.reach(sep_rel, sep_fin)
        if forward and not backward:
            m.ok(m.t("dia.fin_before_rel", fin=_names(sep_fin), rel=_names(sep_rel)), 1)
        elif backward and not forward:
            m.wrong(m.t("dia.rel_before_fin", fin=_names(sep_fin), rel=_names(sep_rel)))
        elif backward and forward:
            m.wrong(m.t("dia.rel_back", fin=_names(sep_fin), rel=_names(sep_rel)))
        else:
            m.missing(m.t("dia.no_release", fin=_names(sep_fin), rel=_names(sep_rel)))
    for s in rel:
        onward = [t for t, _ in g.out[s] if t != s and not g.roles[t] & {"release"}]
        if onward and s not in merged:
            m.warn(m.t("dia.rel_onward", name=s, names=_names(onward)))


def _grade_notes(d: Diagram, m: Marks, have, dec, merged) -> None:
    # --- 5. resource notes -------------------------------------------------------------------
    bare = [s for s, h in d.states.items() if not h or h.strip(" .?…-") in ("", "TODO", "todo")]
    contradictions = _contradictions(d, have, dec, merged, m)
    for text in contradictions:
        m.wrong(text)
    if contradictions and any(_NEGATOR.search(h) for h in d.states.values()):
        m.flag(why="a note with a negation")  # "KV: none", "blocks not yet returned": the reading may be wrong
    if not bare and not contradictions:
        m.ok(m.t("dia.notes_ok"), 1)
    elif not bare:
        m.missing(m.t("dia.notes_contradict"))
    else:
        m.missing(m.t("dia.notes_missing", names=_names(bare)))
    noted = [s for s in dec if d.states.get(s)]
    if noted and any(_holds_kv(d.states[s]) for s in noted):
        m.ok(m.t("dia.decode_kv"), 1)
    elif dec:
        m.missing(m.t("dia.decode_no_kv", names=_names(dec)))


def _grade_bonus(g: _Graph, m: Marks, have, enq, pre, dec, rel, terminal) -> None:
    # --- bonus: preemption and cancel --------------------------------------------------------
    live = dec + pre + have["sample"] + have["update"]
    pre_states = have["preempted"]
    preempt_in = [s for s in pre_states if any(t == s for x in live for t, _ in g.out[x])]
    preempt_edge = [(x, t) for x in live for t, lab in g.out[x] if _PREEMPT.search(lab) and t in enq + pre]
    if preempt_in and g.reach(preempt_in, enq + pre, avoid_roles=terminal):
        m.add_bonus(m.t("dia.preempt", names=_names(preempt_in)), 1)
    elif preempt_edge:
        m.add_bonus(m.t("dia.preempt_edge"), 1)
    elif preempt_in:
        m.info(m.t("dia.preempt_stuck", names=_names(preempt_in)))
    else:
        m.info(m.t("dia.no_preempt"))
    cancel_from = [x for x in dec for t, lab in g.out[x] if _CANCEL.search(lab) or "cancelled" in g.roles[t]]
    if cancel_from:
        cancel_targets = [t for x in cancel_from for t, lab in g.out[x] if _CANCEL.search(lab) or "cancelled" in g.roles[t]]
        if rel and not (set(cancel_targets) & set(rel)) and not g.reach(cancel_targets, rel):
            m.info(m.t("dia.cancel_leak", names=_names(cancel_from), rel=_names(rel)))
        else:
            m.add_bonus(m.t("dia.cancel", names=_names(cancel_from)), 1)
    else:
        where = _names(dec) if dec else "DECODE"
        m.info(m.t("dia.no_cancel", names=where))
