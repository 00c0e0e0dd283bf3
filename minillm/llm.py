"""LLM: the engine's front door. Add requests, step the engine, cancel, read the trace.

``step()`` is one scheduler iteration: schedule (admit, preempt, chunk), one forward pass
over every scheduled request, sample one token for each request whose context is complete,
then the scheduler applies the results (stop checks, finish, release). Each state change is
an ``Event`` in ``llm.trace``; ``step()`` returns the events it produced. Every public method
holds one lock, so an ``LLM`` can be shared by threads (a server, a widget callback, a cell).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections import deque
from typing import Sequence

import torch

from . import intake
from . import trace as tracemod
from .attention import resolve_backend
from .detokenizer import IncrementalDetokenizer
from .engine_args import check_engine_options, default_num_threads, plan_kv_cache
from .generation import WholeGenerations
from .interrupts import StepInterrupts
from .kv_cache import KVCache
from .models import load_config, load_model, load_tokenizer, resolve_model_dir
from .params import SamplingParams
from .request import Request, RequestOutput, RequestState, StopReason
from .runner import ModelRunner
from .sampler import Sampler, make_generator
from .scheduler import ScheduledBatch, Scheduler
from .seams import EngineParts, PooledAllocator
from .trace import Event

def _locked(method):
    """Run ``method`` holding the engine's lock (re-entrant: methods call each other)."""
    def wrapper(self, *args, **kwargs):
        with self._lock:
            return method(self, *args, **kwargs)
    wrapper.__name__, wrapper.__doc__, wrapper.__wrapped__ = method.__name__, method.__doc__, method
    return wrapper


