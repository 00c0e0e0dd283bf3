"""Random add / step / cancel programs, run on two engines, and the shrinking of a failing one.

The build-it grader checks a learner's part by running seeded random programs twice: on an
engine with the learner's part plugged in (``minillm.seams``) and on the same engine with the
engine's own part. After every action the engine's invariants must hold (every block's
reference count equals the number of block tables that hold it; a request that ended has a
stop reason and holds nothing); at the end every request must have ended with a stop reason,
no block may be left in use, and every request must have produced the same tokens and the
same stop reason on both engines.

The first failing program is shrunk (delta debugging: drop chunks of actions while it still
fails, then shorten what is left) and printed as the few lines of code that show the failure.
Both engines start each program from an empty pool with a pool that keeps nothing of earlier
programs (``seams.RefCountPool`` under ``PooledAllocator``), so a program's result depends
on the program alone.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field, replace

GRID = dict(block_size=4, num_kv_blocks=10, max_num_seqs=3, max_num_batched_tokens=12, max_model_len=48)
PREFIXES = ((), (5, 6, 7, 8), (5, 6, 7, 8, 9, 10, 11, 12))
MAX_DRAIN_STEPS = 300
STUCK_STEPS = 8


class InjectedFailure(Exception):
    """Raised on purpose in the model's forward pass (a failed step the engine must undo)."""


WHY = {  # what broke, in English and Chinese
    "queue": ("request {rid} is {state} but in neither the waiting nor the running queue: it vanished without a "
              "stop reason", "请求 {rid} 处于 {state}，却既不在等待队列也不在运行队列里：它没有停止原因就消失了"),
    "twice": ("request {rid} holds a block twice: {table}", "请求 {rid} 把同一个块持有了两次：{table}"),
    "no_reason": ("request {rid} is {state} without a stop reason", "请求 {rid} 处于 {state}，却没有停止原因"),
    "released_holds": ("request {rid} is RELEASED but still holds blocks {table}",
                       "请求 {rid} 已经 RELEASED，却还占着块 {table}"),
    "refcount": ("block {b}: ref_count is {count}, but {n} request(s) hold it ({who})",
                 "块 {b}：ref_count 是 {count}，但持有它的请求有 {n} 个（{who}）"),
    "num_free": ("num_free() is {free}, but {unheld} of {total} blocks are held by no request",
                 "num_free() 是 {free}，但 {total} 个块中有 {unheld} 个没有任何请求持有"),
    "stuck": ("the engine did not finish its requests: {n} steps in a row advanced none of them (still unfinished: "
              "{ids})", "引擎没能让请求结束：连续 {n} 步没有任何请求前进（仍未结束：{ids}）"),
    "too_long": ("the engine did not finish its requests in {n} steps (still unfinished: {ids})",
                 "引擎在 {n} 步内没能让请求结束（仍未结束：{ids}）"),
    "never_released": ("request {rid} FINISHED ({reason}) but was never RELEASED: it still holds blocks {table}",
                       "请求 {rid} 已 FINISHED（{reason}），却一直没有 RELEASED：它还占着块 {table}"),
    "ended": ("request {rid} ended {state} with stop reason {reason}", "请求 {rid} 结束时处于 {state}，停止原因 {reason}"),
    "leak": ("every request ended, but {n} blocks are still in use (a leak)",
             "所有请求都结束了，却还有 {n} 个块被占着（泄漏）"),
    "vanished": ("request {rid} vanished", "请求 {rid} 不见了"),
    "differs": ("request {rid}: your engine gave tokens {got} and stop reason {got_reason}{error}; the reference "
                "engine gave {want} and {want_reason}",
                "请求 {rid}：你的引擎生成的 token 是 {got}、停止原因 {got_reason}{error}；参考引擎是 {want} 和 {want_reason}"),
    "illegal": ("IllegalTransition: your table does not allow {old} -> {new} (request {rid})",
                "IllegalTransition：你的表不允许 {old} -> {new}（请求 {rid}）"),
    "raised": ("{error}", "{error}"),
}
_ILLEGAL = re.compile(r"request '(?P<rid>[^']*)': (?P<old>\w+) -> (?P<new>\w+) is not a legal transition")


