"""The text of chapter 04's exercises notebook, both editions: every prose cell one
``Bi(English, Chinese)``, the answer templates and the ``check(...)`` cells.

It lives in the package because it is what a learner reads while answering: copy detection
(``copies.py``) reads its string literals, so an answer pasted from the notebook earns nothing.
``scripts/build_exercises.py`` (a source checkout) turns these cells into the four notebooks:
the student and solved editions, English and Chinese. The quiz, pitfalls and scenario come from
the graders' own tables (``texts.py``), so the notebook and its grading cannot disagree.
"""

from __future__ import annotations

import re

from nbformat.v4 import new_code_cell, new_markdown_cell

from ...i18n import LANGS, Bi
from .texts import PITFALLS, QUIZ, TASK5_SCENARIO

STUDENT_PATH = "exercises/ch04_exercises.ipynb"  # where the student notebooks sit, from the repository's root
STUDENT_ZH_PATH = "notebooks/zh/ch04/ch04_exercises.ipynb"

STUDENT_ANSWERS = {  # shared by both notebooks: the comments say it in both languages
    "task1_diagram": "# Your answer: the editor above (default), Python data, or DOT text.\n"
                     "# 作答方式：上面的编辑器（默认）、Python 数据或 DOT 文本。\n"
                     "task1_diagram = editor",
    "task2_kv_explain": 'task2_kv_explain = ""   # at most 100 字 (see above) · 不超过 100 字',
    "task3_pressure": '''task3_pressure = [
    ("", ""),   # (scenario, why it makes requests hold more state) · (场景, 它为什么让请求占用更多状态)
    ("", ""),
    ("", ""),
]''',
    "task3_kv_bytes": '''def scenario_kv_bytes(num_requests, prompt_tokens, output_tokens):
    """Bytes of K and V the scenario's requests hold when they have all finished (before release)."""
    raise NotImplementedError("your formula here (cfg, above, has the model's shape) · 在这里写你的公式")

task3_kv_bytes = scenario_kv_bytes''',
    "task4_sampling": 'task4_sampling = ""',
    **{q.id: f'{q.id} = (None, "")   # ("A", "B", "C" or "D", "why, in one sentence") · (选项字母, "一句话理由")'
       for q in QUIZ},
    **{p.id: f'{p.id} = (None, "")   # (True or False, "why, in a sentence") · (True 或 False, "一句话理由")'
       for p in PITFALLS},
    "code_top_p": '''import torch

def my_top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probabilities add up to at least top_p
    (always at least one); set every other logit to -inf. Works on [..., vocab]."""
    raise NotImplementedError("write the filter · 请写出过滤函数")''',
    "code_kv_bytes": '''def my_kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes of K and V that one token needs in the cache, across all layers."""
    raise NotImplementedError("write the formula · 请写出公式")''',
    "code_stop_check": '''from minillm import SamplingParams, StopReason

def my_check_stop(token_id, output_ids, text, params, eos_token_id, prompt_len, max_model_len):
    """Called right after token_id was sampled and appended; returns a StopReason or None."""
    raise NotImplementedError("write the checks, in the engine's order · 按引擎的顺序写出各项检查")''',
    "code_chat_kv": '''def chat_kv_bytes(turn, system_tokens, user_tokens, reply_tokens, bytes_per_token, keep_last=None):
    """KV bytes the request of turn `turn` (1, 2, …) holds once its reply is generated.
    keep_last=None re-sends the whole history; keep_last=N re-sends only the last N earlier turns."""
    raise NotImplementedError("your formula here · 在这里写你的公式")''',
    "task5_trim_policy": 'task5_trim_policy = ("", "")   # ("summary" or "last_n", "why, in a sentence") · ("summary" 或 "last_n", "一句话理由")',
    "task6_gpu_capacity": '''def max_requests(num_layers, num_kv_heads, head_dim, num_params, card_gb, context_tokens, kv_dtype_bytes=2):
    """How many requests of context_tokens (prompt + output) fit at once in the KV cache of one GPU."""
    raise NotImplementedError("your formula here · 在这里写你的公式")''',
}


# ---------------------------------------------------------------------------------------------
# The notebook: every prose cell is one Bi(English, Chinese), so the two editions cannot drift
# ---------------------------------------------------------------------------------------------
def _quiz_markdown(q, number: int, lang: str) -> str:
    opts = "\n".join(f"- **{letter}.** {o.text(lang)}" for letter, o in q.options.items())
    if lang == "zh":
        return f"**第 {number} 题.** {q.text(lang)}  *（章节 {q.section}）*\n\n{opts}"
    return f"**Q{number}.** {q.text(lang)}  *(chapter {q.section})*\n\n{opts}"


def _pitfall_markdown(p, number: int, lang: str) -> str:
    return f"**{'说法' if lang == 'zh' else 'Statement'} {number}.** {p.statement(lang)}"


def _grade_command(lang: str) -> str:
    return f"minillm grade {STUDENT_ZH_PATH if lang == 'zh' else STUDENT_PATH} --json report.json"


SETUP = {  # the set-up cell: the only code that differs, and only in telling check() its language
    "en": "from minillm.grading import DiagramEditor, check, show_scenarios, show_solution, summary",
    "zh": "from minillm.grading import DiagramEditor, check, set_language, show_scenarios, show_solution, summary\n\n"
          "set_language(\"zh\")   # 代码题、选择题等没有自身语言的反馈也用中文（文字答案的反馈跟随答案的语言）",
}


