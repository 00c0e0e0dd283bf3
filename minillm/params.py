"""SamplingParams: the generation settings that travel with a request.

Field names and meanings follow vLLM's ``SamplingParams`` so that what a learner sees here
transfers to a production engine. Every field is checked when the object is built: a bad
value raises ``ValueError`` naming the field and its allowed range, before any request
exists and before any KV block is allocated.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from numbers import Integral, Real


def _is_int(value) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


@dataclass
class SamplingParams:
    """How to turn each step's logits into a token, and when to stop.

    Logits processors run in this fixed order (see ``minillm.sampler``):

    1. repetition_penalty (on prompt and output tokens), then presence_penalty and
       frequency_penalty (on output tokens), all on the raw logits;
    2. temperature (0 means greedy: argmax of the penalised logits, no filters, no randomness);
    3. top_k, 4. top_p, 5. min_p (each removes tokens; at least one always survives);
    6. a draw from the remaining distribution with the request's own seeded generator.

    ``logprobs`` reports the top-N candidates of the model's raw distribution at each step
    (like vLLM), plus the probability of the token actually chosen.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0  # 0 (or -1, as in vLLM) disables top-k
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: int | None = None
    skip_special_tokens: bool = True
    _stop_list: list[str] = field(init=False, repr=False, default_factory=list)

    def __post_init__(self) -> None:
        if not _is_int(self.max_tokens) or self.max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {self.max_tokens!r}")
        self._check_real("temperature", self.temperature, low=0.0, text="a finite float >= 0 (0 = greedy)")
        if not _is_int(self.top_k) or self.top_k < -1:
            raise ValueError(f"top_k must be an int >= 0 (0 or -1 disables it), got {self.top_k!r}")
        if self.top_k == -1:
            self.top_k = 0
        if not _is_real(self.top_p) or math.isnan(self.top_p) or not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be a float in (0, 1], got {self.top_p!r}")
        if not _is_real(self.min_p) or math.isnan(self.min_p) or not (0.0 <= self.min_p <= 1.0):
            raise ValueError(f"min_p must be a float in [0, 1], got {self.min_p!r}")
        self._check_real("repetition_penalty", self.repetition_penalty, low=0.0, strict=True,
                         text="a finite float > 0 (1 = off)")
        self._check_real("presence_penalty", self.presence_penalty, text="a finite float (0 = off)")
        self._check_real("frequency_penalty", self.frequency_penalty, text="a finite float (0 = off)")
        self._stop_list = self._check_stop(self.stop)
        if self.stop_token_ids is None:
            self.stop_token_ids = []
        if not isinstance(self.stop_token_ids, (list, tuple)) or not all(
            _is_int(t) and t >= 0 for t in self.stop_token_ids
        ):
            raise ValueError(f"stop_token_ids must be a list of ints >= 0, got {self.stop_token_ids!r}")
        self.stop_token_ids = list(self.stop_token_ids)
        if not isinstance(self.ignore_eos, bool):
            raise ValueError(f"ignore_eos must be True or False, got {self.ignore_eos!r}")
        if self.seed is not None and not _is_int(self.seed):
            raise ValueError(f"seed must be an int or None, got {self.seed!r}")
        if self.seed is not None and not (-(2**63) <= self.seed < 2**64):
            raise ValueError(f"seed must be an int in [-2**63, 2**64), got {self.seed!r}")
        if self.logprobs is not None and (not _is_int(self.logprobs) or self.logprobs < 0):
            raise ValueError(f"logprobs must be an int >= 0 or None, got {self.logprobs!r}")

    @staticmethod
    def _check_real(name, value, low=None, strict=False, text="a finite float"):
        ok = _is_real(value) and math.isfinite(value)
        if ok and low is not None:
            ok = value > low if strict else value >= low
        if not ok:
            raise ValueError(f"{name} must be {text}, got {value!r}")

    @staticmethod
    def _check_stop(stop) -> list[str]:
        if stop is None:
            return []
        items = [stop] if isinstance(stop, str) else stop
        if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
            raise ValueError(f"stop must be a string or a list of non-empty strings, got {stop!r}")
        if any(s == "" for s in items):
            raise ValueError("stop must not contain an empty string (it would match everywhere)")
        return list(items)

    @property
    def stop_strings(self) -> list[str]:
        """The stop strings as a list, whatever form ``stop`` was given in."""
        return self._stop_list

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
