"""OpenAI request bodies -> engine inputs, engine outputs -> OpenAI response bodies.

The sampling fields are not re-validated here: they go straight into the engine's own
``SamplingParams``, so the HTTP 400 a client sees carries the very message the engine
would raise in Python ("top_p must be a float in (0, 1], got 0"). Only what is specific to
the HTTP API (``n``, ``stream``, the prompt's shape, ``messages``) is checked in this module.

Every field a body carries must be one this server acts on, or ``user`` (an end-user id
meant for a provider's abuse monitoring: taken and ignored, minillm keeps no per-user
record). An OpenAI field minillm does not implement (``response_format``, ``suffix``,
``tools``, ...) is refused with a 400 naming it unless it is ``null``; a name
neither API has (a typo such as ``temprature``) is refused too. Silently ignoring either would
answer a question the client did not ask.
"""

from __future__ import annotations

import dataclasses
import difflib
import time
from dataclasses import dataclass
from typing import Any

from minillm import SamplingParams, StopReason
from minillm.chat import validate_messages

# OpenAI's own sampling fields, then vLLM's extras (sent by the openai client in extra_body).
OPENAI_FIELDS = ("max_tokens", "temperature", "top_p", "stop", "seed", "presence_penalty",
                 "frequency_penalty", "logit_bias")
VLLM_EXTRA_FIELDS = ("top_k", "min_p", "repetition_penalty", "ignore_eos", "stop_token_ids",
                     "skip_special_tokens", "include_stop_str_in_output")
_PARAM_FIELDS = {f.name for f in dataclasses.fields(SamplingParams) if f.init}
_SHARED_FIELDS = {"model", "n", "stream", "stream_options", "user", *OPENAI_FIELDS, *VLLM_EXTRA_FIELDS}
#: The fields each endpoint acts on (plus ``user``, taken and ignored).
COMPLETION_FIELDS = frozenset(_SHARED_FIELDS | {"prompt", "logprobs", "echo", "best_of"})
CHAT_FIELDS = frozenset(_SHARED_FIELDS | {"messages", "logprobs", "top_logprobs", "max_completion_tokens"})
#: OpenAI fields minillm does not implement: a 400 naming them, unless their value is null.
UNSUPPORTED_FIELDS = frozenset({
    "suffix", "response_format", "tools", "tool_choice", "functions", "function_call",
    "parallel_tool_calls", "audio", "modalities", "prediction", "reasoning_effort", "service_tier", "store",
    "metadata", "web_search_options", "verbosity", "prompt_cache_key", "safety_identifier"})
#: Longest error message sent back: a message quoting a megabyte value is cut.
MAX_ERROR_CHARS = 1000

# The chapter's stop reasons in OpenAI's vocabulary; the minillm reason travels beside it.
FINISH_REASONS = {StopReason.EOS: "stop", StopReason.STOP_STRING: "stop",
                  StopReason.MAX_TOKENS: "length", StopReason.CONTEXT_FULL: "length",
                  StopReason.CANCELLED: "abort"}


