"""The build-it track: the learner writes four parts of the engine, each checked on the engine.

    from minillm.grading import build_it
    build_it.check("a")        # MY_TRANSITIONS: the request state machine's legal moves
    build_it.check("b")        # MyBlockPool: a block pool with reference counts and free
    build_it.check("c")        # my_step(llm): one engine step over the engine's own pieces
    build_it.check("d")        # my_top_k_filter, my_top_p_filter
    build_it.show_method("b")  # the method in words (recorded in the notebook)

Each part plugs into the real engine through ``minillm.seams.EngineParts`` and is checked by
seeded random add / step / cancel programs (``programs``) against the same engine with its own
part: the same tokens and stop reasons, no leaked block, every request ended with a stop
reason. The first failing program is shrunk to a few lines and shown as code the learner can
paste and run. These exercises are a track of their own: they are not in the exercises
notebook's ``summary()`` nor in ``minillm grade``'s report.
"""

from __future__ import annotations

import html
import random
from dataclasses import dataclass, fields

from . import programs as P
from .. import safecall
from ..engine_guard import WHOLE_ENGINE
from ...i18n import resolve
from ..registry import Exercise, Marks, NotAttempted, grade
from ..result import Result

N_PROGRAMS = 16
PROGRAM_LENGTH = 10
RUN_TIMEOUT = 60.0

# --- messages (English, Chinese) -----------------------------------------------------------
MESSAGES = {
    "stub": ("{name} is still the stub: write it, run its cell, then check again.",
             "{name} 还是占位代码：先写好它、运行那个单元格，再检查。"),
    "programs_ok": ("{n} random add / step / cancel programs: same tokens and stop reasons as the engine's own "
                    "part, no block leaked, every request ended with a stop reason.",
                    "{n} 个随机的 add / step / cancel 程序：token 和停止原因都与引擎自带的部件一致，没有泄漏的块，"
                    "每个请求都带着停止原因结束。"),
    "program_failed": ("Program {i} of {n} fails: {why}. Shrunk from {before} to {after} actions, it is the code "
                       "below (paste it into a cell to see it again).",
                       "第 {i}/{n} 个程序失败：{why}。从 {before} 个动作缩小到 {after} 个，就是下面这段代码"
                       "（粘贴到单元格里可以复现）。"),
    "extra_edges": ("Your table allows moves the lifecycle diagram does not have: a scheduler bug that makes "
                    "them would go unnoticed.", "你的表允许了生命周期图里没有的转移：调度器若有 bug 走了这些边，没人会发现。"),
    "no_extra": ("Your table allows no move the diagram lacks.", "你的表没有放行图里不存在的转移。"),
    "not_dict": ("MY_TRANSITIONS must be a dict {state: set of next states}, got {type}.",
                 "MY_TRANSITIONS 必须是字典 {状态: 下一状态的集合}，现在是 {type}。"),
    "not_class": ("{name} must be a class (called as {name}(num_blocks)), got {type}.",
                  "{name} 必须是一个类（以 {name}(num_blocks) 调用），现在是 {type}。"),
    "not_function": ("{name} must be a function, got {type}.", "{name} 必须是函数，现在是 {type}。"),
    "cases_ok": ("{name}: all {n} small cases keep exactly the engine's tokens, unchanged.",
                 "{name}：{n} 个小例子保留的 token 与引擎完全一致，数值不变。"),
    "case_failed": ("{name} on logits {logits} with {arg}: it keeps {got}, the engine keeps {want} "
                    "(the smallest case that fails).",
                    "{name} 在 logits {logits}、{arg} 上：保留了 {got}，引擎保留 {want}（失败的最小例子）。"),
    "case_raised": ("{name} on logits {logits} with {arg} raised {error}.", "{name} 在 logits {logits}、{arg} 上抛出 {error}。"),
    "case_shape": ("{name} must return logits of the same shape ({want}), got {got}.",
                   "{name} 必须返回形状相同的 logits（{want}），现在是 {got}。"),
    "case_values": ("{name} on logits {logits} with {arg} changed the values it kept: keep them as they were and set "
                    "the others to -inf.", "{name} 在 logits {logits}、{arg} 上改了保留下来的数值：保留的原样不动，其余设为 -inf。"),
    "engine_own": ("{name} is the engine's own {what}: the task is to write it yourself.",
                   "{name} 就是引擎自带的{what}：这个任务要你自己写。"),
    "lax_demo": ("With your table this bug goes unnoticed (the code below): a {old} request is moved to {new} "
                 "and nothing complains; the engine's own table raises IllegalTransition there.",
                 "用你的表，这个 bug 不会被发现（见下面的代码）：一个 {old} 请求被移到 {new}，没有任何报错；"
                 "引擎自带的表在这里会抛出 IllegalTransition。"),
    "timeout": ("your part did not return within {s:.0f} s (an endless loop?)", "你的部件在 {s:.0f} 秒内没有返回（死循环？）"),
}

