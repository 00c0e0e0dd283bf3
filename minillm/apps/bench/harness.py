"""What every benchmark shares: the two engines on one checkpoint, timing, token identity.

Both engines load the same folder with the same dtype on the same device, in the same
process. Every comparison first checks that the greedy tokens are identical, then times the
two alternately (A B, B A, A B, ...) so slow drifts of a shared machine hit both alike.
"""

from __future__ import annotations

import gc
import os
import platform
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch


class TokenMismatch(AssertionError):
    """Greedy outputs of minillm and the baseline differ: timing them would compare different work."""


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def summarize(xs: list[float]) -> dict:
    """Median, min, max and the raw values of a list of measurements."""
    xs = [float(x) for x in xs]
    return {"median": median(xs), "min": min(xs) if xs else None, "max": max(xs) if xs else None,
            "runs": xs}


def check_identical(what: str, got: list[list[int]], ref: list[list[int]], strict: bool = True) -> dict:
    """Compare minillm's tokens with the baseline's, request by request. Raises TokenMismatch
    (naming the first differing request and position) unless ``strict`` is False."""
    if len(got) != len(ref):
        raise TokenMismatch(f"{what}: {len(got)} outputs vs {len(ref)} reference outputs")
    mismatches = []
    for i, (a, b) in enumerate(zip(got, ref)):
        if a != b:
            pos = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            mismatches.append({"request": i, "position": pos, "len": len(a), "ref_len": len(b)})
    result = {"what": what, "requests": len(got), "tokens": sum(len(r) for r in ref),
              "identical": not mismatches, "mismatches": mismatches[:10]}
    if mismatches and strict:
        m = mismatches[0]
        raise TokenMismatch(f"{what}: greedy tokens differ in {len(mismatches)} of {len(got)} requests "
                            f"(first: request {m['request']} at output position {m['position']})")
    return result


def random_prompts(tokenizer, vocab_size: int, lengths: list[int], seed: int) -> list[list[int]]:
    """Prompts as exact token ids, drawn uniformly from the vocabulary minus special tokens."""
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    rng = random.Random(seed)
    ok = [t for t in range(vocab_size) if t not in special]
    return [[rng.choice(ok) for _ in range(n)] for n in lengths]


# --- the two engines ---------------------------------------------------------------------------
@dataclass
class Engines:
    llm: object          # minillm.LLM
    hf: object           # transformers model
    device: torch.device
    dtype: torch.dtype
    pad_id: int

    @property
    def vocab_size(self) -> int:
        return self.llm.model_config.vocab_size


def load_engines(path: str | Path, device: str, dtype: str = "auto", kv_cache_tokens: int | None = None,
                 max_num_seqs: int = 64, scheduling: str = "continuous", num_threads: int | None = None,
                 decode_graphs: bool = False, attention_backend: str = "auto") -> Engines:
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from minillm import LLM

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    # the engine sets torch's (process-wide) thread count: the baseline then runs with the same
    llm = make_llm(path, device, dtype, kv_cache_tokens, max_num_seqs, scheduling, num_threads=num_threads,
                   decode_graphs=decode_graphs, attention_backend=attention_backend)
    if decode_graphs:  # compile / capture now: no timed round (the check runs count as one) pays for it
        llm.warmup()
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=llm.dtype, attn_implementation="sdpa")
    hf = hf.to(llm.device).eval()
    # generate() fills unset fields of the config it is given from the checkpoint's
    # generation_config.json: clear EOS there too, or it would stop at the first EOS
    hf.generation_config.eos_token_id = None
    tok = llm.tokenizer
    pad = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    assert isinstance(llm, LLM)
    return Engines(llm=llm, hf=hf, device=llm.device, dtype=llm.dtype, pad_id=int(pad))


def make_llm(path, device, dtype="auto", kv_cache_tokens=None, max_num_seqs=64, scheduling="continuous",
             llm_class=None, num_threads=None, decode_graphs=False, attention_backend="auto"):
    """A minillm engine for benchmarking: prefix caching off (the baseline has none, and
    repeated runs of one prompt would otherwise hit the cache), KV budget as given."""
    from minillm import LLM

    return (llm_class or LLM)(str(path), device=device, dtype=dtype, kv_cache_tokens=kv_cache_tokens,
               max_num_seqs=max_num_seqs, enable_prefix_caching=False, scheduling=scheduling,
               num_threads=num_threads, decode_graphs=decode_graphs, attention_backend=attention_backend)


def forget_finished(llm) -> None:
    """Drop released requests and the trace between runs, so a long benchmark does not make
    the engine's bookkeeping grow from run to run."""
    for rid in [r for r, req in llm.requests.items() if req.state.value == "RELEASED"]:
        del llm.requests[rid]
    llm.clear_trace()


