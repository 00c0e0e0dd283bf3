"""Whole generations on top of the engine's step-by-step API: ``generate``, ``chat``, ``stream``.

Each adds its requests, then steps the engine until they are done, holding the engine's lock
for one step at a time: several threads can generate at once, each waiting only for its own
requests while the steps (each one atomic) advance everyone's. If anything is raised meanwhile
(Ctrl-C included), the call's own requests are cancelled, so nothing is left holding memory.
"""

from __future__ import annotations

from typing import Iterator, Sequence

from .params import SamplingParams
from .request import RequestOutput, RequestState, check_text

# Plain functions of an ``LLM`` (its methods of the same names call them); they use only its
# public methods plus its lock and scheduler queues.


def generate(llm, prompts: str | Sequence[str], params: SamplingParams | Sequence[SamplingParams] | None = None,
             ) -> list[RequestOutput]:
    """Run prompts to completion together (continuous batching); outputs in prompt order.
    Safe from several threads at once: each call waits only for its own requests."""
    if isinstance(prompts, str):
        prompts = [prompts]
    try:
        prompts = list(prompts)
    except TypeError:
        raise ValueError(f"prompts must be a string or a list of strings, got {type(prompts).__name__}") from None
    if not prompts:
        raise ValueError("prompts must contain at least one prompt")
    for p in prompts:  # validate every prompt before queueing any, so nothing is half-added
        if not isinstance(p, str) or not p:
            raise ValueError(f"prompt must be a non-empty string, got {p!r}")
        check_text("prompt", p)
    return _run_all(llm, [{"prompt": p} for p in prompts], params)


def chat(llm, messages, params: SamplingParams | Sequence[SamplingParams] | None = None,
         ) -> list[RequestOutput]:
    """Answer one conversation (a list of ``{"role", "content"}`` dicts) or a list of them,
    laid out by the tokenizer's chat template (one BOS, never two); one output each."""
    from .chat import encode_conversation

    convs = [messages] if messages and isinstance(messages, (list, tuple)) and isinstance(messages[0], dict) \
        else list(messages) if isinstance(messages, (list, tuple)) else [messages]
    if not convs:
        raise ValueError("messages must be a conversation or a non-empty list of conversations")
    return _run_all(llm, [{"prompt_token_ids": encode_conversation(llm.tokenizer, c)} for c in convs], params)


def _run_all(llm, inputs: list[dict], params) -> list[RequestOutput]:
    if params is None or isinstance(params, SamplingParams):
        params = [params] * len(inputs)
    elif not isinstance(params, (list, tuple)):
        raise ValueError(f"params must be a SamplingParams or a list of them (one per prompt), "
                         f"got {type(params).__name__}")
    elif len(params) != len(inputs):
        raise ValueError(f"params must be one SamplingParams or one per prompt ({len(inputs)}), "
                         f"got {len(params)}")
    reqs = []
    try:
        with llm._lock:
            for kw, sp in zip(inputs, params):
                reqs.append(llm.add_request(params=sp, **kw))
        while True:
            with llm._lock:
                if not any(r.is_live for r in reqs):
                    break
                if not llm.step() and not llm.scheduler.running:
                    _raise_stalled(llm)
    except BaseException:
        with llm._lock:
            for r in reqs:
                if r.request_id in llm.requests:
                    llm.cancel(r.request_id)
        raise
    with llm._lock:
        outs = [llm.output(r.request_id) for r in reqs]
        if llm.max_history is not None:
            for r in reqs:
                if r.state == RequestState.RELEASED:
                    llm.requests.pop(r.request_id, None)
    return outs


def _raise_stalled(llm) -> None:
    held = [r.request_id for r in llm.scheduler.holding.values()
            if r.state == RequestState.FINISHED and r.block_table]
    raise RuntimeError(
        f"the engine cannot make progress: {len(llm.scheduler.waiting)} waiting request(s) need KV "
        f"blocks held by FINISHED requests that were never released ({', '.join(held) or 'none'}); "
        f"call llm.release(request_id) for them")


def stream(llm, prompt: str, params: SamplingParams | None = None) -> Iterator[str]:
    """Yield text pieces as they are sampled. Closing the iterator early (``break``)
    cancels the request in the engine, so its KV blocks are freed at once."""
    req = llm.add_request(prompt, params)
    sent = 0
    try:
        while req.is_live:
            with llm._lock:
                if req.is_live and not llm.step() and not llm.scheduler.running:
                    _raise_stalled(llm)
                # text that a stop string still being spelled out could take back is held
                safe = len(req.text) if not req.is_live else len(req._detokenizer.stable_text)
            if safe > sent:
                yield req.text[sent:safe]
                sent = safe
        if len(req.text) > sent:
            yield req.text[sent:]
    finally:
        if req.is_live:
            llm.cancel(req.request_id)

