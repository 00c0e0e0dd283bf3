"""Chapter 04's feedback lines, in English and Chinese, under one key: the code graders
(top-p, KV bytes, the stop check, the long chat, the byte count run on the engine) and the
lifecycle diagram. They join the machinery's table (:mod:`..messages`) when this chapter is
imported, so ``msg("top_p.all", n=11)`` finds them like any other key.
"""

from __future__ import annotations

from ...i18n import Bi as B
from ..messages import MESSAGES

CHAPTER_MESSAGES: dict[str, B] = {
    # --- code_top_p -----------------------------------------------------------------------------------
    "top_p.not_tensor": B("{case}: return a tensor of filtered logits, got {type}",
                          "{case}：应返回过滤后的 logits 张量，得到的是 {type}"),
    "top_p.shape": B("{case}: the result has shape {got}, expected {want} (same as the logits)",
                     "{case}：结果的形状是 {got}，应为 {want}（与 logits 相同）"),
    "top_p.mask": B("{case}: you return a mask; return the logits with removed entries set to -inf",
                    "{case}：你返回的是掩码；应返回 logits，并把去掉的位置设为 -inf"),
    "top_p.probs": B("{case}: you return probabilities; return the logits, with the removed entries set to -inf "
                     "(the kept entries stay unchanged)",
                     "{case}：你返回的是概率；应返回 logits，把去掉的位置设为 -inf（保留的位置原样不变）"),
    "top_p.keep": B("{case}: you keep {got}, the engine keeps {want}", "{case}：你保留了 {got}，引擎保留了 {want}"),
    "top_p.keep_row": B("{n} token(s) {ids}", "{n} 个 token {ids}"),
    "top_p.keep_rows": B("{n} tokens (per row: {rows})", "{n} 个 token（每行：{rows}）"),
    "top_p.changed": B("{case}: the kept entries changed; leave kept logits as they are (no softmax, no "
                       "renormalising) and set only the removed ones to -inf",
                       "{case}：保留的位置被改动了；保留的 logits 应原样不动（不做 softmax、不重新归一化），"
                       "只把去掉的位置设为 -inf"),
    "top_p.in_place": B("your function changes the input tensor in place; the engine's filters return a new tensor",
                        "你的函数原地修改了输入张量；引擎的过滤函数返回的是一个新张量"),
    "top_p.all": B("all {n} cases match minillm.sampler.top_p_filter (random rows, batches, top_p=1, tiny top_p, "
                   "-inf entries, one-token vocabulary, ties, huge logits)",
                   "全部 {n} 个用例与 minillm.sampler.top_p_filter 一致（随机行、批量、top_p=1、极小的 top_p、"
                   "已有 -inf、只有一个 token 的词表、并列、超大的 logits）"),
    "top_p.some": B("{passed} of {n} cases match minillm.sampler.top_p_filter",
                    "{n} 个用例中有 {passed} 个与 minillm.sampler.top_p_filter 一致"),
    "top_p.rule": B("rule: sort by probability, keep the smallest prefix whose probability adds up to at least "
                    "top_p — a token is kept when the mass ranked above it is still below top_p",
                    "规则：按概率从大到小排序，保留累计概率至少达到 top_p 的最短前缀——排在一个 token 之前的"
                    "概率总和仍小于 top_p 时，它就保留"),
    # --- code_kv_bytes --------------------------------------------------------------------------------
    "kv.int": B("return an int: a byte count is a whole number", "请返回 int：字节数是整数"),
    "kv.mismatch": B("{case} (layers={layers}, kv_heads={heads}, head_dim={dim}, dtype_bytes={nbytes}): "
                     "you get {got:,}, the engine {want:,}",
                     "{case}（layers={layers}，kv_heads={heads}，head_dim={dim}，dtype_bytes={nbytes}）："
                     "你算出 {got:,}，引擎是 {want:,}"),
    "kv.factor2": B("you are off by a factor 2: every token stores a key AND a value",
                    "差了 2 倍：每个 token 既要存 key，也要存 value"),
    "kv.elements": B("you count elements, not bytes: multiply by dtype_bytes", "你数的是元素个数，不是字节：还要乘以 dtype_bytes"),
    "kv.layers": B("every layer has its own K and V: multiply by num_layers", "每一层都有自己的 K 和 V：还要乘以 num_layers"),
    "kv.heads": B("each KV head stores its own head_dim numbers: multiply by num_kv_heads",
                  "每个 KV 头各存 head_dim 个数：还要乘以 num_kv_heads"),
    "kv.all": B("all {n} model shapes match minillm.kv_cache.kv_bytes_per_token",
                "全部 {n} 种模型形状与 minillm.kv_cache.kv_bytes_per_token 一致"),
    "kv.some": B("{passed} of {n} model shapes match minillm.kv_cache.kv_bytes_per_token",
                 "{n} 种模型形状中有 {passed} 种与 minillm.kv_cache.kv_bytes_per_token 一致"),
    "kv.scale": B("for scale: Llama-3-8B needs {per:,} bytes per token, so one 8,192-token context holds "
                  "{gib:.0f} GiB of KV cache",
                  "量级参考：Llama-3-8B 每个 token 需要 {per:,} 字节，一段 8,192 个 token 的上下文就要 "
                  "{gib:.0f} GiB 的 KV 缓存"),
    # --- code_stop_check ------------------------------------------------------------------------------
    "stop.bad_return": B("return a StopReason or None, got {value!r}", "应返回 StopReason 或 None，得到的是 {value!r}"),
    "stop.strings": B("return StopReason members (StopReason.EOS), not strings",
                      "请返回 StopReason 的成员（如 StopReason.EOS），而不是字符串"),
    "stop.expected": B("{case}: expected {want}, got {got}", "{case}：应为 {want}，得到的是 {got}"),
    "stop.keep_going": B("None (keep going)", "None（继续生成）"),
    "stop.all": B("all {n} cases agree with the engine's stop semantics, including the order EOS → stop string → "
                  "max_tokens → context full",
                  "全部 {n} 个用例与引擎的停止语义一致，包括检查顺序 EOS → 停止字符串 → max_tokens → 上下文已满"),
    "stop.some": B("{passed} of {n} cases agree with the engine's stop semantics",
                   "{n} 个用例中有 {passed} 个与引擎的停止语义一致"),
    # --- task3_kv_bytes (run on the engine) -----------------------------------------------------------
    "bytes.bad_answer": B("task3_kv_bytes should be your function scenario_kv_bytes(num_requests, prompt_tokens, "
                          "output_tokens) or a dict {{scenario name: bytes}}, got {type}",
                          "task3_kv_bytes 应该是你的函数 scenario_kv_bytes(num_requests, prompt_tokens, "
                          "output_tokens)，或一个字典 {{场景名: 字节数}}，得到的是 {type}"),
    "bytes.hidden": B("right on the printed scenarios but not on {n} of {total} fresh ones, e.g. {r} request(s) × "
                      "({p} + {o}) tokens: got {got}, the engine stores {want} bytes. The function must compute the "
                      "bytes, not look them up; no points for it",
                      "对公开的场景正确，但 {total} 个新场景中有 {n} 个不对，例如 {r} 个请求 × ({p} + {o}) 个 token："
                      "得到 {got}，引擎存的是 {want} 字节。函数要真正计算字节数，而不是查表；这道题不得分"),
    "bytes.no_numbers": B("task3_kv_bytes has no numbers yet", "task3_kv_bytes 还没有数字"),
    "bytes.no_engine": B("the engine could not be loaded to run the scenarios ({error})",
                         "无法加载引擎来运行这些场景（{error}）"),
    "bytes.busy": B("the grading engine is busy with other requests", "评分用的引擎正忙于其他请求"),
    "bytes.too_long": B("the model's context ({n} tokens) is too short for this scenario",
                        "模型的上下文（{n} 个 token）对这个场景来说太短"),
    "bytes.unclean": B("the scenario did not run cleanly (preempted or stopped early)",
                       "这个场景没有顺利跑完（被抢占或提前停止）"),
    "bytes.none": B("{name}: no number given", "{name}：没有给出数字"),
    "bytes.not_number": B("{name}: expected a number of bytes, got {type}", "{name}：应为字节数，得到的是 {type}"),
    "bytes.exact": B("{name}: {v:,} bytes — exactly what cache_stats().used_bytes reports (whole blocks of "
                     "{block} tokens)",
                     "{name}：{v:,} 字节——正是 cache_stats().used_bytes 报告的数（按每块 {block} 个 token 整块计）"),
    "bytes.per_token": B("{name}: {v:,} bytes is right per token; the engine reports {used:,} because it hands out "
                         "whole blocks of {block} tokens",
                         "{name}：按 token 计 {v:,} 字节是对的；引擎报告 {used:,}，因为它按每块 {block} 个 token "
                         "整块分配"),
    "bytes.wrong": B("{name}: you get {v:,} bytes, the engine reports {used:,} ({bpt:,} bytes per token, blocks of "
                     "{block} tokens)",
                     "{name}：你算出 {v:,} 字节，引擎报告 {used:,}（每个 token {bpt:,} 字节，每块 {block} 个 token）"),
    "bytes.factor2": B("off by a factor 2: count both K and V", "差了 2 倍：K 和 V 都要算"),
    "bytes.one_request": B("this is one request's worth: {n} requests each hold their own cache",
                           "这只是一个请求的量：{n} 个请求各自持有自己的缓存"),
    "bytes.fp32": B("the engine runs in fp32 on the CPU: 4 bytes per number", "引擎在 CPU 上以 fp32 运行：每个数 4 字节"),
    "bytes.waste": B("{name}: {waste:.0%} of the reserved blocks' room is empty — each of the {n} short requests "
                     "leaves its last block partly unused (chapter 05: paged attention and block size)",
                     "{name}：预留的块里有 {waste:.0%} 的空间是空的——{n} 个短请求各自的最后一块都没有用满"
                     "（第 05 章：paged attention 与块大小）"),
    # --- code_chat_kv ---------------------------------------------------------------------------------
    "chat.mismatch": B("{case}: you get {got:,.0f} bytes, the request holds {want:,}",
                       "{case}：你算出 {got:,.0f} 字节，这个请求实际占 {want:,}"),
    "chat.reply": B("count the reply too: its tokens' K and V are in the cache by the end of the turn",
                    "回复也要算上：到这一轮结束时，回复里每个 token 的 K 和 V 也在缓存中"),
    "chat.system": B("every turn re-sends the system prompt: it is part of each request",
                     "每一轮都会重新发送系统提示：它是每个请求的一部分"),
    "chat.fewer": B("with keep_last=N, early turns have fewer than N earlier turns to keep",
                    "keep_last=N 时，前几轮之前还不到 N 轮可以保留"),
    "chat.k_minus_1": B("at turn k there are k - 1 earlier turns, not k", "第 k 轮之前有 k - 1 轮，而不是 k 轮"),
    "chat.all": B("all {n} cases agree: at turn k one request holds the system prompt, the re-sent history, the new "
                  "message and its reply, {bpt:,} bytes per token on the shipped model",
                  "全部 {n} 个用例一致：第 k 轮的请求占有系统提示、重新发送的历史、新消息和它的回复，"
                  "随附模型每个 token {bpt:,} 字节"),
    "chat.some": B("{passed} of {n} cases agree", "{n} 个用例中有 {passed} 个一致"),
    # --- task1_diagram --------------------------------------------------------------------------------
    "dia.unreadable": B("{error}", "无法读取这张图：{error}"),
    "dia.empty": B("the diagram is still empty: add states and transitions", "状态图还是空的：请添加状态和转移"),
    "dia.state": B("{role} state: {names}", "{role} 状态：{names}"),
    "dia.no_queue": B("no queue state: the request goes from {names} straight on; in an engine it waits in a queue "
                      "(WAITING / QUEUED / 入队) until the scheduler admits it",
                      "没有排队状态：请求从 {names} 直接往下走；在引擎里，它要在队列中等待（WAITING / QUEUED / 入队），"
                      "直到调度器接纳它"),
    "dia.merged_release": B("RELEASED state: {names} finishes and releases in one step (the chapter's 完成释放)",
                            "释放状态：{names} 一步完成并释放（章节中的“完成释放”）"),
    "dia.two_moments": B("§6 treats 'the logic is done' and 'the resources are back' as two moments; drawing "
                         "FINISHED → RELEASED apart shows where a leak would sit",
                         "第 6 节把“逻辑完成”和“资源归还”看作两个时刻；把 FINISHED → RELEASED 分开画，"
                         "能看出泄漏会出在哪里"),
    "dia.no_state": B("no state for {role} (named e.g. {role})", "缺少状态：{role}（可以这样命名）"),
    "dia.unknown_state": B("state {name!r} matches none of the chapter's states; it is kept as an intermediate step",
                           "状态 {name!r} 不对应章节中的任何状态，作为中间步骤保留"),
    "dia.path": B("path {src} → {dst}", "路径 {src} → {dst}"),
    "dia.wrong_way": B("the edge between {src} and {dst} points the wrong way: a request waits, then is prefilled",
                       "{src} 与 {dst} 之间的边方向反了：请求先排队等待，再预填充"),
    "dia.no_admit": B("no transition leads from {src} to {dst} (the scheduler admits the request)",
                      "没有从 {src} 到 {dst} 的转移（调度器接纳请求）"),
    "dia.decode_first": B("{dec} comes before {pre}: prefill builds the state that decode continues from",
                          "{dec} 出现在 {pre} 之前：decode 是在 prefill 建立的状态上继续的"),
    "dia.no_first_token": B("no transition leads from {src} to {dst} (after the first token the request is active)",
                            "没有从 {src} 到 {dst} 的转移（生成第一个 token 之后请求进入活跃状态）"),
    "dia.loops": B("{names} loops (one token per iteration)", "{names} 有循环（每轮一个 token）"),
    "dia.no_loop": B("{names} has no loop: decode runs once per generated token, so draw {d} → {d} or "
                     "{d} → SAMPLE → {d}",
                     "{names} 没有循环：每生成一个 token 就要解码一次，请画出 {d} → {d} 或 {d} → SAMPLE → {d}"),
    "dia.stops": B("a stop condition leads from {dec} to {fin}", "满足停止条件时从 {dec} 进入 {fin}"),
    "dia.no_stop": B("no transition leaves {dec} for {fin} when a stop condition is met (EOS, max_tokens, stop string)",
                     "满足停止条件（EOS、max_tokens、停止字符串）时，没有从 {dec} 到 {fin} 的转移"),
    "dia.merged_ends": B("{names} ends the request (finish, then release)", "{names} 结束了请求（先完成，再释放）"),
    "dia.fin_before_rel": B("{fin} comes before {rel}", "{fin} 在 {rel} 之前"),
    "dia.rel_before_fin": B("{rel} comes before {fin}: the request's logic finishes first (the stop reason is "
                            "known), then its resources are released",
                            "{rel} 出现在 {fin} 之前：请求先在逻辑上完成（停止原因已知），然后才释放资源"),
    "dia.rel_back": B("{rel} leads back to {fin}: a released request is over", "{rel} 又回到了 {fin}：已释放的请求已经结束"),
    "dia.no_release": B("no transition from {fin} to {rel}: after finishing, the engine frees the request's KV blocks",
                        "没有从 {fin} 到 {rel} 的转移：完成之后，引擎要释放请求的 KV 块"),
    "dia.rel_onward": B("{name} leads on to {names}; a released request holds nothing and goes nowhere",
                        "{name} 还通向 {names}；已释放的请求什么都不占，也不会再去任何地方"),
    "dia.notes_ok": B("every state says what it holds", "每个状态都写明了它占有什么"),
    "dia.notes_contradict": B("every state has a note, but the notes above contradict what the engine does",
                              "每个状态都有说明，但上面的说明与引擎的行为矛盾"),
    "dia.notes_missing": B("no resource note on: {names} — say what each state holds (prompt tokens, KV blocks, a "
                           "batch slot, nothing…)",
                           "这些状态没有资源说明：{names}——请写明每个状态占有什么（prompt token、KV 块、batch 槽位、"
                           "什么都没有……）"),
    "dia.decode_kv": B("the decode state's note names the KV cache it holds", "解码状态的说明写到了它占有的 KV 缓存"),
    "dia.decode_no_kv": B("{names}'s note should say it holds KV blocks (the cache grows by one token per step)",
                          "{names} 的说明应写明它占有 KV 块（缓存每步增长一个 token）"),
    "dia.waiting_kv": B("{name}: a waiting request holds no KV block yet — blocks are allocated when it is scheduled",
                        "{name}：等待中的请求还没有 KV 块——被调度时才分配"),
    "dia.released_kv": B("{name}: a released request holds nothing — its KV blocks are back in the pool",
                         "{name}：已释放的请求什么都不占——它的 KV 块已回到池中"),
    "dia.decoding_no_kv": B("{name}: a decoding request does hold KV blocks — it reads them at every step",
                            "{name}：解码中的请求确实占有 KV 块——每一步都要读取它们"),
    "dia.preempt": B("preemption: {names} returns to the queue (blocks freed, recomputed later)",
                     "抢占：{names} 回到队列（释放块，之后重算）"),
    "dia.preempt_edge": B("preemption: a labelled edge sends the request back to be recomputed",
                          "抢占：一条带标签的边把请求送回去重算"),
    "dia.preempt_stuck": B("(optional) {names} has no way back: a preempted request returns to WAITING and is "
                           "recomputed",
                           "（可选）{names} 没有回去的路：被抢占的请求要回到 WAITING，之后重算"),
    "dia.no_preempt": B("(optional, +1) no preemption: when KV blocks run out, a running request is sent back to WAITING",
                        "（可选，+1）没有抢占：KV 块不够时，运行中的请求会被送回 WAITING"),
    "dia.cancel_leak": B("(optional) the cancel path from {names} never reaches {rel}: memory would not drop (chapter "
                         "scenario: the cancel stopped at the API layer)",
                         "（可选）从 {names} 出发的取消路径到不了 {rel}：显存不会降下来（章节场景：取消停在了 API 层）"),
    "dia.cancel": B("cancel: {names} can be cancelled, and the blocks are released", "取消：{names} 可以被取消，并且会释放块"),
    "dia.no_cancel": B("(optional, +1) no transition leaves {names} when the request is cancelled",
                       "（可选，+1）请求被取消时，没有离开 {names} 的转移"),
}

MESSAGES.update(CHAPTER_MESSAGES)