# --- minillm runs ------------------------------------------------------------------------------
def _sampling_params(llm):
    """The SamplingParams class of the package ``llm`` comes from (the before/after script
    runs an older copy of minillm under another package name)."""
    import importlib

    return importlib.import_module(type(llm).__module__.split(".")[0]).SamplingParams


def minillm_run(llm, prompts: list[list[int]], max_tokens: list[int],
                collect: bool = True) -> tuple[float, list[list[int]], list[float]]:
    """Queue every request at once, step until all are done. Returns (seconds, tokens per
    request, time of each step's end relative to the start). ``collect``: a ``gc.collect()``
    first, outside the timed part (a caller timing CPU around this call collects before it)."""
    SamplingParams = _sampling_params(llm)
    if collect:
        gc.collect()
    sync(llm.device)
    t0 = time.perf_counter()
    reqs = [llm.add_request(prompt_token_ids=p, params=SamplingParams(max_tokens=n, temperature=0.0,
                                                                      ignore_eos=True))
            for p, n in zip(prompts, max_tokens)]
    marks = []
    while llm.has_unfinished():
        llm.step()
        sync(llm.device)  # a step without a sampled token (a prefill chunk) returns before its kernels end
        marks.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - t0
    out = [list(r.output_token_ids) for r in reqs]
    forget_finished(llm)
    return elapsed, out, marks


def minillm_latency(llm, prompt: list[int], new_tokens: int,
                    collect: bool = True) -> tuple[float, float, list[int]]:
    """Batch-1 latency: (TTFT, TPOT, tokens). TTFT runs from add_request to the end of the
    step that produced the first token; TPOT is the mean gap between later tokens."""
    elapsed, out, marks = minillm_run(llm, [prompt], [new_tokens], collect)
    ttft = marks[0]
    tpot = (marks[-1] - marks[0]) / (len(marks) - 1) if len(marks) > 1 else None
    return ttft, tpot, out[0]


# --- transformers runs -------------------------------------------------------------------------
def _gen_config(eng: Engines, max_new_tokens: int):
    from transformers import GenerationConfig

    # greedy, no stopping on EOS (= minillm's ignore_eos: EOS may be *chosen*, it just does not
    # stop the request; min_new_tokens would instead forbid EOS and change the argmax)
    return GenerationConfig(do_sample=False, max_new_tokens=max_new_tokens, min_new_tokens=None,
                            eos_token_id=None, pad_token_id=eng.pad_id, use_cache=True,
                            num_beams=1, temperature=None, top_k=None, top_p=None)


class _TimingStreamer:
    """A generate() streamer that only notes when each put() happens: the first put is the
    prompt, every later one a new token."""

    def __init__(self, device):
        self.device = device
        self.times: list[float] = []

    def put(self, value):
        sync(self.device)  # the token is produced when the device is done, not when queued
        self.times.append(time.perf_counter())

    def end(self):
        pass


def hf_generate(eng: Engines, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """One static batch through ``generate()``: left padding, attention mask, greedy."""
    n = len(prompts)
    width = max(len(p) for p in prompts)
    ids = torch.full((n, width), eng.pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p, dtype=torch.long)
        mask[i, width - len(p):] = 1
    with torch.inference_mode():
        out = eng.hf.generate(input_ids=ids.to(eng.device), attention_mask=mask.to(eng.device),
                              generation_config=_gen_config(eng, max_new_tokens))
    got = out[:, width:].tolist()
    if any(len(g) != max_new_tokens for g in got):
        raise RuntimeError(f"generate() returned {sorted({len(g) for g in got})} new tokens, not {max_new_tokens}")
    return got


def hf_static_run(eng: Engines, prompts: list[list[int]], max_tokens: list[int],
                  batch_size: int) -> tuple[float, list[list[int]]]:
    """Requests in arrival order, ``batch_size`` at a time; each batch runs until its longest
    request is done. Returns (seconds, each request's wanted tokens)."""
    gc.collect()
    sync(eng.device)
    t0 = time.perf_counter()
    outs: list[list[int]] = []
    for i in range(0, len(prompts), batch_size):
        chunk, want = prompts[i:i + batch_size], max_tokens[i:i + batch_size]
        got = hf_generate(eng, chunk, max(want))
        outs.extend(g[:w] for g, w in zip(got, want))
    sync(eng.device)
    return time.perf_counter() - t0, outs


def hf_latency(eng: Engines, prompt: list[int], new_tokens: int) -> tuple[float, float, list[int]]:
    """Batch-1 latency of generate(): (TTFT, TPOT, tokens), timed by a streamer."""
    gc.collect()
    sync(eng.device)
    streamer = _TimingStreamer(eng.device)
    ids = torch.tensor([prompt], dtype=torch.long, device=eng.device)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = eng.hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                              generation_config=_gen_config(eng, new_tokens), streamer=streamer)
    toks = streamer.times[1:]
    if out.shape[1] - len(prompt) != new_tokens or len(toks) != new_tokens:
        raise RuntimeError(f"generate() returned {out.shape[1] - len(prompt)} new tokens, not {new_tokens}")
    ttft = toks[0] - t0
    tpot = (toks[-1] - toks[0]) / (len(toks) - 1) if len(toks) > 1 else None
    return ttft, tpot, out[0, len(prompt):].tolist()