def cells(solved: bool, lang: str = "en", answers: dict | None = None) -> list:
    """The notebook's cells in ``lang``; the answer cells hold ``answers`` (the reference answers,
    which the repository keeps out of the package) when ``solved``, else the empty templates."""
    if lang not in LANGS:
        raise ValueError(f"lang must be one of {', '.join(LANGS)}, got {lang!r}")
    if solved and answers is None:
        raise ValueError("a solved notebook needs its answers (tests/solved/answers.py in a source checkout)")
    answer = answers if solved else STUDENT_ANSWERS
    code = new_code_cell

    def md(text: Bi):
        return new_markdown_cell(_own_language(text(lang), lang))

    def ans(ex_id):
        return code(answer[ex_id])

    def chk(ex_id, ignore=False):
        return code(("# NBVAL_IGNORE_OUTPUT (the numbers depend on the shipped model)\n" if ignore else "")
                    + f'check("{ex_id}")')

    suffix = Bi(" (solved)", "（参考答案）")(lang) if solved else ""
    out = [md(Bi(f"""# Chapter 04 exercises — the engine's core path{suffix}
### 第 04 章 练习：推理引擎核心链路 —— prefill、decode、sampling、KV Cache

*中文版：[`{STUDENT_ZH_PATH}`](../notebooks/zh/ch04/ch04_exercises.ipynb)*

The chapter asks one question: *which states does a request go through, from the moment it enters
the engine until its resources are released?* These exercises check that you can answer it — on a
diagram, in a few sentences, and in small pieces of code that are compared with the engine itself.

**How this notebook works**

1. Every exercise has an **answer cell** (replace the empty string, the `None`, or the
   `raise NotImplementedError`) and a **check cell**: `check("…")` grades your answer on the spot
   and says what is right and what is missing. Change the answer, run both cells again.
2. An exercise you have not answered says *not attempted* — that is not an error.
3. To grade the whole notebook at once, run in a terminal:

   ```
   {_grade_command("en")}
   ```

   It reads your answers from the cells as data, runs your code in a sandbox only where an
   answer is code, grades everything outside your kernel and prints a table (the JSON file has
   every piece of feedback). Answers must therefore live in cells, and the diagram you draw with
   the editor is stored in the notebook itself — save the notebook before you submit it.
4. Stuck? `check()` names the idea that is missing without giving the answer away.
   `show_solution("task2")` shows a model answer; it is recorded in the notebook, and the
   instructor's report lists it.

> **The text graders are heuristics.** Written answers (tasks 2–5, the quiz's "why" and the
> pitfall reasons) are read clause by clause for each required idea, in English, Chinese or a mix
> of both, forgiving small typos and reading negation ("does *not* save memory", "无需重算").
> Lists of keywords, copies of the task's own words (or of the options, hints and feedback the
> notebook shows, or of a model answer) and the chapter's misconceptions earn nothing.
> The graders do not understand your text: an unusual but correct answer can be missed, so when
> the evidence is thin the result says **flagged for human review** and a person reads it.
> Feedback is given in the language you answer in.""",
                    f"""# 第 04 章练习：推理引擎核心链路{suffix}
### Chapter 04 exercises — prefill、decode、sampling 与 KV Cache

*English edition: [`{STUDENT_PATH}`](../../../exercises/ch04_exercises.ipynb)*

这一章只问一个问题：*一个请求从进入引擎到资源被释放，要经过哪些状态？* 这些练习检查你能不能回答它——
画成状态图、用几句话讲清楚，再写几段小代码，直接和引擎本身的实现对照。

**这个笔记本怎么用**

1. 每道题有一个**作答单元格**（把空字符串、`None` 或 `raise NotImplementedError` 换成你的答案）和一个
   **检查单元格**：`check("…")` 当场评分，告诉你哪里对、还缺什么。改了答案，就把两个单元格再运行一遍。
2. 还没作答的题会显示 *未作答 · not attempted*——这不是错误。
3. 想一次给整个笔记本评分，在终端里运行：

   ```
   {_grade_command("zh")}
   ```

   它把各单元格里的答案当作数据读出来，只有答案是代码时才在沙箱里运行你的代码，所有评分都在你的
   kernel 之外完成，最后打印一张表（JSON 文件里有每一条反馈）。所以答案必须写在单元格里；用编辑器画的
   状态图保存在笔记本本身——提交前请先保存笔记本。
4. 卡住了？`check()` 会指出缺的是哪个要点，但不会直接给出答案。`show_solution("task2")` 显示参考答案；
   查看记录会写进笔记本，老师的报告里会列出来。

> **文字题的评分是启发式的。** 书面回答（任务 2–5、自测题的理由、误区判断的理由）按子句逐条寻找每个
> 要点，中文、英文或中英混写都可以，能容忍小的拼写错误，也能识别否定（“无需重算”、“并*不*节省显存”）。
> 关键词堆砌、照抄题目（或照抄 notebook 里显示的选项、提示和反馈，或照抄参考答案）、章节里列出的误解都不得分。评分器并不真正理解你的文字：不寻常但正确的回答可能被
> 漏判，所以证据不足时结果会显示**已标记为需要人工复核**，由老师来读。
> 用中文作答就得到中文反馈；代码题等没有自身语言的反馈，也因为下面的 `set_language("zh")` 而用中文。""")),
        md(Bi("""| exercise id | what you do | points | chapter |
|---|---|---|---|
| `task1_diagram` | draw the request lifecycle, with what each state holds | 12 (+2 bonus) | §1, lifecycle diagram |
| `task2_kv_explain` | explain the KV cache in at most 100 characters | 2 | §3 |
| `task3_pressure` | three cache-pressure scenarios, each with its reason | 6 | §3, key table |
| `task3_kv_bytes` | the KV bytes of three scenarios, checked by running them | 3 | §3 |
| `task4_sampling` | why sampling is part of the request's execution | 2 | §4 |
| `quiz1_live_requests` … `quiz4_states_before_batching` | the self-check questions, each with a why | 4 × 2 | §1, §3, §4, §5 |
| `pitfall1_kv_not_hit_cache` … `pitfall3_one_lifecycle` | the pitfalls: true or false, and why | 3 × 2 | pitfalls |
| `code_top_p` | a top-p filter, compared with `minillm.sampler.top_p_filter` | 3 | §4 |
| `code_kv_bytes` | KV bytes per token, compared with `minillm.kv_cache.kv_bytes_per_token` | 2 | §3 |
| `code_stop_check` | the stop-condition check, compared with the engine's semantics | 3 | §6 |
| `code_chat_kv` | the long chat: KV bytes at turn k, full history or the last N turns | 2 | §3 scenario 1 |
| `task5_trim_policy` | the long chat: pick a trimming policy, and why | 2 | §3 scenario 1 |
| `task6_gpu_capacity` | how many requests fit in a GPU's memory, by your formula | 3 | §3, 显存 |
| `quiz5_debug_by_request` … `quiz7_scheduling_states` | the judgement "debug by the request", the key table, §5 and conclusion 2 | 3 × 2 | judgements, key table, §5 |

`check("task1")` works too: a unique prefix of an id is enough.""",
              """| 练习编号 | 要做什么 | 分值 | 对应章节 |
|---|---|---|---|
| `task1_diagram` | 画出请求生命周期，并写明每个状态占有什么 | 12（+2 附加分） | §1、生命周期状态图 |
| `task2_kv_explain` | 用 100 字以内解释 KV Cache | 2 | §3 |
| `task3_pressure` | 三种拉高缓存压力的场景，各附理由 | 6 | §3、关键表格 |
| `task3_kv_bytes` | 三个场景的 KV 字节数，由引擎实际运行来核对 | 3 | §3 |
| `task4_sampling` | 为什么 sampling 属于请求执行语义 | 2 | §4 |
| `quiz1_live_requests` … `quiz4_states_before_batching` | 本章自测题，每题附一句理由 | 4 × 2 | §1、§3、§4、§5 |
| `pitfall1_kv_not_hit_cache` … `pitfall3_one_lifecycle` | 常见误区：判断对错并说明理由 | 3 × 2 | 常见误区 |
| `code_top_p` | top-p 过滤，与 `minillm.sampler.top_p_filter` 对照 | 3 | §4 |
| `code_kv_bytes` | 每个 token 的 KV 字节数，与 `minillm.kv_cache.kv_bytes_per_token` 对照 | 2 | §3 |
| `code_stop_check` | 停止条件检查，与引擎的停止语义对照 | 3 | §6 |
| `code_chat_kv` | 长对话：第 k 轮的 KV 字节数，完整历史或只保留最近 N 轮 | 2 | §3 场景 1 |
| `task5_trim_policy` | 长对话：选一种裁剪历史的策略，并说明理由 | 2 | §3 场景 1 |
| `task6_gpu_capacity` | 用你的公式算出一张 GPU 的显存里能同时放下多少个请求 | 3 | §3、显存 |
| `quiz5_debug_by_request` … `quiz7_scheduling_states` | 工程判断“从请求对象出发排查”、关键表格、§5 与结论 2 | 3 × 2 | 工程判断、关键表格、§5 |

`check("task1")` 也可以：只要编号的前缀唯一就行。""")),
        code(SETUP[lang]),

        # ---- exercise 1 ----------------------------------------------------------------------
        md(Bi("""## Exercise 1 — the request lifecycle state diagram
### 任务 1：画一张“请求生命周期状态图”
*Task 1 of the chapter; §1 "Look from the request, not the model", and the lifecycle diagram.*

Draw the states a request goes through from arrival to release, and the transitions between them.
**The bar:** at least the states for *enqueue*, *prefill*, *active / decode* (with its loop),
*finish* and *release* — and for **every** state, a note saying what it holds: prompt tokens,
KV blocks, a batch slot, the output so far… or nothing.

The grader reads the structure, never the picture (12 points, +2 bonus):

- the five states, 1 point each. Names are matched generously, in English or Chinese:
  WAITING / QUEUED / 入队, PREFILL / 预填充, DECODE / ACTIVE / 解码, FINISHED / DONE / 完成,
  RELEASED / FREED / 释放;
- a path enqueue → prefill (1) and prefill → decode (1);
- the decode loop (1): a self-edge on DECODE, or a cycle such as DECODE → SAMPLE → DECODE;
- a way out of the loop to FINISHED when a stop condition is met (1), and FINISHED *before*
  RELEASED (1) — chapter §6 insists they are two different moments;
- a resource note on every state (1), and a decode note that names the KV cache (1);
- bonus: preemption (a running request sent back to wait when KV blocks run out) and cancel
  (a transition out of DECODE when the user cancels, that ends in RELEASED), +1 each.

**Using the editor.** Type a state name and what it holds, press **Add / update state**
(the dropdown offers common resources). Pick *from* and *to*, type a label, press
**Add transition**. Press **Check my diagram** whenever you like. After every change the diagram
is stored in this cell's output (one grey line under the editor) — *save the notebook* and it
travels with it; `minillm grade` reads it from there. It is also saved to `ch04_task1_diagram.json`
next to the notebook and read back when this cell runs again.

Names are matched generously: vLLM's WAITING / RUNNING, TensorRT-LLM's CONTEXT_INIT /
GENERATION_IN_PROGRESS / GENERATION_COMPLETE, the chapter's 入队 / 预填充 / 解码 / 完成 / 释放, and
a merged 完成释放 state are all fine. A note that contradicts the engine (KV blocks held while
WAITING or after RELEASED, none while decoding) costs the note point.""",
              """## 任务 1：画一张“请求生命周期状态图”
### Exercise 1 — the request lifecycle state diagram
*对应章节的任务 1；§1“从‘请求’而不是‘模型’角度看系统”，以及图解实验室里的生命周期状态图。*

画出一个请求从到达到释放所经过的状态，以及状态之间的转移。
**最低完成标准：** 至少包含*入队*、*预填充（prefill）*、*活跃 / 解码（decode，带循环）*、*完成*、*释放*
这几个状态——而且**每个**状态都要写明它占有什么：prompt token、KV 块、batch 槽位、已生成的输出……或者什么都不占。

评分器只读图的结构，不看图画得好不好（12 分，另有 2 分附加分）：

- 五个状态，各 1 分。状态名的匹配很宽松，中英文都可以：
  入队 / WAITING / QUEUED、预填充 / PREFILL、解码 / DECODE / ACTIVE、完成 / FINISHED / DONE、
  释放 / RELEASED / FREED；
- 入队 → 预填充 的路径（1 分），预填充 → 解码 的路径（1 分）；
- 解码循环（1 分）：解码状态上的自环，或者 解码 → 采样 → 解码 这样的回路；
- 满足停止条件时跳出循环进入“完成”（1 分），并且“完成”在“释放”*之前*（1 分）——第 6 节强调这是两个不同的时刻；
- 每个状态都有资源说明（1 分），并且解码状态的说明写到了 KV Cache（1 分）；
- 附加分：抢占（KV 块不够时，运行中的请求被送回去等待）和取消（用户取消时离开解码状态、最终到达释放的转移），各 +1。

**编辑器怎么用。** 输入状态名和它占有的东西，点 **添加 / 更新状态**（下拉框里有常见的资源可选）。
选好 *从* 和 *到*，输入转移的标签，点 **添加转移**。随时可以点 **检查我的状态图** 看反馈。
每次改动后，状态图都会存进这个单元格的输出里（编辑器下方的一行灰字）——*保存笔记本*，图就跟着笔记本走；
`minillm grade` 从那里读取它。它也会存到笔记本旁边的 `ch04_task1_diagram.json`，这个单元格再次运行时会读回来。

状态名的匹配很宽松：vLLM 的 WAITING / RUNNING、TensorRT-LLM 的 CONTEXT_INIT / GENERATION_IN_PROGRESS /
GENERATION_COMPLETE、本章的 入队 / 预填充 / 解码 / 完成 / 释放，以及合并成一个的“完成释放”状态都可以。
与引擎行为矛盾的说明（WAITING 时或 RELEASED 之后还占着 KV 块、解码时却不占 KV 块）会丢掉说明那 1 分。""")),
        code("# NBVAL_IGNORE_OUTPUT (a live widget)\neditor = DiagramEditor(save_to=\"ch04_task1_diagram.json\")\neditor"),
        new_markdown_cell(Bi("Prefer typing? The answer may also be plain Python data, or DOT text:",
                             "更喜欢直接写？答案也可以是普通的 Python 数据，或者 DOT 文本"
                             "（状态名和说明都可以用中文）：")(lang) + _DATA_EXAMPLE[lang]),
        ans("task1_diagram"),
        chk("task1_diagram"),

        # ---- exercise 2 ----------------------------------------------------------------------
        md(Bi("""## Exercise 2 — the KV cache in at most 100 characters
### 任务 2：写一段 100 字以内的 KV Cache 解释
*Task 2; §3 "Why the KV cache is the engine's core asset".*

Explain the KV cache in **at most 100 字**: every Chinese character counts one, Latin letters and
digits count one per 2.5 (so about 45 English words fit), spaces and punctuation are free.
**The bar:** both ideas must be there:

1. it *avoids recomputing* the keys and values of the tokens already processed (that is where
   decode's speed comes from), and
2. it *costs memory that grows* — with every token of context and every live request (memory
   pressure).

One point per idea. A misconception ("a cache that hits or misses", "it saves memory") cancels the
idea it contradicts; a list of keywords, or text copied from the task, its options or the feedback, scores 0; an answer over the limit
loses one point, with a warning.""",
              """## 任务 2：写一段 100 字以内的 KV Cache 解释
### Exercise 2 — the KV cache in at most 100 characters
*对应章节的任务 2；§3“KV Cache 为什么会成为引擎核心资产”。*

用**不超过 100 字**解释 KV Cache：每个汉字算一个字，拉丁字母和数字每 2.5 个算一个字（大约 45 个英文单词），
空格和标点不计。**最低完成标准：** 两点都不能漏——

1. 它*避免重复计算*已经处理过的 token 的 key 和 value（decode 的速度正是从这里来的）；
2. 它*占用的显存会增长*——随上下文里的每个 token、随每个活跃请求增长（显存压力）。

每点 1 分。误解（“命中 / 未命中的缓存”“它能节省显存”）会抵消与之矛盾的那一点；关键词堆砌、照抄题目、选项或反馈得 0 分；
超出字数扣 1 分，并给出提醒。""")),
        ans("task2_kv_explain"),
        chk("task2_kv_explain"),

        # ---- exercise 3 ----------------------------------------------------------------------
        md(Bi("""## Exercise 3 — what raises cache pressure
### 任务 3：列出三种会显著拉高缓存压力的场景
*Task 3; §3 and its judgment "long context plus high concurrency: think cache management first",
and the key table.*

**Part a.** Name three scenarios that make the KV cache grow, each with its reason.
**The bar:** for each one, say *why* it makes requests hold more state — what grows, and because
of what. Two points per scenario: one for a recognised scenario that differs from the other two
(long context, high concurrency, long outputs — or others, such as beam search or requests that
are never released), one for a reason that says what grows (half a point if the reason is thin).
Each reason at most 300 characters.""",
              """## 任务 3：列出三种会显著拉高缓存压力的场景
### Exercise 3 — what raises cache pressure
*对应章节的任务 3；§3 及其工程判断“看到长上下文 + 高并发，第一反应应该是缓存管理”，以及关键表格。*

**a 部分。** 写出三种会让 KV Cache 变大的场景，每种附上理由。
**最低完成标准：** 每种场景都要解释它*为什么*会让请求占用更多状态——是什么在增长、因为什么而增长。
每个场景 2 分：场景能被识别、且与另外两个不同得 1 分（长上下文、高并发、长输出，或者其他，比如 beam search、
一直没有被释放的请求）；理由说清了什么在增长得 1 分（理由太单薄得 0.5 分）。每条理由不超过 300 字。""")),
        ans("task3_pressure"),
        chk("task3_pressure"),
        md(Bi("""**Part b.** Now put numbers on three concrete scenarios. For `task3_kv_bytes` the engine runs
each one on the shipped model: random prompts of exactly `prompt_tokens` tokens (all different, so
no prefix is shared), `ignore_eos=True` so every request produces exactly `output_tokens` tokens, and
`auto_release=False` so the finished requests keep their blocks. Then it reads
`cache_stats().used_bytes` — just before releasing them.

Write `scenario_kv_bytes(num_requests, prompt_tokens, output_tokens)` with your own formula: the
bytes of K and V those requests hold at that moment, for the shipped model in fp32 (4 bytes per
number). Either count is accepted — tokens × bytes per token, or the engine's own number, which
rounds every request up to whole blocks of `block_size` tokens; the feedback shows you the other.
One point per scenario. When all three are right, the grader also calls your function on three fresh
scenarios it never prints: a function that only looks up the printed ones gets no points.""",
              """**b 部分。** 现在给三个具体场景算出数字。检查 `task3_kv_bytes` 时，引擎会在随附的模型上真的把每个场景跑一遍：
随机 prompt 恰好 `prompt_tokens` 个 token（彼此不同，没有共享前缀），`ignore_eos=True` 让每个请求恰好生成
`output_tokens` 个 token，`auto_release=False` 让已完成的请求继续占着它们的块。然后在释放之前读取
`cache_stats().used_bytes`。

用你自己的公式写出 `scenario_kv_bytes(num_requests, prompt_tokens, output_tokens)`：这一刻这些请求占有的
K 和 V 的字节数（随附模型，fp32，每个数 4 字节）。两种算法都算对——token 数 × 每个 token 的字节数，或者引擎自己的
数（它把每个请求向上取整到以 `block_size` 个 token 为一块的整块）；反馈会告诉你另一种的结果。每个场景 1 分。
三个都对时，评分器还会用三个从不打印的新场景调用你的函数：只会查表返回这三个数的函数不得分。""")),
        code("# NBVAL_IGNORE_OUTPUT (the numbers depend on the shipped model)\n"
             "from minillm import LLM\n\n"
             "llm = LLM()\n"
             "cfg = llm.model_config\n"
             "print(f\"layers={cfg.num_hidden_layers}  kv_heads={cfg.num_key_value_heads}  head_dim={cfg.head_dim}  \"\n"
             "      f\"dtype=float32 (4 bytes)  block_size={llm.cache_stats().block_size}\")"),
        code("show_scenarios()"),
        ans("task3_kv_bytes"),
        chk("task3_kv_bytes", ignore=True),

        # ---- exercise 4 ----------------------------------------------------------------------
        md(Bi("""## Exercise 4 — sampling is part of the request
### 任务 4：解释 sampling 为什么属于请求执行语义的一部分
*Task 4; §4 "Why sampling is part of the state machine".*

Explain why sampling belongs to the request's execution semantics, not to the presentation of its
output. **The bar:** your answer says that the sampled token *becomes part of the request's
history* (its context), and that *the next decode step is computed from it*. One point for each;
at most 160 字 (about 70 English words). "Sampling only makes the output more random" or "it is
a UI knob" is the chapter's pitfall 2 and cancels both points.""",
              """## 任务 4：解释 sampling 为什么属于请求执行语义的一部分
### Exercise 4 — sampling is part of the request
*对应章节的任务 4；§4“Sampling 为什么是状态机的一部分”。*

解释为什么采样属于请求的执行语义，而不只是输出的呈现方式。**最低完成标准：** 你的回答要说到，采样出的 token
*会进入请求的历史（上下文）*，并且*下一轮 decode 是基于它计算的*。每点 1 分；不超过 160 字（约 70 个英文单词）。
“采样只是让输出更随机一点”或“它是一个 UI 参数”正是本章的误区 2，两分都会被抵消。""")),
        ans("task4_sampling"),
        chk("task4_sampling"),

        # ---- quiz ----------------------------------------------------------------------------
        md(Bi("""## Self-check quiz
### 自测问题

The chapter's four self-check questions, then three on what they leave out (the judgement "debug by the
request object", the key table, §5 and conclusion 2), each with one best answer. Answer with a pair: the letter
and **why, in one sentence** — `("B", "because …")` (2 points: one for the letter, one for the
why). "Answer: B", "选B" or "I think B" are read as B; two letters are not an answer. A wrong pick
tells you why it is wrong, so you can try again; the right one shows the explanation of every
option.""",
              """## 自测问题
### Self-check quiz

本章的四道自测题，再加三道补上它们没覆盖的内容（工程判断“从请求对象出发排查”、关键表格、§5 与结论 2），每题有一个最佳答案。用一对值作答：选项字母和**一句话理由**——`("B", "因为……")`
（2 分：字母 1 分，理由 1 分）。“选B”“答案：B”“Answer: B”都按 B 处理；写两个字母不算作答。
选错时会告诉你错在哪里，可以再试；选对后会显示每个选项的解析。""")),
    ]
    for i, q in enumerate(QUIZ, start=1):
        out += [new_markdown_cell(_quiz_markdown(q, i, lang)), ans(q.id), chk(q.id)]

    out.append(md(Bi("""## Pitfalls
### 常见误区

Three statements drawn from the chapter's pitfalls. Say whether each is **true or false**, and
**why**, in a sentence (2 points each: one for the verdict, one for the reason; reasons at most
120 字, graded heuristically).""",
                     """## 常见误区
### Pitfalls

下面三个说法来自本章的常见误区。判断每个说法**对还是错**，并用一句话说明**理由**（每题 2 分：判断 1 分，
理由 1 分；理由不超过 120 字，启发式评分）。""")))
    for i, p in enumerate(PITFALLS, start=1):
        out += [new_markdown_cell(_pitfall_markdown(p, i, lang)), ans(p.id), chk(p.id)]

    out += [
        md(Bi("""## Coding tasks
### 编程练习

Three small functions, each compared with the engine itself. Your function runs with a time limit of a
few seconds per call; an exception or an endless loop becomes feedback, not a crash.

### Code 1 — a top-p (nucleus) filter
*§4 sampling; the engine's version is `minillm.sampler.top_p_filter`.*

`my_top_p_filter(logits, top_p)` takes logits of shape `[..., vocab]` and returns a tensor of the
same shape: sort the tokens by probability, keep the smallest set of the most likely ones whose
probabilities add up to **at least** `top_p` (always at least one token), and set every other logit
to `-inf`. Kept logits stay as they are — no softmax in the output, no renormalising.

It is compared with the engine on 14 cases, the random ones drawn afresh each time it is graded
(3 points, in proportion): random rows and batches, `top_p=1.0`, a tiny `top_p`, a dominant token,
logits that already hold `-inf`, a one-token vocabulary, tied logits, logits near ±1000 that overflow
or underflow a hand-written softmax, and a batch with a row that is all `-inf`. While it is graded no
engine code is available to it (`top_p_filter`, the fast path's filter, a copy of either: calling
one fails the case and sends the function to a person).""",
              """## 编程练习
### Coding tasks

三个小函数，每个都直接和引擎本身的实现对照。你的函数每次调用只有几秒的时间限制；抛出异常或陷入死循环
都只会变成反馈，不会让笔记本崩溃。

### 编程 1：top-p（nucleus）过滤
*§4 采样；引擎里的实现是 `minillm.sampler.top_p_filter`。*

`my_top_p_filter(logits, top_p)` 接收形状为 `[..., vocab]` 的 logits，返回同样形状的张量：按概率从大到小排序，
保留累计概率**至少**达到 `top_p` 的最少的那几个 token（至少保留一个），其余 logits 设为 `-inf`。
保留下来的 logits 原样不动——输出里不做 softmax，也不重新归一化。

它会在 14 个用例上与引擎对照，其中随机用例每次评分都重新抽取（3 分，按通过比例给分）：随机的单行和批量、
`top_p=1.0`、极小的 `top_p`、一个占主导的 token、已经含有 `-inf` 的 logits、只有一个 token 的词表、并列的
logits、接近 ±1000、会让手写 softmax 上溢或下溢的 logits，以及有一整行都是 `-inf` 的批量。评分时引擎的代码对它都不可用
（`top_p_filter`、快速路径的过滤函数或它们的拷贝：调用任何一个都算该用例失败，并交由人工阅读）。""")),
        ans("code_top_p"),
        chk("code_top_p"),
        md(Bi("""### Code 2 — KV bytes per token
*§3; the engine's version is `minillm.kv_cache.kv_bytes_per_token`.*

`my_kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes)` returns how many bytes of
keys and values one token occupies in the cache, across all layers. It is compared with the engine
on the shipped model and six real model shapes, with and without grouped-query attention and in
several precisions, and on two shapes drawn fresh each time it is graded (2 points, in proportion).""",
              """### 编程 2：每个 token 的 KV 字节数
*§3；引擎里的实现是 `minillm.kv_cache.kv_bytes_per_token`。*

`my_kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes)` 返回一个 token 在所有层的缓存里
占用多少字节的 key 和 value。它会在随附的模型和六种真实模型的形状上与引擎对照，有的用分组查询注意力（GQA）、
有的不用，精度也各不相同，另加每次评分时新抽取的两种形状（2 分，按通过比例给分）。""")),
        ans("code_kv_bytes"),
        chk("code_kv_bytes"),
        md(Bi("""### Code 3 — the stop check
*§6 "What is reclaimed when a request ends", and the judgment "stop conditions are system semantics".*

After every sampled token the engine asks: is this request done, and why? Write
`my_check_stop(token_id, output_ids, text, params, eos_token_id, prompt_len, max_model_len)`:

- `token_id` — the token just sampled; `output_ids` — the output token ids so far, ending with it;
- `text` — the output text so far; `params` — the request's `SamplingParams`;
- `eos_token_id` — the model's end-of-sequence token; `prompt_len` — the prompt's length in tokens;
  `max_model_len` — the longest context the model takes.

Return a `StopReason`, or `None` to keep decoding. Check in the engine's order, the first match wins:

1. `StopReason.EOS` — the model's EOS token (unless `params.ignore_eos`), or any of
   `params.stop_token_ids` (these apply even with `ignore_eos`, which only skips the model's EOS);
2. `StopReason.STOP_STRING` — one of `params.stop_strings` appears in `text`;
3. `StopReason.MAX_TOKENS` — `params.max_tokens` output tokens have been produced;
4. `StopReason.CONTEXT_FULL` — prompt plus output fill `max_model_len`.

(`CANCELLED` never comes from this check: it arrives from outside, through `LLM.cancel`.) Compared
with the engine's semantics on 16 cases and 4 drawn fresh each time it is graded (3 points, in proportion).""",
              """### 编程 3：停止条件检查
*§6“请求结束时，系统真正要回收什么”，以及“停止条件是系统语义”这一判断。*

每采样出一个 token，引擎都要问：这个请求结束了吗？为什么结束？请写出
`my_check_stop(token_id, output_ids, text, params, eos_token_id, prompt_len, max_model_len)`：

- `token_id`——刚采样出的 token；`output_ids`——到目前为止的输出 token id，最后一个就是它；
- `text`——到目前为止的输出文本；`params`——这个请求的 `SamplingParams`；
- `eos_token_id`——模型的结束符；`prompt_len`——prompt 的 token 数；`max_model_len`——模型能接受的最长上下文。

返回一个 `StopReason`，或者返回 `None` 表示继续解码。按引擎的顺序检查，先满足的优先：

1. `StopReason.EOS`——模型的 EOS token（除非 `params.ignore_eos`），或者 `params.stop_token_ids` 中的任何一个
   （即使设置了 `ignore_eos` 它们也生效，`ignore_eos` 只跳过模型自己的 EOS）；
2. `StopReason.STOP_STRING`——`text` 中出现了 `params.stop_strings` 里的某一个；
3. `StopReason.MAX_TOKENS`——已经生成了 `params.max_tokens` 个输出 token；
4. `StopReason.CONTEXT_FULL`——prompt 加输出填满了 `max_model_len`。

（`CANCELLED` 从不来自这个检查：它从外部经由 `LLM.cancel` 到来。）会在 16 个用例、外加每次评分时新抽取的 4 个用例上与引擎的语义对照
（3 分，按通过比例给分）。""")),
        ans("code_stop_check"),
        chk("code_stop_check"),
        md(Bi("""## Exercise 5 — the long chat gets heavier
### 任务 5：长对话越来越重
*§3, scenario 1 "长对话越来越重"; notebook 03 measures it on the engine.*

In a chat, every turn sends **one new request** whose prompt is the system prompt, the whole
history so far, and the new user message; the model then generates its reply. So the KV cache one
request holds grows turn after turn — unless the server trims the history: it can keep only the
**last N turns** (`keep_last=N`), or replace the old turns with a short **summary**.

**Part a.** Write `chat_kv_bytes(turn, system_tokens, user_tokens, reply_tokens, bytes_per_token,
keep_last=None)`: the bytes of K and V held by the request of turn `turn` (1, 2, …) once its reply
is generated, counting tokens (not blocks). Every earlier turn is one user message plus one reply.
Compared with the exact count on 8 cases and 2 drawn fresh each time it is graded, with the shipped model's bytes per token (2 points, in
proportion).""",
              """## 任务 5：长对话越来越重
### Exercise 5 — the long chat gets heavier
*§3 场景 1“长对话越来越重”；第 03 个笔记本在引擎上实际测量过它。*

在对话中，每一轮都会发送**一个新请求**，它的 prompt 是系统提示、到目前为止的全部历史，再加上新的用户消息；
然后模型生成回复。所以一个请求占用的 KV Cache 一轮比一轮大——除非服务端裁剪历史：可以只保留**最近 N 轮**
（`keep_last=N`），或者把早先的轮次换成一段简短的**摘要**。

**a 部分。** 写出 `chat_kv_bytes(turn, system_tokens, user_tokens, reply_tokens, bytes_per_token,
keep_last=None)`：第 `turn` 轮（1、2、……）的请求在回复生成完之后占有的 K 和 V 字节数，按 token 计（不按块）。
之前的每一轮都是一条用户消息加一条回复。会在 8 个用例、外加每次评分时新抽取的 2 个用例上与精确值对照，使用随附模型每个 token 的字节数
（2 分，按通过比例给分）。""")),
        ans("code_chat_kv"),
        chk("code_chat_kv"),
        md(Bi(f"""**Part b.** Pick a policy for this chat, and say why in a sentence (2 points: the policy, the
reason):

> {TASK5_SCENARIO.en}

Answer `("summary", "why …")` or `("last_n", "why …")`.""",
              f"""**b 部分。** 为下面这段对话选一种策略，并用一句话说明理由（2 分：策略 1 分，理由 1 分）：

> {TASK5_SCENARIO.zh}

用 `("summary", "理由……")` 或 `("last_n", "理由……")` 作答。""")),
        ans("task5_trim_policy"),
        chk("task5_trim_policy"),
        md(Bi("""## Exercise 6 — how many requests fit in a GPU's memory
### 任务 6：显存里放得下多少个请求
*§3 "the KV cache is the core memory burden", on real cards; notebook 03 builds the table.*

Write `max_requests(num_layers, num_kv_heads, head_dim, num_params, card_gb, context_tokens,
kv_dtype_bytes=2)`: how many requests of `context_tokens` tokens (prompt + output) fit at once in the
KV cache of one GPU with `card_gb` GB, under notebook 03's assumptions:

- GB is 10^9 bytes, and the engine may use 90% of the card;
- the weights come first: `num_params` × 2 bytes (bf16); what is left is the KV budget;
- one token's K and V take the engine's bytes per token, with `kv_dtype_bytes` per number
  (2 for bf16, 1 for FP8);
- a request takes whole blocks of 16 tokens (round `context_tokens` up to a multiple of 16);
- the answer is a whole number of requests, 0 when the weights alone do not fit.

Check one case by hand first: Llama-3-8B (32 layers, 8 KV heads, head_dim 128, 8.03 billion
parameters) on an 80 GB card at 8,192 tokens gives 52. Compared with `minillm.viz.kv_capacity` on 9
cases (and 2 drawn fresh each time it is graded): three published models, 24 / 80 / 141 GB, several lengths, bf16 and FP8 (3 points, in
proportion). A wrong count says which slip would explain it.""",
              """## 任务 6：显存里放得下多少个请求
*§3“KV 缓存是显存压力的核心来源”，放到真实的卡上；第 03 个笔记本里有这张表。*

写出 `max_requests(num_layers, num_kv_heads, head_dim, num_params, card_gb, context_tokens,
kv_dtype_bytes=2)`：一张 `card_gb` GB 的 GPU 上，KV 缓存里能同时放下多少个 `context_tokens` 个 token（提示 + 输出）的请求。
前提和笔记本 03 相同：

- GB 指 10^9 字节，引擎最多用卡上 90% 的显存；
- 先放权重：`num_params` × 2 字节（bf16），剩下的才是 KV 预算；
- 一个 token 的 K 和 V 按引擎的每 token 字节数算，每个数 `kv_dtype_bytes` 字节（bf16 是 2，FP8 是 1）；
- 请求按 16 个 token 一块整块占用（把 `context_tokens` 向上取整到 16 的倍数）；
- 答案是整数个请求；权重本身都放不下时为 0。

先手算一个用例：Llama-3-8B（32 层、8 个 KV 头、head_dim 128、80.3 亿参数）在 80 GB 的卡上、每个请求 8,192 个 token，
结果是 52。会在 9 个用例（外加每次评分时新抽取的 2 个）上与 `minillm.viz.kv_capacity` 对照：三个公开模型，24 / 80 / 141 GB，几种长度，bf16 和 FP8
（3 分，按通过比例给分）。算错时，反馈会指出哪种失误能解释你的结果。""")),
        ans("task6_gpu_capacity"),
        chk("task6_gpu_capacity"),
        md(Bi("""## Your score
### 总分

All exercises at once — the same table `minillm grade` prints.""",
              """## 总分
### Your score

一次查看所有练习——和 `minillm grade` 打印的是同一张表。""")),
        code("summary()"),
    ]
    return out