class BadRequest(ValueError):
    """A request the API cannot serve; ``param`` names the offending field (HTTP 400)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def param_of(message: str) -> str | None:
    """The field a ``SamplingParams`` message names: its first word ("top_p must be ...")."""
    first = message.split(" ", 1)[0]
    return first if first in _PARAM_FIELDS else None


@dataclass
class ParsedRequest:
    """What one HTTP body asks the engine for."""

    prompt: str | None
    prompt_token_ids: list[int] | None
    params: SamplingParams
    stream: bool
    include_usage: bool
    top_logprobs: int | None  # how many candidates to report per token; None = no logprobs


def check_fields(body: dict, known: frozenset) -> None:
    """Every field is one the endpoint acts on, or an unimplemented OpenAI field set to null."""
    for name, value in body.items():
        if name in known or (name in UNSUPPORTED_FIELDS and value is None):
            continue
        if name in UNSUPPORTED_FIELDS:
            raise BadRequest(f"{name} is not supported by minillm serve (send it as null or leave it out)", name)
        close = difflib.get_close_matches(name, sorted(known), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise BadRequest(f"unknown field {name[:100]!r}: neither an OpenAI nor a vLLM field that minillm serve "
                         f"takes here{hint}", name[:100])


def _one(body: dict, name: str) -> None:
    """``n`` / ``best_of``: absent, null or exactly the integer 1 (not 1.0, not true)."""
    value = body.get(name)
    if value is not None and (type(value) is not int or value != 1):
        raise BadRequest(f"{name} must be the integer 1 (minillm serve returns one choice per request), "
                         f"got {value!r}", name)


def _check_common(body: dict, known: frozenset) -> None:
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    check_fields(body, known)
    _one(body, "n")
    _one(body, "best_of")
    for name in ("stream", "echo"):
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise BadRequest(f"{name} must be true or false, got {body[name]!r}", name)
    if body.get("echo"):
        raise BadRequest("echo is not supported by minillm serve", "echo")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest(f"model must be a string, got {type(model).__name__}", "model")
    opts = body.get("stream_options")
    if opts is not None and (not isinstance(opts, dict)
                             or not isinstance(opts.get("include_usage", False), bool)):
        raise BadRequest("stream_options must be an object like {\"include_usage\": true}", "stream_options")


def _sampling_params(body: dict, overrides: dict) -> SamplingParams:
    kwargs: dict[str, Any] = {}
    for name in OPENAI_FIELDS + VLLM_EXTRA_FIELDS:
        if body.get(name) is not None:
            kwargs[name] = body[name]
    kwargs.update(overrides)
    if "logit_bias" in kwargs:
        kwargs["logit_bias"] = _logit_bias(kwargs["logit_bias"])
    if "include_stop_str_in_output" in kwargs and "include_stop_str_in_output" not in _PARAM_FIELDS:
        if kwargs.pop("include_stop_str_in_output"):
            raise BadRequest("include_stop_str_in_output is not supported by this engine version",
                             "include_stop_str_in_output")
    try:
        return SamplingParams(**kwargs)
    except ValueError as exc:
        raise BadRequest(str(exc), param_of(str(exc))) from None


def _logit_bias(value):
    """JSON object keys are strings: ``{"50256": -100}`` -> ``{50256: -100}`` (the range and the
    vocabulary are the engine's checks)."""
    if not isinstance(value, dict):
        raise BadRequest(f"logit_bias must be an object {{\"token id\": bias}}, got {type(value).__name__}",
                         "logit_bias")
    out = {}
    for key, bias in value.items():
        if not (key.isascii() and key.isdigit()) or len(key) > 18:
            raise BadRequest(f"logit_bias keys must be token ids (non-negative integers), got {key[:50]!r}",
                             "logit_bias")
        out[int(key)] = bias
    return out


def _stream_flags(body: dict) -> tuple[bool, bool]:
    stream = bool(body.get("stream", False))
    include_usage = bool((body.get("stream_options") or {}).get("include_usage", False))
    return stream, include_usage


def parse_completion(body: dict) -> ParsedRequest:
    """``POST /v1/completions``: ``prompt`` is a string or a list of token ids (one prompt)."""
    _check_common(body, COMPLETION_FIELDS)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    text, ids = None, None
    if isinstance(prompt, str) and prompt:
        text = prompt
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
    else:
        raise BadRequest("prompt must be a non-empty string or a non-empty list of token ids "
                         "(one prompt per request)", "prompt")
    logprobs = body.get("logprobs")
    if logprobs is not None and (not isinstance(logprobs, int) or isinstance(logprobs, bool) or not 0 <= logprobs <= 20):
        raise BadRequest(f"logprobs must be an int in [0, 20] or null, got {logprobs!r}", "logprobs")
    params = _sampling_params(body, {} if logprobs is None else {"logprobs": logprobs})
    stream, include_usage = _stream_flags(body)
    return ParsedRequest(text, ids, params, stream, include_usage, logprobs)


def parse_chat(body: dict, max_model_len: int, encode) -> ParsedRequest:
    """``POST /v1/chat/completions``. ``encode(messages)`` gives the templated prompt's token
    ids, so that a missing ``max_tokens`` means "the rest of the context", as in vLLM."""
    _check_common(body, CHAT_FIELDS)
    try:
        messages = validate_messages(body.get("messages"))
    except ValueError as exc:
        raise BadRequest(str(exc), "messages") from None
    logprobs = body.get("logprobs", False)
    if not isinstance(logprobs, bool) and logprobs is not None:
        raise BadRequest(f"logprobs must be true or false, got {logprobs!r}", "logprobs")
    top = body.get("top_logprobs")
    if top is not None and (not isinstance(top, int) or isinstance(top, bool) or not 0 <= top <= 20):
        raise BadRequest(f"top_logprobs must be an int in [0, 20] or null, got {top!r}", "top_logprobs")
    if top is not None and not logprobs:
        raise BadRequest("top_logprobs needs logprobs=true", "top_logprobs")
    overrides: dict[str, Any] = {}
    if logprobs:
        overrides["logprobs"] = top or 0
    if body.get("max_completion_tokens") is not None and body.get("max_tokens") is None:
        overrides["max_tokens"] = body["max_completion_tokens"]
    try:
        ids = encode(messages)
    except ValueError as exc:
        raise BadRequest(str(exc), "messages") from None
    if body.get("max_tokens") is None and "max_tokens" not in overrides:
        overrides["max_tokens"] = max(max_model_len - len(ids), 1)
    try:
        params = _sampling_params(body, overrides)
    except BadRequest as exc:  # the field the client sent is the one to name
        if exc.param == "max_tokens" and body.get("max_tokens") is None and "max_completion_tokens" in body:
            raise BadRequest(str(exc).replace("max_tokens", "max_completion_tokens", 1),
                             "max_completion_tokens") from None
        raise
    stream, include_usage = _stream_flags(body)
    return ParsedRequest(None, ids, params, stream, include_usage, (top or 0) if logprobs else None)


# --- responses --------------------------------------------------------------------------
def error_body(message: str, param: str | None = None, kind: str = "invalid_request_error",
               code: int | None = None) -> dict:
    """OpenAI's error object. The message is cut to ``MAX_ERROR_CHARS``, and the message and
    param are made encodable (a lone surrogate the client sent becomes ``\\ud800``)."""
    if len(message) > MAX_ERROR_CHARS:
        message = f"{message[:MAX_ERROR_CHARS]}... ({len(message)} characters)"
    message = _encodable(message)
    param = None if param is None else _encodable(param)
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _encodable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def finish_fields(stop_reason: StopReason | None) -> dict:
    """``finish_reason`` as OpenAI names it, and minillm's own reason beside it."""
    if stop_reason is None:
        return {"finish_reason": None}
    return {"finish_reason": FINISH_REASONS[stop_reason], "minillm_stop_reason": stop_reason.value}


def completion_logprobs(entries: list[dict], token_text, text_start: int = 0) -> dict:
    """The legacy completions ``logprobs`` object (tokens, token_logprobs, top_logprobs, offsets)."""
    tokens, lps, tops, offsets = [], [], [], []
    pos = text_start
    for e in entries:
        t = token_text(e["token_id"])
        tokens.append(t)
        lps.append(e["logprob"])
        tops.append({token_text(i): lp for i, lp in e["top"]} if e["top"] else None)
        offsets.append(pos)
        pos += len(t)
    return {"tokens": tokens, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets}


def chat_logprobs(entries: list[dict], token_text) -> dict:
    """The chat ``logprobs`` object: one entry per token with its top alternatives."""
    def item(tid, lp):
        t = token_text(tid)
        return {"token": t, "logprob": lp, "bytes": list(t.encode("utf-8"))}

    return {"content": [dict(item(e["token_id"], e["logprob"]),
                             top_logprobs=[item(i, lp) for i, lp in e["top"]]) for e in entries]}


def now() -> int:
    return int(time.time())