class Why(str):
    """A finding: the English text (it is a ``str``), with ``.zh`` its Chinese twin."""

    zh: str = ""

    @classmethod
    def of(cls, key: str, **fields) -> "Why":
        en, zh = WHY[key]
        why = cls(en.format(**fields))
        why.zh = zh.format(**fields)
        return why

    @classmethod
    def pair(cls, en: str, zh: str | None) -> "Why":
        why = cls(en)
        why.zh = zh or en
        return why

    def text(self, lang: str) -> str:
        return self.zh if lang == "zh" and self.zh else str(self)


def raised(exc: BaseException) -> Why:
    """What the learner's code (or the engine around it) raised, as a finding."""
    m = _ILLEGAL.search(str(exc))
    if type(exc).__name__ == "IllegalTransition" and m:
        return Why.of("illegal", **m.groupdict())
    return Why.of("raised", error=f"{type(exc).__name__}: {exc}")


class Broken(Exception):
    """A program broke an invariant (or the learner's code raised): ``why`` says which."""

    def __init__(self, key: str, **fields):
        self.why = Why.of(key, **fields)
        super().__init__(str(self.why))


@dataclass(frozen=True)
class Add:
    prompt: tuple
    max_tokens: int
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0

    def line(self, i: int) -> str:
        extra = "" if self.temperature == 0 else (f", temperature={self.temperature}, seed={self.seed}"
                                                  + (f", top_k={self.top_k}" if self.top_k else "")
                                                  + (f", top_p={self.top_p}" if self.top_p < 1 else ""))
        return (f"llm.add_request(prompt_token_ids={list(self.prompt)}, request_id='r{i}', "
                f"params=SamplingParams(max_tokens={self.max_tokens}, ignore_eos=True{extra}))")


@dataclass(frozen=True)
class Step:
    n: int = 1

    def line(self, i: int) -> str:
        return "llm.step()" if self.n == 1 else f"for _ in range({self.n}): llm.step()"


@dataclass(frozen=True)
class Cancel:
    target: int  # the target-th request added so far (mod the number added)

    def line(self, i: int) -> str:
        return f"llm.cancel('r{i}')"


@dataclass(frozen=True)
class Drop:
    """A request created (NEW) and cancelled before it was ever queued."""

    def line(self, i: int) -> str:
        return f"llm.cancel(llm.new_request(prompt_token_ids=[5], request_id='r{i}').request_id)"


@dataclass(frozen=True)
class FailStep:
    """A step whose forward pass raises: the engine must undo it."""

    def line(self, i: int) -> str:
        return "build_it.failing_step(llm)   # a step whose forward pass raises"


def random_program(rng: random.Random, length: int, sampling: bool = False, failures: bool = True) -> list:
    """``length`` actions: adds of prompts that share prefixes (some long enough to prefill in
    chunks, some long enough to fill the pool), steps, cancels, dropped requests, failed steps."""
    kinds = ["add", "step", "cancel", "drop", "fail"] if failures else ["add", "step", "cancel"]
    weights = [5, 5, 2, 1, 1][:len(kinds)]
    out = []
    for _ in range(length):
        kind = rng.choices(kinds, weights)[0]
        if kind == "add":
            tail = tuple(rng.randrange(2, 300) for _ in range(rng.choice([1, 2, 3, 6, 14])))
            prompt = rng.choice(PREFIXES) + tail
            max_tokens = rng.choice([1, 2, 3, 5, 8, 8, 40])
            if sampling:
                out.append(Add(prompt, max_tokens, rng.choice([0.8, 1.0, 1.5]), rng.choice([0, 0, 2, 5, 40]),
                               rng.choice([1.0, 0.9, 0.6, 0.3]), rng.randrange(1 << 20)))
            else:
                out.append(Add(prompt, max_tokens))
        elif kind == "step":
            out.append(Step(rng.choice([1, 1, 2, 3])))
        elif kind == "cancel":
            out.append(Cancel(rng.randrange(8)))
        elif kind == "drop":
            out.append(Drop())
        else:
            out.append(FailStep())
    return out


