"""The scheduler: which requests run this step, and in which phase.

Two queues. ``waiting`` holds WAITING and PREEMPTED requests (preempted ones go to the
front: they were admitted earlier). ``running`` holds admitted requests in admission order.

Each step (continuous batching):
1. every running request gets room for one more token (its decode). When the pool is out
   of blocks, the most recently admitted running request is *preempted*: its blocks go back
   to the pool and it returns to the front of ``waiting``, to be recomputed later;
2. waiting requests are admitted in order while there is a free batch slot
   (``max_num_seqs``), room in the step's token budget (``max_num_batched_tokens``) and
   enough free blocks for their whole context; they are prefilled in this same step.

So new requests join while others decode, and a decode step is one batched forward pass.
With ``policy="static"`` a new batch is admitted only when the running set is empty: the
classic static batching that continuous batching improves on.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from .kv_cache import KVCache
from .request import Request, RequestState


@dataclass
class ScheduledBatch:
    decodes: list[Request] = field(default_factory=list)
    prefills: list[Request] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    context_full: list[Request] = field(default_factory=list)

    @property
    def requests(self) -> list[Request]:
        return self.decodes + self.prefills

    def __bool__(self) -> bool:
        return bool(self.decodes or self.prefills)


class Scheduler:
    def __init__(self, kv_cache: KVCache, max_num_seqs: int, max_num_batched_tokens: int,
                 policy: str, transition: Callable[..., None]):
        if policy not in ("continuous", "static"):
            raise ValueError(f"scheduling must be 'continuous' or 'static', got {policy!r}")
        self.kv = kv_cache
        self.allocator = kv_cache.allocator
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.policy = policy
        self._transition = transition
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # --- one step ----------------------------------------------------------------------
    def schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        self._schedule_decodes(batch)
        if self.policy == "continuous" or not self.running:
            self._admit(batch)
        return batch

    def _schedule_decodes(self, batch: ScheduledBatch) -> None:
        for req in list(self.running):
            if req not in self.running:  # preempted earlier in this loop (requests compare by identity)
                continue
            while not self.allocator.append_slot(req.block_table, req.num_tokens - 1):
                if len(self.running) == 1:
                    # alone and still no room: the whole KV budget is this request's context
                    self.running.remove(req)
                    batch.context_full.append(req)
                    break
                victim = self.running[-1]
                self.preempt(victim)
                batch.preempted.append(victim)
                if victim is req:
                    break
            else:
                batch.decodes.append(req)

    def _admit(self, batch: ScheduledBatch) -> None:
        budget = self.max_num_batched_tokens - len(batch.decodes)
        while self.waiting and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            tokens = req.all_token_ids
            if not self.allocator.can_allocate(tokens):
                break
            hits = len(self.allocator.match_prefix(tokens)) * self.allocator.block_size
            new_tokens = len(tokens) - hits
            if new_tokens > budget and batch:  # a prompt larger than the budget runs alone
                break
            self.waiting.popleft()
            req.block_table, cached = self.allocator.allocate(tokens)
            req.num_computed_tokens = cached
            if req.state == RequestState.WAITING:
                req.num_cached_prompt_tokens = cached
            self._transition(req, RequestState.PREFILL, cached_tokens=cached, blocks=len(req.block_table))
            self.running.append(req)
            batch.prefills.append(req)
            budget -= new_tokens

    # --- taking requests out --------------------------------------------------------------
    def preempt(self, req: Request) -> None:
        """Free the request's blocks and queue it for recomputation (prompt + output so far)."""
        self.running.remove(req)
        freed = len(req.block_table)
        self.allocator.free(req.block_table)
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self._transition(req, RequestState.PREEMPTED, blocks=freed)
        self.waiting.appendleft(req)

    def dequeue(self, req: Request) -> None:
        """Take a request out of whichever queue holds it (its blocks stay with it)."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)

    def remove(self, req: Request) -> int:
        """Dequeue a request and free its blocks; returns the number of blocks freed."""
        self.dequeue(req)
        freed = len(req.block_table)
        self.allocator.free(req.block_table)
        return freed

