"""LLM: the engine's front door. Add requests, step the engine, cancel, read the trace.

``step()`` is one scheduler iteration: schedule (admit, preempt), one forward pass over every
scheduled request, sample one token each, check stop conditions, finish and release. Each
state change is an ``Event`` in ``llm.trace``; ``step()`` returns the events it produced.
"""

from __future__ import annotations

import itertools
import random
import time
from typing import Iterator, Sequence

import torch

from . import trace as tracemod
from .kv_cache import KVCache
from .models import load_config, load_model, load_tokenizer, resolve_model_dir
from .params import SamplingParams
from .request import Request, RequestOutput, RequestState, StopReason
from .runner import ModelRunner
from .sampler import Sampler, make_generator
from .scheduler import Scheduler
from .stopping import check_stop, find_stop_string
from .trace import Event

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "float16": torch.float16,
           "fp16": torch.float16, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
CPU_KV_BUDGET_BYTES = 256 << 20


def pick_device(device: str | torch.device) -> torch.device:
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, str):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device='cuda' was asked for but no CUDA device is available; use device='cpu'")
    return dev


def pick_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in _DTYPES:
        raise ValueError(f"dtype must be 'auto' or one of {sorted(_DTYPES)}, got {dtype!r}")
    return _DTYPES[dtype]


