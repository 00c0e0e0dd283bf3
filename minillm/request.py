"""A request is a small state machine that holds resources.

The chapter's central picture: a request is not "input in, output out" but an object that
moves through states and, in some of them, holds memory (KV blocks) and a batch slot.
Every legal move is listed in ``TRANSITIONS``; any other move raises, so a bug in the
scheduler shows up as an error at the exact step where it happens.

Two edges exist for the engine's own bookkeeping: PREFILL -> PREFILL (a long prompt is
prefilled in chunks over several steps: each further chunk is one more PREFILL) and
PREFILL -> WAITING (a step failed or was interrupted before its first prefill chunk was
computed: the request goes back to the queue exactly as it was).
"""

from __future__ import annotations

import enum
import numbers
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from .params import SamplingParams

if TYPE_CHECKING:  # annotations only: a request does not need torch or the detokenizer to exist
    import torch

    from .detokenizer import IncrementalDetokenizer


class RequestState(str, enum.Enum):
    NEW = "NEW"              # created and validated, text not yet tokenized
    WAITING = "WAITING"      # tokenized, queued for a first prefill; holds no KV block
    PREFILL = "PREFILL"      # admitted: its context is being written into the KV cache (maybe in chunks)
    DECODE = "DECODE"        # active: one token per step, KV blocks held and growing
    PREEMPTED = "PREEMPTED"  # blocks taken back under memory pressure; will be recomputed
    FINISHED = "FINISHED"    # the logic is done (stop reason known); blocks may still be held
    RELEASED = "RELEASED"    # blocks back in the pool, statistics recorded: nothing held

    def __str__(self) -> str:  # print(state) shows "DECODE", not "RequestState.DECODE"
        return self.value


class StopReason(str, enum.Enum):
    EOS = "EOS"                  # the model's end-of-sequence token, or one of stop_token_ids
    MAX_TOKENS = "MAX_TOKENS"    # max_tokens output tokens were produced
    STOP_STRING = "STOP_STRING"  # a stop string appeared in the output text (it is cut off)
    CANCELLED = "CANCELLED"      # cancel(request_id) was called before the request finished
    CONTEXT_FULL = "CONTEXT_FULL"  # prompt + output reached max_model_len, or alone filled the whole KV pool

    def __str__(self) -> str:
        return self.value


S = RequestState
TRANSITIONS: dict[RequestState, frozenset[RequestState]] = {
    S.NEW: frozenset({S.WAITING, S.FINISHED}),
    S.WAITING: frozenset({S.PREFILL, S.FINISHED}),
    S.PREFILL: frozenset({S.PREFILL, S.DECODE, S.WAITING, S.PREEMPTED, S.FINISHED}),
    S.DECODE: frozenset({S.PREEMPTED, S.FINISHED}),
    S.PREEMPTED: frozenset({S.PREFILL, S.FINISHED}),
    S.FINISHED: frozenset({S.RELEASED}),
    S.RELEASED: frozenset(),
}
LIVE_STATES = frozenset({S.NEW, S.WAITING, S.PREFILL, S.DECODE, S.PREEMPTED})


class IllegalTransition(RuntimeError):
    """Raised when code tries to move a request along an edge the state diagram does not have.
    ``request_id``, ``old`` and ``new`` say which request and which edge (the course's error
    hook turns them into a sentence)."""

    def __init__(self, message: str, request_id: str | None = None, old: RequestState | None = None,
                 new: RequestState | None = None) -> None:
        super().__init__(message)
        self.request_id, self.old, self.new = request_id, old, new


