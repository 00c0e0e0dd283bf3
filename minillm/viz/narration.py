"""Engine events in plain words: one sentence per event, one sentence per stepper action.

The trace is data (``Event(step, time, request_id, kind, data)``); a learner reads sentences.
``describe_event`` says what one event means ("request 0: WAITING -> PREFILL, 2 KV blocks
allocated"), ``summarize_action`` what a whole button press did to its request. Both read only
the events, in the course's language; the stepper's log and the notebooks use them.
"""

from __future__ import annotations

import math

from ..trace import Event
from ._common import token_text
from .i18n import phrase, resolve_lang

__all__ = ["describe_event", "summarize_action"]


def _quote(text: str, lang) -> str:
    return f"「{text}」" if resolve_lang(lang) == "zh" else repr(text)


def describe_event(e: Event, tokenizer=None, lang=None, *, token_label=None) -> str:
    """One engine event in plain words (used by the stepper's log and the notebooks).

    ``lang``: "en" or "zh" (None: the course-wide language). ``token_label(event)``, when
    given, names a sampled token (the stepper passes the text its detokenized request shows);
    otherwise the token's own text from ``tokenizer``."""
    lang = resolve_lang(lang)
    d = e.data
    who = phrase("ev.who", lang, rid=e.request_id)
    if e.kind == "transition":
        frm, to = d.get("from"), d.get("to")
        if frm is None:
            return phrase("ev.created", lang, who=who)
        if to == "WAITING":
            return phrase("ev.waiting", lang, who=who, n=d.get("prompt_tokens"))
        if to == "PREFILL":
            cached = d.get("cached_tokens", 0)
            extra = phrase("ev.prefill_cached", lang, n=cached) if cached else ""
            return phrase("ev.prefill", lang, who=who, frm=frm, blocks=d.get("blocks"), extra=extra)
        if to == "DECODE":
            return phrase("ev.decode", lang, who=who)
        if to == "PREEMPTED":
            return phrase("ev.preempted", lang, who=who, frm=frm, blocks=d.get("blocks"))
        if to == "FINISHED":
            return phrase("ev.finished", lang, who=who, frm=frm, reason=d.get("stop_reason"))
        if to == "RELEASED":
            return phrase("ev.released", lang, who=who, blocks=d.get("blocks"))
        return f"{who}: {frm} -> {to}"
    if e.kind == "token":
        label = token_label(e) if token_label is not None else (
            token_text(tokenizer, d["token_id"]) if tokenizer is not None else None)
        text = f" {_quote(label, lang)}" if label is not None else ""
        prob = f" (p={math.exp(d['logprob']):.3f})" if "logprob" in d else ""
        return phrase("ev.token", lang, who=who, index=d["index"], id=d["token_id"], text=text, prob=prob)
    if e.kind == "step":
        n = d["num_tokens"]
        key = "ev.step_one" if n == 1 else "ev.step"
        return phrase(key, lang, step=e.step, prefill=d["num_prefill"], decode=d["num_decode"], n=n,
                      used=d["used_blocks"], total=d["total_blocks"])
    return repr(e)


def summarize_action(action: str, events: list[Event], request_id, tokenizer=None, lang=None, *,
                     token_label=None) -> str:
    """One sentence for what a stepper action did to its request, from the events it caused,
    e.g. "Prefill: one forward pass over 5 prompt tokens, 1 KV block allocated, first token
    'fox' sampled"."""
    lang = resolve_lang(lang)
    mine = [e for e in events if e.request_id == request_id]
    steps = [e for e in events if e.kind == "step"]
    tokens = [e for e in mine if e.kind == "token"]
    moved = {e.data.get("to"): e for e in mine if e.kind == "transition"}

    def name(e):
        label = token_label(e) if token_label is not None else (
            token_text(tokenizer, e.data["token_id"]) if tokenizer is not None else str(e.data["token_id"]))
        return _quote(label, lang)

    parts = []
    if action == "tokenize" and "WAITING" in moved:
        parts.append(phrase("sum.tokenize", lang, n=moved["WAITING"].data.get("prompt_tokens")))
    elif action in ("prefill", "decode_one") and "PREFILL" in moved:
        pre = moved["PREFILL"].data
        chunks = [e.data.get("chunk_tokens") for e in mine if e.kind == "transition" and e.data.get("to") == "PREFILL"]
        # this request's own prompt tokens (a step may also have carried other requests' tokens)
        n = sum(c for c in chunks if c) if any(chunks) else sum(s.data["num_tokens"] for s in steps)
        key = "sum.prefill" if len(steps) <= 1 else "sum.prefill_steps"
        parts.append(phrase(key, lang, n=n, blocks=pre.get("blocks"), steps=len(steps)))
        if pre.get("cached_tokens"):
            parts.append(phrase("sum.cached", lang, n=pre["cached_tokens"]))
        if tokens:
            parts.append(phrase("sum.first", lang, tok=name(tokens[0])))
    elif action == "decode_one" and tokens:
        parts.append(phrase("sum.decode", lang, tok=name(tokens[-1]), index=tokens[-1].data["index"]))
    elif action == "run_to_end":
        parts.append(phrase("sum.run", lang, steps=len(steps), n=len(tokens)))
    elif action == "cancel":
        parts.append(phrase("sum.cancel", lang, blocks=moved.get("RELEASED").data.get("blocks")
                            if "RELEASED" in moved else 0))
    elif action == "release" and "RELEASED" in moved:
        parts.append(phrase("sum.release", lang, blocks=moved["RELEASED"].data.get("blocks")))
    if "FINISHED" in moved and action not in ("cancel",):
        parts.append(phrase("sum.finished", lang, reason=moved["FINISHED"].data.get("stop_reason")))
    if not parts:
        return ""
    sep = "，" if lang == "zh" else ", "
    return phrase(f"btn.{action}", lang) + ("：" if lang == "zh" else ": ") + sep.join(parts)