def failing_step(llm) -> None:
    """One step whose forward pass raises in the model's first layer (the engine undoes it)."""
    layer = llm.model.model.layers[0]

    def boom(*args, **kwargs):
        raise InjectedFailure("injected")

    layer.forward = boom
    try:
        llm.step()
    except InjectedFailure:
        pass
    finally:
        del layer.forward


# --- running ----------------------------------------------------------------------------
@dataclass
class Outcome:
    """What a program gave: per request (tokens, stop reason), or the first broken invariant."""

    results: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)  # request id -> why the engine ended it (req.error)
    broken: Why | None = None
    at: int | None = None  # the action after which it broke (None: while draining)


def _holders(llm) -> dict[int, list[str]]:
    held: dict[int, list[str]] = {}
    for r in llm.requests.values():
        for b in r.block_table:
            held.setdefault(b, []).append(r.request_id)
    return held


def check_invariants(llm) -> None:
    """Raise Broken naming the first disagreement between the pool and the requests."""
    from ...request import LIVE_STATES, RequestState

    alloc = llm.kv_cache.allocator
    held = _holders(llm)
    queued = {r.request_id for r in llm.scheduler.waiting} | {r.request_id for r in llm.scheduler.running}
    for r in llm.requests.values():
        if r.state in LIVE_STATES and r.state != RequestState.NEW and r.request_id not in queued:
            raise Broken("queue", rid=r.request_id, state=r.state)
        if len(set(r.block_table)) != len(r.block_table):
            raise Broken("twice", rid=r.request_id, table=r.block_table)
        if r.state not in LIVE_STATES and r.stop_reason is None:
            raise Broken("no_reason", rid=r.request_id, state=r.state)
        if r.state == RequestState.RELEASED and r.block_table:
            raise Broken("released_holds", rid=r.request_id, table=r.block_table)
    for b in range(alloc.num_blocks):
        count, holders = alloc.ref_count[b], held.get(b, [])
        if count != len(holders):
            raise Broken("refcount", b=b, count=count, n=len(holders), who=", ".join(holders) or "-")
    free = alloc.num_free
    if free != alloc.num_blocks - len(held):
        raise Broken("num_free", free=free, unheld=alloc.num_blocks - len(held), total=alloc.num_blocks)


def _apply(llm, action, added: list[str], index: int) -> None:
    from ...params import SamplingParams

    if isinstance(action, Add):
        params = SamplingParams(max_tokens=action.max_tokens, temperature=action.temperature, top_k=action.top_k,
                                top_p=action.top_p, seed=action.seed, ignore_eos=True)
        llm.add_request(prompt_token_ids=list(action.prompt), params=params, request_id=f"r{index}")
        added.append(f"r{index}")
    elif isinstance(action, Step):
        for _ in range(action.n):
            llm.step()
    elif isinstance(action, Cancel):
        if added:
            llm.cancel(added[action.target % len(added)])
    elif isinstance(action, Drop):
        llm.cancel(llm.new_request(prompt_token_ids=[5], request_id=f"r{index}").request_id)
    else:
        failing_step(llm)


def _progress(llm) -> tuple:
    return tuple((r.state, r.num_computed_tokens, len(r.output_token_ids)) for r in llm.requests.values())


def _drain(llm) -> None:
    """Step until nothing is unfinished; Broken if that takes too long or nothing moves for
    ``STUCK_STEPS`` steps in a row (a step that advances no request will never finish)."""
    last, still = None, 0
    for _ in range(MAX_DRAIN_STEPS):
        if not llm.has_unfinished():
            return
        llm.step()
        check_invariants(llm)
        now = _progress(llm)
        still = still + 1 if now == last else 0
        last = now
        if still >= STUCK_STEPS:
            break
    unfinished = ", ".join(r.request_id for r in llm.requests.values() if r.is_live)
    if still >= STUCK_STEPS:
        raise Broken("stuck", n=STUCK_STEPS, ids=unfinished)
    raise Broken("too_long", n=MAX_DRAIN_STEPS, ids=unfinished)


