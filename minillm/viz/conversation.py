"""A multi-turn chat on the engine, measured turn by turn: the chapter's scenario
"a long conversation gets heavier and slower" (长对话越来越重).

A chat API keeps no state between turns: each turn the client sends the whole conversation
again, plus the new message, and the engine makes a brand-new request of it. So the request
of turn *k* is as long as everything said before it, and it holds KV cache for all of it.
``run_chat`` plays such a conversation on a real engine and records, for every turn, what
that request cost: prompt tokens, the part found in the prefix cache, the part that really
went through the model, KV blocks held, and TTFT. ``policy`` picks what the client re-sends:

* ``"full"``: the whole history (what a naive client does);
* ``"last_turns"``: only the last ``keep_turns`` exchanges (trimming);
* ``"summary"``: a fixed summary in place of the older turns, then the last ``keep_turns``.

The conversation is laid out by ``minillm.chat`` (the model's chat template, or the plain
``role: content`` fallback for a base model such as the shipped story model).
"""

from __future__ import annotations

from typing import Sequence

from ..chat import encode_conversation
from ..params import SamplingParams
from .fonts import with_cjk_fonts
from .i18n import phrase, resolve_lang
from .plots.figure import byte_unit, new_figure, request_color

__all__ = ["POLICIES", "conversation_for_turn", "run_chat", "plot_chat_turns", "chat_summary"]

POLICIES = ("full", "last_turns", "summary")


def conversation_for_turn(history: Sequence[dict], message: str, *, policy: str = "full",
                          keep_turns: int = 2, summary: str | None = None) -> list[dict]:
    """The messages the client sends for a new ``message``, given the ``history`` so far
    (alternating user / assistant dicts) and the trimming ``policy``."""
    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    if not isinstance(keep_turns, int) or isinstance(keep_turns, bool) or keep_turns < 0:
        raise ValueError(f"keep_turns must be an int >= 0, got {keep_turns!r}")
    if policy == "summary" and not (isinstance(summary, str) and summary.strip()):
        raise ValueError("summary must be a non-empty string when policy='summary'")
    history = list(history)
    if policy == "full":
        kept = history
    else:
        kept = history[max(0, len(history) - 2 * keep_turns):]
        if policy == "summary" and len(kept) < len(history):  # something was dropped: summarise it
            kept = [{"role": "system", "content": summary}] + kept
    return kept + [{"role": "user", "content": message}]


def run_chat(llm, messages: Sequence[str], *, policy: str = "full", keep_turns: int = 2,
             summary: str | None = None, params: SamplingParams | None = None, lang=None) -> list[dict]:
    """Play one conversation on ``llm``, one request per turn; return one row per turn.

    ``lang`` only checks the language setting here (run_chat prints nothing and its rows are
    numbers and the model's replies); the chart is ``plot_chat_turns(..., lang=...)``.

    Each row: ``turn``, ``prompt_tokens``, ``cached_tokens`` (found in the prefix cache at
    admission, from the PREFILL transition event), ``prefilled_tokens`` (the rest: what the
    model really computed), ``output_tokens``, ``kv_blocks`` and ``kv_bytes`` (held by the
    turn's request when it finished, shared prefix blocks included), ``ttft`` (seconds) and
    ``reply``. Every request is released before the next turn: nothing is left allocated."""
    resolve_lang(lang)
    if isinstance(messages, str) or not messages or not all(isinstance(m, str) and m for m in messages):
        raise ValueError("messages must be a non-empty list of non-empty strings (the user's turns)")
    if llm.has_unfinished():
        raise ValueError("the engine still has unfinished requests; finish or cancel them first, so that "
                         "each turn's timing measures that turn only")
    conversation_for_turn([], "check", policy=policy, keep_turns=keep_turns, summary=summary)  # validates
    if params is None:
        params = SamplingParams(max_tokens=32, temperature=0.0, stop=["\n"])
    stats = llm.cache_stats()
    history: list[dict] = []
    rows = []
    for turn, message in enumerate(messages, start=1):
        sent = conversation_for_turn(history, message, policy=policy, keep_turns=keep_turns, summary=summary)
        ids = encode_conversation(llm.tokenizer, sent)
        mark = len(llm.trace)
        req = llm.add_request(prompt_token_ids=ids, params=params, auto_release=False)
        while req.is_live:
            llm.step()
        admitted = [e for e in llm.trace[mark:] if e.request_id == req.request_id
                    and e.kind == "transition" and e.data.get("to") == "PREFILL"]
        cached = admitted[0].data.get("cached_tokens", 0) if admitted else 0
        blocks = len(req.block_table)
        llm.release(req.request_id)
        reply = req.text.strip()
        rows.append({
            "turn": turn, "prompt_tokens": len(ids), "cached_tokens": cached,
            "prefilled_tokens": len(ids) - cached, "output_tokens": len(req.output_token_ids),
            "kv_blocks": blocks, "kv_bytes": blocks * stats.block_size * stats.bytes_per_token,
            "ttft": llm.metrics(req.request_id)["ttft"], "reply": reply,
        })
        history += [{"role": "user", "content": message}, {"role": "assistant", "content": reply}]
    return rows