EDGE_WHY = {  # why a move the diagram lacks is wrong, by the kind of move
    "from_released": ("a RELEASED request has ended and holds nothing: nothing brings it back",
                      "RELEASED 的请求已经结束、什么都不占：没有任何转移能让它回来"),
    "from_finished": ("a FINISHED request's logic is done: the one move left is giving its blocks back (RELEASED)",
                      "FINISHED 的请求逻辑已完成：唯一剩下的一步是归还它的块（RELEASED）"),
    "to_new": ("NEW is where a request is born: none goes back there", "NEW 是请求诞生的状态：没有请求会回到这里"),
    "to_released": ("RELEASED comes only after FINISHED: a request gets its stop reason before its blocks go",
                    "RELEASED 只能在 FINISHED 之后：请求先有停止原因，再归还块"),
    "to_decode": ("only PREFILL leads to DECODE: decoding needs the whole context's K/V in the cache",
                  "只有 PREFILL 能进入 DECODE：解码需要整段上下文的 K/V 已在缓存里"),
    "decode_waiting": ("a DECODE request that loses its blocks is PREEMPTED (to be recomputed), not just WAITING",
                       "失去块的 DECODE 请求是被抢占（PREEMPTED，之后重算），而不只是 WAITING"),
    "other": ("the engine never makes this move", "引擎从不走这条边"),
}


def _t(lang: str, key: str, **fields) -> str:
    en, zh = MESSAGES[key]
    return (zh if lang == "zh" else en).format(**fields)


def _edge_why(old: str, new: str, lang: str) -> str:
    if old == "RELEASED":
        key = "from_released"
    elif old == "FINISHED":
        key = "from_finished"
    elif new == "NEW":
        key = "to_new"
    elif new == "RELEASED":
        key = "to_released"
    elif new == "DECODE":
        key = "to_decode"
    elif (old, new) == ("DECODE", "WAITING"):
        key = "decode_waiting"
    else:
        key = "other"
    return EDGE_WHY[key][1 if lang == "zh" else 0]


# --- engines -----------------------------------------------------------------------------
_ENGINES: dict = {}


def small_engine(parts=None):
    """The engine the programs run on: the shipped model on the CPU with a pool of 10 blocks of
    4 tokens, 3 batch slots and a 12-token step, so prompts prefill in chunks and requests
    preempt each other. ``parts``: a ``minillm.seams.EngineParts``, or None for the engine's own
    parts (with ``seams.RefCountPool`` as its pool, so nothing is kept between programs)."""
    from ...llm import LLM
    from ...seams import EngineParts, RefCountPool

    parts = parts or EngineParts()
    if parts.block_pool is None:
        parts = EngineParts(parts.transitions, RefCountPool, parts.step, parts.top_k_filter, parts.top_p_filter)
    return LLM(device="cpu", parts=parts, **P.GRID)


def finish(llm) -> dict:
    """Step until every request ended, checking the invariants after each step; returns
    {request id: (tokens, stop reason)} (raises AssertionError saying what broke)."""
    out = P.run(llm, [])
    if out.broken:
        raise AssertionError(out.broken.text(resolve(None)))
    return out.results


def failing_step(llm) -> None:
    """One step whose forward pass raises (the engine must undo it): ``programs.failing_step``."""
    P.failing_step(llm)


SMOKE = [P.Add((5, 6, 7, 8, 9, 10, 11, 12, 40), 6), P.Add((5, 6, 7, 8, 9, 10, 11, 12, 41), 5, 0.8, 5, 0.9, 1),
         P.Step(2), P.Add((30, 31, 32), 4, 1.0, 20, 0.6, 2), P.Step(1), P.Cancel(0)]
