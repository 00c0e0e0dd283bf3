"""Write the chapter 04 exercises notebook and its solved twin from one source.

    python -m minillm.grading.build_notebooks [--execute]

The student notebook (``exercises/ch04_exercises.ipynb``) and the solved one
(``tests/solved/ch04_exercises_solved.ipynb``) share every cell except the answer cells, so
their instructions cannot drift apart. ``--execute`` runs both and stores their outputs
(the student's must show "not attempted" everywhere; the solved one, full marks), which is
what nbval compares against. Cells whose output depends on the shipped model carry
``# NBVAL_IGNORE_OUTPUT``.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from .texts import PITFALLS, QUIZ, TASK5_SCENARIO

REPO = Path(__file__).resolve().parents[2]
STUDENT = REPO / "exercises" / "ch04_exercises.ipynb"
SOLVED = REPO / "tests" / "solved" / "ch04_exercises_solved.ipynb"

SOLVED_SOURCE = REPO / "tests" / "solved" / "answers.py"


def solved_answers() -> dict:
    """The reference answers, read from ``tests/solved/answers.py`` (a source checkout only)."""
    import runpy

    if not SOLVED_SOURCE.is_file():
        raise FileNotFoundError(f"the reference answers are in {SOLVED_SOURCE} (a source checkout), not installed")
    return runpy.run_path(str(SOLVED_SOURCE))["SOLVED_ANSWERS"]


STUDENT_ANSWERS = {
    "task1_diagram": "# Your answer: the editor above (default), Python data, or DOT text.\ntask1_diagram = editor",
    "task2_kv_explain": 'task2_kv_explain = ""   # at most 100 字 (see above)',
    "task3_pressure": '''task3_pressure = [
    ("", ""),   # (scenario, why it makes requests hold more state)
    ("", ""),
    ("", ""),
]''',
    "task3_kv_bytes": '''def scenario_kv_bytes(num_requests, prompt_tokens, output_tokens):
    """Bytes of K and V the scenario's requests hold when they have all finished (before release)."""
    raise NotImplementedError("your formula here (cfg, above, has the model's shape)")

task3_kv_bytes = scenario_kv_bytes''',
    "task4_sampling": 'task4_sampling = ""',
    **{q.id: f'{q.id} = (None, "")   # ("A", "B", "C" or "D", "why, in one sentence")' for q in QUIZ},
    **{p.id: f'{p.id} = (None, "")   # (True or False, "why, in a sentence")' for p in PITFALLS},
    "code_top_p": '''import torch

