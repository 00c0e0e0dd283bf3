"""RequestStepperCore: one request, walked through the real engine one action at a time.

Plain Python, no widgets: each action (``tokenize``, ``prefill``, ``decode_one``,
``run_to_end``, ``cancel``, ``release``) calls the engine (``LLM.new_request`` / ``enqueue`` /
``step`` / ``cancel`` / ``release``) and returns the events it wrote to the trace; every view
(tokens, candidates, blocks, bytes, timings) is read back from the request object,
``llm.trace``, ``llm.metrics()`` and ``llm.cache_stats()``. Tests and notebooks drive it
directly; :class:`~minillm.viz.stepper.RequestStepper` is the widget around it.

The request is created with ``auto_release=False``, so the engine stops at FINISHED and waits
for ``release()``: the memory still held after the logic is done can be seen, then watched
going back to the pool.
"""

from __future__ import annotations

import dataclasses
import math

from ..params import SamplingParams
from ..request import LIVE_STATES, RequestState
from ..trace import Event
from ._common import DEFAULT_PROMPT, default_llm, esc, token_pieces, token_text
from .diagram import edges_of_events
from .i18n import phrase, resolve_lang

__all__ = ["ACTIONS", "BUTTON_LABELS", "DEFAULT_LOGPROBS", "button_labels", "RequestStepperCore"]

S = RequestState
ACTIONS = ("tokenize", "prefill", "decode_one", "run_to_end", "cancel", "release")
BUTTON_LABELS = {
    "tokenize": "Tokenize",
    "prefill": "Prefill",
    "decode_one": "Decode one step",
    "run_to_end": "Run to end",
    "cancel": "Cancel",
    "release": "Release",
}
DEFAULT_LOGPROBS = 8


def button_labels(lang=None) -> dict[str, str]:
    """action -> button label in ``lang`` (None: the course-wide language)."""
    return {a: phrase(f"btn.{a}", lang) for a in ACTIONS + ("new",)}


