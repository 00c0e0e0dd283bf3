"""The reference answers of the chapter 04 exercises (each must grade to full marks).

They live here, under tests/, not in the installed ``minillm`` package and not in the tree
the course lab serves: ``python scripts/build_exercises.py`` reads them from this file
to write the solved notebook next to it.
"""

SOLVED_DIAGRAM = '''task1_diagram = {
    "states": {
        "NEW": "the prompt text and its SamplingParams; nothing on the device",
        "WAITING": "prompt token ids and sampling params in the queue; no KV block yet",
        "PREFILL": "KV blocks for the whole prompt, a batch slot, a budget of prompt tokens this step",
        "DECODE": "its KV blocks (one more token per step), a batch slot, the output token ids so far",
        "PREEMPTED": "token ids only: its KV blocks were freed, it will be recomputed",
        "FINISHED": "the stop reason and the output; its KV blocks are still held",
        "RELEASED": "nothing: the KV blocks are back in the pool, the stats are recorded",
    },
    "transitions": [
        ("NEW", "WAITING", "tokenize, enqueue"),
        ("WAITING", "PREFILL", "scheduled (blocks allocated)"),
        ("PREFILL", "DECODE", "first token sampled"),
        ("DECODE", "DECODE", "decode → sample → append to history"),
        ("DECODE", "PREEMPTED", "preempt: out of KV blocks"),
        ("PREEMPTED", "WAITING", "requeued"),
        ("DECODE", "FINISHED", "EOS / max_tokens / stop string / context full"),
        ("DECODE", "FINISHED", "cancel"),
        ("WAITING", "FINISHED", "cancel"),
        ("FINISHED", "RELEASED", "release: free blocks, record stats"),
    ],
}'''

