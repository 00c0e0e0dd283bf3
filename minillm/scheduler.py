"""The scheduler: which requests run this step, how many tokens each, and what their output does.

Two queues. ``waiting`` holds WAITING and PREEMPTED requests (preempted ones go to the
front: they were admitted earlier). ``running`` holds admitted requests in admission order.

Each step (continuous batching, vLLM v1's rule) spends one token budget,
``max_num_batched_tokens``:

1. running requests first, in admission order: a decoding request needs one token (decodes
   always run, even past the budget, so a small budget can never starve one), a request still
   being prefilled (chunked prefill) needs the rest of its prompt, cut to what is left of the
   budget. Each gets room in the KV cache for those tokens. When the pool is
   out of blocks, the most recently admitted running request is *preempted*: its blocks go
   back to the pool and it returns to the front of ``waiting``, to be recomputed later;
2. then waiting requests, in order, while there is a free batch slot (``max_num_seqs``),
   budget left and enough free blocks for their whole context. With chunked prefill a prompt
   longer than the budget left gets a first chunk now and the rest in later steps
   (PREFILL -> PREFILL); without it, a prompt that does not fit waits (or runs alone).

A request is sampled from only when this step's tokens reach the end of its context: a
partial prefill produces no token and draws nothing from its generator.

After the forward pass and the sampling, ``update_from_output`` does everything the results
imply, in one place: advance ``num_computed_tokens``, index newly full blocks in the prefix
cache, append tokens, detokenise, check stop conditions (``check_stop``), finish and release;
it returns the requests that finished. Until then nothing points at this step's KV as
computed, so a failed step is undone by ``rollback``. The scheduler calls nobody back: every
request that ends (here, on a cancel, or with a full context) is also put on ``ended`` for
the engine to collect.

With ``policy="static"`` a new batch is admitted only when the running set is empty: the
classic static batching that continuous batching improves on.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import torch

from .kv_cache import KVCache
from .params import SamplingParams
from .request import Request, RequestState, StopReason
from .sampler import logprob_entry


def check_stop(token_id: int, num_output_tokens: int, num_tokens: int, params: SamplingParams,
               eos_token_ids: list[int] | set[int], max_model_len: int,
               stop_string_found: bool = False) -> StopReason | None:
    """The stop reason after appending ``token_id`` (``num_*`` already count it), or None.

    Checked after every sampled token, in this order: the model's end-of-sequence token (unless
    ``ignore_eos``) or one of ``stop_token_ids`` -> EOS; a stop string in the output text ->
    STOP_STRING (found by the detokenizer, which sees the text as it grows); ``max_tokens``
    reached -> MAX_TOKENS; prompt + output filling the model's context (``max_model_len``) ->
    CONTEXT_FULL. Cancellation (CANCELLED) comes from outside, through ``LLM.cancel``."""
    if (token_id in eos_token_ids and not params.ignore_eos) or token_id in params.stop_token_ids:
        return StopReason.EOS
    if stop_string_found:
        return StopReason.STOP_STRING
    if num_output_tokens >= params.max_tokens:
        return StopReason.MAX_TOKENS
    if num_tokens >= max_model_len:
        return StopReason.CONTEXT_FULL
    return None


@dataclass
class ScheduledBatch:
    """One step's plan. ``prefill_chunks[i]`` is how many tokens of ``prefills[i]`` are
    computed this step; every decode computes one."""

    decodes: list[Request] = field(default_factory=list)
    prefills: list[Request] = field(default_factory=list)
    prefill_chunks: list[int] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    context_full: list[Request] = field(default_factory=list)
    # admitted this step, with what rollback needs to put them back as they were:
    # (request, state before admission, num_cached_prompt_tokens before, first_scheduled_time before)
    admitted: list[tuple] = field(default_factory=list)
    # the requests whose context is complete after this step: they get a token (the decodes,
    # then the prefills whose chunk reaches the end of the prompt); set by ``schedule``
    sampled: list[Request] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + sum(self.prefill_chunks)

    def __bool__(self) -> bool:
        return bool(self.decodes or self.prefills)


class Scheduler:
    def __init__(self, kv_cache: KVCache, max_num_seqs: int, max_num_batched_tokens: int,
                 policy: str, transition: Callable[..., None], *, emit: Callable[..., None] | None = None,
                 chunked_prefill: bool = True, eos_token_ids=(), max_model_len: int = 1 << 62):
        if policy not in ("continuous", "static"):
            raise ValueError(f"scheduling must be 'continuous' or 'static', got {policy!r}")
        self.kv = kv_cache
        self.allocator = kv_cache.allocator
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.policy = policy
        self.chunked_prefill = chunked_prefill
        self.eos_token_ids = set(eos_token_ids)
        self.max_model_len = max_model_len
        self._transition = transition  # (req, new state, **data) -> its Event
        self._emit = emit              # (request id, kind, **data) -> the Event
        # every request that ended (finish() puts it here), for the engine to collect: the
        # fast layer drops what it keeps per request on the device (penalty counts, table rows)
        self.ended: list[Request] = []
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        # every request that holds KV blocks (running, or FINISHED and not released yet), so
        # "who holds what" costs O(holders), never a scan over every request ever served
        self.holding: dict[str, Request] = {}

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # --- one step ----------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self._schedule_running(batch, self.max_num_batched_tokens)
        if self.policy == "continuous" or not self.running:
            self._admit(batch, budget)
        batch.sampled = list(batch.decodes)
        for req, n in zip(batch.prefills, batch.prefill_chunks):
            if req.num_computed_tokens + n == req.num_tokens:
                batch.sampled.append(req)
        return batch

    def _schedule_running(self, batch: ScheduledBatch, budget: int) -> int:
        for req in list(self.running):
            if req not in self.running:  # preempted earlier in this loop (requests compare by identity)
                continue
            remaining = req.num_tokens - req.num_computed_tokens
            prefilling = req.state == RequestState.PREFILL
            if prefilling and self.chunked_prefill:
                n = min(remaining, budget)
            elif prefilling:
                n = remaining
            else:
                n = 1
            if n <= 0:
                continue  # the budget is spent: this prefill waits a step, keeping its place
            if not self._make_room(req, req.num_computed_tokens + n, batch):
                continue
            if prefilling:
                self._transition(req, RequestState.PREFILL, chunk_tokens=n,
                                 computed_tokens=req.num_computed_tokens)
                batch.prefills.append(req)
                batch.prefill_chunks.append(n)
            else:
                batch.decodes.append(req)
            budget -= n
        return budget

    def _make_room(self, req: Request, num_tokens: int, batch: ScheduledBatch) -> bool:
        """Blocks for the first ``num_tokens`` tokens of ``req``, preempting the most recently
        admitted running requests if needed. False when ``req`` itself had to leave."""
        bs = self.allocator.block_size
        table = req.block_table
        while len(table) * bs < num_tokens:
            if self.allocator.append_slot(table, len(table) * bs):
                continue
            if len(self.running) == 1:
                if len(table) >= self.allocator.num_blocks:
                    # alone and its own context fills the whole pool: nothing can ever make room
                    self.running.remove(req)
                    batch.context_full.append(req)
                else:
                    # the rest of the pool is held by FINISHED requests nobody released: wait
                    # for them (LLM.generate / stream raise a clear "release them" error)
                    self.preempt(req)
                    batch.preempted.append(req)
                return False
            victim = self.running[-1]
            self.preempt(victim)
            batch.preempted.append(victim)
            if victim is req:
                return False
        return True

    def _admit(self, batch: ScheduledBatch, budget: int) -> None:
        while self.waiting and len(self.running) < self.max_num_seqs and budget > 0:
            req = self.waiting[0]
            tokens, hashes = req.all_token_ids, req.block_hashes  # each block hashed once per request
            if not self.allocator.can_allocate(tokens, hashes):
                break
            hits = len(self.allocator.match_prefix(tokens, hashes)) * self.allocator.block_size
            new_tokens = len(tokens) - hits
            if self.chunked_prefill:
                n = min(new_tokens, budget)
            elif new_tokens > budget and batch:  # without chunking a long prompt runs alone
                break
            else:
                n = new_tokens
            self.waiting.popleft()
            batch.admitted.append((req, req.state, req.num_cached_prompt_tokens, req.first_scheduled_time))
            req.block_table, cached = self.allocator.allocate(tokens, hashes)
            self.holding[req.request_id] = req
            req.num_computed_tokens = cached
            if req.state == RequestState.WAITING:
                req.num_cached_prompt_tokens = cached
            event = self._transition(req, RequestState.PREFILL, cached_tokens=cached,
                                     blocks=len(req.block_table), chunk_tokens=n)
            if req.first_scheduled_time is None:
                req.first_scheduled_time = event.time
            self.running.append(req)
            batch.prefills.append(req)
            batch.prefill_chunks.append(n)
            budget -= n

    def rollback(self, batch: ScheduledBatch) -> None:
        """Undo the parts of ``batch`` that only the failed forward pass would have made true.

        Requests admitted in this step go back to the front of ``waiting`` in their earlier
        state (WAITING or PREEMPTED), their blocks freed; requests that were already running
        keep their blocks and were simply not advanced. Preemptions and CONTEXT_FULL finishes
        decided while scheduling stand: they are legal moves whatever the step did."""
        for req, state, cached_before, first_scheduled in reversed(batch.admitted):
            if req.state != RequestState.PREFILL:
                continue  # already taken out (e.g. cancelled) since
            if req in self.running:
                self.running.remove(req)
            freed = self._free(req)
            req.num_computed_tokens = 0
            req.num_cached_prompt_tokens = cached_before
            req.first_scheduled_time = first_scheduled
            self._transition(req, state, blocks=freed, rolled_back=True)
            self.waiting.appendleft(req)

    # --- the results of a step -------------------------------------------------------------
    def update_from_output(self, batch: ScheduledBatch, token_ids: list[int | None],
                           logprobs: list | torch.Tensor | None, errors: dict[int, str] | None = None,
                           ) -> list[Request]:
        """Apply one successful step: ``token_ids[i]`` was sampled for ``batch.sampled[i]``.
        Returns the requests that finished in it.

        A request whose own part failed (``errors[i]``: its sampling raised) or whose own
        postprocessing raises (say, its detokenisation) is ended alone as CANCELLED with
        ``req.error`` set; the other requests of the step are unaffected."""
        errors = errors or {}
        bs = self.allocator.block_size
        for req, n in zip(batch.decodes + batch.prefills, [1] * len(batch.decodes) + batch.prefill_chunks):
            before = req.num_computed_tokens
            req.num_computed_tokens = before + n
            if req.num_computed_tokens // bs > before // bs:  # a block just filled up: index it
                self.allocator.commit_full_blocks(req.block_table, req.all_token_ids, req.num_computed_tokens,
                                                  req.block_hashes)
        finished = []
        for i, (req, token) in enumerate(zip(batch.sampled, token_ids)):
            error, reason = errors.get(i), None
            if error is None:
                try:
                    reason = self._append_token(req, token, None if logprobs is None else logprobs[i])
                    if reason is not None:
                        self.finish(req, reason)
                except Exception as exc:  # noqa: BLE001 - one request's failure must not sink the step
                    error = f"{type(exc).__name__}: {exc}"
            if error is not None and req.is_live:
                self.finish(req, StopReason.CANCELLED, error=error)
            if error is not None or reason is not None:
                finished.append(req)
        return finished

    def _append_token(self, req: Request, token: int, logprobs) -> StopReason | None:
        """Record ``token`` (with ``logprobs``: None, or the row's log-probabilities), show its
        text; returns why the request stops now, or None."""
        req.output_token_ids.append(token)
        data = {"token_id": token, "index": len(req.output_token_ids) - 1}
        if logprobs is not None:
            entry = logprob_entry(token, logprobs, req.params.logprobs)
            req.logprobs.append(entry)
            data["logprob"], data["top"] = entry["logprob"], entry["top"]
        now = self._emit(req.request_id, "token", **data).time
        if req.first_token_time is None:
            req.first_token_time = now
        req.last_token_time = now
        if req.state == RequestState.PREFILL:
            self._transition(req, RequestState.DECODE)
        params = req.params
        is_stop_token = (token in self.eos_token_ids and not params.ignore_eos) or token in params.stop_token_ids
        stop_found = req._detokenizer.update(token, hidden=is_stop_token)
        req.text = req._detokenizer.text
        return check_stop(token, len(req.output_token_ids), req.num_tokens, params,
                          self.eos_token_ids, self.max_model_len, stop_found)

    # --- taking requests out --------------------------------------------------------------
    def finish(self, req: Request, reason: StopReason, error: str | None = None) -> None:
        """The request's logic is done: out of the queues, FINISHED with ``reason``; released
        at once when it auto-releases."""
        self.dequeue(req)
        self.ended.append(req)
        if req._detokenizer is not None and error is None:
            req._detokenizer.finish()  # text held back for a character still incomplete
            req.text = req._detokenizer.text
        req.stop_reason = reason
        data = {"stop_reason": reason.value}
        if error is not None:
            req.error = error
            data["error"] = error
        req.finished_time = self._transition(req, RequestState.FINISHED, **data).time
        if req.auto_release:
            self.release(req)

    def release(self, req: Request) -> int:
        """FINISHED -> RELEASED: blocks back to the pool. Returns the number of blocks freed."""
        freed = self._free(req)
        req.released_time = self._transition(req, RequestState.RELEASED, blocks=freed).time
        return freed

    def preempt(self, req: Request) -> None:
        """Free the request's blocks and queue it for recomputation (prompt + output so far)."""
        self.running.remove(req)
        freed = self._free(req)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self._transition(req, RequestState.PREEMPTED, blocks=freed)
        self.waiting.appendleft(req)

    def dequeue(self, req: Request) -> None:
        """Take a request out of whichever queue holds it (its blocks stay with it)."""
        if req in self.running:
            self.running.remove(req)
        elif req.state in (RequestState.WAITING, RequestState.PREEMPTED) and req in self.waiting:
            self.waiting.remove(req)

    def _free(self, req: Request) -> int:
        freed = len(req.block_table)
        self.allocator.free(req.block_table)
        self.holding.pop(req.request_id, None)
        return freed

    def blocks_held(self) -> dict[str, int]:
        """Request id -> blocks held, for every request holding any (O(holders))."""
        held = {}
        for rid, req in self.holding.items():
            if req.block_table:
                held[rid] = len(req.block_table)
        return held