ENGINE_MESSAGES = {
    "mine": ("This engine runs on your parts ({names}).", "这个引擎用的是你写的部件（{names}）。"),
    "own": ("Your part ({names}) is not ready yet ({why}): this engine uses the engine's own part instead. "
            "build_it.check shows a short failing program.",
            "你的部件（{names}）还没准备好（{why}）：这个引擎暂时用引擎自带的部件。build_it.check 会给出一段很短的失败程序。"),
}


def engine(parts, *, quiet: bool = False, **options):
    """An engine built with the learner's ``parts`` (a ``minillm.seams.EngineParts``), for the
    widgets: a short program is run on it first; if it breaks (a stub, an exception, a broken
    invariant) this says why in one sentence and returns the engine with its own parts instead,
    so every cell after it still runs. ``options``: ``LLM`` options (default: the CPU, a pool
    of 64 blocks of 4 tokens, as the widgets draw it)."""
    from ...llm import LLM
    from ...seams import EngineParts

    lang = resolve(None)
    opts = {"device": "cpu", "block_size": 4, "num_kv_blocks": 64, **options}
    names = ", ".join(f.name for f in fields(parts) if getattr(parts, f.name) is not None) or "-"
    try:
        trial = LLM(parts=parts, **opts)
        call = safecall.call(P.run, trial, SMOKE, timeout=RUN_TIMEOUT)
        why = P.Why.of("raised", error=call.error) if not call.ok else P.compare(call.value, P.run(LLM(**opts), SMOKE))
    except Exception as exc:  # noqa: BLE001 - e.g. a block_pool whose constructor raises
        why = P.raised(exc)
    if why is None:
        llm = LLM(parts=parts, **opts)
        key = "mine"
    else:
        llm = LLM(parts=EngineParts(), **opts)
        key = "own"
        why = "NotImplementedError" if "NotImplementedError" in why else why.text(lang)
    if not quiet:
        print(ENGINE_MESSAGES[key][lang == "zh"].format(names=names, why=why))
    return llm


def _reset(llm) -> None:
    llm.requests.clear()
    llm.clear_trace()


class _Runner:
    """Runs programs on a learner's engine and on the reference, rebuilding the learner's after
    a failure (its state may be anything then) and remembering the reference's outcomes."""

    def __init__(self, parts, reference_parts, forbid=(), prepare=None):
        self.parts, self.reference_parts = parts, reference_parts
        self.forbid, self.prepare = tuple(forbid), prepare
        self.mine = None
        self.timed_out = False

    def _reference(self, program) -> P.Outcome:
        key = (repr(self.reference_parts), tuple(program))
        if key not in _ENGINES:
            eng = _ENGINES.setdefault(("engine", repr(self.reference_parts)), small_engine(self.reference_parts))
            _reset(eng)
            _ENGINES[key] = P.run(eng, program)
            _reset(eng)
        return _ENGINES[key]

    def failure(self, program) -> P.Why | None:
        if self.mine is None:
            self.mine = small_engine(self.parts)
            if self.prepare is not None:
                self.prepare(self.mine)
        _reset(self.mine)
        call = safecall.call(P.run, self.mine, program, timeout=RUN_TIMEOUT, forbid=self.forbid)
        if call.timed_out:
            self.timed_out, self.mine = True, None
            return "timeout"
        if not call.ok:  # the engine's own answer reached (engine_guard), or the engine raised outside the program
            self.mine = None
            return P.Why.pair(call.error, call.error_zh)
        mine = call.value
        why = P.compare(mine, self._reference(program))
        if why is not None:
            self.mine = None
        return why