class LLM(WholeGenerations):
    """A small, complete inference engine over a Llama / Qwen2 / Qwen3 checkpoint.

    Args:
        model: a local Hugging Face folder; None loads the model shipped in the package.
        device: "auto" (CUDA when available, else CPU), "cpu", "cuda", "cuda:N".
        dtype: "auto" (float32 on CPU; on CUDA bfloat16 where the GPU computes in it natively, else float16), "float32", "bfloat16", "float16".
        block_size: tokens per KV block.
        num_kv_blocks / kv_cache_tokens: the KV budget, in blocks or in tokens (give one).
            Default: room for ``max_num_seqs`` full contexts, capped at 256 MiB on CPU and at
            half the free memory on CUDA.
        max_num_seqs: most requests running at once (batch slots).
        max_num_batched_tokens: token budget of one step (prefill tokens + one per decode).
        max_model_len: longest context (prompt + output); default the model's maximum.
        enable_prefix_caching: share full KV blocks between prompts that start alike.
        enable_chunked_prefill: prefill a prompt longer than the step's budget in chunks over
            several steps, next to the running decodes (vLLM's default); False makes a long
            prompt wait for room, then run alone.
        scheduling: "continuous" (default) or "static" (a new batch only when all finished).
        seed: seeds the generators of requests that give no seed of their own.
        max_history: None keeps every request in ``llm.requests`` (the course's default); an
            int keeps at most that many released ones (oldest dropped first), and
            ``generate()`` / ``chat()`` drop their own released requests once their outputs
            are returned. A server sets it so memory does not grow with requests served.
        trace_limit: None keeps every event in ``llm.trace``; an int keeps the latest that
            many (``llm.trace`` is then a bounded deque).
        num_threads: CPU threads for torch (``torch.set_num_threads``, which is process-wide:
            it applies to everything else in the process too). None chooses from the model size
            and the machine: one thread per 60M parameters, at least 1, at most the usable cores
            (so small models get 1 thread: more only add synchronisation); torch is left alone
            on CUDA and when OMP_NUM_THREADS is set. ``llm.num_threads`` is what was set
            (None: nothing was).
        attention_backend: how decode attention reads the paged KV pool (``minillm.attention``):
            "auto" (default: "flex" on CUDA; on the CPU "kernel" where it builds and has its
            vectorised path for the model's heads, else "gather"), "gather" (the readable
            reference: gather each context, one SDPA), "paged" (whole blocks picked through
            fixed-shape block tables, one SDPA), "kernel" (the CPU's C kernel reading the pool
            in place through the block tables; float32 on the CPU, built with the system's C
            compiler on first use) or "flex" (FlexAttention over the pool through the block
            tables; compiled on CUDA, unverified there; eager and slow on the CPU).
            ``llm.attention_backend`` is the one used.
        weight_dtype: None (weights in ``dtype``) or "int8": every projection stored as int8
            with per-output-channel scales, a quarter of the bytes a decode step reads
            (CPU, ``dtype="float32"`` only; ``minillm.models.weights``, with its documented
            logit tolerance against float32).
        compile: True runs the forward through ``torch.compile`` (attention stays eager;
            ``minillm.fast.compiled``): one graph for every step, compiled in the first step
            or by ``warmup()`` (tens of seconds); ``llm.model`` stays the eager reference. Not with
            ``weight_dtype="int8"``; float32 logits match eager to rounding (bf16 rounds otherwise).
        row_split: True splits each float projection of 1 MiB or more by output rows across
            persistent CPU threads for steps of at most 4 rows (batch-1/few-request decode),
            bit-identical to one ``F.linear`` (``minillm.fast.threaded``): used when there are
            2+ threads and ``compile`` is off; ``llm.shard_pool`` holds its threads (None: unused).
            Off by default: torch's own threads were faster on a quiet machine; the split is for a
            shared, oversubscribed one, where torch's threads can collapse 14-40x.
        decode_graphs: run decode-only steps at fixed shapes, one graph per bucket of rows and
            blocks, padded (``minillm.fast.decode_graphs``): True = CUDA graphs on CUDA (unverified:
            no GPU has run them), inductor with its C++ wrapper on the CPU (batches up to 4; each
            bucket compiles on first use, seconds to tens of seconds); "eager" = the same
            fixed-shape path uncompiled. Off by default. Steps with a prefill run eager.
        parts: ``minillm.seams.EngineParts``: parts written outside the engine (a transition
            table, a block pool, a step function, top-k / top-p filters) used instead of the
            engine's own; the build-it notebook plugs a learner's parts in here. None: all its own.
    """

    def __init__(self, model: str | None = None, device: str = "auto", dtype: str = "auto", *,
                 block_size: int = 16, num_kv_blocks: int | None = None,
                 kv_cache_tokens: int | None = None, max_num_seqs: int = 64,
                 max_num_batched_tokens: int = 4096, max_model_len: int | None = None,
                 enable_prefix_caching: bool = True, enable_chunked_prefill: bool = True,
                 scheduling: str = "continuous", seed: int = 0, max_history: int | None = None,
                 trace_limit: int | None = None, num_threads: int | None = None,
                 attention_backend: str = "auto", weight_dtype: str | None = None, compile: bool = False,
                 row_split: bool = False, decode_graphs: bool | str = False, parts: EngineParts | None = None):
        opts = check_engine_options(
            device, dtype, block_size=block_size, num_kv_blocks=num_kv_blocks, kv_cache_tokens=kv_cache_tokens,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching, enable_chunked_prefill=enable_chunked_prefill,
            scheduling=scheduling, seed=seed, max_history=max_history, trace_limit=trace_limit,
            num_threads=num_threads, attention_backend=attention_backend, weight_dtype=weight_dtype,
            compile=compile, row_split=row_split, decode_graphs=decode_graphs)
        self.options = opts
        if parts is not None and not isinstance(parts, EngineParts):
            raise ValueError(f"parts must be a minillm.seams.EngineParts or None, got {type(parts).__name__}")
        self.parts = parts = parts or EngineParts()
        self.device, self.dtype, self.max_history = opts.device, opts.dtype, opts.max_history
        self.model_path = resolve_model_dir(model)
        self.model_config = cfg = load_config(self.model_path)
        limit = cfg.max_position_embeddings
        if opts.max_model_len is not None and opts.max_model_len > limit:  # before loading any weight
            raise ValueError(f"max_model_len must be <= the model's max_position_embeddings ({limit}), "
                             f"got {opts.max_model_len}")
        self.tokenizer = load_tokenizer(self.model_path, cfg.vocab_size)
        self.max_model_len = opts.max_model_len or limit
        self.model = load_model(self.model_path, cfg, self.dtype, self.device, self.max_model_len)
        self.num_threads = opts.num_threads or default_num_threads(
            sum(p.numel() for p in self.model.parameters()), self.device)
        if self.num_threads is not None:
            torch.set_num_threads(self.num_threads)
        if opts.weight_dtype is not None:  # after the thread count: it is chosen from the float parameters
            from .models.weights import quantize_weights

            quantize_weights(self.model, opts.weight_dtype)
        self.shard_pool = None  # the row split's worker threads, joined when the model goes
        threads = self.num_threads or (torch.get_num_threads() if self.device.type == "cpu" else 1)
        if opts.row_split and threads >= 2 and not opts.compile:
            from .fast.threaded import use_row_split

            self.shard_pool = use_row_split(self.model, threads)
        plan = plan_kv_cache(opts, cfg)  # after the weights are on the device: what is left is the budget
        self.kv_cache = KVCache(cfg.num_hidden_layers, plan.num_kv_blocks, opts.block_size, cfg.num_key_value_heads,
                                cfg.head_dim, self.dtype, self.device, opts.enable_prefix_caching,
                                scratch_block=opts.decode_graphs is not None,
                                allocator=None if parts.block_pool is None else PooledAllocator(
                                    parts.block_pool(plan.num_kv_blocks), plan.num_kv_blocks, opts.block_size,
                                    opts.enable_prefix_caching))
        #: the attention backend this engine runs ("auto" resolved)
        self.attention_backend = resolve_backend(opts.attention_backend, self.device, self.dtype, cfg.head_dim,
                                                 cfg.num_attention_heads // cfg.num_key_value_heads)
        self.runner = ModelRunner(self.model, self.kv_cache, self.device, self.attention_backend)
        if opts.decode_graphs is not None:
            from .fast.decode_graphs import DecodeGraphs

            self.runner.graphs = DecodeGraphs(self.model, self.kv_cache, self.device, opts.decode_graphs,
                                              opts.max_num_seqs, self.max_model_len, self.runner.attention)
        if opts.compile:  # the runner calls the compiled forward; self.model stays eager
            from .fast.compiled import CompiledModel

            self.runner.model = CompiledModel(self.model)
        self.sampler = Sampler(parts.top_k_filter, parts.top_p_filter)
        self.sampler.seed = opts.seed  # the unseeded rows' shared noise on CUDA (``Sampler._noise``)
        eos = set(cfg.eos_token_ids)  # config.json's and generation_config.json's
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.scheduler = Scheduler(self.kv_cache, opts.max_num_seqs, opts.max_num_batched_tokens, opts.scheduling,
                                   self._transition, emit=self._emit, chunked_prefill=opts.enable_chunked_prefill,
                                   eos_token_ids=eos, max_model_len=self.max_model_len,
                                   on_release=self._forget_old, on_finish=self._forget_ended)
        self.requests: dict[str, Request] = {}
        self.trace: list[Event] | deque[Event] = [] if opts.trace_limit is None else deque(maxlen=opts.trace_limit)
        self.step_count = 0
        self._step_events: list[Event] | None = None  # collects the events of the step under way
        self._released_ids: deque[str] = deque()
        self._ids = itertools.count()
        self._seed_rng = random.Random(opts.seed)
        self._lock = threading.RLock()

    @property
    def eos_token_ids(self) -> set[int]:
        """Token ids that end a request as EOS: config.json, generation_config.json and the
        tokenizer's EOS (settable, e.g. to teach what an EOS does)."""
        return self.scheduler.eos_token_ids

    @eos_token_ids.setter
    def eos_token_ids(self, ids) -> None:
        self.scheduler.eos_token_ids = set(ids)

    # --- events ------------------------------------------------------------------------
    def _emit(self, request_id, kind, **data) -> None:
        event = Event(self.step_count, time.monotonic(), request_id, kind, data)
        self.trace.append(event)
        if self._step_events is not None:
            self._step_events.append(event)
        return event

    def _transition(self, req: Request, new_state: RequestState, **data) -> Event:
        old = req.move_to(new_state, self.parts.transitions)
        return self._emit(req.request_id, "transition", **{"from": old.value, "to": new_state.value}, **data)

    @_locked
    def clear_trace(self) -> None:
        """Forget past events (the requests and the cache are untouched)."""
        self.trace.clear()

    def _forget_ended(self, req: Request) -> None:
        """Called when a request finishes: the sampler and the runner drop its device state."""
        for part in (self.sampler, self.runner):
            getattr(part, "forget", lambda r: None)(req)

    def _forget_old(self, req: Request) -> None:
        """Called on every release: keep at most ``max_history`` released requests."""
        if self.max_history is None:
            return
        self._released_ids.append(req.request_id)
        while len(self._released_ids) > self.max_history:
            old = self.requests.get(self._released_ids.popleft())
            if old is not None and old.state == RequestState.RELEASED:
                del self.requests[old.request_id]

    # --- adding requests ----------------------------------------------------------------
    def _new_id(self, request_id) -> str:
        if request_id is None:
            request_id = str(next(self._ids))
            while request_id in self.requests:
                request_id = str(next(self._ids))
        elif not isinstance(request_id, str) or request_id in self.requests:
            raise ValueError(f"request_id must be a new string, got {request_id!r}")
        return request_id

    @_locked
    def new_request(self, prompt: str | None = None, params: SamplingParams | None = None, *,
                    prompt_token_ids: Sequence[int] | None = None, request_id: str | None = None,
                    auto_release: bool = True) -> Request:
        """Validate and register a request in state NEW (not tokenized, not queued yet)."""
        params = intake.check_params(params, self.model_config.vocab_size)
        ids = intake.check_prompt(prompt, prompt_token_ids, self.model_config.vocab_size)
        request_id = self._new_id(request_id)
        seed = params.seed if params.seed is not None else self._seed_rng.getrandbits(63)
        req = Request(request_id=request_id, prompt=prompt, params=params, auto_release=auto_release)
        if ids is not None:
            req.prompt_token_ids = ids
        req._generator = make_generator(seed, self.device)
        self.requests[request_id] = req
        self._emit(request_id, "transition", **{"from": None, "to": RequestState.NEW.value})
        return req

    @_locked
    def enqueue(self, req: Request) -> Request:
        """Tokenize (NEW -> WAITING) and queue for the scheduler. A prompt that cannot be
        tokenized or can never run (longer than max_model_len allows, larger than the whole KV
        budget) raises, and the request is gone again: not in ``llm.requests``, not in the trace."""
        try:
            ids = intake.check_fits(req.prompt_token_ids or self.tokenizer.encode(req.prompt), req.prompt,
                                    self.model_config.vocab_size, self.max_model_len,
                                    self.kv_cache.num_blocks, self.kv_cache.block_size)
            req._detokenizer = IncrementalDetokenizer(self.tokenizer, ids, req.params)
        except BaseException:
            self.requests.pop(req.request_id, None)
            self._unemit(req.request_id)
            raise
        req.prompt_token_ids = ids
        req.arrival_time = self._transition(req, RequestState.WAITING, prompt_tokens=len(ids)).time
        self.scheduler.add(req)
        return req

    def _unemit(self, request_id: str) -> None:
        """Drop a request's NEW event again (it never became a real request)."""
        for i in range(len(self.trace) - 1, -1, -1):
            e = self.trace[i]
            if e.request_id == request_id and e.kind == "transition" and e.data.get("to") == "NEW":
                del self.trace[i]
                return

    @_locked
    def add_request(self, prompt: str | None = None, params: SamplingParams | None = None, *,
                    prompt_token_ids: Sequence[int] | None = None, request_id: str | None = None,
                    auto_release: bool = True) -> Request:
        """Create, tokenize and queue a request (NEW -> WAITING). With ``auto_release=False``
        a finished request keeps its blocks until ``release(request_id)``."""
        req = self.new_request(prompt, params, prompt_token_ids=prompt_token_ids,
                               request_id=request_id, auto_release=auto_release)
        return self.enqueue(req)

    def prepare_prompt(self, prompt: str | None = None, *, messages=None,
                       prompt_token_ids: Sequence[int] | None = None) -> list[int]:
        """The token ids a request would run, checked as ``add_request`` checks them (ids in
        the vocabulary, shorter than ``max_model_len``, within the KV budget), *without* the
        engine's lock. Tokenising a long prompt, or laying out a chat by its template, takes
        time; done here, in the caller's thread, it delays no other request's step (the server
        calls this from a worker thread, then adds the request by its ids). Give exactly one
        of ``prompt``, ``messages`` (a conversation) and ``prompt_token_ids``; bad input
        raises ``ValueError`` naming it."""
        if sum(x is not None for x in (prompt, messages, prompt_token_ids)) != 1:
            raise ValueError("give exactly one of prompt, messages and prompt_token_ids")
        vocab = self.model_config.vocab_size
        if messages is not None:
            from .chat import encode_conversation

            ids = encode_conversation(self.tokenizer, messages)
        else:
            if prompt is None and isinstance(prompt_token_ids, (list, tuple)):
                intake.check_length(len(prompt_token_ids), self.max_model_len)  # before a look at each id
            ids = intake.check_prompt(prompt, prompt_token_ids, vocab)
            if ids is None:
                ids = self.tokenizer.encode(prompt)
        return intake.check_fits(list(ids), prompt, vocab, self.max_model_len, self.kv_cache.num_blocks,
                                 self.kv_cache.block_size)

    # --- one engine iteration ------------------------------------------------------------
    @_locked
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
        self.step_count += 1
        self._step_events = events = []
        t0 = time.monotonic()
        try:
            with StepInterrupts() as interrupts:
                if self.parts.step is not None:  # a learner's own step (minillm.seams): no rollback,
                    with interrupts.deliverable():  # and Ctrl-C stops it at once (it may loop forever)
                        batch = self.parts.step(self)
                    if not isinstance(batch, ScheduledBatch):
                        raise TypeError(f"parts.step must return the ScheduledBatch of its step, "
                                        f"got {type(batch).__name__}")
                else:
                    batch = self._step_once(interrupts)
                if batch or batch.preempted or batch.context_full:
                    kv, pool = self.kv_cache, self.kv_cache.allocator  # (stats() would build a snapshot)
                    self._emit(None, "step", num_prefill=len(batch.prefills), num_decode=len(batch.decodes),
                               num_tokens=batch.num_tokens, num_preempted=len(batch.preempted),
                               prefill_tokens={r.request_id: n for r, n in zip(batch.prefills, batch.prefill_chunks)},
                               duration=time.monotonic() - t0, used_blocks=pool.num_used,
                               total_blocks=pool.num_blocks, block_size=kv.block_size,
                               bytes_per_token=kv.bytes_per_token, kv_blocks=self.scheduler.blocks_held())
        finally:
            self._step_events = None
        return events

    def _step_once(self, interrupts) -> ScheduledBatch:
        """The engine's own step: schedule, run, sample, then stop and release (in
        ``update_from_output``); undone if the forward pass or the sampling raises."""
        batch = self.scheduler.schedule()
        for req in batch.context_full:
            self.scheduler.finish(req, StopReason.CONTEXT_FULL)
        if batch:
            sampled = batch.sampled
            rngs = [(r, r._generator.get_state()) for r in sampled if not r.params.greedy]
            shared = getattr(self.sampler, "rng_state", None)  # (a wrapped sampler may have none)
            shared_state = shared() if shared is not None else None
            try:
                with interrupts.deliverable():
                    logits = self.runner.run(batch.decodes, batch.prefills, batch.prefill_chunks)
                    token_ids, logprobs, errors = self.runner.sample(self.sampler, logits, sampled, rngs)
            except BaseException:
                for r, state in rngs:
                    r._generator.set_state(state)
                if shared is not None:
                    self.sampler.set_rng_state(shared_state)
                self.scheduler.rollback(batch)
                raise
            self.scheduler.update_from_output(batch, token_ids, logprobs, errors)
        return batch

    @_locked
    def warmup(self) -> int:
        """With ``compile=True`` or ``decode_graphs``: compile (capture) now, not in the first
        steps (call it before adding requests; ``minillm.fast.compiled.warm_up``,
        ``minillm.fast.decode_graphs.warm_up``). Returns the graphs made (0: eager)."""
        from .fast.decode_graphs import warm_up as make_decode_graphs
        from .fast.compiled import warm_up

        return warm_up(self) + make_decode_graphs(self)

    # --- finishing from outside ----------------------------------------------------------
    @_locked
    def release(self, request_id: str) -> Request:
        """FINISHED -> RELEASED: give the request's blocks back to the pool and record its stats."""
        req = self.get_request(request_id)
        if req.state == RequestState.RELEASED:
            return req
        if req.state != RequestState.FINISHED:
            raise ValueError(f"request {request_id!r} is {req.state.value}; only a FINISHED request "
                             f"can be released (cancel it first)")
        self.scheduler.release(req)
        return req

    @_locked
    def cancel(self, request_id: str) -> Request:
        """Stop a request wherever it is: when this returns it is RELEASED and holds no block.
        A FINISHED request keeps its stop reason and is released; a RELEASED one is left as is.
        From another thread it takes effect between two steps."""
        req = self.get_request(request_id)
        if req.is_live:
            self.scheduler.finish(req, StopReason.CANCELLED)
        if req.state == RequestState.FINISHED:
            self.scheduler.release(req)
        return req

    @_locked
    def get_request(self, request_id: str) -> Request:
        try:
            return self.requests[request_id]
        except (KeyError, TypeError):
            raise KeyError(f"unknown request_id {request_id!r}") from None

    # --- whole generations ---------------------------------------------------------------
    @_locked
    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    @_locked
    def output(self, request_id: str) -> RequestOutput:
        req = self.get_request(request_id)
        if not req.is_finished:
            raise ValueError(f"request {request_id!r} is still {req.state.value}")
        return RequestOutput(request_id=req.request_id, prompt=req.prompt,
                             prompt_token_ids=list(req.prompt_token_ids), text=req.text,
                             token_ids=list(req.output_token_ids), stop_reason=req.stop_reason,
                             logprobs=list(req.logprobs), metrics=tracemod.metrics_of(req))

    def default_sampling_params(self, **overrides) -> SamplingParams:
        """``SamplingParams`` with the values the model's ``generation_config.json`` recommends
        (temperature, top_p, top_k, ...; vLLM's ``generation_config="auto"``), then ``overrides``."""
        return SamplingParams(**{**self.model_config.generation_defaults, **overrides})

    # --- looking inside ------------------------------------------------------------------
    @_locked
    def cache_stats(self):
        """Total / used / free blocks, block size, bytes per token, used and total bytes."""
        return self.kv_cache.stats()

    @_locked
    def blocks_held(self) -> dict[str, int]:
        """Request id -> number of KV blocks it holds (live or finished-but-not-released)."""
        return self.scheduler.blocks_held()

    @_locked
    def metrics(self, request_id: str) -> dict:
        """Queue time, TTFT, TPOT, end-to-end time of one request, from its own timestamps."""
        return tracemod.metrics_of(self.get_request(request_id))

    @_locked
    def summary(self) -> dict:
        return tracemod.summary(list(self.trace))

    @_locked
    def export_chrome_trace(self, path=None) -> dict:
        return tracemod.to_chrome_trace(list(self.trace), path)

    @_locked
    def next_token_logits(self, prompt: str | Sequence[int]) -> torch.Tensor:
        """Raw logits for the token after ``prompt`` (no request, no cache): for the
        sampling lessons, which look at one distribution many ways."""
        if isinstance(prompt, str):
            ids = self.prepare_prompt(prompt)
        else:  # checked like a request's ids: ints in the vocabulary, shorter than max_model_len
            ids = self.prepare_prompt(prompt_token_ids=prompt)
        return self.model.full_logits(ids)[-1]

    def __repr__(self) -> str:
        s = self.cache_stats()
        return (f"LLM({self.model_config.architecture} from {self.model_path.name}, device={self.device}, "
                f"dtype={str(self.dtype).replace('torch.', '')}, kv_blocks={s.total_blocks}x{s.block_size})")