# --- the machine -------------------------------------------------------------------------------
def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cpu_features() -> list[str]:
    """The vector extensions that matter for float32 / bfloat16 matmuls on x86."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                return [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16") if f in flags]
    except OSError:
        pass
    return []


def _mem_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                return round(int(line.split()[1]) / 2**20, 1)
    except OSError:
        pass
    return None


def machine_info(device: torch.device) -> dict:
    import transformers

    info = {
        "cpu": _cpu_name(), "cpu_features": _cpu_features(), "logical_cpus": os.cpu_count(),
        "memory_gib": _mem_gib(),
        "torch_threads": torch.get_num_threads(), "platform": platform.platform(),
        "python": sys.version.split()[0], "torch": torch.__version__, "transformers": transformers.__version__,
        "device": str(device), "load_average_start": _loadavg(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def read_bandwidth(threads: int, nbytes: int = 256 << 20, repeats: int = 5) -> float:
    """GB/s of float32 reads from memory at ``threads`` threads, the best of ``repeats`` rounds
    of two probes: torch's ``sum`` over ``nbytes`` and ``minillm.fast.gemv.read_probe`` (4
    far-apart streams per thread, the buffer split between the threads). That is the floor a
    batch-1 decode step cannot beat, since it reads every weight once; the faster probe counts,
    so that the floor is what the core can read, not what one stream gets. The buffer is in 2 MB
    pages where the system allows, as the fast layer's weights are (``minillm.fast.huge_pages``):
    on 4 KB pages a Zen 4 core read ~20 % less, and a floor from there would flatter the engine.
    It holds random values, as weights do, made once per size. Measured in the same run as the
    engines, because a shared core's bandwidth moves with its neighbours' load (on the Zen 4 share
    two threads read 32-34 GB/s most minutes and ~60 in a few)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        x = _probe_buffer(nbytes)
        x.sum()  # touch the pages once
        probes = [x.sum]
        probe = _stream_probe(x, threads)
        if probe is not None:
            probes.append(probe)
        best = float("inf")
        for _ in range(repeats):
            for fn in probes:
                t0 = time.perf_counter()
                fn()
                best = min(best, time.perf_counter() - t0)
        return nbytes / best / 1e9
    finally:
        torch.set_num_threads(before)


_PROBE_BUFFERS: dict = {}  # nbytes -> the read probe's buffer (random values; made once: filling it takes ~0.3 s)


def _probe_buffer(nbytes: int) -> torch.Tensor:
    """``nbytes`` of float32 random values in 2 MB pages where the system allows, made once."""
    from minillm.fast import huge_pages

    if nbytes not in _PROBE_BUFFERS:
        x = huge_pages.zeros((nbytes // 4,), torch.float32, "cpu")
        _PROBE_BUFFERS[nbytes] = x.uniform_(generator=torch.Generator().manual_seed(0))
    return _PROBE_BUFFERS[nbytes]


_PROBE_POOLS: dict = {}  # threads -> the executor the probe runs on (kept: bandwidth is probed often)


def _stream_probe(x: torch.Tensor, threads: int):
    """A callable reading ``x`` with the gemv kernel's probe on ``threads`` threads (None where the
    kernel does not build here)."""
    from concurrent.futures import ThreadPoolExecutor

    from minillm.fast import gemv

    if not gemv.available():
        return None
    parts = x.chunk(threads)
    if threads == 1:
        return lambda: gemv.read_probe(x)
    pool = _PROBE_POOLS.setdefault(threads, ThreadPoolExecutor(threads, thread_name_prefix="read-probe"))

    def run():
        list(pool.map(gemv.read_probe, parts))
    run()  # start the pool's threads outside the timed rounds
    return run


def bandwidth_by_threads(threads_list) -> dict[str, float]:
    """{"1": GB/s, "2": GB/s, ...}: ``read_bandwidth`` at each thread count, rounded."""
    return {str(t): round(read_bandwidth(t), 2) for t in threads_list}


class CpuClock:
    """Wall and CPU seconds of a block: ``time.process_time`` counts every thread of this
    process (torch's, CTranslate2's and llama.cpp's pools alike), so CPU time beside wall time
    shows what a second thread costs and whether a shared machine starved the run."""

    def __enter__(self):
        self.wall0, self.cpu0 = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall = time.perf_counter() - self.wall0
        self.cpu = time.process_time() - self.cpu0
        return False


def _loadavg():
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None