def run_programs(m: Marks, parts, reference_parts, *, sampling=False, failures=True, seed=0,
                 n=N_PROGRAMS, code_parts="", name="", forbid=(), prepare=None) -> bool:
    """Seeded programs on both engines; on the first failure, shrink it and show it. True if all pass.
    ``forbid``: engine functions the learner's part must not reach (``engine_guard``);
    ``prepare(llm)``: applied to each new engine of the learner's (e.g. to block the engine's own step)."""
    runner = _Runner(parts, reference_parts, forbid, prepare)
    rng = random.Random(seed)
    for i in range(n):
        program = P.random_program(rng, PROGRAM_LENGTH, sampling=sampling, failures=failures)
        why = runner.failure(program)
        if why is None:
            continue
        if "NotImplementedError" in why:
            raise NotAttempted(_t("en", "stub", name=name), _t("zh", "stub", name=name))
        if runner.timed_out:
            m.wrong(_t(m.lang, "timeout", s=RUN_TIMEOUT))
            return False
        small = P.ddmin(program, lambda p: runner.failure(p) is not None and not runner.timed_out)
        final = runner.failure(small) or why
        text = final.text(m.lang) if isinstance(final, P.Why) else str(final)
        m.wrong(_t(m.lang, "program_failed", i=i + 1, n=n, why=text, before=len(program), after=len(small)))
        code = P.as_code(small, code_parts)
        m.program = f"{m.program}\n\n{code}" if m.program else code
        return False
    m.ok(_t(m.lang, "programs_ok", n=n))
    return True


# --- part (a): the state machine's legal moves ---------------------------------------------
def grade_moves(table, m: Marks) -> None:
    from ...request import TRANSITIONS, RequestState
    from ...seams import EngineParts

    if not isinstance(table, dict):
        m.wrong(_t(m.lang, "not_dict", type=type(table).__name__))
        return
    if table is TRANSITIONS:
        m.wrong(_t(m.lang, "engine_own", name="MY_TRANSITIONS", what=_WHAT["a"][m.lang == "zh"]))
        return
    extra = []
    for old in RequestState:
        allowed = {str(s) for s in table.get(old, ())}
        for new in sorted(allowed - {s.value for s in TRANSITIONS[old]}):
            extra.append(f"{old.value} → {new}: {_edge_why(old.value, new, m.lang)}")
    if extra:
        m.wrong(_t(m.lang, "extra_edges"))
        for line in extra[:6]:
            m.wrong(line)
        _show_lax_move(table, m)
    else:
        m.ok(_t(m.lang, "no_extra"), 1)
    if run_programs(m, EngineParts(transitions=table), EngineParts(), seed=11,
                    code_parts="EngineParts(transitions=MY_TRANSITIONS)", name="MY_TRANSITIONS"):
        m.score += 2


_ADD = "r = llm.add_request(prompt_token_ids=[5, 6, 7], request_id='r0'"
_ONE = "params=SamplingParams(max_tokens={n}, ignore_eos=True)"
LAX_SETUP = {  # a few lines that bring request r to each state (PREEMPTED needs a crowd: none)
    "NEW": ["r = llm.new_request(prompt_token_ids=[5, 6, 7], request_id='r0')"],
    "WAITING": [_ADD + ")"],
    "PREFILL": ["r = llm.add_request(prompt_token_ids=list(range(5, 25)), request_id='r0')",
                "llm.step()"],
    "DECODE": [_ADD + ", " + _ONE.format(n=5) + ")", "llm.step()"],
    "FINISHED": [_ADD + ", " + _ONE.format(n=1) + ", auto_release=False)", "llm.step()"],
    "RELEASED": [_ADD + ", " + _ONE.format(n=1) + ")", "llm.step()"],
}


def _show_lax_move(table, m: Marks) -> None:
    """For the first move the diagram lacks that a few lines can reach, run those lines on an
    engine guarded by the learner's table and, if the wrong move passes, show them."""
    from ...params import SamplingParams
    from ...request import TRANSITIONS, RequestState
    from ...seams import EngineParts

    states = {s.value for s in RequestState}
    for old in RequestState:
        for new in sorted({str(s) for s in table.get(old, ())} - {s.value for s in TRANSITIONS[old]}):
            if old.value not in LAX_SETUP or new not in states:
                continue
            note = "没有报错：这个 bug 不会被发现" if m.lang == "zh" else "no error: the bug goes unnoticed"
            lines = LAX_SETUP[old.value] + [f"r.move_to(S.{new}, MY_TRANSITIONS)   # {note}"]
            ns = {"llm": small_engine(EngineParts(transitions=table)), "SamplingParams": SamplingParams,
                  "S": RequestState, "MY_TRANSITIONS": table}
            call = safecall.call(exec, "\n".join(lines[:-1]), ns, timeout=RUN_TIMEOUT)
            if not call.ok or ns.get("r") is None or ns["r"].state != old:
                continue
            if not safecall.call(exec, lines[-1], ns, timeout=RUN_TIMEOUT).ok:
                continue
            m.wrong(_t(m.lang, "lax_demo", old=old.value, new=new))
            m.program = "\n".join(["llm = build_it.small_engine(EngineParts(transitions=MY_TRANSITIONS))", *lines])
            return


