"""Timed experiments on a real engine: prefill cost by prompt length, decode with and without the cache.

Unlike the other charts these run new requests: each measurement is a real request (random
token ids, so no two share a cached prefix) whose time is its own step's ``duration``; the
no-cache side times ``llm.model.full_logits`` directly. The engine must be idle first, so
every timed step does only the work measured.
"""

from __future__ import annotations

import math
import random
import statistics
import time
from typing import Sequence

from ..fonts import with_cjk_fonts
from ..i18n import phrase, resolve_lang
from .figure import STATE_COLORS, new_figure

__all__ = ["random_prompt", "measure_prefill", "measure_cache_vs_recompute", "plot_prefill_times",
           "plot_cache_vs_recompute"]


def _require_idle(llm) -> None:
    if llm.has_unfinished():
        raise ValueError("the engine still has unfinished requests; run them to the end (or cancel "
                         "them) before timing, so that every timed step does only the work measured")


def _random_ids(rng: random.Random, n: int, vocab: int, avoid: set[int]) -> list[int]:
    ids = []
    while len(ids) < n:
        t = rng.randrange(vocab)
        if t not in avoid:
            ids.append(t)
    return ids


def _special_ids(llm) -> set[int]:
    ids = set(getattr(llm, "eos_token_ids", set()))
    ids.update(getattr(llm.tokenizer, "all_special_ids", []) or [])
    return ids


def random_prompt(llm, num_tokens: int, seed: int = 0) -> list[int]:
    """``num_tokens`` random token ids (no special tokens), for timing experiments: the model does
    the same arithmetic whatever the ids are, and random prompts never share a cached prefix."""
    if num_tokens >= llm.max_model_len:
        raise ValueError(f"num_tokens must be < max_model_len ({llm.max_model_len}), got {num_tokens}")
    return _random_ids(random.Random(seed), num_tokens, llm.model_config.vocab_size, _special_ids(llm))


def measure_prefill(llm, lengths: Sequence[int], *, repeats: int = 3, seed: int = 0) -> list[dict]:
    """Time the prefill of prompts of exactly ``lengths`` tokens on the engine.

    Each measurement is one real request (``prompt_token_ids=`` random ids, so no two prompts
    share a cached prefix) with ``max_tokens=1``: one ``llm.step()`` prefills it, samples its
    only token and releases it. The time is that step's own ``duration`` from the trace.
    Returns ``[{"prompt_tokens", "seconds" (the fastest of the repeats), "all", "cached_tokens"}]``.
    """
    from ...params import SamplingParams

    _require_idle(llm)
    rng = random.Random(seed)
    vocab = llm.model_config.vocab_size
    avoid = _special_ids(llm)
    params = SamplingParams(max_tokens=1, temperature=0.0)

    def one(n: int) -> tuple[float, int]:
        req = llm.add_request(prompt_token_ids=_random_ids(rng, n, vocab, avoid), params=params)
        events = llm.step()
        step = next(e for e in events if e.kind == "step")
        pre = next(e for e in events if e.request_id == req.request_id and e.kind == "transition"
                   and e.data["to"] == "PREFILL")
        if req.is_live:  # cannot happen with max_tokens=1, but never leave blocks behind
            llm.cancel(req.request_id)
        return step.data["duration"], pre.data.get("cached_tokens", 0)

    one(min(lengths))  # warm-up: first calls pay one-off allocation costs
    rows = []
    for n in lengths:
        runs = [one(n) for _ in range(repeats)]
        rows.append({"prompt_tokens": n, "seconds": min(t for t, _ in runs), "all": [t for t, _ in runs],
                     "cached_tokens": max(c for _, c in runs)})
    return rows


