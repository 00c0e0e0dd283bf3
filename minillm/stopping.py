"""Stop conditions: when a request's logic is done, and why.

Checked after every sampled token, in this order: the model's end-of-sequence token (unless
``ignore_eos``) or one of ``stop_token_ids`` -> EOS; a stop string in the output text ->
STOP_STRING (found by the detokenizer, ``detokenizer.find_stop``, which
sees the text as it grows); ``max_tokens`` reached -> MAX_TOKENS; prompt + output filling the model's
context (``max_model_len``) -> CONTEXT_FULL. Cancellation (CANCELLED) comes from outside,
through ``LLM.cancel``.
"""

from __future__ import annotations

from .params import SamplingParams
from .request import StopReason


def check_stop(token_id: int, num_output_tokens: int, num_tokens: int, params: SamplingParams,
               eos_token_ids: list[int] | set[int], max_model_len: int,
               stop_string_found: bool = False) -> StopReason | None:
    """The stop reason after appending ``token_id`` (``num_*`` already count it), or None."""
    if (token_id in eos_token_ids and not params.ignore_eos) or token_id in params.stop_token_ids:
        return StopReason.EOS
    if stop_string_found:
        return StopReason.STOP_STRING
    if num_output_tokens >= params.max_tokens:
        return StopReason.MAX_TOKENS
    if num_tokens >= max_model_len:
        return StopReason.CONTEXT_FULL
    return None