def run(llm, program: list) -> Outcome:
    """Run ``program`` on ``llm`` (an engine with nothing in it), then step until every request
    ended. Never raises for what the engine's parts do: the first problem is the Outcome's."""
    out, added = Outcome(), []
    at = None
    try:
        for i, action in enumerate(program):
            at = i
            _apply(llm, action, added, i)
            check_invariants(llm)
        at = None
        _drain(llm)
        for r in llm.requests.values():
            if r.state.value == "FINISHED":
                raise Broken("never_released", rid=r.request_id, reason=r.stop_reason, table=r.block_table)
            if r.state.value != "RELEASED" or r.stop_reason is None:
                raise Broken("ended", rid=r.request_id, state=r.state, reason=r.stop_reason)
            out.results[r.request_id] = (list(r.output_token_ids), r.stop_reason.value)
            if r.error:
                out.errors[r.request_id] = r.error
        if llm.kv_cache.allocator.num_used:
            raise Broken("leak", n=llm.kv_cache.allocator.num_used)
    except Broken as exc:
        out.broken, out.at = exc.why, at
    except Exception as exc:  # noqa: BLE001 - the learner's part raised: that is the finding
        out.broken, out.at = raised(exc), at
    return out


def compare(mine: Outcome, ref: Outcome) -> Why | None:
    """The first difference between the learner's engine and the reference, or None."""
    if ref.broken:  # the reference itself broke: not the learner's fault (the grader's)
        raise RuntimeError(f"the reference engine broke an invariant: {ref.broken}")
    if mine.broken:
        return mine.broken
    for rid, (tokens, reason) in ref.results.items():
        got = mine.results.get(rid)
        if got is None:
            return Why.of("vanished", rid=rid)
        if got != (tokens, reason):
            error = f" ({mine.errors[rid]})" if rid in mine.errors else ""
            return Why.of("differs", rid=rid, got=got[0], got_reason=got[1], error=error, want=tokens,
                          want_reason=reason)
    return None


# --- shrinking ---------------------------------------------------------------------------
def ddmin(program: list, fails, budget: int = 80) -> list:
    """A shortest-possible sublist of ``program`` that still ``fails`` (Zeller's delta
    debugging, with a budget of ``budget`` trials), then each Add made smaller where it still fails."""
    trials = [0]

    def still(p):
        if trials[0] >= budget:
            return False
        trials[0] += 1
        return fails(p)

    n = 2
    while len(program) >= 2:
        chunk = max(1, len(program) // n)
        parts = [program[i:i + chunk] for i in range(0, len(program), chunk)]
        for i in range(len(parts)):
            rest = [a for j, part in enumerate(parts) if j != i for a in part]
            if rest and still(rest):
                program, n = rest, max(n - 1, 2)
                break
        else:
            if n >= len(program):
                break
            n = min(len(program), 2 * n)
    for i, a in enumerate(program):
        program = _shrink_add(program, i, still) if isinstance(a, Add) else program
        if isinstance(program[i], Step) and program[i].n > 1:
            smaller = program[:i] + [Step(1)] + program[i + 1:]
            program = smaller if still(smaller) else program
    return program


def _smaller_adds(a: Add):
    """Smaller versions of one Add: one output token, half the prompt (either end), half the output."""
    yield replace(a, max_tokens=1)
    if len(a.prompt) > 1:
        yield replace(a, prompt=a.prompt[len(a.prompt) // 2:])
        yield replace(a, prompt=a.prompt[:len(a.prompt) // 2])
    yield replace(a, max_tokens=max(1, a.max_tokens // 2))


def _shrink_add(program: list, i: int, still) -> list:
    """Make the Add at ``i`` smaller while the program still fails (until nothing smaller does)."""
    progress = True
    while progress:
        progress = False
        for smaller in _smaller_adds(program[i]):
            trial = program[:i] + [smaller] + program[i + 1:]
            if smaller != program[i] and still(trial):
                program, progress = trial, True
                break
    return program


def as_code(program: list, parts: str) -> str:
    """The program as lines a learner can paste into a cell to see the failure again."""
    lines = [f"llm = build_it.small_engine({parts})"]
    added = []
    for i, a in enumerate(program):
        if isinstance(a, Cancel):
            lines.append(Cancel(0).line(added[a.target % len(added)]) if added else "# (cancel: nothing added yet)")
            continue
        if isinstance(a, Add):
            added.append(i)
        lines.append(a.line(i))
    lines.append("build_it.finish(llm)   # step until every request ended, checking the invariants")
    return "\n".join(lines)
