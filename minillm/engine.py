"""The engine core: requests in, one step at a time, every state change an event.

``EngineCore`` holds the requests, the scheduler, the runner and the sampler, and does two
things with them (``LLM`` adds loading and the whole-generation API on top):

* ``add_request``: check the request (``minillm.request``), tokenize, register it (NEW), queue
  it (WAITING). A request that can never run raises and leaves nothing behind.
* ``step``: one scheduler iteration as a transaction. Schedule (admit, preempt, chunk), one
  forward pass over every scheduled request, one token for each request whose context is
  complete, then ``Scheduler.update_from_output`` applies the results (stop checks, finish,
  release). If the forward pass or the sampling raises (an error, Ctrl-C), the step is undone
  and the exception re-raised: nothing advanced, and every later output is token for token
  what an uninterrupted run gives.

Each state change is an ``Event`` in ``trace``, made by ``_emit`` (the event bus: one list,
plus the events of the step under way, which ``step()`` returns). Every public method holds
one lock, so the engine can be shared by threads (a server, a widget callback, a cell).
"""

from __future__ import annotations

import _signal  # the C module behind ``signal``: its calls skip the Python wrappers' enum conversion
import itertools
import random
import signal
import threading
import time
from collections import deque
from typing import Sequence

import torch

from . import request as checks
from .detokenizer import IncrementalDetokenizer
from .params import SamplingParams
from .request import Request, RequestState, StopReason
from .scheduler import ScheduledBatch, Scheduler
from .trace import Event


class StepInterrupts:
    """Ctrl-C during a step, made safe. A step changes the engine in three phases: scheduling,
    the forward pass and sampling, then applying the results. Only the middle phase can take
    long, and it changes nothing but the KV cache's contents, which nothing points at until the
    results are applied. So a SIGINT (Ctrl-C, Jupyter's "interrupt kernel") is raised at once
    in the middle phase (between ``open()`` and ``close()``), where the step is rolled back;
    in the two bookkeeping phases it is held back and raised as soon as the step is whole
    again. Either way the engine is left exactly as before the step, or exactly as after it.
    Only the main thread receives signals, so other threads need nothing of this. Kept cheap
    (it wraps every step): the handler is read and swapped with ``_signal`` directly."""

    def __enter__(self):
        self._previous, self._open, self._pending = None, False, None
        if threading.current_thread() is threading.main_thread():
            previous = _signal.getsignal(signal.SIGINT)
            if callable(previous):  # not SIG_IGN / SIG_DFL: a Python handler to defer
                self._previous = previous
                _signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum, frame):
        if self._open:
            self._open = False
            self._previous(signum, frame)
        else:
            self._pending = (signum, frame)

    def open(self) -> None:
        """From here a SIGINT is raised at once (one held back is raised now)."""
        if self._pending is not None:
            signum, frame = self._pending
            self._pending = None
            self._previous(signum, frame)
        self._open = True

    def close(self) -> None:
        """From here a SIGINT is held back. Python runs a signal's handler at the next bytecode
        it checks, which may be this call's first: the step's ``try`` must still be around it."""
        self._open = False

    def __exit__(self, exc_type, exc, tb):
        if self._previous is not None:
            _signal.signal(signal.SIGINT, self._previous)
            if exc_type is None and self._pending is not None:
                self._previous(*self._pending)
        return False


