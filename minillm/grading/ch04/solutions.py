"""Chapter 04's model answers, shown only on request (``show_solution``, see :mod:`..solutions`).

For the coding tasks the "solution" is the method in words, not code: the reference code is
kept out of the installed package (it lives under ``tests/solved/``). Inside the grader's jail
this file is replaced by :mod:`.._blind_solutions`, so a submission finds no model answers.
"""

from __future__ import annotations

MODEL_ANSWERS = {  # exercise id -> (English, Chinese)
    "task1_diagram": ("WAITING (prompt ids, params; no KV) → PREFILL (KV blocks for the prompt, a batch slot) → DECODE "
                      "(its KV blocks, one more token per step; loops on itself) → FINISHED (stop reason; blocks still "
                      "held) → RELEASED (nothing: blocks back in the pool). Bonus: DECODE → WAITING on preemption, "
                      "and a cancel edge that ends in RELEASED.",
                      "入队 WAITING（prompt token、采样参数；还没有 KV）→ 预填充 PREFILL（整段 prompt 的 KV 块、一个 batch "
                      "槽位）→ 解码 DECODE（自己的 KV 块，每步多一个 token；自环）→ 完成 FINISHED（停止原因；块还占着）"
                      "→ 释放 RELEASED（什么都不占：块回到池中）。附加：显存不够时 DECODE → WAITING（抢占），以及一条以 "
                      "RELEASED 结束的取消边。"),
    "task2_kv_explain": ("It keeps the keys and values of tokens already processed, so decode computes only the new "
                         "token; the price is memory that grows with context and with live requests.",
                         "它保存已处理 token 的 key 和 value，decode 只需计算新 token，避免重复计算；代价是显存占用随上下文"
                         "长度和活跃请求数增长。"),
    "task3_pressure": ("Long context (every prompt token keeps its K/V), high concurrency (every live request holds its "
                       "own cache at once), long outputs (each generated token adds K/V and the request holds it longer).",
                       "长上下文（每个 prompt token 都保留自己的 K/V）；高并发（每个活跃请求同时各占一份缓存）；长输出"
                       "（每生成一个 token 就多一份 K/V，而且请求占得更久）。"),
    "task3_kv_bytes": ("requests × (prompt tokens + output tokens) × 2 (K and V) × layers × KV heads × head_dim × 4 "
                       "bytes; the engine reports whole blocks of block_size tokens per request.",
                       "请求数 × (prompt token 数 + 输出 token 数) × 2（K 和 V）× 层数 × KV 头数 × head_dim × 4 字节；"
                       "引擎按每个请求整块（每块 block_size 个 token）报告。"),
    "task4_sampling": ("The sampled token is appended to the request's history, and the next decode step is computed "
                       "from that history, so each choice steers all later steps; its parameters travel with the request.",
                       "采样选出的 token 会追加到请求的历史上下文中，下一步 decode 基于这段历史计算，所以每次选择都决定"
                       "之后的走向；采样参数随请求一起携带。"),
    "code_top_p": ("Sort the logits, take the softmax, and keep a token while the probability mass ranked above it is "
                   "still below top_p (the first token always stays); set the rest to -inf in the original order.",
                   "把 logits 排序并做 softmax；排在一个 token 之前的概率总和仍小于 top_p 时就保留它（第一个 token 总是保留），"
                   "其余位置按原顺序设为 -inf。"),
    "code_kv_bytes": ("Every token stores one key and one value per layer and per KV head, each head_dim numbers of "
                      "dtype_bytes bytes: multiply the five factors.",
                      "每个 token 在每一层、每个 KV 头上各存一个 key 和一个 value，每个是 head_dim 个数、每个数 "
                      "dtype_bytes 字节：把这五个因子乘起来。"),
    "code_stop_check": ("Check in order: EOS (unless ignore_eos) or a stop token id; a stop string in the text; "
                        "max_tokens output tokens; prompt plus output filling the context.",
                        "按顺序检查：EOS（除非 ignore_eos）或 stop token id；文本中出现停止字符串；输出达到 max_tokens；"
                        "prompt 加输出填满上下文。"),
}


def model_answer(ex_id: str, lang: str) -> str:
    """The model answer of exercise ``ex_id`` (a full id) in ``lang``; KeyError when it has none."""
    from .texts import PITFALLS, QUIZ

    if ex_id in MODEL_ANSWERS:
        return MODEL_ANSWERS[ex_id][1 if lang == "zh" else 0]
    for p in PITFALLS:
        if p.id == ex_id:
            return f"{'True' if p.truth else 'False'}. {p.why(lang)}"
    for q in QUIZ:
        if q.id == ex_id:
            return f"{q.answer}. {q.options[q.answer].why(lang)}"
    raise KeyError(ex_id)


def model_texts() -> list[str]:
    """Every model answer, both languages, and the pitfalls' reasons (copy detection)."""
    from .texts import PITFALLS

    out = [s for pair in MODEL_ANSWERS.values() for s in pair]
    return [s for s in out + [t for p in PITFALLS for t in (p.why.en, p.why.zh)] if s]