# --- part (b): a block pool with reference counts ------------------------------------------
def grade_pool(cls, m: Marks) -> None:
    from ...seams import EngineParts

    if not isinstance(cls, type):
        m.wrong(_t(m.lang, "not_class", name="MyBlockPool", type=type(cls).__name__))
        return
    from ...kv_cache import BlockAllocator
    from ...seams import RefCountPool

    if issubclass(cls, (RefCountPool, BlockAllocator)):
        m.wrong(_t(m.lang, "engine_own", name="MyBlockPool", what=_WHAT["b"][m.lang == "zh"]))
        return
    probe = safecall.call(lambda: cls(4).num_free())
    if probe.not_implemented:
        raise NotAttempted(_t("en", "stub", name="MyBlockPool"), _t("zh", "stub", name="MyBlockPool"))
    if run_programs(m, EngineParts(block_pool=cls), EngineParts(), seed=22,
                    code_parts="EngineParts(block_pool=MyBlockPool)", name="MyBlockPool"):
        m.score += 3


# --- part (c): one engine step --------------------------------------------------------------
_WHAT = {"a": ("transition table (request.TRANSITIONS)", "转移表（request.TRANSITIONS）"),
         "b": ("pool (or a subclass of it)", "块池（或它的子类）")}


def _block_own_step(llm) -> None:
    """The engine's own step is unavailable to a learner's engine (the task is to write it)."""
    from ..messages import both

    en, _zh = both("call.engine_used", name="LLM._step_once")

    def blocked(*args, **kwargs):
        raise RuntimeError(en)

    llm._step_once = blocked

def grade_step(fn, m: Marks) -> None:
    from ...seams import EngineParts

    if not callable(fn) or isinstance(fn, type):
        m.wrong(_t(m.lang, "not_function", name="my_step", type=type(fn).__name__))
        return
    if run_programs(m, EngineParts(step=fn), EngineParts(), seed=33, failures=False,
                    code_parts="EngineParts(step=my_step)", name="my_step", prepare=_block_own_step):
        m.score += 3


# --- part (d): top-k and top-p -----------------------------------------------------------
TOP_K_CASES = [([2.0, 1.0, 0.0], 1), ([0.5, 3.0, 1.0, 2.0], 2), ([1.0, 2.0, 3.0], 3), ([1.0, 2.0, 3.0], 5),
               ([0.1, -1.0, 4.0, 2.5, 2.0, -3.0], 3)]
FORBID_D = ("minillm.sampler:top_k_filter", "minillm.sampler:top_p_filter", "minillm.sampler:sorted_filters")
TOP_P_CASES = [([2.0, 1.0, 0.0], 0.5), ([0.0, 3.0, 1.0], 0.99), ([1.0, 1.5, 0.2, 0.7], 0.6), ([3.0, 0.0], 0.01),
               ([0.3, -1.0, 2.0, 1.2, 0.0, 0.9], 0.8), ([1.0, 0.0, 2.0], 1.0)]


def _check_cases(m: Marks, fn, name: str, cases, engine_fn, arg: str) -> bool:
    import torch

    for logits, x in cases:
        given = torch.tensor(logits)
        out = safecall.call(fn, given.clone(), x, forbid=FORBID_D + (WHOLE_ENGINE,))  # alone: no engine code
        label = f"{arg}={x}"
        if out.not_implemented:
            raise NotAttempted(_t("en", "stub", name=name), _t("zh", "stub", name=name))
        if not out.ok:
            m.wrong(_t(m.lang, "case_raised", name=name, logits=logits, arg=label, error=out.describe(m.lang)))
            return False
        want = engine_fn(given.clone(), x)
        got = out.value
        if not isinstance(got, torch.Tensor) or got.shape != given.shape:
            m.wrong(_t(m.lang, "case_shape", name=name, want=list(given.shape),
                       got=getattr(got, "shape", type(got).__name__)))
            return False
        kept, kept_ref = ~torch.isneginf(got.float()), ~torch.isneginf(want)
        if not torch.equal(kept, kept_ref):
            m.wrong(_t(m.lang, "case_failed", name=name, logits=logits, arg=label,
                       got=kept.nonzero().flatten().tolist(), want=kept_ref.nonzero().flatten().tolist()))
            return False
        if not torch.allclose(got.float()[kept], given[kept]):
            m.wrong(_t(m.lang, "case_values", name=name, logits=logits, arg=label))
            return False
    m.ok(_t(m.lang, "cases_ok", name=name, n=len(cases)), 1)
    return True


