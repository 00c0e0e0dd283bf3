"""``task6_gpu_capacity``: how many requests fit in a GPU's memory (显存), by the learner's formula.

The answer is a function ``max_requests(num_layers, num_kv_heads, head_dim, num_params, card_gb,
context_tokens, kv_dtype_bytes=2)``. It is compared with ``minillm.viz.kv_capacity`` (the engine's
bytes-per-token formula, the card's budget, whole blocks of 16 tokens) on the published shapes
of Llama-3-8B, Qwen2.5-7B and Qwen3-0.6B on 24 / 80 / 141 GB cards, at several context lengths,
in bf16 and FP8, and on a card the weights alone do not fit. A wrong count names the case and,
where the ratio gives it away, the likely slip (K and V, GB vs GiB, the 90 %, the weights).
"""

from __future__ import annotations

import random
from collections import Counter

from ..cases import CaseRun, engine_piece
from .coding import FORBIDDEN
from ...i18n import Bi
from ..registry import Marks, register

UTILIZATION, WEIGHT_BYTES, BLOCK = 0.9, 2, 16
# (model, card GB, context tokens, KV bytes per number)
CASES = [
    ("Llama-3-8B", 80, 8192, 2), ("Llama-3-8B", 24, 8192, 2), ("Llama-3-8B", 141, 32768, 2),
    ("Llama-3-8B", 80, 8192, 1), ("Qwen2.5-7B", 24, 4096, 2), ("Qwen2.5-7B", 80, 1000, 2),
    ("Qwen3-0.6B", 24, 8192, 2), ("Qwen3-0.6B", 141, 40960, 1), ("Llama-3-8B", 16, 2048, 2),
]

def fresh_cases(seed: int | None = None, n: int = 2) -> list[tuple]:
    """``n`` cases drawn from the run's seed (never printed before grading): a published model,
    a card, a context length and a KV width."""
    from ..cases import run_seed

    rng = random.Random((run_seed() if seed is None else seed) ^ 0xCA9A)
    models = sorted({case[0] for case in CASES})
    return [(rng.choice(models), rng.choice((16, 24, 40, 48, 80, 141)), rng.randint(256, 65536), rng.choice((1, 2)),
             "fresh") for _ in range(n)]


T = {
    "case": Bi("{model} on {card} GB, {ctx} tokens, KV {kv} byte(s) per number",
               "{model}，{card} GB 的卡，每个请求 {ctx} 个 token，KV 每个数 {kv} 字节"),
    "not_number": Bi("{case}: expected a whole number of requests, got {got!r}",
                     "{case}：应返回请求个数（整数），得到的是 {got!r}"),
    "mismatch": Bi("{case}: got {got}, the engine's arithmetic gives {want}",
                   "{case}：得到 {got}，按引擎的算法应是 {want}"),
    "all": Bi("all {n} cases match the calculator: the cache, not the weights, sets how many requests fit",
              "{n} 个用例全部与计算器一致：决定能同时放下多少请求的是缓存，而不是权重"),
    "some": Bi("{passed} of {n} cases match", "{n} 个用例中有 {passed} 个一致"),
    "hint.kv": Bi("hint: one token stores both K and V: 2 x layers x kv_heads x head_dim x bytes",
                  "提示：一个 token 要存 K 和 V 两份：2 × 层数 × KV 头数 × head_dim × 字节数"),
    "hint.gib": Bi("hint: a card's GB here is 10^9 bytes (card_gb * 10**9), not 2^30",
                   "提示：这里卡的 GB 指 10^9 字节（card_gb * 10**9），不是 2^30"),
    "hint.util": Bi("hint: the engine may use 90% of the card: 0.9 * card_gb * 10**9 before the weights",
                    "提示：引擎最多用卡上 90% 的显存：先算 0.9 * card_gb * 10**9，再减去权重"),
    "hint.weights": Bi("hint: the weights come first: num_params x 2 bytes (bf16) leave the card before the cache",
                       "提示：先扣掉权重：num_params × 2 字节（bf16），剩下的才给缓存"),
    "hint.blocks": Bi("hint: a request takes whole blocks of 16 tokens: round the context up to a multiple of 16",
                      "提示：请求按 16 个 token 一块整块占用：把上下文向上取整到 16 的倍数"),
    "hint.none": Bi("hint: when the weights alone do not fit, no request fits: return 0, not a negative number",
                    "提示：权重本身都放不下时，一个请求也放不下：返回 0，而不是负数"),
}


def _reference(shape, card_gb: float, context: int, kv_bytes: int, *, util=UTILIZATION, gb=10**9,
               weights=True, blocks=True, kv_factor=2) -> int:
    """The count under the task's assumptions; the keywords undo one of them (to name a slip)."""
    per_token = kv_factor * shape.num_layers * shape.num_kv_heads * shape.head_dim * kv_bytes
    tokens = -(-context // BLOCK) * BLOCK if blocks else context
    budget = int(card_gb * gb * util) - (shape.num_params * WEIGHT_BYTES if weights else 0)
    return max(budget, 0) // (tokens * per_token)


def _slips(shape, card, ctx, kv, got) -> list[str]:
    """Every single slip that would give ``got`` in this case."""
    if got < 0:
        return ["hint.none"]
    found = []
    for key, change in (("hint.kv", {"kv_factor": 1}), ("hint.gib", {"gb": 2**30}), ("hint.util", {"util": 1.0}),
                        ("hint.weights", {"weights": False}), ("hint.blocks", {"blocks": False})):
        other = _reference(shape, card, ctx, kv, **change)
        if other == got and other != _reference(shape, card, ctx, kv):
            found.append(key)
    return found


def _load_calculator():
    from minillm.viz import kv_capacity

    return kv_capacity


@register("task6_gpu_capacity", "Task 6 · how many requests fit in GPU memory", "§3 KV cache (显存)", 3,
          answer_name="max_requests", kind="code", title_zh="任务 6 · 显存里放得下多少个请求")
def grade_gpu_capacity(fn, m: Marks) -> None:
    calc = engine_piece(m, fn, "max_requests", "minillm.viz.kv_capacity", _load_calculator)
    if calc is None:
        return
    def args(case):
        model, card, ctx, kv = case[:4]
        shape = calc.PUBLISHED[model]
        return shape.num_layers, shape.num_kv_heads, shape.head_dim, shape.num_params, card, ctx, kv

    hints = Counter()
    run = CaseRun(fn, CASES + fresh_cases(), args, name="max_requests", label=lambda case: T["case"](
        m.lang, model=case[0], card=case[1], ctx=case[2], kv=case[3]), forbid=FORBIDDEN["max_requests"],
                  fresh=lambda case: len(case) > 4)
    for (model, card, ctx, kv, *_), case, _, got in run:
        shape = calc.PUBLISHED[model]
        want = calc.capacity(shape, card, ctx, kv_dtype=kv, block_size=BLOCK, utilization=UTILIZATION).max_requests
        if isinstance(got, bool) or not isinstance(got, (int, float)) or got != int(got):
            run.fail(T["not_number"](m.lang, case=case, got=got))
            continue
        if int(got) == want:
            run.passed()
            continue
        run.fail(T["mismatch"](m.lang, case=case, got=int(got), want=want))
        hints.update(_slips(shape, card, ctx, kv, int(got)))
    run.report(m, 3, T["all"](m.lang, n=run.total), T["some"](m.lang, passed=run.passes, n=run.total))
    most = max(hints.values(), default=0)
    for h in sorted(h for h, n in hints.items() if n == most):  # the slip that explains the most cases
        m.info(T[h](m.lang))