def _own_language(text: str, lang: str) -> str:
    """The Chinese edition's headings without their English subtitle (a '### …' line in English right
    under a heading); the English edition keeps its Chinese subtitles, the chapter's own words."""
    if lang != "zh":
        return text
    lines = text.split("\n")
    keep = [line for i, line in enumerate(lines)
            if not (i > 0 and lines[i - 1].startswith("#") and line.startswith("### ")
                    and len(re.findall(r"[\u4e00-\u9fff]", line)) < 3)]
    return "\n".join(keep)


_DATA_EXAMPLE = {
    "en": """

```python
task1_diagram = {
    "states": {"WAITING": "prompt token ids, sampling params; no KV block yet", ...},
    "transitions": [("WAITING", "PREFILL", "scheduled"), ...],   # (from, to, label)
}
task1_diagram = '''digraph {
    WAITING [holds="prompt token ids; no KV block yet"];
    WAITING -> PREFILL [label="scheduled"];
}'''
```""",
    "zh": """

```python
task1_diagram = {
    "states": {"入队": "prompt token 与采样参数；还没有 KV 块", ...},
    "transitions": [("入队", "预填充", "被调度"), ...],   # (起点, 终点, 标签)
}
task1_diagram = '''digraph {
    入队 [holds="prompt token；还没有 KV 块"];
    入队 -> 预填充 [label="被调度"];
}'''
```""",
}
