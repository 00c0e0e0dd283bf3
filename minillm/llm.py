"""LLM: the engine's front door. Load a model, add requests, step, generate, look inside.

``LLM`` is an ``EngineCore`` (``minillm.engine``: requests, the step transaction, the events)
built over a loaded model: it checks the options, loads the weights and the tokenizer, sizes
the KV cache, picks the path (the fast layer, or the reference with ``fast=False``) and adds
the whole-generation API (``generate``, ``chat``, ``stream``, ``minillm.generation``) and the
views the course reads (``cache_stats``, ``metrics``, ``summary``, ``export_chrome_trace``).
"""

from __future__ import annotations

from typing import Sequence

import torch

from . import fast as fast_layer
from . import generation
from . import request as checks
from . import trace as tracemod
from .engine import EngineCore
from .engine_args import check_engine_options, default_num_threads, plan_kv_cache
from .kv_cache import KVCache
from .models import load_config, load_model, load_tokenizer, resolve_model_dir
from .params import SamplingParams
from .request import RequestOutput
from .runner import ModelRunner
from .sampler import Sampler
from .seams import EngineParts, PooledAllocator


class LLM(EngineCore):
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
        num_threads: CPU threads for torch (``torch.set_num_threads``, process-wide). None: one
            per 60M parameters, at least 1, at most the usable cores; torch is left alone on CUDA
            and when OMP_NUM_THREADS is set. ``llm.num_threads`` is what was set (None: nothing).
        fast: True (default) runs the fast layer (``minillm.fast``: batched decode attention,
            device-side block tables, the batched sampler, and the options below); False runs
            the reference path the chapter reads (``minillm.runner``, ``minillm.sampler``, the
            model's own attention), token for token the same, with none of the options below.
        attention_backend: how the fast path's decode attention reads the paged pool
            (``minillm.fast.attention``): "auto" ("flex" on CUDA; on the CPU "kernel" where the C
            kernel builds and has a vectorised path for the model's heads, else "gather"),
            "gather", "paged", "kernel" or "flex". ``llm.attention_backend`` is the one used.
        weight_dtype: None (weights in ``dtype``) or "int8" (CPU, float32: every projection int8
            with per-output-channel scales, ``minillm.models.weights``, within its logit tolerance).
        compile: True runs the forward through ``torch.compile`` (``minillm.fast.compiled``).
        row_split: True splits big projections by output rows across persistent CPU threads for
            steps of at most 4 rows (``minillm.fast.threaded``); for oversubscribed machines.
        decode_graphs: decode-only steps at fixed shapes, one graph per bucket
            (``minillm.fast.decode_graphs``): True = CUDA graphs on CUDA (unverified), inductor on
            the CPU; "eager" = the same fixed-shape path uncompiled. Off by default.
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
                 row_split: bool = False, decode_graphs: bool | str = False, fast: bool = True,
                 parts: EngineParts | None = None):
        self.options = opts = check_engine_options(
            device, dtype, block_size=block_size, num_kv_blocks=num_kv_blocks, kv_cache_tokens=kv_cache_tokens,
            max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens, max_model_len=max_model_len,
            enable_prefix_caching=enable_prefix_caching, enable_chunked_prefill=enable_chunked_prefill,
            scheduling=scheduling, seed=seed, max_history=max_history, trace_limit=trace_limit,
            num_threads=num_threads, attention_backend=attention_backend, weight_dtype=weight_dtype,
            compile=compile, row_split=row_split, decode_graphs=decode_graphs, fast=fast)
        if parts is not None and not isinstance(parts, EngineParts):
            raise ValueError(f"parts must be a minillm.seams.EngineParts or None, got {type(parts).__name__}")
        parts = parts or EngineParts()
        self.device, self.dtype = opts.device, opts.dtype
        self.model_path = resolve_model_dir(model)
        self.model_config = cfg = load_config(self.model_path)
        limit = cfg.max_position_embeddings
        if opts.max_model_len is not None and opts.max_model_len > limit:  # before loading any weight
            raise ValueError(f"max_model_len must be <= the model's max_position_embeddings ({limit}), "
                             f"got {opts.max_model_len}")
        self.tokenizer = tokenizer = load_tokenizer(self.model_path, cfg.vocab_size)
        self.max_model_len = opts.max_model_len or limit
        self.model = load_model(self.model_path, cfg, self.dtype, self.device, self.max_model_len)
        self.num_threads = opts.num_threads or default_num_threads(
            sum(p.numel() for p in self.model.parameters()), self.device)
        if self.num_threads is not None:
            torch.set_num_threads(self.num_threads)
        self.shard_pool = None  # the row split's worker threads, joined when the model goes
        if opts.fast:
            fast_layer.prepare_model(self, opts)
        plan = plan_kv_cache(opts, cfg)  # after the weights are on the device: what is left is the budget
        pool = None if parts.block_pool is None else PooledAllocator(
            parts.block_pool(plan.num_kv_blocks), plan.num_kv_blocks, opts.block_size, opts.enable_prefix_caching)
        self.kv_cache = KVCache(cfg.num_hidden_layers, plan.num_kv_blocks, opts.block_size, cfg.num_key_value_heads,
                                cfg.head_dim, self.dtype, self.device, opts.enable_prefix_caching,
                                scratch_block=opts.decode_graphs is not None, allocator=pool,
                                zeros=fast_layer.kv_pool_zeros if opts.fast else torch.zeros)
        if opts.fast:
            runner, sampler, self.attention_backend = fast_layer.build(self, opts, cfg, parts)
        else:  # the reference path: plain runner, one row at a time sampler, the model's own attention
            runner, sampler = ModelRunner(self.model, self.kv_cache, self.device), Sampler(
                parts.top_k_filter, parts.top_p_filter)
            self.attention_backend = "reference"
        eos = set(cfg.eos_token_ids)  # config.json's and generation_config.json's
        if tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        super().__init__(runner, sampler, self.kv_cache, tokenizer, vocab_size=cfg.vocab_size,
                         max_model_len=self.max_model_len, eos_token_ids=eos, max_num_seqs=opts.max_num_seqs,
                         max_num_batched_tokens=opts.max_num_batched_tokens, scheduling=opts.scheduling,
                         chunked_prefill=opts.enable_chunked_prefill, seed=opts.seed, max_history=opts.max_history,
                         trace_limit=opts.trace_limit, device=self.device, parts=parts)

    @property
    def eos_token_ids(self) -> set[int]:
        """Token ids that end a request as EOS: config.json, generation_config.json and the
        tokenizer's EOS (settable, e.g. to teach what an EOS does)."""
        return self.scheduler.eos_token_ids

    @eos_token_ids.setter
    def eos_token_ids(self, ids) -> None:
        self.scheduler.eos_token_ids = set(ids)

    def clear_trace(self) -> None:
        """Forget past events (the requests and the cache are untouched)."""
        with self._lock:
            self.trace.clear()

    def prepare_prompt(self, prompt: str | None = None, *, messages=None,
                       prompt_token_ids: Sequence[int] | None = None) -> list[int]:
        """The token ids a request would run, checked as ``add_request`` checks them (ids in
        the vocabulary, shorter than ``max_model_len``, within the KV budget), *without* the
        engine's lock. Tokenising a long prompt, or laying out a chat by its template, takes
        time; done here, in the caller's thread, it delays no other request's step (the server
        calls this from a worker thread, then adds the request by its ids). Give exactly one
        of ``prompt``, ``messages`` (a conversation) and ``prompt_token_ids``; bad input
        raises ``ValueError`` naming it."""
        return checks.prepare_ids(self.tokenizer, prompt, messages, prompt_token_ids, self.model_config.vocab_size,
                                  self.max_model_len, self.kv_cache.num_blocks, self.kv_cache.block_size)

    def warmup(self) -> int:
        """With ``compile=True`` or ``decode_graphs``: compile (capture) now, not in the first
        steps (call it before adding requests; ``minillm.fast.compiled.warm_up``,
        ``minillm.fast.decode_graphs.warm_up``). Returns the graphs made (0: eager)."""
        from .fast.compiled import warm_up
        from .fast.decode_graphs import warm_up as make_decode_graphs

        with self._lock:
            return warm_up(self) + make_decode_graphs(self)

    # --- whole generations (``minillm.generation``) ---------------------------------------
    def generate(self, prompts: str | Sequence[str], params: SamplingParams | Sequence[SamplingParams] | None = None,
                 ) -> list[RequestOutput]:
        """Run prompts to completion together (continuous batching); outputs in prompt order.
        Safe from several threads at once: each call waits only for its own requests."""
        return generation.generate(self, prompts, params)

    def chat(self, messages, params: SamplingParams | Sequence[SamplingParams] | None = None,
             ) -> list[RequestOutput]:
        """Answer one conversation (a list of ``{"role", "content"}`` dicts) or a list of them,
        laid out by the tokenizer's chat template (one BOS, never two); one output each."""
        return generation.chat(self, messages, params)

    def stream(self, prompt: str, params: SamplingParams | None = None):
        """Yield text pieces as they are sampled. Closing the iterator early (``break``)
        cancels the request in the engine, so its KV blocks are freed at once."""
        return generation.stream(self, prompt, params)

    def has_unfinished(self) -> bool:
        with self._lock:
            return self.scheduler.has_work()

    def output(self, request_id: str) -> RequestOutput:
        with self._lock:
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
    def cache_stats(self):
        """Total / used / free blocks, block size, bytes per token, used and total bytes."""
        with self._lock:
            return self.kv_cache.stats()

    def blocks_held(self) -> dict[str, int]:
        """Request id -> number of KV blocks it holds (live or finished-but-not-released)."""
        with self._lock:
            return self.scheduler.blocks_held()

    def metrics(self, request_id: str) -> dict:
        """Queue time, TTFT, TPOT, end-to-end time of one request, from its own timestamps."""
        with self._lock:
            return tracemod.metrics_of(self.get_request(request_id))

    def summary(self) -> dict:
        with self._lock:
            return tracemod.summary(list(self.trace))

    def export_chrome_trace(self, path=None) -> dict:
        with self._lock:
            return tracemod.to_chrome_trace(list(self.trace), path)

    def next_token_logits(self, prompt: str | Sequence[int]) -> torch.Tensor:
        """Raw logits for the token after ``prompt`` (no request, no cache): for the
        sampling lessons, which look at one distribution many ways."""
        with self._lock:
            if isinstance(prompt, str):
                ids = self.prepare_prompt(prompt)
            else:  # checked like a request's ids: ints in the vocabulary, shorter than max_model_len
                ids = self.prepare_prompt(prompt_token_ids=prompt)
            return self.model.full_logits(ids)[-1]

    def __repr__(self) -> str:
        s = self.cache_stats()
        return (f"LLM({self.model_config.architecture} from {self.model_path.name}, device={self.device}, "
                f"dtype={str(self.dtype).replace('torch.', '')}, kv_blocks={s.total_blocks}x{s.block_size})")