@dataclass(eq=False)  # a request is an identity, not a value: two requests are never "equal"
class Request:
    """One generation request and everything it holds.

    ``num_computed_tokens`` counts the tokens whose keys and values are already in the KV
    cache; the next forward pass processes ``all_token_ids[num_computed_tokens:]``.
    """

    request_id: str
    prompt: str | None
    params: SamplingParams
    prompt_token_ids: list[int] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    state: RequestState = RequestState.NEW
    stop_reason: StopReason | None = None
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    num_cached_prompt_tokens: int = 0  # prompt tokens found in the prefix cache at the last admission
    num_preemptions: int = 0
    auto_release: bool = True
    text: str = ""  # output text so far (cut at a stop string)
    logprobs: list[dict] = field(default_factory=list)
    error: str | None = None  # why the engine ended this request (CANCELLED) when something raised for it alone
    # timestamps (time.monotonic seconds); None until the moment happens
    arrival_time: float | None = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    finished_time: float | None = None
    released_time: float | None = None
    # prefix-cache hashes of this request's full blocks, in order (computed once per block)
    block_hashes: list[bytes] = field(default_factory=list, repr=False)
    _detokenizer: IncrementalDetokenizer | None = field(default=None, repr=False)
    _generator: torch.Generator | None = field(default=None, repr=False)

    # --- state machine -------------------------------------------------------------------
    def move_to(self, new_state: RequestState, transitions=None) -> RequestState:
        """Move along one edge of the lifecycle diagram; returns the old state. ``transitions``:
        the table that decides what is legal (default ``TRANSITIONS``; ``minillm.seams``)."""
        old = self.state
        table = TRANSITIONS if transitions is None else transitions
        if new_state not in table.get(old, ()):
            allowed = ", ".join(sorted(str(s) for s in table.get(old, ()))) or "none"
            raise IllegalTransition(
                f"request {self.request_id!r}: {old.value} -> {new_state.value} is not a legal "
                f"transition (from {old.value} the allowed next states are: {allowed})",
                self.request_id, old, new_state,
            )
        self.state = new_state
        return old

    # --- derived views -------------------------------------------------------------------
    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def last_token_id(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def is_live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def is_finished(self) -> bool:
        return self.state in (RequestState.FINISHED, RequestState.RELEASED)

    @property
    def num_blocks(self) -> int:
        return len(self.block_table)

    def __repr__(self) -> str:
        reason = f", stop_reason={self.stop_reason.value}" if self.stop_reason else ""
        return (
            f"Request(id={self.request_id!r}, state={self.state.value}, prompt_tokens="
            f"{len(self.prompt_token_ids)}, output_tokens={len(self.output_token_ids)}, "
            f"blocks={self.block_table}{reason})"
        )


@dataclass
class RequestOutput:
    """What ``LLM.generate`` returns for one prompt: text, tokens, why it stopped, metrics."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    text: str
    token_ids: list[int]
    stop_reason: StopReason
    logprobs: list[dict]
    metrics: dict

    @property
    def finish_reason(self) -> str:
        """vLLM's name for the same thing, lower-case."""
        return self.stop_reason.value.lower()


# --- checks on a new request ---------------------------------------------------------------
# All made before anything is registered, queued or allocated, so a request that can never
# run leaves nothing behind (no entry in ``llm.requests``, no event).

def check_params(params, vocab_size: int | None = None) -> SamplingParams:
    """``params`` (None: the defaults), with its ``logit_bias`` ids in the vocabulary."""
    if params is None:
        return SamplingParams()
    if not isinstance(params, SamplingParams):
        raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
    bias = params.logit_bias
    if vocab_size is not None and bias and bias[-1][0] >= vocab_size:  # sorted: the last id is the largest
        raise ValueError(f"logit_bias keys must be token ids in the vocabulary [0, {vocab_size}), "
                         f"got {bias[-1][0]}")
    return params


def _ids_in(ids, vocab_size: int) -> bool:
    """Every id a (non-bool) int in [0, vocab_size)."""
    for t in ids:
        if not isinstance(t, numbers.Integral) or isinstance(t, bool) or not 0 <= t < vocab_size:
            return False
    return True


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
    if not ids or not _ids_in(ids, vocab_size):
        raise ValueError(f"prompt_token_ids must be a non-empty list of ints in [0, {vocab_size})")
    return list(map(int, ids))


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
    if n == 0 or not _ids_in(ids, vocab_size):
        raise ValueError(f"the tokenizer turned prompt {_short(prompt)} into {n} ids, not a non-empty "
                         f"list of ids in [0, {vocab_size})")
    if -(-(n + 1) // block_size) > num_blocks:
        raise ValueError(f"prompt has {n} tokens but the whole KV budget holds {num_blocks * block_size} "
                         f"tokens: shorten the prompt or raise num_kv_blocks / kv_cache_tokens")
    return list(map(int, ids))


def _short(value, limit: int = 200) -> str:
    """``repr(value)``, cut to ``limit`` characters: an error message must not echo a megabyte."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def prepare_ids(tokenizer, prompt, messages, prompt_token_ids, vocab_size: int, max_model_len: int,
                num_blocks: int, block_size: int) -> list[int]:
    """``LLM.prepare_prompt``: exactly one of a text, a conversation and token ids, to checked ids."""
    if sum(x is not None for x in (prompt, messages, prompt_token_ids)) != 1:
        raise ValueError("give exactly one of prompt, messages and prompt_token_ids")
    if messages is not None:
        from .chat import encode_conversation

        ids = encode_conversation(tokenizer, messages)
    else:
        if prompt is None and isinstance(prompt_token_ids, (list, tuple)):
            check_length(len(prompt_token_ids), max_model_len)  # before a look at each id
        ids = check_prompt(prompt, prompt_token_ids, vocab_size)
        if ids is None:
            ids = tokenizer.encode(prompt)
    return check_fits(list(ids), prompt, vocab_size, max_model_len, num_blocks, block_size)