def _positive_int(name: str, value, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


class LLM:
    """A small, complete inference engine over a Llama / Qwen2 / Qwen3 checkpoint.

    Args:
        model: a local Hugging Face folder; None loads the model shipped in the package.
        device: "auto" (CUDA when available, else CPU), "cpu", "cuda", "cuda:N".
        dtype: "auto" (bfloat16 on CUDA, float32 on CPU), "float32", "bfloat16", "float16".
        block_size: tokens per KV block.
        num_kv_blocks / kv_cache_tokens: the KV budget, in blocks or in tokens (give one).
            Default: room for ``max_num_seqs`` full contexts, capped at 256 MiB on CPU and at
            half the free memory on CUDA.
        max_num_seqs: most requests running at once (batch slots).
        max_num_batched_tokens: token budget of one step (prefill tokens + one per decode).
        max_model_len: longest context (prompt + output); default the model's maximum.
        enable_prefix_caching: share full KV blocks between prompts that start alike.
        scheduling: "continuous" (default) or "static" (a new batch only when all finished).
        seed: seeds the generators of requests that give no seed of their own.
    """

    def __init__(self, model: str | None = None, device: str = "auto", dtype: str = "auto", *,
                 block_size: int = 16, num_kv_blocks: int | None = None,
                 kv_cache_tokens: int | None = None, max_num_seqs: int = 64,
                 max_num_batched_tokens: int = 4096, max_model_len: int | None = None,
                 enable_prefix_caching: bool = True, scheduling: str = "continuous",
                 seed: int = 0):
        self.device = pick_device(device)
        self.dtype = pick_dtype(dtype, self.device)
        _positive_int("block_size", block_size)
        _positive_int("max_num_seqs", max_num_seqs)
        _positive_int("max_num_batched_tokens", max_num_batched_tokens)
        if num_kv_blocks is not None and kv_cache_tokens is not None:
            raise ValueError("give the KV budget as num_kv_blocks or kv_cache_tokens, not both")
        self.model_path = resolve_model_dir(model)
        self.model_config = load_config(self.model_path)
        limit = self.model_config.max_position_embeddings
        if max_model_len is None:
            max_model_len = limit
        _positive_int("max_model_len", max_model_len, minimum=2)
        if max_model_len > limit:
            raise ValueError(f"max_model_len must be <= the model's max_position_embeddings ({limit}), "
                             f"got {max_model_len}")
        self.max_model_len = max_model_len
        self.tokenizer = load_tokenizer(self.model_path)
        self.model = load_model(self.model_path, self.model_config, self.dtype, self.device, max_model_len)

        cfg = self.model_config
        elem = torch.empty((), dtype=self.dtype).element_size()
        bytes_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * elem
        if kv_cache_tokens is not None:
            _positive_int("kv_cache_tokens", kv_cache_tokens)
            num_kv_blocks = -(-kv_cache_tokens // block_size)
        elif num_kv_blocks is None:
            if self.device.type == "cuda":
                budget = torch.cuda.mem_get_info(self.device)[0] // 2
            else:
                budget = CPU_KV_BUDGET_BYTES
            want = max_num_seqs * max_model_len
            tokens = min(want, budget // bytes_per_token)
            num_kv_blocks = max(-(-tokens // block_size), 1)
        _positive_int("num_kv_blocks", num_kv_blocks)
        self.kv_cache = KVCache(cfg.num_hidden_layers, num_kv_blocks, block_size, cfg.num_key_value_heads,
                                cfg.head_dim, self.dtype, self.device, enable_prefix_caching)
        self.runner = ModelRunner(self.model, self.kv_cache, self.device)
        self.sampler = Sampler()
        self.scheduler = Scheduler(self.kv_cache, max_num_seqs, max_num_batched_tokens, scheduling,
                                   self._transition)
        eos = set(cfg.eos_token_ids)
        if self.tokenizer.eos_token_id is not None:
            eos.add(self.tokenizer.eos_token_id)
        self.eos_token_ids = eos
        self.requests: dict[str, Request] = {}
        self.trace: list[Event] = []
        self.step_count = 0
        self._ids = itertools.count()
        self._seed_rng = random.Random(seed)

    # --- events ------------------------------------------------------------------------
    def _emit(self, request_id, kind, **data) -> None:
        self.trace.append(Event(self.step_count, time.monotonic(), request_id, kind, data))

    def _transition(self, req: Request, new_state: RequestState, **data) -> None:
        old = req.move_to(new_state)
        self._emit(req.request_id, "transition", **{"from": old.value, "to": new_state.value}, **data)

    def clear_trace(self) -> None:
        """Forget past events (the requests and the cache are untouched)."""
        self.trace.clear()

    # --- adding requests ----------------------------------------------------------------
    def new_request(self, prompt: str | None = None, params: SamplingParams | None = None, *,
                    prompt_token_ids: Sequence[int] | None = None, request_id: str | None = None,
                    auto_release: bool = True) -> Request:
        """Validate and register a request in state NEW (not tokenized, not queued yet)."""
        params = SamplingParams() if params is None else params
        if not isinstance(params, SamplingParams):
            raise ValueError(f"params must be a SamplingParams, got {type(params).__name__}")
        if prompt_token_ids is None:
            if not isinstance(prompt, str) or not prompt:
                raise ValueError(f"prompt must be a non-empty string, got {prompt!r}")
        else:
            vocab = self.model_config.vocab_size
            ids = list(prompt_token_ids)
            if not ids or not all(isinstance(t, int) and 0 <= t < vocab for t in ids):
                raise ValueError(f"prompt_token_ids must be a non-empty list of ints in [0, {vocab})")
        if request_id is None:
            request_id = str(next(self._ids))
            while request_id in self.requests:
                request_id = str(next(self._ids))
        elif not isinstance(request_id, str) or request_id in self.requests:
            raise ValueError(f"request_id must be a new string, got {request_id!r}")
        seed = params.seed if params.seed is not None else self._seed_rng.getrandbits(63)
        req = Request(request_id=request_id, prompt=prompt, params=params, auto_release=auto_release)
        if prompt_token_ids is not None:
            req.prompt_token_ids = list(prompt_token_ids)
        req._generator = make_generator(seed, self.device)
        self.requests[request_id] = req
        self._emit(request_id, "transition", **{"from": None, "to": RequestState.NEW.value})
        return req

    def enqueue(self, req: Request) -> Request:
        """Tokenize (NEW -> WAITING) and queue for the scheduler. Rejects a prompt that can
        never run: longer than max_model_len allows, or larger than the whole KV budget."""
        if not req.prompt_token_ids:
            req.prompt_token_ids = self.tokenizer.encode(req.prompt)
        n = len(req.prompt_token_ids)
        problem = None
        if n >= self.max_model_len:
            problem = (f"prompt has {n} tokens but max_model_len is {self.max_model_len}: shorten the "
                       f"prompt to at most {self.max_model_len - 1} tokens")
        elif self.kv_cache.allocator.blocks_needed(n + 1) > self.kv_cache.num_blocks:
            cap = self.kv_cache.num_blocks * self.kv_cache.block_size
            problem = (f"prompt has {n} tokens but the whole KV budget holds {cap} tokens: shorten the "
                       f"prompt or raise num_kv_blocks / kv_cache_tokens")
        if problem:
            del self.requests[req.request_id]
            raise ValueError(problem)
        req.arrival_time = time.monotonic()
        self._transition(req, RequestState.WAITING, prompt_tokens=n)
        self.scheduler.add(req)
        return req

    def add_request(self, prompt: str | None = None, params: SamplingParams | None = None, *,
                    prompt_token_ids: Sequence[int] | None = None, request_id: str | None = None,
                    auto_release: bool = True) -> Request:
        """Create, tokenize and queue a request (NEW -> WAITING). With ``auto_release=False``
        a finished request keeps its blocks until ``release(request_id)``."""
        req = self.new_request(prompt, params, prompt_token_ids=prompt_token_ids,
                               request_id=request_id, auto_release=auto_release)
        return self.enqueue(req)

    # --- one engine iteration ------------------------------------------------------------
    def step(self) -> list[Event]:
        """Schedule, run one forward pass, sample, stop, release. Returns this step's events."""
        self.step_count += 1
        first_event = len(self.trace)
        t0 = time.monotonic()
        batch = self.scheduler.schedule()
        for req in batch.context_full:
            self._finish(req, StopReason.CONTEXT_FULL)
        num_new = sum(r.num_tokens - r.num_computed_tokens for r in batch.prefills) + len(batch.decodes)
        if batch:
            now = time.monotonic()
            for req in batch.prefills:
                if req.first_scheduled_time is None:
                    req.first_scheduled_time = now
            logits = self.runner.run(batch.decodes, batch.prefills)
            reqs = batch.requests
            token_ids, raw_logits = self.sampler(logits, reqs)
            logprobs = raw_logits.log_softmax(-1) if any(r.params.logprobs is not None for r in reqs) else None
            for i, (req, token) in enumerate(zip(reqs, token_ids)):
                self._append_token(req, token, None if logprobs is None else logprobs[i])
        if batch or batch.preempted or batch.context_full:
            stats = self.kv_cache.stats()
            self._emit(None, "step", num_prefill=len(batch.prefills), num_decode=len(batch.decodes),
                       num_tokens=num_new, num_preempted=len(batch.preempted),
                       duration=time.monotonic() - t0, used_blocks=stats.used_blocks,
                       total_blocks=stats.total_blocks, block_size=stats.block_size,
                       bytes_per_token=stats.bytes_per_token, kv_blocks=self.blocks_held())
        return self.trace[first_event:]

    def _append_token(self, req: Request, token: int, logprobs: torch.Tensor | None) -> None:
        before, req.num_computed_tokens = req.num_computed_tokens, req.num_tokens
        bs = self.kv_cache.block_size
        if req.num_computed_tokens // bs > before // bs:  # a block just filled up: index it
            self.kv_cache.allocator.commit_full_blocks(req.block_table, req.all_token_ids, req.num_computed_tokens)
        req.output_token_ids.append(token)
        now = time.monotonic()
        data = {"token_id": token, "index": len(req.output_token_ids) - 1}
        if logprobs is not None:
            n = req.params.logprobs
            top = torch.topk(logprobs, min(max(n, 1), logprobs.shape[-1])) if n else None
            entry = {"token_id": token, "logprob": float(logprobs[token]),
                     "top": [] if top is None else [(int(t), float(lp)) for lp, t in zip(*top)]}
            req.logprobs.append(entry)
            data["logprob"], data["top"] = entry["logprob"], entry["top"]
        self._emit(req.request_id, "token", **data)
        if req.first_token_time is None:
            req.first_token_time = now
        if req.state == RequestState.PREFILL:
            self._transition(req, RequestState.DECODE)
        stop_found = self._update_text(req)
        reason = check_stop(token, len(req.output_token_ids), req.num_tokens, req.params,
                            self.eos_token_ids, self.max_model_len, stop_found)
        if reason is not None:
            self.scheduler.dequeue(req)
            self._finish(req, reason)

    def _update_text(self, req: Request) -> bool:
        """Incremental detokenisation: decode a short window so a word split over tokens (or a
        multi-byte character) only appears once complete. Returns True when a stop string
        appeared; the text is then cut where the stop string starts."""
        ids = req.output_token_ids
        skip = req.params.skip_special_tokens
        cached = self.__dict__.get("_decode_ids")
        decode = cached[1] if cached is not None and cached[0] is self.tokenizer else self._make_decode_ids()
        prefix = decode(ids[req._prefix_offset:req._read_offset], skip)
        full = decode(ids[req._prefix_offset:], skip)
        if len(full) <= len(prefix) or full.endswith("\ufffd"):
            return False
        old_len = len(req.text)
        req.text += full[len(prefix):]
        req._prefix_offset, req._read_offset = req._read_offset, len(ids)
        stops = req.params.stop_strings
        if stops:
            longest = max(len(s) for s in stops)
            at = find_stop_string(req.text, stops, old_len - longest + 1)
            if at != -1:
                req.text = req.text[:at]
                return True
        return False

    def _make_decode_ids(self):
        """``tokenizer.decode`` for the per-token detokenisation, straight to the Rust
        ``tokenizers`` backend when that gives the same text (a plain fast tokenizer with no
        space clean-up): the transformers wrapper costs several times the decode itself."""
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        tok = self.tokenizer
        cls = type(tok)
        plain = (isinstance(tok, TokenizersBackend) and cls.decode is TokenizersBackend.decode
                 and cls._decode is TokenizersBackend._decode and not tok.clean_up_tokenization_spaces)
        if plain:
            backend = tok.backend_tokenizer
            fn = lambda ids, skip: backend.decode(ids, skip_special_tokens=skip)  # noqa: E731
        else:
            fn = lambda ids, skip: tok.decode(ids, skip_special_tokens=skip)  # noqa: E731
        self._decode_ids = (tok, fn)
        return fn

    def _finish(self, req: Request, reason: StopReason) -> None:
        req.stop_reason = reason
        req.finished_time = time.monotonic()
        self._transition(req, RequestState.FINISHED, stop_reason=reason.value)
        if req.auto_release:
            self.release(req.request_id)

    # --- finishing from outside ----------------------------------------------------------
    def release(self, request_id: str) -> Request:
        """FINISHED -> RELEASED: give the request's blocks back to the pool and record its stats."""
        req = self.get_request(request_id)
        if req.state == RequestState.RELEASED:
            return req
        if req.state != RequestState.FINISHED:
            raise ValueError(f"request {request_id!r} is {req.state.value}; only a FINISHED request "
                             f"can be released (cancel it first)")
        freed = self.scheduler.remove(req)
        req.released_time = time.monotonic()
        self._transition(req, RequestState.RELEASED, blocks=freed)
        return req

    def cancel(self, request_id: str) -> Request:
        """Stop a request wherever it is: when this returns it is RELEASED and holds no block.
        A FINISHED request keeps its stop reason and is released; a RELEASED one is left as is."""
        req = self.get_request(request_id)
        if req.is_live:
            self.scheduler.dequeue(req)
            self._finish(req, StopReason.CANCELLED)
        if req.state == RequestState.FINISHED:
            self.release(request_id)
        return req

    def get_request(self, request_id: str) -> Request:
        try:
            return self.requests[request_id]
        except (KeyError, TypeError):
            raise KeyError(f"unknown request_id {request_id!r}") from None

    # --- whole generations ---------------------------------------------------------------
    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    def generate(self, prompts: str | Sequence[str], params: SamplingParams | Sequence[SamplingParams] | None = None,
                 ) -> list[RequestOutput]:
        """Run prompts to completion together (continuous batching); outputs in prompt order."""
        if isinstance(prompts, str):
            prompts = [prompts]
        prompts = list(prompts)
        if not prompts:
            raise ValueError("prompts must contain at least one prompt")
        if params is None or isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        elif len(params) != len(prompts):
            raise ValueError(f"params must be one SamplingParams or one per prompt ({len(prompts)}), got {len(params)}")
        for p in prompts:  # validate every prompt before queueing any, so nothing is half-added
            if not isinstance(p, str) or not p:
                raise ValueError(f"prompt must be a non-empty string, got {p!r}")
        reqs = []
        try:
            for p, sp in zip(prompts, params):
                reqs.append(self.add_request(p, sp))
            while any(r.is_live for r in reqs):
                if not self.step() and not self.scheduler.running:
                    self._raise_stalled()
        except BaseException:
            for r in reqs:
                self.cancel(r.request_id)
            raise
        return [self.output(r.request_id) for r in reqs]

    def _raise_stalled(self) -> None:
        held = [r.request_id for r in self.requests.values() if r.state == RequestState.FINISHED and r.block_table]
        raise RuntimeError(
            f"the engine cannot make progress: {len(self.scheduler.waiting)} waiting request(s) need KV "
            f"blocks held by FINISHED requests that were never released ({', '.join(held) or 'none'}); "
            f"call llm.release(request_id) for them")

    def stream(self, prompt: str, params: SamplingParams | None = None) -> Iterator[str]:
        """Yield text pieces as they are sampled. Closing the iterator early (``break``)
        cancels the request in the engine, so its KV blocks are freed at once."""
        req = self.add_request(prompt, params)
        sent = 0
        hold = max((len(s) for s in req.params.stop_strings), default=1) - 1
        try:
            while req.is_live:
                if not self.step() and not self.scheduler.running:
                    self._raise_stalled()
                safe = len(req.text) if not req.is_live else len(req.text) - hold
                if safe > sent:
                    yield req.text[sent:safe]
                    sent = safe
            if len(req.text) > sent:
                yield req.text[sent:]
        finally:
            if req.is_live:
                self.cancel(req.request_id)

    def output(self, request_id: str) -> RequestOutput:
        req = self.get_request(request_id)
        if not req.is_finished:
            raise ValueError(f"request {request_id!r} is still {req.state.value}")
        return RequestOutput(request_id=req.request_id, prompt=req.prompt,
                             prompt_token_ids=list(req.prompt_token_ids), text=req.text,
                             token_ids=list(req.output_token_ids), stop_reason=req.stop_reason,
                             logprobs=list(req.logprobs), metrics=self.metrics(request_id))

    # --- looking inside ------------------------------------------------------------------
    def cache_stats(self):
        """Total / used / free blocks, block size, bytes per token, used and total bytes."""
        return self.kv_cache.stats()

    def blocks_held(self) -> dict[str, int]:
        """Request id -> number of KV blocks it holds (live or finished-but-not-released)."""
        return {r.request_id: len(r.block_table) for r in self.requests.values() if r.block_table}

    def metrics(self, request_id: str) -> dict:
        return tracemod.request_metrics(self.trace, request_id)

    def summary(self) -> dict:
        return tracemod.summary(self.trace)

    def export_chrome_trace(self, path=None) -> dict:
        return tracemod.to_chrome_trace(self.trace, path)

    def next_token_logits(self, prompt: str | Sequence[int]) -> torch.Tensor:
        """Raw logits for the token after ``prompt`` (no request, no cache): for the
        sampling lessons, which look at one distribution many ways."""
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        if not ids:
            raise ValueError("prompt must be a non-empty string or token id list")
        return self.model.full_logits(ids)[-1]

    def __repr__(self) -> str:
        s = self.cache_stats()
        return (f"LLM({self.model_config.architecture} from {self.model_path.name}, device={self.device}, "
                f"dtype={str(self.dtype).replace('torch.', '')}, kv_blocks={s.total_blocks}x{s.block_size})")