SOLVED_ANSWERS = {
    "task1_diagram": SOLVED_DIAGRAM,
    "task2_kv_explain": 'task2_kv_explain = ("KV cache keeps past tokens\' keys/values so decode skips recomputing them, "\n'
                        '                    "but its memory grows.")',
    "task3_pressure": '''task3_pressure = [
    ("long context", "Every prompt token keeps its own keys and values in the cache, so a longer context "
                     "means more KV entries held by the request."),
    ("high concurrency", "Each live request holds its own KV blocks at the same time, so the total grows "
                         "with the number of requests."),
    ("long outputs", "Every generated token appends one more K/V entry per layer, and the request holds its "
                     "cache for more decode steps."),
]''',
    "task3_kv_bytes": '''def scenario_kv_bytes(num_requests, prompt_tokens, output_tokens):
    """Bytes of K and V the scenario's requests hold when they have all finished (before release)."""
    per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 4  # K and V, fp32
    return num_requests * (prompt_tokens + output_tokens) * per_token

task3_kv_bytes = scenario_kv_bytes''',
    "task4_sampling": '''task4_sampling = ("Sampling picks the token that is appended to the request's history, and the next decode "
                  "step is computed from that context, so the choice steers every later step; that is why "
                  "temperature and top-p travel with the request.")''',
    "quiz1_live_requests": 'quiz1_live_requests = ("B", "each request holds state and resources, KV blocks and a batch slot, until it is released")',
    "quiz2_kv_tradeoff": 'quiz2_kv_tradeoff = ("D", "it avoids recomputing the keys and values of past tokens, but that memory grows with tokens and requests")',
    "quiz3_sampling_interface": 'quiz3_sampling_interface = ("C", "the sampled token is appended to the history and every later step is computed from it")',
    "quiz4_states_before_batching": 'quiz4_states_before_batching = ("D", "a batch mixes requests in different states that change every step")',
    "pitfall1_kv_not_hit_cache": '''pitfall1_kv_not_hit_cache = (False, "It is execution state bound to each live request: the keys and "
                                     "values of that request's own tokens, not answers looked up by prompt.")''',
    "pitfall2_sampling_not_ui": '''pitfall2_sampling_not_ui = (False, "Sampling picks every token, and the picked token is appended to the "
                                    "history that the next step is computed from, so it changes the path.")''',
    "pitfall3_one_lifecycle": '''pitfall3_one_lifecycle = (True, "Prefill builds the request's KV cache, and decode continues from that "
                                  "same cache, one token per step.")''',
    "code_chat_kv": '''def chat_kv_bytes(turn, system_tokens, user_tokens, reply_tokens, bytes_per_token, keep_last=None):
    """KV bytes the request of turn `turn` (1, 2, …) holds once its reply is generated.
    keep_last=None re-sends the whole history; keep_last=N re-sends only the last N earlier turns."""
    earlier = turn - 1 if keep_last is None else min(turn - 1, keep_last)
    tokens = system_tokens + earlier * (user_tokens + reply_tokens) + user_tokens + reply_tokens
    return tokens * bytes_per_token''',
    "task5_trim_policy": '''task5_trim_policy = ("summary", "Keeping only the last N turns would drop turn 1, the exercise every later "
                              "turn refers to; a summary keeps its gist while the KV per turn stays bounded.")''',
    "code_top_p": '''import torch

def my_top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probabilities add up to at least top_p
    (always at least one); set every other logit to -inf. Works on [..., vocab]."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.softmax(dim=-1)
    mass_above = probs.cumsum(dim=-1) - probs        # probability of the tokens ranked higher
    remove_sorted = mass_above >= top_p              # enough mass above it: this token is not needed
    remove_sorted[..., 0] = False                    # the most likely token always stays
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, float("-inf"))''',
    "code_kv_bytes": '''def my_kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes of K and V that one token needs in the cache, across all layers."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes   # 2 = one key and one value''',
    "code_stop_check": '''from minillm import SamplingParams, StopReason

def my_check_stop(token_id, output_ids, text, params, eos_token_id, prompt_len, max_model_len):
    """Called right after token_id was sampled and appended; returns a StopReason or None."""
    if (token_id == eos_token_id and not params.ignore_eos) or token_id in params.stop_token_ids:
        return StopReason.EOS
    if any(s in text for s in params.stop_strings):
        return StopReason.STOP_STRING
    if len(output_ids) >= params.max_tokens:
        return StopReason.MAX_TOKENS
    if prompt_len + len(output_ids) >= max_model_len:
        return StopReason.CONTEXT_FULL
    return None''',
    "task6_gpu_capacity": '''def max_requests(num_layers, num_kv_heads, head_dim, num_params, card_gb, context_tokens, kv_dtype_bytes=2):
    """How many requests of context_tokens (prompt + output) fit at once in the KV cache of one GPU."""
    per_token = 2 * num_layers * num_kv_heads * head_dim * kv_dtype_bytes   # K and V, every layer
    tokens = -(-context_tokens // 16) * 16                                  # whole blocks of 16
    budget = int(0.9 * card_gb * 10**9) - 2 * num_params                    # 90% of the card minus bf16 weights
    return max(budget, 0) // (tokens * per_token)''',
    "quiz5_debug_by_request": 'quiz5_debug_by_request = ("B", "each request holds its KV blocks and state until it is released, so one that finished but still holds blocks shows up there")',
    "quiz6_key_table_decode": 'quiz6_key_table_decode = ("B", "decode takes one step per output token, so longer outputs mean more steps and the scheduler decides how they are batched")',
    "quiz7_scheduling_states": 'quiz7_scheduling_states = ("C", "the requests are in different states that change at every step")',
}

# The Chinese notebook's reference answers: the written ones in Chinese (each must grade to full
# marks with Chinese feedback); code is the same in both notebooks.
SOLVED_DIAGRAM_ZH = '''task1_diagram = {
    "states": {
        "进入请求": "prompt 文本和它的采样参数；设备上什么都不占",
        "入队": "队列里的 prompt token 与采样参数；还没有 KV 块",
        "预填充": "整段 prompt 的 KV 块、一个 batch 槽位、本步的 prompt token 预算",
        "解码": "自己的 KV 块（每步多一个 token）、一个 batch 槽位、已生成的输出 token",
        "被抢占": "只剩 token id：KV 块已被释放，之后要重算",
        "完成": "停止原因和输出；KV 块仍然占着",
        "释放": "什么都不占：KV 块已回到池中，统计已记录",
    },
    "transitions": [
        ("进入请求", "入队", "分词、入队"),
        ("入队", "预填充", "被调度（分配块）"),
        ("预填充", "解码", "采样出第一个 token"),
        ("解码", "解码", "解码 → 采样 → 追加到历史"),
        ("解码", "被抢占", "抢占：KV 块不够"),
        ("被抢占", "入队", "重新排队"),
        ("解码", "完成", "EOS / max_tokens / 停止字符串 / 上下文已满"),
        ("解码", "完成", "用户取消"),
        ("入队", "完成", "用户取消"),
        ("完成", "释放", "释放：归还块、记录统计"),
    ],
}'''

