"""SamplingParams: the generation settings that travel with a request.

Field names and meanings follow vLLM's ``SamplingParams`` so that what a learner sees here
transfers to a production engine. Every field is checked when the object is built: a bad
value raises ``ValueError`` naming the field and its allowed range, before any request
exists and before any KV block is allocated. Ranges are chosen so that every accepted value
runs: nothing a request carries can make the sampler overflow float32 or raise mid-step.

The object is immutable once built (a request's settings must not change under the engine's
feet between two steps); ``params.replace(temperature=0.5)`` (or ``dataclasses.replace``)
gives a changed copy, checked again.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from numbers import Integral, Real

#: Temperatures below this are greedy (argmax), as in vLLM: dividing logits by a smaller
#: number only sharpens the distribution towards the argmax and risks float32 overflow.
GREEDY_EPS = 1e-5
#: Largest float32 value: a float field beyond it would become inf inside the sampler.
FLOAT32_MAX = 3.4028234663852886e38
#: repetition_penalty range: dividing/multiplying float32 logits by at most 1e4 keeps any
#: realistic logit (|x| < 1e30) finite, and 1e-4 .. 1e4 is far beyond any useful setting.
REPETITION_PENALTY_RANGE = (1e-4, 1e4)
#: Most top candidates ``logprobs`` may ask for (OpenAI's and vLLM's default limit).
MAX_LOGPROBS = 20
#: Largest |bias| ``logit_bias`` may add to a logit (OpenAI's range: -100 bans a token, 100
#: all but forces it).
MAX_LOGIT_BIAS = 100.0
#: Most stop strings, longest stop string (characters) and most stop token ids a request may
#: carry: every step looks for each stop string in the new text and each sampled token in the
#: ids, so a megabyte of them (100,000 stop strings) made every other request 25x slower.
MAX_STOP_STRINGS = 64
MAX_STOP_CHARS = 1024
MAX_STOP_TOKEN_IDS = 1024

_MUTATION_HINT = ("SamplingParams is immutable once built; make a changed copy with "
                  "params.replace({name}=...) (or dataclasses.replace(params, {name}=...))")


def _is_int(value) -> bool:
    kind = type(value)
    if kind is int:  # the common case, without the slower ABC check
        return True
    return kind is not bool and isinstance(value, Integral)


def _is_real(value) -> bool:
    kind = type(value)
    if kind is float or kind is int:
        return True
    return kind is not bool and isinstance(value, Real)


def _is_bool(value) -> bool:
    kind = type(value)
    return isinstance(value, bool) or (kind.__module__ == "numpy" and kind.__name__ in ("bool", "bool_"))


@dataclass(unsafe_hash=True)
class SamplingParams:
    """How to turn each step's logits into a token, and when to stop.

    Logits processors run in this fixed order (see ``minillm.sampler``):

    0. logit_bias (added to the model's logits, before anything else, as in vLLM and OpenAI);
    1. repetition_penalty (on prompt and output tokens), then presence_penalty and
       frequency_penalty (on output tokens), all on the raw logits;
    2. temperature (0, or anything below ``GREEDY_EPS`` = 1e-5, means greedy: argmax of the
       penalised logits, no filters, no randomness);
    3. top_k (0 or -1 = off; a k larger than the vocabulary keeps every token),
       4. top_p, 5. min_p (each removes tokens; at least one always survives);
    6. a draw from the remaining distribution with the request's own seeded generator.

    Ranges: max_tokens int >= 1; temperature float in [0, 3.4e38]; top_k int >= -1;
    top_p in (0, 1]; min_p in [0, 1]; repetition_penalty in [1e-4, 1e4] (1 = off);
    presence_penalty and frequency_penalty finite in float32 (|x| <= 3.4e38, 0 = off);
    stop at most 64 strings of at most 1024 characters, stop_token_ids at most 1024 ids;
    seed any int (reduced modulo 2**64 for the generator) or None; logprobs None or an int
    in [0, 20]; logit_bias a dict {token id (int >= 0): bias in [-100, 100]} or None, stored
    as sorted ``(token_id, bias)`` pairs (``dict(params.logit_bias)`` gives the dict back; the
    engine checks the ids against the model's vocabulary when the request is added). Numpy
    scalars are accepted and stored as Python int/float; bools are never taken as numbers.

    ``logprobs`` reports the top-N candidates of the model's raw distribution at each step
    (like vLLM), plus the probability of the token actually chosen.

    ``include_stop_str_in_output`` (vLLM's meaning): keep the matched stop string, and the
    text of a stop token (EOS or one of ``stop_token_ids``), at the end of the output text;
    by default both are left out.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0  # 0 (or -1, as in vLLM) disables top-k
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop: tuple[str, ...] | str | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    seed: int | None = None
    logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    logit_bias: dict[int, float] | tuple[tuple[int, float], ...] | None = None
    _stop_list: tuple[str, ...] = field(init=False, repr=False, compare=False, default=())
    #: True when the request takes the argmax: temperature 0 or below ``GREEDY_EPS`` (set from
    #: ``temperature`` when the object is made; the object never changes after)
    greedy: bool = field(init=False, repr=False, compare=False, default=False)

    def __post_init__(self) -> None:
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        set_("max_tokens", self._int("max_tokens", self.max_tokens, "an int >= 1", low=1))
        set_("temperature", self._float("temperature", self.temperature,
                                        "a float in [0, 3.4e38] (0, or below 1e-5, = greedy)", low=0.0))
        top_k = self._int("top_k", self.top_k, "an int >= 0 (0 or -1 disables it)", low=-1)
        set_("top_k", 0 if top_k == -1 else top_k)
        top_p = self._float("top_p", self.top_p, "a float in (0, 1]", low=0.0, high=1.0)
        if top_p == 0.0:
            raise ValueError("top_p must be a float in (0, 1], got 0.0")
        set_("top_p", top_p)
        set_("min_p", self._float("min_p", self.min_p, "a float in [0, 1]", low=0.0, high=1.0))
        low, high = REPETITION_PENALTY_RANGE
        set_("repetition_penalty", self._float("repetition_penalty", self.repetition_penalty,
                                               "a float in [1e-4, 1e4] (1 = off)", low=low, high=high))
        for name in ("presence_penalty", "frequency_penalty"):
            set_(name, self._float(name, getattr(self, name),
                                   "a float finite in float32, in [-3.4e38, 3.4e38] (0 = off)"))
        stop_list = self._check_stop(self.stop)
        set_("_stop_list", stop_list)
        if self.stop is not None and not isinstance(self.stop, str):
            set_("stop", stop_list)
        set_("stop_token_ids", self._check_stop_token_ids(self.stop_token_ids))
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            value = getattr(self, name)
            if not _is_bool(value):
                raise ValueError(f"{name} must be True or False, got {value!r}")
            set_(name, bool(value))
        if self.seed is not None:
            set_("seed", self._int("seed", self.seed, "an int (any size, reduced modulo 2**64) or None"))
        if self.logprobs is not None:
            set_("logprobs", self._int("logprobs", self.logprobs,
                                       f"an int in [0, {MAX_LOGPROBS}] or None", low=0, high=MAX_LOGPROBS))
        set_("logit_bias", self._check_logit_bias(self.logit_bias))
        set_("greedy", self.temperature < GREEDY_EPS)
        set_("_sealed", True)  # from here on, assignment raises (see __setattr__)

    # --- immutability --------------------------------------------------------------------
    def __setattr__(self, name, value):
        if self.__dict__.get("_sealed"):
            raise dataclasses.FrozenInstanceError(_MUTATION_HINT.format(name=name))
        object.__setattr__(self, name, value)

    def __delattr__(self, name):
        raise dataclasses.FrozenInstanceError(_MUTATION_HINT.format(name=name))

    def replace(self, **changes) -> "SamplingParams":
        """A copy with ``changes`` applied, validated like a new object."""
        return dataclasses.replace(self, **changes)

    # --- checks --------------------------------------------------------------------------
    @staticmethod
    def _int(name, value, text, low=None, high=None) -> int:
        ok = _is_int(value)
        if ok:
            value = int(value)
            ok = (low is None or value >= low) and (high is None or value <= high)
        if not ok:
            raise ValueError(f"{name} must be {text}, got {value!r}")
        return value

    @staticmethod
    def _float(name, value, text, low=None, high=None) -> float:
        ok = _is_real(value)
        if ok:
            value = float(value)
            ok = (math.isfinite(value) and abs(value) <= FLOAT32_MAX
                  and (low is None or value >= low) and (high is None or value <= high))
        if not ok:
            raise ValueError(f"{name} must be {text}, got {value!r}")
        return value

    @staticmethod
    def _check_stop(stop) -> tuple[str, ...]:
        if stop is None:
            return ()
        items = [stop] if isinstance(stop, str) else stop
        if not isinstance(items, (list, tuple)) or not all(isinstance(s, str) for s in items):
            raise ValueError(f"stop must be a string or a list of non-empty strings, got {_short(stop)}")
        if any(s == "" for s in items):
            raise ValueError("stop must not contain an empty string (it would match everywhere)")
        if len(items) > MAX_STOP_STRINGS:
            raise ValueError(f"stop must hold at most {MAX_STOP_STRINGS} strings, got {len(items)}")
        longest = max((len(s) for s in items), default=0)
        if longest > MAX_STOP_CHARS:
            raise ValueError(f"stop strings must be at most {MAX_STOP_CHARS} characters long, got one of {longest}")
        return tuple(items)

    @staticmethod
    def _check_logit_bias(bias) -> tuple[tuple[int, float], ...]:
        if bias is None:
            return ()
        try:
            pairs = list(bias.items() if isinstance(bias, Mapping) else bias)
            pairs = [(t, b) for t, b in pairs]
        except (TypeError, ValueError):
            raise ValueError(f"logit_bias must be a dict {{token id: bias}}, got {_short(bias)}") from None
        out = {}
        for t, b in pairs:
            if not _is_int(t) or t < 0:
                raise ValueError(f"logit_bias keys must be token ids (ints >= 0), got {_short(t)}")
            ok = _is_real(b) and math.isfinite(b) and -MAX_LOGIT_BIAS <= b <= MAX_LOGIT_BIAS
            if not ok:
                raise ValueError(f"logit_bias values must be floats in [{-MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}], "
                                 f"got {_short(b)} for token {int(t)}")
            out[int(t)] = float(b)
        return tuple(sorted(out.items()))

    @staticmethod
    def _check_stop_token_ids(ids) -> tuple[int, ...]:
        if ids is None:
            return ()
        if not isinstance(ids, (list, tuple)) or not all(_is_int(t) and t >= 0 for t in ids):
            raise ValueError(f"stop_token_ids must be a list of ints >= 0, got {_short(ids)}")
        if len(ids) > MAX_STOP_TOKEN_IDS:
            raise ValueError(f"stop_token_ids must hold at most {MAX_STOP_TOKEN_IDS} ids, got {len(ids)}")
        return tuple(int(t) for t in ids)

    # --- derived -------------------------------------------------------------------------
    @property
    def stop_strings(self) -> list[str]:
        """The stop strings as a list, whatever form ``stop`` was given in."""
        return list(self._stop_list)


def _short(value, limit: int = 100) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."
