"""The widgets' and plots' words: one phrase table per language. The language itself is the
course-wide setting of :mod:`minillm.i18n` (shared with the grader's feedback), re-exported here.

    from minillm.viz import set_language
    set_language("zh")          # every view made after this speaks Chinese
    RequestStepper(lang="en")   # ... except one that asks for English

Every view takes ``lang=None``; None means the course-wide setting (``get_language()``, "en"
until ``set_language`` is called, here or in ``minillm.grading``: it is one setting). The words
live in ``PHRASES``, one dict per language with the same keys, so a label is looked up, never
translated on the fly; the engine's own names (states such as WAITING or DECODE, stop reasons, ``SamplingParams``
fields) stay as the engine spells them in every language.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..i18n import LANGS as LANGUAGES
from ..i18n import get_language, pick, set_language
from ..i18n import resolve as resolve_lang

__all__ = ["LANGUAGES", "get_language", "set_language", "resolve_lang", "phrase", "PhraseMapping", "PHRASES"]


def phrase(key: str, lang=None, **fields) -> str:
    """The phrase ``key`` in ``lang`` (None: the course-wide language), with ``fields`` filled in."""
    text = pick(en=EN[key], zh=ZH[key], lang=lang)
    return text.format(**fields) if fields else text


class PhraseMapping(Mapping):
    """A read-only dict whose values are phrases in the course-wide language, looked up when
    read: ``STATE_HOLDS["WAITING"]`` is English or Chinese depending on ``set_language``.
    ``.in_language(lang)`` gives a plain dict in one language."""

    def __init__(self, keys: dict, lang=None):
        self._keys = dict(keys)   # mapping key -> phrase key
        self._lang = lang

    def __getitem__(self, key):
        return phrase(self._keys[key], self._lang)

    def __iter__(self):
        return iter(self._keys)

    def __len__(self):
        return len(self._keys)

    def in_language(self, lang=None) -> dict:
        return {k: phrase(v, lang) for k, v in self._keys.items()}

    def __repr__(self):
        return repr(self.in_language())


# Fonts. Token text can be Chinese in either edition, so every view carries a CJK fallback.
CJK_FONTS = ("Noto Sans CJK SC", "Source Han Sans SC", "PingFang SC", "Microsoft YaHei",
             "WenQuanYi Micro Hei")
_CJK_CSS = ", ".join(f'"{f}"' for f in CJK_FONTS)
#: CSS font-family for text: the notebook's own font first, then the Chinese fonts.
FONT_STACK = (f'var(--jp-content-font-family, system-ui, -apple-system, "Segoe UI", Roboto, Helvetica, '
              f'Arial), {_CJK_CSS}, sans-serif')
#: CSS font-family for token chips and logs: a monospace font, then Chinese fonts.
MONO_STACK = (f'var(--jp-code-font-family, Menlo, Consolas, "DejaVu Sans Mono"), "Noto Sans Mono CJK SC", '
              f'{_CJK_CSS}, monospace')
#: font-family for the lifecycle diagram's SVG text (graphviz writes Helvetica).
SVG_FONT_STACK = "Helvetica, Arial, " + ", ".join(f"'{f}'" for f in CJK_FONTS) + ", sans-serif"


# ---------------------------------------------------------------------------------------------
# The phrase tables: one per language, the same keys ({names} are filled in by the caller).
# ---------------------------------------------------------------------------------------------

EN: dict[str, str] = {
    # snapshots of widgets (_common.widget_bundle)
    "snap.note": "A snapshot: run the cell to use the buttons.",
    # the stepper's buttons and controls
    "btn.tokenize": "Tokenize",
    "btn.prefill": "Prefill",
    "btn.decode_one": "Decode one step",
    "btn.run_to_end": "Run to end",
    "btn.cancel": "Cancel",
    "btn.release": "Release",
    "btn.new": "New request",
    "ctl.prompt": "prompt",
    "ctl.top_k": "top-k (0=off)",
    "ctl.seed": "seed",
    "ctl.max_tokens": "max tokens",
    "ctl.request": "The request: prompt + SamplingParams",
    "ctl.actions": "Engine actions",
    "err.not_now": "{label} does not apply: the request is {state}",
    "err.tokenize_first": " (press Tokenize first)",
    # status line
    "st.line": "request {rid} · state {state} · KV blocks held {blocks} · engine step {step} · stop reason {reason}",
    "st.plain": "RequestStepper: request {rid} in {state} (run the cell to use the buttons)",
    "st.none_yet": "(none yet)",
    # engine events in words (describe_event)
    "ev.who": "request {rid}",
    "ev.created": "{who} created: NEW (prompt and SamplingParams validated, not tokenized yet)",
    "ev.waiting": "{who}: NEW -> WAITING, tokenized into {n} tokens and queued",
    "ev.prefill": "{who}: {frm} -> PREFILL, scheduled with {blocks} KV blocks{extra}",
    "ev.prefill_cached": ", {n} prompt tokens found in the prefix cache",
    "ev.decode": "{who}: PREFILL -> DECODE, the first token is out; from now on one token per step",
    "ev.preempted": "{who}: {frm} -> PREEMPTED, {blocks} blocks taken back (will be recomputed)",
    "ev.finished": "{who}: {frm} -> FINISHED, stop reason {reason}",
    "ev.released": "{who}: FINISHED -> RELEASED, {blocks} KV blocks back in the pool",
    "ev.token": "{who}: sampled output token #{index} = id {id}{text}{prob}",
    "ev.step": "engine step {step}: {prefill} prefill + {decode} decode, {n} tokens through the model; "
               "KV pool {used}/{total} blocks used",
    "ev.step_one": "engine step {step}: {prefill} prefill + {decode} decode, {n} token through the model; "
                   "KV pool {used}/{total} blocks used",
    # one sentence per action (summarize_action)
    "sum.tokenize": "the prompt became {n} token ids, the request waits in the queue (no KV block yet)",
    "sum.prefill": "one forward pass over {n} prompt tokens, {blocks} KV blocks allocated",
    "sum.prefill_steps": "{steps} forward passes (chunked prefill) over {n} prompt tokens, {blocks} KV blocks allocated",
    "sum.cached": "{n} more found in the prefix cache (not recomputed)",
    "sum.first": "first token {tok} sampled",
    "sum.decode": "one token in, one forward pass, output token #{index} {tok} sampled",
    "sum.run": "{steps} engine steps, {n} tokens sampled",
    "sum.cancel": "the request stops at once and its {blocks} KV blocks go back to the pool",
    "sum.release": "{blocks} KV blocks back in the pool",
    "sum.finished": "finished ({reason})",
    # the token view
    "tok.head": "Tokens",
    "tok.none": "Not tokenized yet: the prompt is still text. Press <b>Tokenize</b>.",
    "tok.counts": "Tokens: {n_in} prompt (blue) + {n_out} output (green, newest in amber)",
    "tok.so_far": "text so far:",
    "tok.prompt_tip": "prompt token id {id}",
    "tok.out_tip": "output token #{i}, id {id}",
    "tok.partial_tip": "part of a character (UTF-8 bytes)",
    "tok.invalid_tip": "bytes that are not valid UTF-8 (decoded as �)",
    "notice.bytes": "{chars} character(s) of this prompt ({sample}) are not in the tokenizer's vocabulary: "
                    "they became {n} raw byte tokens (shown as ‹E5 B0›), which the model has hardly seen in "
                    "training, so expect nonsense after them. The engine's mechanics are the same.",
    # next-token candidates
    "cand.head": "Next-token candidates",
    "cand.none": "No token sampled yet. The first one comes out of Prefill.",
    "cand.sampled": "★ sampled",
    "cand.token": "token",
    "cand.explain": "for output token #{index}: the model's probabilities (before temperature and filters) "
                    "and the token the sampler drew with {knobs}. That token is now part of the history.",
    # the KV pool
    "pool.head": "KV cache pool ({total} blocks × {size} tokens)",
    "pool.shared": " (shared)",
    "pool.tip_mine": "block {block}: entry {pos} of this request's block table{share}",
    "pool.tip_other": "block {block}: held by another request{share}",
    "pool.tip_cached": "block {block}: free, still holds a cached prefix",
    "pool.tip_free": "block {block}: free",
    "pool.leg_mine": "this request (number = position in its block table)",
    "pool.leg_other": "other requests",
    "pool.leg_cached": "free, prefix still cached",
    "pool.leg_free": "free",
    "pool.held": "this request holds <b>{blocks}</b> blocks = {slots} token slots ({filled} filled with K/V) = "
                 "<b>{bytes}</b> ({bpt} bytes per token)",
    "pool.total": "pool: {used} / {total} blocks in use, {used_bytes} of {total_bytes}",
    # timings
    "met.head": "Timings (from the engine's trace; stepping by hand, your pauses between clicks count too)",
    "met.line": "TTFT {ttft} · TPOT {tpot} · queue {queue} · end-to-end {e2e} · FINISHED→RELEASED {release} · "
                "output tokens {n}",
    # the "what just happened" panel
    "log.head_idle": "What happened",
    "log.nothing": "Nothing yet. In {state} a request holds: {holds}.",
    "log.head": "What “{label}” did in the engine",
    "log.not_admitted": "(the scheduler could not admit the request this step: no free slot, budget or blocks)",
    "log.no_events": "no events",
    "log.now": "Now {state}: holds {holds}.",
    "log.all": "all events of this request",
    # the lifecycle diagram
    "holds.NEW": "prompt text + SamplingParams; no tokens, no blocks",
    "holds.WAITING": "token ids, a place in the waiting queue; no KV blocks yet",
    "holds.PREFILL": "a batch slot and KV blocks for the whole prompt, being written this step",
    "holds.DECODE": "a batch slot and KV blocks that grow by one token per step",
    "holds.PREEMPTED": "its tokens only: blocks were taken back, the prompt + output will be recomputed",
    "holds.FINISHED": "a stop reason; its KV blocks until release",
    "holds.RELEASED": "nothing: blocks back in the pool, statistics recorded",
    "edge.NEW.WAITING": "tokenize + enqueue",
    "edge.NEW.FINISHED": "cancel",
    "edge.WAITING.PREFILL": "scheduled:\nblocks allocated",
    "edge.WAITING.FINISHED": "cancel",
    "edge.PREFILL.DECODE": "first token\nsampled",
    "edge.PREFILL.PREFILL": "next chunk\n(chunked prefill)",
    "edge.PREFILL.WAITING": "step interrupted:\nrolled back",
    "edge.PREFILL.PREEMPTED": "out of blocks",
    "edge.PREFILL.FINISHED": "stop / cancel",
    "edge.DECODE.PREEMPTED": "out of blocks:\nblocks freed",
    "edge.DECODE.FINISHED": "stop: EOS, max_tokens,\nstop string, cancel,\ncontext full",
    "edge.PREEMPTED.PREFILL": "re-admitted:\nrecompute",
    "edge.PREEMPTED.FINISHED": "cancel",
    "edge.FINISHED.RELEASED": "release:\nblocks back to pool",
    "edge.loop": "decode -> sample\n-> append token",
    "diag.tooltip": "{state}: holds {holds}",
    "diag.no_package": "The Python package <code>graphviz</code> is not installed (<code>pip install graphviz</code>); "
                       "the current state is <b>{state}</b>.",
    "diag.no_dot": "Graphviz's `dot` program was not found, so here is the diagram as DOT text. Install Graphviz "
                   "(e.g. `apt install graphviz`, `brew install graphviz` or `conda install graphviz`) to see "
                   "the picture.",
    # the sampling explorer
    "se.raw": "model (raw logits)",
    "se.greedy": "temperature 0: greedy (argmax)",
    "se.top_k": "top-k (k={k})",
    "se.top_k_off": "top-k (off)",
    "se.top_p": "top-p (p={p})",
    "se.top_p_off": "top-p (off)",
    "se.min_p": "min-p ({p})",
    "se.min_p_off": "min-p (off)",
    "se.summary": "kept {kept} tokens; top {top} p={p}",
    "se.removed": "removed",
    "se.tokens_left_row": "tokens left",
    "se.tokens_left": "{n} tokens left",
    "se.rank": " (rank {r})",
    "se.probability": "probability",
    "se.draws_title": "{n} draws, seed {seed}\nbar: share, |: probability",
    "se.draws_outside": "\n({k} drawn outside these tokens)",
    "se.draws": "draws",
    "se.btn_append": "Append sampled token",
    "se.btn_undo": "Undo",
    "se.btn_reset": "Reset",
    "se.btn_prompt": "Use this prompt",
    "se.plain": "SamplingExplorer: {line} (run the cell to use the sliders)",
    "se.context": "<b>Context</b> ({n} prompt tokens in blue, {m} sampled tokens in amber):",
    "se.step_col": "step (engine order)",
    "se.left_col": "tokens left",
    "se.would_sample": "The engine would sample {tok} (id {id}, p={p}, rank {rank} in the model's distribution) with "
                       "seed {seed} at this position. {button} puts it into the context: it becomes history, and "
                       "the next distribution is computed from it.",
    # the long-chat scenario (conversation.plot_chat_turns)
    "chat.tokens": "tokens",
    "chat.prompt": "prompt tokens sent this turn",
    "chat.prefill": "tokens through the model in prefill\n(prompt minus prefix-cache hits)",
    "chat.kv": "KV cache held by this turn's request",
    "chat.ttft": "TTFT (wall time: noisy; compare with the panel above)",
    "chat.turn": "turn",
    # plots (minillm.viz.plots)
    "plot.engine_step": "engine step",
    "plot.no_steps": "no steps in the trace yet",
    "plot.no_requests": "no requests in the trace yet",
    "plot.request": "request {rid}",
    "plot.req": "req {rid}",
    "plot.n_tok": " ({n} tok)",
    "kv.pool_line": "pool: used blocks x block bytes",
    "kv.formula_line": "formula: tokens x bytes/token",
    "kv.pool_size": "pool size ({n} blocks)",
    "kv.mark_cancel": "cancel {rid}",
    "kv.mark_release": "release {rid}",
    "kv.ylabel": "KV cache ({unit})",
    "kv.title": "KV cache over steps ({bpt} bytes/token, {bs} tokens/block)",
    "growth.none": "request {rid} holds no KV in this trace",
    "growth.formula": "formula: tokens x {bpt} B",
    "growth.measured": "measured: blocks x {bs} tokens x {bpt} B",
    "growth.xlabel": "tokens in the cache",
    "growth.ylabel": "KV bytes ({unit})",
    "growth.title": "request {rid}: KV grows with every token, a block at a time",
    "peaks.xlabel": "peak KV cache ({unit})",
    "peaks.title": "peak KV memory, measured on the engine",
    "states.title": "request states over engine steps",
    "states.relative": "steps since the run began",
    "steps.prefill": "prefill step",
    "steps.decode": "decode step",
    "steps.mixed": "mixed step",
    "steps.ylabel": "step duration (ms)",
    "steps.title": "how long each engine step took",
    "times.xlabel": "ms since the request was queued   (orange: waiting for the first token, | = a token)",
    "times.title": "token arrival times: TTFT, then one token per decode step",
    "lat.ttft": "TTFT: queued -> first token",
    "lat.tpot": "TPOT: mean gap between later tokens",
    "lat.xtick": "req {rid}\n{n} prompt tok",
    "lat.title": "time to first token vs time per output token",
    "pre.xlabel": "prompt tokens",
    "pre.ylabel": "prefill step (ms)",
    "pre.title": "one prefill step vs prompt length",
    "pre.per_token": "prefill: ms per prompt token",
    "pre.decode": "decode: ms per generated token (1 request)",
    "pre.ylabel2": "ms per token (log)",
    "pre.title2": "cost per token",
    "cvr.with": "with KV cache: one decode step",
    "cvr.without": "without: recompute the whole context",
    "cvr.xlabel": "tokens in the context",
    "cvr.ylabel": "ms for the next token",
    "cvr.title": "the next token's cost as the context grows",
    # CacheMonitor
    "mon.summary": "after step {step}: {used} of {total} blocks in use = {used} x {bs} tokens x {bpt} B = "
                   "{used_bytes} ({held} request(s) holding blocks, {tokens} tokens cached = {formula_bytes} "
                   "by the formula); {formula}",
    "mon.formula": "2 x {layers} layers x {heads} kv_heads x {dim} head_dim x {elem} bytes = {value} bytes per token",
    "mon.live": "{n} request(s) still to run: press Step.",
    "mon.idle": "Nothing left to run: every request has finished and been released. Press Add a request.",
    "mon.empty": "no engine step yet: add a request, then press Step",
    "mon.add": "Add a request",
    "mon.add_tip": "llm.add_request(): {n} prompt tokens, {m} output tokens",
    "mon.step": "Step",
    "mon.step_tip": "llm.step(), then refresh",
    "mon.step10": "Step x10",
    "mon.step10_tip": "ten llm.step() calls, then refresh",
    "mon.refresh": "Refresh",
    "mon.refresh_tip": "re-read the trace and cache_stats()",
}

ZH: dict[str, str] = {
    "snap.note": "这是一张快照：运行这个单元格后才能使用按钮。",
    "btn.tokenize": "分词",
    "btn.prefill": "预填充",
    "btn.decode_one": "解码一步",
    "btn.run_to_end": "运行到结束",
    "btn.cancel": "取消",
    "btn.release": "释放",
    "btn.new": "新请求",
    "ctl.prompt": "提示",
    "ctl.top_k": "top-k（0=关）",
    "ctl.seed": "随机种子",
    "ctl.max_tokens": "最多 token",
    "ctl.request": "请求：提示 + SamplingParams",
    "ctl.actions": "引擎操作",
    "err.not_now": "现在不能「{label}」：请求处于 {state}",
    "err.tokenize_first": "（请先按「分词」）",
    "st.line": "请求 {rid} · 状态 {state} · 占用 KV 块 {blocks} · 引擎步 {step} · 停止原因 {reason}",
    "st.plain": "RequestStepper：请求 {rid} 处于 {state}（运行单元格后才能使用按钮）",
    "st.none_yet": "（尚未创建）",
    "ev.who": "请求 {rid}",
    "ev.created": "{who} 已创建：NEW（提示与 SamplingParams 已校验，尚未分词）",
    "ev.waiting": "{who}：NEW -> WAITING，分词得到 {n} 个 token，进入等待队列",
    "ev.prefill": "{who}：{frm} -> PREFILL，被调度，分配 {blocks} 个 KV 块{extra}",
    "ev.prefill_cached": "，其中 {n} 个提示 token 命中前缀缓存",
    "ev.decode": "{who}：PREFILL -> DECODE，第一个 token 已产生；此后每步一个 token",
    "ev.preempted": "{who}：{frm} -> PREEMPTED，{blocks} 个块被收回（之后重新计算）",
    "ev.finished": "{who}：{frm} -> FINISHED，停止原因 {reason}",
    "ev.released": "{who}：FINISHED -> RELEASED，{blocks} 个 KV 块回到池中",
    "ev.token": "{who}：采样出输出 token #{index} = id {id}{text}{prob}",
    "ev.step": "引擎第 {step} 步：{prefill} 个预填充 + {decode} 个解码，{n} 个 token 过模型；KV 池已用 {used}/{total} 块",
    "ev.step_one": "引擎第 {step} 步：{prefill} 个预填充 + {decode} 个解码，{n} 个 token 过模型；KV 池已用 {used}/{total} 块",
    "sum.tokenize": "提示变成 {n} 个 token id，请求在队列中等待（还没有 KV 块）",
    "sum.prefill": "一次前向算完 {n} 个提示 token，分配 {blocks} 个 KV 块",
    "sum.prefill_steps": "分块预填充：{steps} 次前向算完 {n} 个提示 token，分配 {blocks} 个 KV 块",
    "sum.cached": "另有 {n} 个命中前缀缓存（不必重算）",
    "sum.first": "采样出第一个 token{tok}",
    "sum.decode": "输入一个 token，一次前向，采样出输出 token #{index}{tok}",
    "sum.run": "{steps} 个引擎步，采样出 {n} 个 token",
    "sum.cancel": "请求立即停止，它的 {blocks} 个 KV 块回到池中",
    "sum.release": "{blocks} 个 KV 块回到池中",
    "sum.finished": "已结束（{reason}）",
    "tok.head": "Token",
    "tok.none": "还没有分词：提示仍是一段文本。请按<b>分词</b>。",
    "tok.counts": "Token：{n_in} 个提示（蓝）+ {n_out} 个输出（绿，最新的为琥珀色）",
    "tok.so_far": "目前的文本：",
    "tok.prompt_tip": "提示 token id {id}",
    "tok.out_tip": "输出 token #{i}，id {id}",
    "tok.partial_tip": "一个汉字的一部分（UTF-8 字节）",
    "tok.invalid_tip": "不是合法 UTF-8 的字节（解码为 �）",
    "notice.bytes": "提示里有 {chars} 个字符（{sample}）不在分词器的词表中：它们被拆成 {n} 个原始字节 token"
                    "（显示为 ‹E5 B0›），模型在训练中几乎没见过，所以之后的生成多半没有意义。引擎的机制不变。",
    "cand.head": "下一个 token 的候选",
    "cand.none": "还没有采样任何 token。第一个 token 由预填充产生。",
    "cand.sampled": "★ 被采样",
    "cand.token": "token",
    "cand.explain": "输出 token #{index}：模型给出的概率（温度和过滤之前），以及采样器按 {knobs} 抽中的 token。"
                    "这个 token 现在已经成为历史的一部分。",
    "pool.head": "KV 缓存池（{total} 个块 × 每块 {size} 个 token）",
    "pool.shared": "（共享）",
    "pool.tip_mine": "块 {block}：本请求块表中的第 {pos} 项{share}",
    "pool.tip_other": "块 {block}：被其他请求占用{share}",
    "pool.tip_cached": "块 {block}：空闲，仍保存着可复用的前缀",
    "pool.tip_free": "块 {block}：空闲",
    "pool.leg_mine": "本请求（数字 = 在块表中的位置）",
    "pool.leg_other": "其他请求",
    "pool.leg_cached": "空闲，前缀仍在缓存中",
    "pool.leg_free": "空闲",
    "pool.held": "本请求占用 <b>{blocks}</b> 个块 = {slots} 个 token 槽位（其中 {filled} 个已写入 K/V）= "
                 "<b>{bytes}</b>（每个 token {bpt} 字节）",
    "pool.total": "整个池：已用 {used} / {total} 个块，{used_bytes} / {total_bytes}",
    "met.head": "耗时（来自引擎的 trace；手动单步时，你两次点击之间的停顿也算在内）",
    "met.line": "TTFT {ttft} · TPOT {tpot} · 排队 {queue} · 端到端 {e2e} · FINISHED→RELEASED {release} · "
                "输出 token {n} 个",
    "log.head_idle": "刚刚发生了什么",
    "log.nothing": "还什么都没发生。处于 {state} 的请求持有：{holds}。",
    "log.head": "「{label}」在引擎里做了什么",
    "log.not_admitted": "（调度器这一步没能接纳这个请求：没有空闲槽位、预算或块）",
    "log.no_events": "没有事件",
    "log.now": "现在处于 {state}，持有：{holds}。",
    "log.all": "这个请求的全部事件",
    "holds.NEW": "提示文本 + SamplingParams；没有 token，没有块",
    "holds.WAITING": "token id 和等待队列中的一个位置；还没有 KV 块",
    "holds.PREFILL": "一个批次槽位和容纳整个提示的 KV 块，本步正在写入",
    "holds.DECODE": "一个批次槽位和每步增长一个 token 的 KV 块",
    "holds.PREEMPTED": "只剩它的 token：块已被收回，提示 + 输出将被重新计算",
    "holds.FINISHED": "一个停止原因；释放之前仍占着它的 KV 块",
    "holds.RELEASED": "什么都没有：块已回到池中，统计已记录",
    "edge.NEW.WAITING": "分词 + 入队",
    "edge.NEW.FINISHED": "取消",
    "edge.WAITING.PREFILL": "被调度：\n分配块",
    "edge.WAITING.FINISHED": "取消",
    "edge.PREFILL.DECODE": "采样出\n第一个 token",
    "edge.PREFILL.PREFILL": "下一段\n（分块预填充）",
    "edge.PREFILL.WAITING": "本步中断：\n回滚",
    "edge.PREFILL.PREEMPTED": "块不够",
    "edge.PREFILL.FINISHED": "停止 / 取消",
    "edge.DECODE.PREEMPTED": "块不够：\n块被收回",
    "edge.DECODE.FINISHED": "停止：EOS、max_tokens、\n停止串、取消、\n上下文已满",
    "edge.PREEMPTED.PREFILL": "重新接纳：\n重算",
    "edge.PREEMPTED.FINISHED": "取消",
    "edge.FINISHED.RELEASED": "释放：\n块回到池中",
    "edge.loop": "解码 -> 采样\n-> 追加 token",
    "diag.tooltip": "{state} 持有：{holds}",
    "diag.no_package": "没有安装 Python 包 <code>graphviz</code>（<code>pip install graphviz</code>）；"
                       "当前状态是 <b>{state}</b>。",
    "diag.no_dot": "没有找到 Graphviz 的 `dot` 程序，下面是状态图的 DOT 文本。安装 Graphviz（例如 "
                   "`apt install graphviz`、`brew install graphviz` 或 `conda install graphviz`）后即可看到图。",

    "se.raw": "模型（原始 logits）",
    "se.greedy": "温度 0：贪心（argmax）",
    "se.top_k": "top-k（k={k}）",
    "se.top_k_off": "top-k（关）",
    "se.top_p": "top-p（p={p}）",
    "se.top_p_off": "top-p（关）",
    "se.min_p": "min-p（{p}）",
    "se.min_p_off": "min-p（关）",
    "se.summary": "保留 {kept} 个 token；最高 {top} p={p}",
    "se.removed": "已移除",
    "se.tokens_left_row": "剩余 token",
    "se.tokens_left": "剩 {n} 个 token",
    "se.rank": "（第 {r} 名）",
    "se.probability": "概率",
    "se.draws_title": "抽样 {n} 次，种子 {seed}\n条：占比，|：概率",
    "se.draws_outside": "\n（有 {k} 次抽到了这些 token 以外的）",
    "se.draws": "抽样次数",
    "se.btn_append": "追加采样的 token",
    "se.btn_undo": "撤销",
    "se.btn_reset": "重置",
    "se.btn_prompt": "使用这个提示",
    "se.plain": "SamplingExplorer：{line}（运行单元格后才能使用滑块）",
    "se.context": "<b>上下文</b>（{n} 个提示 token 为蓝色，{m} 个采样出的 token 为琥珀色）：",
    "se.step_col": "步骤（引擎顺序）",
    "se.left_col": "剩余 token",
    "se.would_sample": "在这个位置，引擎会用种子 {seed} 采样出 {tok}（id {id}，p={p}，在模型分布中排第 {rank} 名）。"
                       "{button} 会把它放进上下文：它成为历史，下一个分布由它算出。",
    "chat.tokens": "token 数",
    "chat.prompt": "本轮发送的提示 token",
    "chat.prefill": "预填充时真正过模型的 token\n（提示减去前缀缓存命中）",
    "chat.kv": "本轮请求占用的 KV 缓存",
    "chat.ttft": "TTFT（墙钟时间，有噪声；请对照上面的图）",
    "chat.turn": "轮次",
    "plot.engine_step": "引擎步",
    "plot.no_steps": "trace 里还没有引擎步",
    "plot.no_requests": "trace 里还没有请求",
    "plot.request": "请求 {rid}",
    "plot.req": "请求 {rid}",
    "plot.n_tok": "（{n} 个 token）",
    "kv.pool_line": "池：已用块数 × 每块字节",
    "kv.formula_line": "公式：token 数 × 每 token 字节",
    "kv.pool_size": "池容量（{n} 个块）",
    "kv.mark_cancel": "取消 {rid}",
    "kv.mark_release": "释放 {rid}",
    "kv.ylabel": "KV 缓存（{unit}）",
    "kv.title": "KV 缓存随引擎步的变化（每 token {bpt} 字节，每块 {bs} 个 token）",
    "growth.none": "这段 trace 里请求 {rid} 没有占用 KV",
    "growth.formula": "公式：token 数 × {bpt} B",
    "growth.measured": "实测：块数 × {bs} 个 token × {bpt} B",
    "growth.xlabel": "缓存中的 token 数",
    "growth.ylabel": "KV 字节（{unit}）",
    "growth.title": "请求 {rid}：KV 随每个 token 增长，按块分配",
    "peaks.xlabel": "KV 缓存峰值（{unit}）",
    "peaks.title": "KV 内存峰值（在引擎上实测）",
    "states.title": "请求状态随引擎步的变化",
    "states.relative": "从本次运行开始算起的引擎步",
    "steps.prefill": "预填充步",
    "steps.decode": "解码步",
    "steps.mixed": "混合步",
    "steps.ylabel": "每步耗时（ms）",
    "steps.title": "每个引擎步用了多久",
    "times.xlabel": "从请求入队起的毫秒数（橙色：等待第一个 token，| = 一个 token）",
    "times.title": "token 到达时间：先是 TTFT，之后每个解码步一个 token",
    "lat.ttft": "TTFT：入队 -> 第一个 token",
    "lat.tpot": "TPOT：后续 token 的平均间隔",
    "lat.xtick": "请求 {rid}\n{n} 个提示 token",
    "lat.title": "首 token 时间 vs 每个输出 token 的时间",
    "pre.xlabel": "提示 token 数",
    "pre.ylabel": "预填充一步（ms）",
    "pre.title": "一次预填充的耗时与提示长度",
    "pre.per_token": "预填充：每个提示 token 的毫秒数",
    "pre.decode": "解码：每生成一个 token 的毫秒数（1 个请求）",
    "pre.ylabel2": "每个 token 的毫秒数（对数）",
    "pre.title2": "每个 token 的成本",
    "cvr.with": "有 KV 缓存：一个解码步",
    "cvr.without": "没有缓存：重算整个上下文",
    "cvr.xlabel": "上下文中的 token 数",
    "cvr.ylabel": "下一个 token 的毫秒数",
    "cvr.title": "上下文变长时，下一个 token 的成本",
    "mon.summary": "第 {step} 步之后：已用 {used} / {total} 个块 = {used} × {bs} 个 token × {bpt} B = {used_bytes}"
                   "（{held} 个请求占着块，缓存了 {tokens} 个 token = 按公式 {formula_bytes}）；{formula}",
    "mon.formula": "2 × {layers} 层 × {heads} 个 kv_heads × {dim} head_dim × {elem} 字节 = 每个 token {value} 字节",
    "mon.live": "还有 {n} 个请求要运行：请按「单步」。",
    "mon.idle": "没有可运行的了：所有请求都已结束并释放。请按「添加请求」。",
    "mon.empty": "还没有引擎步：先添加一个请求，再按「单步」",
    "mon.add": "添加请求",
    "mon.add_tip": "llm.add_request()：{n} 个提示 token，{m} 个输出 token",
    "mon.step": "单步",
    "mon.step_tip": "llm.step()，然后刷新",
    "mon.step10": "走 10 步",
    "mon.step10_tip": "调用十次 llm.step()，然后刷新",
    "mon.refresh": "刷新",
    "mon.refresh_tip": "重新读取 trace 和 cache_stats()",
}

PHRASES = {"en": EN, "zh": ZH}
