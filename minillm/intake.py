"""Checks on a new request, all made before anything is registered, queued or allocated, so a
request that can never run leaves nothing behind (no entry in ``llm.requests``, no event)."""

from __future__ import annotations

import numbers
from typing import Sequence

from .params import SamplingParams


def check_params(params, vocab_size: int | None = None) -> SamplingParams:
    """``params`` (None: the defaults), with its ``logit_bias`` ids in the vocabulary."""
    if params is None:
        return SamplingParams()
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
    bias = getattr(params, "logit_bias", ())
    if vocab_size is not None and bias and bias[-1][0] >= vocab_size:  # sorted: the last id is the largest
        raise ValueError(f"logit_bias keys must be token ids in the vocabulary [0, {vocab_size}), "
                         f"got {bias[-1][0]}")
    return params


def _all_ints(values) -> bool:
    return all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in values)


def check_text(name: str, text: str) -> str:
    """``text`` unchanged if it is valid Unicode. A lone surrogate (a half of a UTF-16 pair,
    which JSON's ``"\\ud800"`` escape can smuggle in) has no UTF-8 form: the tokenizer would
    raise a ``TypeError`` on it, so it is refused here with the position named."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{name} must be valid Unicode text: it holds a lone surrogate "
                         f"{text[exc.start]!r} at index {exc.start}") from None
    return text


def check_prompt(prompt, prompt_token_ids: Sequence[int] | None, vocab_size: int) -> list[int] | None:
    """The prompt's token ids when given as ids (numpy ints become ints), else None after
    checking the text."""
    if prompt_token_ids is None:
        if not isinstance(prompt, str) or not prompt:
            raise ValueError(f"prompt must be a non-empty string, got {_short(prompt)}")
        check_text("prompt", prompt)
        return None
    if prompt is not None:
        raise ValueError("give prompt or prompt_token_ids, not both")
    try:
        ids = list(prompt_token_ids)
    except TypeError:
        ids = []
    if not ids or not _all_ints(ids) or not all(0 <= t < vocab_size for t in ids):
        raise ValueError(f"prompt_token_ids must be a non-empty list of ints in [0, {vocab_size})")
    return [int(t) for t in ids]


def check_length(n: int, max_model_len: int) -> None:
    """A prompt of ``n`` tokens leaves room for at least one output token."""
    if n >= max_model_len:
        raise ValueError(f"prompt has {n} tokens but max_model_len is {max_model_len}: shorten the "
                         f"prompt to at most {max_model_len - 1} tokens")


def check_fits(ids: list[int], prompt, vocab_size: int, max_model_len: int, num_blocks: int,
               block_size: int) -> list[int]:
    """Token ids that can run: ids in range, shorter than max_model_len, and (with one token of
    output) no larger than the whole KV pool."""
    n = len(ids)
    check_length(n, max_model_len)  # first: a 400k-token prompt is refused without a look at each id
    if n == 0 or not _all_ints(ids) or not all(0 <= t < vocab_size for t in ids):
        raise ValueError(f"the tokenizer turned prompt {_short(prompt)} into {n} ids, not a non-empty "
                         f"list of ids in [0, {vocab_size})")
    if -(-(n + 1) // block_size) > num_blocks:
        raise ValueError(f"prompt has {n} tokens but the whole KV budget holds {num_blocks * block_size} "
                         f"tokens: shorten the prompt or raise num_kv_blocks / kv_cache_tokens")
    return [int(t) for t in ids]


def _short(value, limit: int = 200) -> str:
    """``repr(value)``, cut to ``limit`` characters: an error message must not echo a megabyte."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