def grade_filters(pair, m: Marks) -> None:
    from ...sampler import top_k_filter, top_p_filter
    from ...seams import EngineParts

    top_k, top_p = pair
    for fn, name in ((top_k, "my_top_k_filter"), (top_p, "my_top_p_filter")):
        if not callable(fn):
            m.wrong(_t(m.lang, "not_function", name=name, type=type(fn).__name__))
            return
    ok_k = _check_cases(m, top_k, "my_top_k_filter", TOP_K_CASES, top_k_filter, "k")
    ok_p = _check_cases(m, top_p, "my_top_p_filter", TOP_P_CASES, top_p_filter, "p")
    if ok_k and ok_p and run_programs(
            m, EngineParts(top_k_filter=top_k, top_p_filter=top_p),
            EngineParts(top_k_filter=top_k_filter, top_p_filter=top_p_filter), seed=44, sampling=True,
            failures=False, code_parts="EngineParts(top_k_filter=my_top_k_filter, top_p_filter=my_top_p_filter)",
            name="my_top_k_filter", forbid=FORBID_D):
        m.score += 1


# --- the track ---------------------------------------------------------------------------
PARTS = {
    "build_a_moves": Exercise("build_a_moves", "Build (a) · the state machine's legal moves", "§1 + §6", "MY_TRANSITIONS",
                              3, grade_moves, kind="engine", title_zh="动手 (a) · 状态机的合法转移"),
    "build_b_pool": Exercise("build_b_pool", "Build (b) · a block pool with reference counts", "§3 + §6", "MyBlockPool",
                             3, grade_pool, kind="engine", title_zh="动手 (b) · 带引用计数的块池"),
    "build_c_step": Exercise("build_c_step", "Build (c) · one engine step", "§2 + §5 + §6", "my_step",
                             3, grade_step, kind="engine", title_zh="动手 (c) · 引擎的一步"),
    "build_d_filters": Exercise("build_d_filters", "Build (d) · top-k and top-p", "§4", "my_top_k_filter, my_top_p_filter",
                                3, grade_filters, kind="engine", title_zh="动手 (d) · top-k 与 top-p"),
}