class RequestStepperCore:
    """One request, driven step by step through the real engine. No widgets needed.

    Args:
        llm: an ``LLM``; None builds one on the shipped model with a small pool of small
            blocks (``block_size=4``, 64 blocks) so the block table is easy to watch.
        prompt: the prompt used by ``tokenize()`` (can be changed until then).
        params: the ``SamplingParams`` used by ``tokenize()``; ``logprobs`` is set to
            8 when not given, so the next-token candidates can be shown.
    """

    def __init__(self, llm=None, prompt: str = DEFAULT_PROMPT, params: SamplingParams | None = None,
                 *, max_run_steps: int = 10_000, lang=None):
        self.lang = resolve_lang(lang)
        self.llm = llm if llm is not None else default_llm()
        self.prompt = prompt
        self.params = params if params is not None else SamplingParams(max_tokens=20, temperature=0.8, seed=0)
        self.max_run_steps = max_run_steps
        self.req = None
        self.last_action: str | None = None
        self.last_events: list[Event] = []
        self.log: list[tuple[str, list[Event]]] = []  # (action, events) for this request

    # --- state ---------------------------------------------------------------------------
    @property
    def state(self) -> RequestState:
        """The request's state; NEW until ``tokenize()`` hands the request to the engine."""
        return S.NEW if self.req is None else self.req.state

    @property
    def request_id(self) -> str | None:
        return None if self.req is None else self.req.request_id

    def can(self, action: str) -> bool:
        """Whether ``action`` (one of ACTIONS) applies to the current state."""
        st = self.state
        if action == "tokenize":
            return self.req is None
        if self.req is None:
            return False
        if action == "prefill":
            return st in (S.WAITING, S.PREEMPTED)
        if action == "decode_one":
            return st == S.DECODE
        if action == "run_to_end":
            return st in (S.WAITING, S.PREEMPTED, S.PREFILL, S.DECODE)
        if action == "cancel":
            return st in LIVE_STATES
        if action == "release":
            return st == S.FINISHED
        raise ValueError(f"unknown action {action!r}; expected one of {', '.join(ACTIONS)}")

    def _require(self, action: str) -> None:
        if not self.can(action):
            raise ValueError(phrase("err.not_now", self.lang, label=phrase(f"btn.{action}", self.lang),
                                    state=self.state.value)
                             + ("" if self.req is not None else phrase("err.tokenize_first", self.lang)))

    def _record(self, action: str, start: int) -> list[Event]:
        events = list(self.llm.trace[start:])
        self.last_action, self.last_events = action, events
        self.log.append((action, events))
        return events

    # --- actions: each one calls the engine and returns the events it produced --------------
    def tokenize(self, prompt: str | None = None, params: SamplingParams | None = None) -> list[Event]:
        """Create the request (NEW) and tokenize + enqueue it (NEW -> WAITING)."""
        self._require("tokenize")
        if prompt is not None:
            self.prompt = prompt
        if params is not None:
            self.params = params
        params = self.params
        if params.logprobs is None:
            params = dataclasses.replace(params, logprobs=DEFAULT_LOGPROBS)
        start = len(self.llm.trace)
        self.req = self.llm.new_request(self.prompt, params, auto_release=False)
        self.llm.enqueue(self.req)
        return self._record("tokenize", start)

    def prefill(self) -> list[Event]:
        """One engine step for a WAITING (or PREEMPTED) request: the scheduler admits it,
        allocates its blocks, runs its whole context through the model and samples the first
        token, so after the step the request is already in DECODE (or FINISHED)."""
        self._require("prefill")
        start = len(self.llm.trace)
        self.llm.step()
        return self._record("prefill", start)

    def decode_one(self) -> list[Event]:
        """One engine step for a DECODE request: one token in, one token sampled."""
        self._require("decode_one")
        start = len(self.llm.trace)
        self.llm.step()
        return self._record("decode_one", start)

    def run_to_end(self) -> list[Event]:
        """Step the engine until this request stops (it then waits in FINISHED for release)."""
        self._require("run_to_end")
        start = len(self.llm.trace)
        for _ in range(self.max_run_steps):
            if not self.req.is_live:
                break
            self.llm.step()
        return self._record("run_to_end", start)

    def cancel(self) -> list[Event]:
        """``llm.cancel``: the request is FINISHED (CANCELLED) and RELEASED in the same call."""
        self._require("cancel")
        start = len(self.llm.trace)
        self.llm.cancel(self.req.request_id)
        return self._record("cancel", start)

    def release(self) -> list[Event]:
        """``llm.release``: FINISHED -> RELEASED, the request's blocks go back to the pool."""
        self._require("release")
        start = len(self.llm.trace)
        self.llm.release(self.req.request_id)
        return self._record("release", start)

    def reset(self, prompt: str | None = None, params: SamplingParams | None = None) -> list[Event]:
        """Start over with a new request (back to NEW). The old request is cancelled if it is
        still live, or released if it is FINISHED, so it never keeps blocks behind."""
        start = len(self.llm.trace)
        if self.req is not None:
            if self.req.is_live:
                self.llm.cancel(self.req.request_id)
            elif self.req.state == S.FINISHED:
                self.llm.release(self.req.request_id)
        events = list(self.llm.trace[start:])
        self.req = None
        self.log = []
        self.last_action, self.last_events = "reset", events
        if prompt is not None:
            self.prompt = prompt
        if params is not None:
            self.params = params
        return events

    # --- views of the engine's state -----------------------------------------------------
    def request_events(self) -> list[Event]:
        """This request's events in the engine trace."""
        if self.req is None:
            return []
        return [e for e in self.llm.trace if e.request_id == self.req.request_id]

    def last_edges(self) -> list[tuple[str, str]]:
        """Lifecycle edges the last action moved this request along."""
        mine = [e for e in self.last_events if e.request_id == self.request_id]
        return edges_of_events(mine)

    @property
    def blocks_held(self) -> int:
        return 0 if self.req is None else len(self.req.block_table)

    def prompt_pieces(self):
        """The prompt's tokens as ``TokenPiece``s: the text each adds (a Chinese character split
        over byte tokens shows on the token that completes it; the others are marked partial)."""
        if self.req is None:
            return []
        return token_pieces(self.llm.tokenizer, self.req.prompt_token_ids)

    def output_pieces(self):
        """The output tokens as ``TokenPiece``s, decoded after the prompt as the request's
        detokenizer does: their ``text`` joins to ``req.text`` (unless a stop string cut it)."""
        if self.req is None:
            return []
        return token_pieces(self.llm.tokenizer, self.req.output_token_ids, context=self.req.prompt_token_ids)

    def prompt_tokens(self) -> list[tuple[int, str]]:
        """(id, label) per prompt token; the label is the visible text or ‹bytes› of a partial token."""
        return [(p.token_id, p.label) for p in self.prompt_pieces()]

    def output_tokens(self) -> list[tuple[int, str]]:
        return [(p.token_id, p.label) for p in self.output_pieces()]

    def token_label(self, event) -> str:
        """The caption of a sampled token event: the piece of the output it is."""
        if self.req is not None and event.request_id == self.req.request_id:
            pieces = self.output_pieces()
            i = event.data.get("index", -1)
            if 0 <= i < len(pieces) and pieces[i].token_id == event.data["token_id"]:
                return pieces[i].label
        return token_text(self.llm.tokenizer, event.data["token_id"])

    def candidates(self) -> dict | None:
        """The top candidates the engine reported for the latest sampled token (raw model
        probabilities, before temperature and filters) and the token actually chosen."""
        if self.req is None or not self.req.logprobs:
            return None
        entry = self.req.logprobs[-1]
        tok = self.llm.tokenizer
        top = [(int(t), token_text(tok, t), math.exp(lp)) for t, lp in entry["top"]]
        chosen = int(entry["token_id"])
        return {"index": len(self.req.logprobs) - 1, "chosen": chosen,
                "chosen_text": token_text(tok, chosen), "chosen_prob": math.exp(entry["logprob"]),
                "chosen_rank": next((i for i, (t, _, _) in enumerate(top) if t == chosen), None),
                "top": top}

    def pool(self) -> list[dict]:
        """Every block of the KV pool: whose it is. ``kind`` is "mine" (``pos`` = its index in
        this request's block table), "other" (held by another request), "cached" (free, but
        still holding a full block of tokens the prefix cache can reuse) or "free"."""
        alloc = self.llm.kv_cache.allocator
        mine = {b: i for i, b in enumerate(self.req.block_table)} if self.req is not None else {}
        others = set()
        for r in self.llm.requests.values():
            if self.req is None or r.request_id != self.req.request_id:
                others.update(r.block_table)
        cells = []
        for b in range(alloc.num_blocks):
            if b in mine:
                kind = "mine"
            elif b in others or alloc.ref_count[b] > 0:
                kind = "other"
            elif alloc.block_hashes[b] is not None:
                kind = "cached"
            else:
                kind = "free"
            cells.append({"block": b, "kind": kind, "pos": mine.get(b), "shared": alloc.ref_count[b] > 1})
        return cells

    def kv(self) -> dict:
        """Bytes and blocks, from ``llm.cache_stats()`` and the request's block table."""
        s = self.llm.cache_stats()
        blocks = self.blocks_held
        return {"blocks": blocks, "block_size": s.block_size, "slots": blocks * s.block_size,
                "tokens_in_cache": 0 if self.req is None else min(self.req.num_computed_tokens, blocks * s.block_size),
                "bytes_per_token": s.bytes_per_token, "bytes_held": blocks * s.block_bytes,
                "used_blocks": s.used_blocks, "total_blocks": s.total_blocks,
                "used_bytes": s.used_bytes, "total_bytes": s.total_bytes, "cached_blocks": s.cached_blocks}

    def metrics(self) -> dict:
        return {} if self.req is None else self.llm.metrics(self.req.request_id)

    def status_html(self) -> str:
        """The status line, with the stable ``minillm-state`` / ``minillm-blocks`` hooks."""
        rid = "–" if self.req is None else esc(self.req.request_id)
        reason = self.req.stop_reason.value if self.req is not None and self.req.stop_reason else "–"
        return ("<div class='minillm-status'>" + phrase(
            "st.line", self.lang, rid=f"<b>{rid}</b>",
            state=f"<span class=\"minillm-state\">{self.state.value}</span>",
            blocks=f"<span class=\"minillm-blocks\">{self.blocks_held}</span>",
            step=f"<b>{self.llm.step_count}</b>", reason=f"<b>{reason}</b>") + "</div>")