class EngineCore:
    """Requests, steps and events over a built runner, sampler and KV cache (see the module
    docstring). A runner or sampler with a ``forget(req)`` method (the fast layer's, which keep
    rows on the device) is told of every request that ends; ``parts``: ``minillm.seams.EngineParts``."""

    def __init__(self, runner, sampler, kv_cache, tokenizer, *, vocab_size: int, max_model_len: int,
                 eos_token_ids: set[int], max_num_seqs: int, max_num_batched_tokens: int, scheduling: str,
                 chunked_prefill: bool, seed: int, max_history: int | None, trace_limit: int | None,
                 device: torch.device, parts):
        self.runner, self.sampler, self.kv_cache, self.tokenizer = runner, sampler, kv_cache, tokenizer
        self.vocab_size, self.max_model_len, self.max_history = vocab_size, max_model_len, max_history
        self.device, self.parts = device, parts
        self.scheduler = Scheduler(kv_cache, max_num_seqs, max_num_batched_tokens, scheduling, self._transition,
                                   emit=self._emit, chunked_prefill=chunked_prefill, eos_token_ids=eos_token_ids,
                                   max_model_len=max_model_len)
        self.requests: dict[str, Request] = {}
        self.trace: list[Event] | deque[Event] = [] if trace_limit is None else deque(maxlen=trace_limit)
        self.step_count = 0
        self._step_events: list[Event] | None = None  # collects the events of the step under way
        self._released_ids: deque[str] = deque()
        self._ids = itertools.count()
        self._seed_rng = random.Random(seed)
        self._lock = threading.RLock()

    # --- events ------------------------------------------------------------------------
    def _emit(self, request_id, kind, **data) -> Event:
        event = Event(self.step_count, time.monotonic(), request_id, kind, data)
        self.trace.append(event)
        if self._step_events is not None:
            self._step_events.append(event)
        return event

    def _transition(self, req: Request, new_state: RequestState, **data) -> Event:
        old = req.move_to(new_state, self.parts.transitions)
        return self._emit(req.request_id, "transition", **{"from": old.value, "to": new_state.value}, **data)

    def _collect_ended(self) -> None:
        """Requests that ended since the last call: the fast layer forgets them; released
        ones beyond ``max_history`` are dropped from ``requests``."""
        ended, self.scheduler.ended = self.scheduler.ended, []
        for req in ended:
            for part in (self.runner, self.sampler):
                forget = getattr(part, "forget", None)
                if forget is not None:
                    forget(req)
            if req.state == RequestState.RELEASED and self.max_history is not None:
                self._forget_released(req)

    def _forget_released(self, req: Request) -> None:
        self._released_ids.append(req.request_id)
        while len(self._released_ids) > self.max_history:
            old = self.requests.get(self._released_ids.popleft())
            if old is not None and old.state == RequestState.RELEASED:
                del self.requests[old.request_id]

    # --- adding requests ----------------------------------------------------------------
    def new_request(self, prompt: str | None = None, params: SamplingParams | None = None, *,
                    prompt_token_ids: Sequence[int] | None = None, request_id: str | None = None,
                    auto_release: bool = True) -> Request:
        """Validate and register a request in state NEW (not tokenized, not queued yet)."""
        with self._lock:
            params = checks.check_params(params, self.vocab_size)
            ids = checks.check_prompt(prompt, prompt_token_ids, self.vocab_size)
            if request_id is None:
                request_id = str(next(self._ids))
                while request_id in self.requests:
                    request_id = str(next(self._ids))
            elif not isinstance(request_id, str) or request_id in self.requests:
                raise ValueError(f"request_id must be a new string, got {request_id!r}")
            req = Request(request_id=request_id, prompt=prompt, params=params, auto_release=auto_release)
            if ids is not None:
                req.prompt_token_ids = ids
            seed = params.seed if params.seed is not None else self._seed_rng.getrandbits(63)
            req._generator = torch.Generator(device=self.device)  # the request's own draws
            req._generator.manual_seed(int(seed) % (2**64))
            self.requests[request_id] = req
            self._emit(request_id, "transition", **{"from": None, "to": RequestState.NEW.value})
            return req

    def enqueue(self, req: Request) -> Request:
        """Tokenize (NEW -> WAITING) and queue for the scheduler. A prompt that cannot be
        tokenized or can never run (longer than max_model_len allows, larger than the whole KV
        budget) raises, and the request is gone again: not in ``requests``, not in the trace."""
        with self._lock:
            try:
                ids = checks.check_fits(req.prompt_token_ids or self.tokenizer.encode(req.prompt), req.prompt,
                                        self.vocab_size, self.max_model_len, self.kv_cache.allocator.num_blocks,
                                        self.kv_cache.block_size)
                req._detokenizer = IncrementalDetokenizer(self.tokenizer, ids, req.params)
            except BaseException:
                self.requests.pop(req.request_id, None)
                for i in range(len(self.trace) - 1, -1, -1):  # its NEW event: it never became a request
                    if self.trace[i].request_id == req.request_id:
                        del self.trace[i]
                        break
                raise
            req.prompt_token_ids = ids
            req.arrival_time = self._transition(req, RequestState.WAITING, prompt_tokens=len(ids)).time
            self.scheduler.add(req)
            return req

    def add_request(self, prompt: str | None = None, params: SamplingParams | None = None, *,
                    prompt_token_ids: Sequence[int] | None = None, request_id: str | None = None,
                    auto_release: bool = True) -> Request:
        """Create, tokenize and queue a request (NEW -> WAITING). With ``auto_release=False``
        a finished request keeps its blocks until ``release(request_id)``."""
        with self._lock:
            req = self.new_request(prompt, params, prompt_token_ids=prompt_token_ids,
                                   request_id=request_id, auto_release=auto_release)
            return self.enqueue(req)

    # --- one engine iteration ------------------------------------------------------------
    def step(self) -> list[Event]:
        """Schedule, run one forward pass, sample, stop, release. Returns this step's events.

        A step is a transaction. Nothing advances a request's ``num_computed_tokens``, appends
        a token or indexes a block in the prefix cache until the forward pass and the sampling
        have succeeded. If anything is raised before that (an error in the model, Ctrl-C /
        "interrupt kernel", which is only let in there), the step is undone and the exception
        re-raised: requests admitted in it go back to the front of the queue as they were
        (PREFILL -> WAITING or PREEMPTED, blocks freed), running ones simply were not
        advanced, seeded generators are rewound. Catch it and keep stepping: every output is
        token for token what an uninterrupted run gives. A request whose own results raise
        (say, in detokenisation) ends alone as CANCELLED with ``req.error`` set."""
        with self._lock:
            self.step_count += 1
            self._step_events = events = []
            t0 = time.monotonic()
            try:
                with StepInterrupts() as sigint:
                    if self.parts.step is None:
                        batch = self._step_once(sigint)
                    else:  # a learner's own step (``minillm.seams``): no rollback, and Ctrl-C stops
                        sigint.open()  # it at once (it may loop forever)
                        batch = self.parts.step(self)
                        sigint.close()
                        if not isinstance(batch, ScheduledBatch):
                            raise TypeError(f"parts.step must return the ScheduledBatch of its step, "
                                            f"got {type(batch).__name__}")
                    self._collect_ended()
                    if batch.decodes or batch.prefills or batch.preempted or batch.context_full:
                        self._emit_step(batch, time.monotonic() - t0)
            finally:
                self._step_events = None
            return events

    def _step_once(self, sigint: StepInterrupts | None) -> ScheduledBatch:
        """The engine's own step: schedule, run, sample, then stop and release (in
        ``update_from_output``); undone if the forward pass or the sampling raises."""
        batch = self.scheduler.schedule()
        for req in batch.context_full:
            self.scheduler.finish(req, StopReason.CONTEXT_FULL)
        if not (batch.decodes or batch.prefills):
            return batch
        saved = []  # the generators a sampled request draws from, to rewind if the step is undone
        for req in batch.sampled:
            if not req.params.greedy:
                saved.append((req, req._generator.get_state()))
        shared = self.sampler.rng_state() if hasattr(self.sampler, "rng_state") else None  # the fast sampler's
        try:
            if sigint is not None:
                sigint.open()
            logits = self.runner.run(batch.decodes, batch.prefills, batch.prefill_chunks)
            token_ids, logprobs, errors = self.runner.sample(self.sampler, logits, batch.sampled, saved)
            if sigint is not None:
                # inside the try: a signal that arrived during the last C call is often handled
                # only here, at the call's first bytecode, and must still undo the step
                sigint.close()
        except BaseException:
            if sigint is not None:  # closed before any call (a call is where a handler may run),
                sigint._open = False   # so a second SIGINT cannot cut the rollback short
            self._undo(batch, saved, shared)
            raise
        self.scheduler.update_from_output(batch, token_ids, logprobs, errors)
        return batch

    def _undo(self, batch: ScheduledBatch, saved: list, shared) -> None:
        """Put back what a step that raised had changed: the seeded generators' states, the fast
        sampler's shared generator, and the scheduler's view of the batch."""
        for req, state in saved:
            req._generator.set_state(state)
        if hasattr(self.sampler, "set_rng_state"):
            self.sampler.set_rng_state(shared)
        self.scheduler.rollback(batch)

    def _emit_step(self, batch: ScheduledBatch, duration: float) -> None:
        """The step's own event: what ran, and the KV pool right after it."""
        chunks = {}
        for req, n in zip(batch.prefills, batch.prefill_chunks):
            chunks[req.request_id] = n
        pool, kv = self.kv_cache.allocator, self.kv_cache
        self._emit(None, "step", num_prefill=len(batch.prefills), num_decode=len(batch.decodes),
                   num_tokens=len(batch.decodes) + sum(batch.prefill_chunks), num_preempted=len(batch.preempted),
                   prefill_tokens=chunks, duration=duration, used_blocks=pool.num_used,
                   total_blocks=pool.num_blocks, block_size=kv.block_size, bytes_per_token=kv.bytes_per_token,
                   kv_blocks=self.scheduler.blocks_held())

    # --- finishing from outside ----------------------------------------------------------
    def release(self, request_id: str) -> Request:
        """FINISHED -> RELEASED: give the request's blocks back to the pool and record its stats."""
        with self._lock:
            req = self.get_request(request_id)
            if req.state == RequestState.RELEASED:
                return req
            if req.state != RequestState.FINISHED:
                raise ValueError(f"request {request_id!r} is {req.state.value}; only a FINISHED request "
                                 f"can be released (cancel it first)")
            self.scheduler.release(req)
            if self.max_history is not None:
                self._forget_released(req)
            return req

    def cancel(self, request_id: str) -> Request:
        """Stop a request wherever it is: when this returns it is RELEASED and holds no block.
        A FINISHED request keeps its stop reason and is released; a RELEASED one is left as is.
        From another thread it takes effect between two steps."""
        with self._lock:
            req = self.get_request(request_id)
            if req.is_live:
                self.scheduler.finish(req, StopReason.CANCELLED)
            self._collect_ended()
            if req.state == RequestState.FINISHED:
                self.release(request_id)
            return req

    def get_request(self, request_id: str) -> Request:
        with self._lock:
            try:
                return self.requests[request_id]
            except (KeyError, TypeError):
                raise KeyError(f"unknown request_id {request_id!r}") from None