def my_top_p_filter(logits: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose probabilities add up to at least top_p
    (always at least one); set every other logit to -inf. Works on [..., vocab]."""
    raise NotImplementedError("write the filter")''',
    "code_kv_bytes": '''def my_kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes of K and V that one token needs in the cache, across all layers."""
    raise NotImplementedError("write the formula")''',
    "code_stop_check": '''from minillm import SamplingParams, StopReason

def my_check_stop(token_id, output_ids, text, params, eos_token_id, prompt_len, max_model_len):
    """Called right after token_id was sampled and appended; returns a StopReason or None."""
    raise NotImplementedError("write the checks, in the engine's order")''',
    "code_chat_kv": '''def chat_kv_bytes(turn, system_tokens, user_tokens, reply_tokens, bytes_per_token, keep_last=None):
    """KV bytes the request of turn `turn` (1, 2, …) holds once its reply is generated.
    keep_last=None re-sends the whole history; keep_last=N re-sends only the last N earlier turns."""
    raise NotImplementedError("your formula here")''',
    "task5_trim_policy": 'task5_trim_policy = ("", "")   # ("summary" or "last_n", "why, in a sentence")',
}


# ---------------------------------------------------------------------------------------------
# The notebook
# ---------------------------------------------------------------------------------------------
def _quiz_markdown(q, number: int) -> str:
    opts = "\n".join(f"- **{letter}.** {text}" for letter, (text, _) in q.options.items())
    return f"**Q{number}.** {q.text}  *(chapter {q.section})*\n\n{opts}"


def _pitfall_markdown(p, number: int) -> str:
    return f"**Statement {number}.** {p.statement}"


def cells(solved: bool) -> list:
    answer = solved_answers() if solved else STUDENT_ANSWERS
    md, code = new_markdown_cell, new_code_cell

    def ans(ex_id):
        return code(answer[ex_id])

    def chk(ex_id, ignore=False):
        return code(("# NBVAL_IGNORE_OUTPUT (the numbers depend on the shipped model)\n" if ignore else "")
                    + f'check("{ex_id}")')

    title = "# Chapter 04 exercises — the engine's core path" + (" (solved)" if solved else "")
    out = [md(f"""{title}
### 第 04 章 练习：推理引擎核心链路 —— prefill、decode、sampling、KV Cache

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
   minillm grade exercises/ch04_exercises.ipynb --json report.json
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
> Lists of keywords, copies of the task's own words and the chapter's misconceptions earn nothing.
> The graders do not understand your text: an unusual but correct answer can be missed, so when
> the evidence is thin the result says **flagged for human review** and a person reads it.
> Feedback is given in the language you answer in.
>
> 中文作答会得到中文反馈。评分器按子句识别要点（中英文及混写均可，能容忍小的拼写错误，也能识别否定），
> 关键词堆砌、照抄题目和章节中的误解不得分；拿不准时会标记为“需要人工复核”。"""),
        md("""| exercise id | what you do | points | chapter |
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

`check("task1")` works too: a unique prefix of an id is enough."""),
        code("from minillm.grading import DiagramEditor, check, show_scenarios, summary"),

        # ---- exercise 1 ----------------------------------------------------------------------
        md("""## Exercise 1 — the request lifecycle state diagram
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
WAITING or after RELEASED, none while decoding) costs the note point."""),
        code("# NBVAL_IGNORE_OUTPUT (a live widget)\neditor = DiagramEditor(save_to=\"ch04_task1_diagram.json\")\neditor"),
        md("""Prefer typing? The answer may also be plain Python data, or DOT text:

```python
task1_diagram = {
    "states": {"WAITING": "prompt token ids, sampling params; no KV block yet", ...},
    "transitions": [("WAITING", "PREFILL", "scheduled"), ...],   # (from, to, label)
}
task1_diagram = '''digraph {
    WAITING [holds="prompt token ids; no KV block yet"];
    WAITING -> PREFILL [label="scheduled"];
}'''
```"""),
        ans("task1_diagram"),
        chk("task1_diagram"),

        # ---- exercise 2 ----------------------------------------------------------------------
        md("""## Exercise 2 — the KV cache in at most 100 characters
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
idea it contradicts; a list of keywords or the task's own words score 0; an answer over the limit
loses one point, with a warning."""),
        ans("task2_kv_explain"),
        chk("task2_kv_explain"),

        # ---- exercise 3 ----------------------------------------------------------------------
        md("""## Exercise 3 — what raises cache pressure
### 任务 3：列出三种会显著拉高缓存压力的场景
*Task 3; §3 and its judgment "long context plus high concurrency: think cache management first",
and the key table.*

**Part a.** Name three scenarios that make the KV cache grow, each with its reason.
**The bar:** for each one, say *why* it makes requests hold more state — what grows, and because
of what. Two points per scenario: one for a recognised scenario that differs from the other two
(long context, high concurrency, long outputs — or others, such as beam search or requests that
are never released), one for a reason that says what grows (half a point if the reason is thin).
Each reason at most 300 characters."""),
        ans("task3_pressure"),
        chk("task3_pressure"),
        md("""**Part b.** Now put numbers on three concrete scenarios. For `task3_kv_bytes` the engine runs
each one on the shipped model: random prompts of exactly `prompt_tokens` tokens (all different, so
no prefix is shared), `ignore_eos=True` so every request produces exactly `output_tokens` tokens, and
`auto_release=False` so the finished requests keep their blocks. Then it reads
`cache_stats().used_bytes` — just before releasing them.

Write `scenario_kv_bytes(num_requests, prompt_tokens, output_tokens)` with your own formula: the
bytes of K and V those requests hold at that moment, for the shipped model in fp32 (4 bytes per
number). Either count is accepted — tokens × bytes per token, or the engine's own number, which
rounds every request up to whole blocks of `block_size` tokens; the feedback shows you the other.
One point per scenario."""),
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
        md("""## Exercise 4 — sampling is part of the request
### 任务 4：解释 sampling 为什么属于请求执行语义的一部分
*Task 4; §4 "Why sampling is part of the state machine".*

Explain why sampling belongs to the request's execution semantics, not to the presentation of its
output. **The bar:** your answer says that the sampled token *becomes part of the request's
history* (its context), and that *the next decode step is computed from it*. One point for each;
at most 160 字 (about 70 English words). "Sampling only makes the output more random" or "it is
a UI knob" is the chapter's pitfall 2 and cancels both points."""),
        ans("task4_sampling"),
        chk("task4_sampling"),

        # ---- quiz ----------------------------------------------------------------------------
        md("""## Self-check quiz
### 自测问题

The chapter's four self-check questions, each with one best answer. Answer with a pair: the letter
and **why, in one sentence** — `("B", "because …")` (2 points: one for the letter, one for the
why). "Answer: B", "选B" or "I think B" are read as B; two letters are not an answer. A wrong pick
tells you why it is wrong, so you can try again; the right one shows the explanation of every
option."""),
    ]
    for i, q in enumerate(QUIZ, start=1):
        out += [md(_quiz_markdown(q, i)), ans(q.id), chk(q.id)]

    out.append(md("""## Pitfalls
### 常见误区

Three statements drawn from the chapter's pitfalls. Say whether each is **true or false**, and
**why**, in a sentence (2 points each: one for the verdict, one for the reason; reasons at most
120 字, graded heuristically)."""))
    for i, p in enumerate(PITFALLS, start=1):
        out += [md(_pitfall_markdown(p, i)), ans(p.id), chk(p.id)]

    out += [
        md("""## Coding tasks
### 编程练习

Three small functions, each compared with the engine itself. Your function runs with a time limit of a
few seconds per call; an exception or an endless loop becomes feedback, not a crash.

### Code 1 — a top-p (nucleus) filter
*§4 sampling; the engine's version is `minillm.sampler.top_p_filter`.*

`my_top_p_filter(logits, top_p)` takes logits of shape `[..., vocab]` and returns a tensor of the
same shape: sort the tokens by probability, keep the smallest set of the most likely ones whose
probabilities add up to **at least** `top_p` (always at least one token), and set every other logit
to `-inf`. Kept logits stay as they are — no softmax in the output, no renormalising.

It is compared with the engine on 11 cases (3 points, in proportion): random rows and batches,
`top_p=1.0`, a tiny `top_p`, a dominant token, logits that already hold `-inf`, a one-token
vocabulary, tied logits, and logits large enough to overflow a hand-written softmax."""),
        ans("code_top_p"),
        chk("code_top_p"),
        md("""### Code 2 — KV bytes per token
*§3; the engine's version is `minillm.kv_cache.kv_bytes_per_token`.*

`my_kv_bytes_per_token(num_layers, num_kv_heads, head_dim, dtype_bytes)` returns how many bytes of
keys and values one token occupies in the cache, across all layers. It is compared with the engine
on the shipped model and six real model shapes, with and without grouped-query attention and in
several precisions (2 points, in proportion)."""),
        ans("code_kv_bytes"),
        chk("code_kv_bytes"),
        md("""### Code 3 — the stop check
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
with the engine's semantics on 16 cases (3 points, in proportion)."""),
        ans("code_stop_check"),
        chk("code_stop_check"),
        md(f"""## Exercise 5 — the long chat gets heavier
### 任务 5：长对话越来越重
*§3, scenario 1 "长对话越来越重"; notebook 03 measures it on the engine.*

In a chat, every turn sends **one new request** whose prompt is the system prompt, the whole
history so far, and the new user message; the model then generates its reply. So the KV cache one
request holds grows turn after turn — unless the server trims the history: it can keep only the
**last N turns** (`keep_last=N`), or replace the old turns with a short **summary**.

**Part a.** Write `chat_kv_bytes(turn, system_tokens, user_tokens, reply_tokens, bytes_per_token,
keep_last=None)`: the bytes of K and V held by the request of turn `turn` (1, 2, …) once its reply
is generated, counting tokens (not blocks). Every earlier turn is one user message plus one reply.
Compared with the exact count on 8 cases, with the shipped model's bytes per token (2 points, in
proportion)."""),
        ans("code_chat_kv"),
        chk("code_chat_kv"),
        md(f"""**Part b.** Pick a policy for this chat, and say why in a sentence (2 points: the policy, the
reason):

> {TASK5_SCENARIO}

Answer `("summary", "why …")` or `("last_n", "why …")`."""),
        ans("task5_trim_policy"),
        chk("task5_trim_policy"),
        md("""## Your score
### 总分

All exercises at once — the same table `minillm grade` prints."""),
        code("summary()"),
    ]
    return out


def build(solved: bool):
    nb = new_notebook(cells=cells(solved))
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, cell in enumerate(nb.cells):  # stable cell ids: clean diffs when regenerated
        cell["id"] = f"ch04-ex-{i:02d}"
    return nb


def execute(nb, folder: Path):
    from nbclient import NotebookClient

    NotebookClient(nb, timeout=600, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(folder)}}).execute()
    return nb


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--execute", action="store_true", help="run both notebooks and store their outputs")
    args = parser.parse_args(argv)
    for path, solved in ((STUDENT, False), (SOLVED, True)):
        nb = build(solved)
        path.parent.mkdir(parents=True, exist_ok=True)
        if args.execute:
            os.environ.setdefault("TQDM_DISABLE", "1")
            execute(nb, path.parent)
        nbformat.write(nb, path)
        print(f"wrote {path.relative_to(REPO)}")


if __name__ == "__main__":
    main()