def chat_summary(rows: Sequence[dict], last: int = 4) -> dict:
    """A few numbers that describe one run: the last turn's prompt and KV, the total tokens
    prefilled over the conversation, and the fastest TTFT of the last ``last`` turns (the
    minimum is the least disturbed by whatever else the machine was doing)."""
    tail = rows[-last:]
    return {
        "turns": len(rows),
        "last_prompt_tokens": rows[-1]["prompt_tokens"],
        "last_kv_blocks": rows[-1]["kv_blocks"],
        "last_kv_bytes": rows[-1]["kv_bytes"],
        "peak_kv_bytes": max(r["kv_bytes"] for r in rows),
        "total_prefilled_tokens": sum(r["prefilled_tokens"] for r in rows),
        "total_cached_tokens": sum(r["cached_tokens"] for r in rows),
        "min_ttft_last": min(r["ttft"] for r in tail),
    }


@with_cjk_fonts
def plot_chat_turns(runs: dict[str, Sequence[dict]], *, title: str | None = None, lang=None):
    """Four panels, one line per run: prompt tokens, tokens really prefilled (prompt minus
    prefix-cache hits), KV held by the turn's request, and TTFT, against the turn number."""
    lang = resolve_lang(lang)
    if not runs:
        raise ValueError("runs must be a non-empty dict {name: rows from run_chat}")
    fig, axes = new_figure(10.0, 6.4, ncols=2, nrows=2)
    (ax_prompt, ax_prefill), (ax_kv, ax_ttft) = axes
    peak = max(r["kv_bytes"] for rows in runs.values() for r in rows) or 1
    div, unit = byte_unit(peak)
    for i, (name, rows) in enumerate(runs.items()):
        turns = [r["turn"] for r in rows]
        style = dict(color=request_color(i), marker="o", markersize=3.5, linewidth=1.6, label=name)
        ax_prompt.plot(turns, [r["prompt_tokens"] for r in rows], **style)
        ax_prefill.plot(turns, [r["prefilled_tokens"] for r in rows], **style)
        ax_kv.plot(turns, [r["kv_bytes"] / div for r in rows], **style)
        ax_ttft.plot(turns, [r["ttft"] * 1e3 for r in rows], **style)
    for ax, ylabel, text in (
            (ax_prompt, phrase("chat.tokens", lang), phrase("chat.prompt", lang)),
            (ax_prefill, phrase("chat.tokens", lang), phrase("chat.prefill", lang)),
            (ax_kv, unit, phrase("chat.kv", lang)),
            (ax_ttft, "ms", phrase("chat.ttft", lang))):
        ax.set_title(text, fontsize=11)
        ax.set_ylabel(ylabel, fontsize=11)
        ax.set_xlabel(phrase("chat.turn", lang), fontsize=11)
        ax.tick_params(labelsize=10)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
    ax_prompt.legend(fontsize=10, frameon=False)
    if title:
        fig.suptitle(title, fontsize=12)
    return fig