SOLVED_ANSWERS_ZH = {
    **SOLVED_ANSWERS,
    "task1_diagram": SOLVED_DIAGRAM_ZH,
    "task2_kv_explain": 'task2_kv_explain = "KV Cache 保存历史 token 的 K/V，decode 时无需重复计算；代价是显存占用随上下文和并发请求增长。"',
    "task3_pressure": '''task3_pressure = [
    ("长上下文", "每个 prompt token 都要在缓存里保留自己的 K 和 V，上下文越长，请求占用的 KV 越多。"),
    ("高并发", "每个活跃请求同时各自占着 KV 块，总占用随请求数增长。"),
    ("长输出", "每生成一个 token 就要在每一层多追加一份 K/V，而且请求占用缓存的时间更长。"),
]''',
    "task4_sampling": '''task4_sampling = ("采样选出的 token 会追加到请求的历史上下文中，下一步 decode 基于它继续计算，"
                  "所以每次选择都决定后续路径；这也是 temperature、top-p 要随请求携带的原因。")''',
    "quiz1_live_requests": 'quiz1_live_requests = ("B", "因为每个请求在释放之前都占着状态和资源：KV 块和 batch 槽位")',
    "quiz2_kv_tradeoff": 'quiz2_kv_tradeoff = ("D", "它避免重复计算历史 token 的键值，但显存占用随 token 数和请求数增长")',
    "quiz3_sampling_interface": 'quiz3_sampling_interface = ("C", "采样出的 token 会加入历史，后续每一步都基于它计算")',
    "quiz4_states_before_batching": 'quiz4_states_before_batching = ("D", "一个 batch 里混着状态各不相同的请求，而且状态每一步都在变化")',
    "pitfall1_kv_not_hit_cache": '''pitfall1_kv_not_hit_cache = (False, "它是绑定在每个活跃请求上的执行状态：保存的是该请求自身 token 的键值，"
                                     "不是按 prompt 查找的答案。")''',
    "pitfall2_sampling_not_ui": '''pitfall2_sampling_not_ui = (False, "采样选出每一个 token，选中的 token 会追加到历史上下文中，下一步基于它计算，"
                                    "所以它改变请求的推进路径。")''',
    "pitfall3_one_lifecycle": '''pitfall3_one_lifecycle = (True, "prefill 建立请求的 KV 缓存，decode 基于同一份缓存继续，每步一个 token。")''',
    "task5_trim_policy": '''task5_trim_policy = ("summary", "只保留最近 N 轮会丢掉第 1 轮的题目，而后面每一轮都要引用它；摘要能保留它的要点，"
                              "同时每轮的 KV 占用也有上限。")''',
    "task6_gpu_capacity": '''def max_requests(num_layers, num_kv_heads, head_dim, num_params, card_gb, context_tokens, kv_dtype_bytes=2):
    """一张 GPU 的 KV 缓存里，能同时放下多少个 context_tokens 个 token（提示 + 输出）的请求。"""
    per_token = 2 * num_layers * num_kv_heads * head_dim * kv_dtype_bytes   # K 和 V，每一层
    tokens = -(-context_tokens // 16) * 16                                  # 按 16 个 token 一块整块占用
    budget = int(0.9 * card_gb * 10**9) - 2 * num_params                    # 卡的 90% 减去 bf16 权重
    return max(budget, 0) // (tokens * per_token)''',
    "quiz5_debug_by_request": 'quiz5_debug_by_request = ("B", "每个请求在释放之前都占着 KV 块和状态，看它们就知道谁早该归还却没有归还")',
    "quiz6_key_table_decode": 'quiz6_key_table_decode = ("B", "decode 每个输出 token 一步，输出越长步数越多，调度决定这些步怎样合批")',
    "quiz7_scheduling_states": 'quiz7_scheduling_states = ("C", "请求处于不同的状态，而且每一步都在变化")',
}