METHODS = {  # the method in words, shown on request (the code is under tests/solved/build_it.py)
    "build_a_moves": (
        "Read the edges off the lifecycle: NEW → WAITING or FINISHED; WAITING → PREFILL or FINISHED; PREFILL → "
        "PREFILL (next chunk), DECODE, WAITING (a failed step undone), PREEMPTED or FINISHED; DECODE → PREEMPTED or "
        "FINISHED; PREEMPTED → PREFILL or FINISHED; FINISHED → RELEASED; RELEASED → nothing.",
        "照生命周期图读出每条边：NEW → WAITING 或 FINISHED；WAITING → PREFILL 或 FINISHED；PREFILL → PREFILL（下一块）、"
        "DECODE、WAITING（失败的一步被撤销）、PREEMPTED 或 FINISHED；DECODE → PREEMPTED 或 FINISHED；PREEMPTED → "
        "PREFILL 或 FINISHED；FINISHED → RELEASED；RELEASED → 无。"),
    "build_b_pool": (
        "Keep a list of free ids and a count per block. allocate(n): pop n ids, set each count to 1. share(b): count "
        "+1. free(ids): count -1 for each; a block whose count reaches 0 goes back on the free list (and only then). "
        "num_free(): the free list's length; ref_count(b): its count.",
        "维护一个空闲块列表和每块一个计数。allocate(n)：弹出 n 个块，计数设为 1。share(b)：计数加 1。free(ids)：每块计数"
        "减 1，减到 0 的块（且只有这时）放回空闲列表。num_free()：空闲列表长度；ref_count(b)：它的计数。"),
    "build_c_step": (
        "batch = llm.scheduler.schedule(); finish every request in batch.context_full with CONTEXT_FULL; if the batch "
        "is not empty: logits = llm.runner.run(decodes, prefills, prefill_chunks), then sample one token for "
        "batch.sampled only (a prefill chunk that does not end the prompt gets none), then "
        "scheduler.update_from_output (stop checks, finish, release). Return the batch.",
        "batch = llm.scheduler.schedule()；把 batch.context_full 里的请求以 CONTEXT_FULL 结束；batch 不空时："
        "logits = llm.runner.run(decodes, prefills, prefill_chunks)，只为 batch.sampled 采样（没走完 prompt 的 prefill "
        "块不采样），再调用 scheduler.update_from_output（停止检查、结束、释放）。返回 batch。"),
    "build_d_filters": (
        "top-k: find the k-th largest logit and set every logit below it to -inf (k <= 0 or k >= vocabulary keeps "
        "all). top-p: sort descending, softmax, and drop a token when the probability ranked above it already "
        "reaches p (the first always stays); write -inf back in the original order.",
        "top-k：找到第 k 大的 logit，比它小的全部设为 -inf（k <= 0 或 k 不小于词表时全保留）。top-p：降序排序、softmax，"
        "排在某 token 之前的概率之和已达到 p 时去掉它（第一个总保留）；按原顺序写回 -inf。"),
}


@dataclass
class Verdict:
    """A Result plus the shrunk failing program (if any), shown as code under the card."""

    result: Result
    program: str | None = None

    @property
    def passed(self) -> bool:
        return self.result.passed

    def __str__(self) -> str:
        return str(self.result) + (f"\n\n{self.program}" if self.program else "")

    __repr__ = __str__

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(str(self))

    def _repr_html_(self) -> str:
        code = (f"<pre style='background:#f6f8fa;padding:6px 10px;margin:2px 0 4px 14px;font-size:12px;"
                f"white-space:pre-wrap'>{html.escape(self.program)}</pre>" if self.program else "")
        return self.result._repr_html_() + code


def resolve_part(part: str) -> str:
    key = str(part).strip().lower()
    hits = [k for k in PARTS if key in (k, k.split("_")[1]) or (len(key) > 1 and k.startswith(key))]
    if len(hits) != 1:
        raise KeyError(f"part must be one of a, b, c, d (or {', '.join(PARTS)}), got {part!r}")
    return hits[0]


def check(part: str, answer=None, *, namespace: dict | None = None, lang: str | None = None) -> Verdict:
    """Check one part (``"a"`` … ``"d"``): its answer is read from the notebook by name (part d
    reads both filters) unless given."""
    from ..registry import _user_namespace

    try:
        ex = PARTS[resolve_part(part)]
    except KeyError as exc:  # a typo in the part's name is feedback, not a traceback
        from ..result import ERROR, Feedback

        return Verdict(Result(str(part), "unknown part", 0, 0, ERROR, [Feedback("wrong", exc.args[0])]))
    if answer is None:
        ns = namespace if namespace is not None else _user_namespace()
        names = [n.strip() for n in ex.answer_name.split(",")]
        values = tuple(ns.get(n) for n in names)
        answer = values[0] if len(values) == 1 else (None if None in values else values)
    box = {}
    grader = ex.grader

    def run(ans, marks):
        marks.program = None
        try:
            grader(ans, marks)
        finally:
            box["program"] = marks.program

    result = grade(Exercise(ex.id, ex.title, ex.section, ex.answer_name, ex.max_score, run, kind=ex.kind,
                            title_zh=ex.title_zh), answer, resolve(lang))
    return Verdict(result, box.get("program"))


def show_method(part: str):
    """The method of one part in words (recorded in the notebook, like ``show_solution``)."""
    from ...i18n import get_language
    from ..solutions import _Shown

    ex_id = resolve_part(part)
    return _Shown(ex_id, METHODS[ex_id][1 if get_language() == "zh" else 0], get_language())