def measure_cache_vs_recompute(llm, context_lengths: Sequence[int], *, decode_steps: int = 4,
                               repeats: int = 3, seed: int = 0) -> list[dict]:
    """The cost of one new token at each context length, with and without the KV cache.

    With the cache: a real request whose prompt has ``L`` tokens is prefilled, then decoded for
    ``decode_steps`` steps; each decode step feeds one token and reads the cached keys and values
    of all the others. Its time is the median ``duration`` of those steps in the trace.
    Without it: ``llm.model.full_logits(context)`` recomputes every position of the same context
    (prompt + the first token), which is what every step would cost if nothing were kept.

    Both paths predict the next token from the same context, so they must agree: ``same_token``
    says whether the argmax of the recomputed logits is the token the engine produced (greedy)
    and ``logprob_diff`` how far apart the two computations put that token's log-probability.
    Returns ``[{"context_tokens", "with_cache_s", "recompute_s", "same_token", "logprob_diff"}]``.
    """
    import torch

    from ...params import SamplingParams

    _require_idle(llm)
    rng = random.Random(seed)
    vocab = llm.model_config.vocab_size
    avoid = _special_ids(llm)
    params = SamplingParams(max_tokens=decode_steps + 1, temperature=0.0, ignore_eos=True, logprobs=0)
    rows = []
    for i, n in enumerate([min(context_lengths)] + list(context_lengths)):  # the first is a warm-up
        if n + decode_steps + 1 > llm.max_model_len:
            raise ValueError(f"context length {n} + {decode_steps + 1} new tokens exceeds max_model_len "
                             f"({llm.max_model_len})")
        prompt = _random_ids(rng, n, vocab, avoid)
        req = llm.add_request(prompt_token_ids=prompt, params=params)
        durations = []
        while req.is_live:
            events = llm.step()
            step = next((e for e in events if e.kind == "step"), None)
            if step is not None and step.data["num_prefill"] == 0:
                durations.append(step.data["duration"])
        context = prompt + req.output_token_ids[:1]
        best = math.inf
        for _ in range(repeats):
            t0 = time.perf_counter()
            logits = llm.model.full_logits(context)[-1]
            if logits.is_cuda:  # kernels run asynchronously: wait for them before reading the clock
                torch.cuda.synchronize(logits.device)
            best = min(best, time.perf_counter() - t0)
        engine_token = req.output_token_ids[1]
        same = int(torch.argmax(logits)) == engine_token
        recomputed = float(torch.log_softmax(logits, -1)[engine_token])
        diff = abs(recomputed - req.logprobs[1]["logprob"])
        if i == 0:
            continue
        rows.append({"context_tokens": n + 1, "with_cache_s": statistics.median(durations),
                     "recompute_s": best, "same_token": same, "logprob_diff": diff})
    return rows


@with_cjk_fonts
def plot_prefill_times(rows: Sequence[dict], *, decode_step_s: float | None = None, title: str | None = None, lang=None):
    """Left: prefill time against prompt length. Right: the same time per prompt token, with
    (optionally) one decode step's time per token beside it."""
    lang = resolve_lang(lang)
    fig, axes = new_figure(10.0, 3.6, ncols=2)
    ax, ax2 = axes[0]
    ns = [r["prompt_tokens"] for r in rows]
    ms = [r["seconds"] * 1e3 for r in rows]
    ax.plot(ns, ms, "o-", color=STATE_COLORS["PREFILL"])
    ax.set_xlabel(phrase('pre.xlabel', lang))
    ax.set_ylabel(phrase('pre.ylabel', lang))
    ax.set_title(phrase('pre.title', lang))
    ax.set_xlim(0, None)
    ax.set_ylim(0, None)
    ax.grid(alpha=0.3)
    per = [m / n for m, n in zip(ms, ns)]
    ax2.plot(ns, per, "o-", color=STATE_COLORS["PREFILL"], label=phrase('pre.per_token', lang))
    if decode_step_s is not None:
        ax2.axhline(decode_step_s * 1e3, color=STATE_COLORS["DECODE"], linestyle="--",
                    label=phrase('pre.decode', lang))
    ax2.set_yscale("log")
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax2.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax2.yaxis.set_minor_formatter(NullFormatter())
    ax2.set_xlabel(phrase('pre.xlabel', lang))
    ax2.set_ylabel(phrase('pre.ylabel2', lang))
    ax2.set_title(phrase('pre.title2', lang))
    ax2.legend(fontsize=8, frameon=False)
    ax2.grid(alpha=0.3, which="both")
    if title:
        fig.suptitle(title)
    return fig


@with_cjk_fonts
def plot_cache_vs_recompute(rows: Sequence[dict], *, title: str | None = None, lang=None):
    """Cost of one new token against context length: decode with the KV cache (an engine step)
    vs recomputing the whole context (``full_logits``)."""
    lang = resolve_lang(lang)
    fig, axes = new_figure(8.0, 3.6)
    ax = axes[0][0]
    ns = [r["context_tokens"] for r in rows]
    ax.plot(ns, [r["with_cache_s"] * 1e3 for r in rows], "o-", color=STATE_COLORS["DECODE"],
            label=phrase('cvr.with', lang))
    ax.plot(ns, [r["recompute_s"] * 1e3 for r in rows], "s-", color=STATE_COLORS["PREEMPTED"],
            label=phrase('cvr.without', lang))
    last = rows[-1]
    ratio = last["recompute_s"] / last["with_cache_s"]
    ax.annotate(f"{ratio:.0f}x", (ns[-1], last["recompute_s"] * 1e3), xytext=(-10, 6),
                textcoords="offset points", ha="right", fontsize=9)
    ax.set_xlabel(phrase('cvr.xlabel', lang))
    ax.set_ylabel(phrase('cvr.ylabel', lang))
    ax.set_xlim(0, ns[-1] * 1.08)
    ax.set_ylim(0, last["recompute_s"] * 1e3 * 1.15)
    ax.set_title(title or phrase('cvr.title', lang))
    ax.legend(fontsize=8, frameon=False, loc="upper left")
    ax.grid(alpha=0.3)
    return fig
