"""The four benchmarks. Each returns a JSON-ready dict; ratios are minillm / baseline of medians.

1. ``latency``: batch-1 TTFT and TPOT, minillm vs ``generate()`` (DynamicCache).
2. ``throughput``: a mixed workload, minillm (continuous batching) vs ``generate()`` at
   several static batch sizes; also 4. minillm's own static scheduling on the same workload.
3. ``kv_cache``: one decode step with the KV cache vs recomputing the whole context.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass

import torch

from .harness import (Engines, check_identical, forget_finished, hf_latency, hf_static_run, make_llm,
                      median, minillm_latency, minillm_run, random_prompts, summarize, sync)


@dataclass
class Settings:
    runs: int = 5                                   # timed rounds (after the check / warm-up run)
    seed: int = 0
    # 1. latency
    prompt_lens: tuple = (16, 128, 512)
    new_tokens: int = 128
    # 2. + 4. throughput
    num_requests: int = 64
    prompt_range: tuple = (16, 256)
    output_range: tuple = (16, 256)
    batch_sizes: tuple = (1, 4, 16, 32, 64)
    small_batch_requests: int = 8                   # generate() at batch sizes < 16 runs only this many
    # 3. KV cache on / off
    kv_points: tuple = (16, 32, 64, 128, 256, 512, 1024)
    kv_decode_steps: int = 8                        # decode steps timed around each point
    quick: bool = False
    strict: bool = True                             # a token mismatch stops the benchmark

    @classmethod
    def quick_settings(cls, runs: int | None = None) -> "Settings":
        return cls(runs=2 if runs is None else runs, prompt_lens=(16, 128), new_tokens=32,
                   num_requests=16, prompt_range=(16, 64), output_range=(16, 64), batch_sizes=(1, 4, 16),
                   small_batch_requests=8, kv_points=(16, 64, 256), kv_decode_steps=4, quick=True)

    def as_dict(self) -> dict:
        return asdict(self)


def _log(msg: str) -> None:
    print(f"  {msg}", flush=True)


# --- 1. batch-1 latency ------------------------------------------------------------------------
def latency(eng: Engines, s: Settings) -> dict:
    llm = eng.llm
    lens = [p for p in s.prompt_lens if p + s.new_tokens <= llm.max_model_len]
    prompts = random_prompts(llm.tokenizer, eng.vocab_size, lens, seed=s.seed + 1)
    out = {"new_tokens": s.new_tokens, "prompts": []}
    for plen, prompt in zip(lens, prompts):
        # the first run of each is the warm-up and the token-identity check
        _, _, mine = minillm_latency(llm, prompt, s.new_tokens)
        _, _, ref = hf_latency(eng, prompt, s.new_tokens)
        check = check_identical(f"latency prompt={plen}", [mine], [ref], s.strict)
        m_ttft, m_tpot, h_ttft, h_tpot = [], [], [], []
        for r in range(s.runs):
            order = ("m", "h") if r % 2 == 0 else ("h", "m")
            for who in order:
                if who == "m":
                    ttft, tpot, toks = minillm_latency(llm, prompt, s.new_tokens)
                    m_ttft.append(ttft), m_tpot.append(tpot)
                else:
                    ttft, tpot, toks = hf_latency(eng, prompt, s.new_tokens)
                    h_ttft.append(ttft), h_tpot.append(tpot)
                if toks != ref:
                    check_identical(f"latency prompt={plen} run {r}", [toks], [ref], s.strict)
        row = {
            "prompt_tokens": plen, "check": check,
            "minillm": {"ttft_s": summarize(m_ttft), "tpot_s": summarize(m_tpot)},
            "transformers": {"ttft_s": summarize(h_ttft), "tpot_s": summarize(h_tpot)},
            "ttft_ratio": median(m_ttft) / median(h_ttft),
            "tpot_ratio": median(m_tpot) / median(h_tpot),
            "tpot_ratio_per_run": summarize([a / b for a, b in zip(m_tpot, h_tpot)]),
        }
        out["prompts"].append(row)
        _log(f"latency p={plen}: TTFT {median(m_ttft) * 1e3:.1f} vs {median(h_ttft) * 1e3:.1f} ms, "
             f"TPOT {median(m_tpot) * 1e3:.2f} vs {median(h_tpot) * 1e3:.2f} ms "
             f"(minillm/transformers {row['tpot_ratio']:.2f})")
    return out


# --- 2. + 4. mixed-workload throughput -----------------------------------------------------------
def make_workload(eng: Engines, s: Settings) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(s.seed + 2)
    plens = [rng.randint(*s.prompt_range) for _ in range(s.num_requests)]
    olens = [rng.randint(*s.output_range) for _ in range(s.num_requests)]
    prompts = random_prompts(eng.llm.tokenizer, eng.vocab_size, plens, seed=s.seed + 3)
    return prompts, olens


def throughput(eng: Engines, s: Settings, static_llm=None) -> dict:
    """minillm (continuous) vs generate() at each static batch size, and minillm static
    scheduling (``static_llm``) on the same requests. Output tokens/s counts only the tokens
    each request asked for."""
    prompts, olens = make_workload(eng, s)
    useful = sum(olens)
    llm = eng.llm
    # warm-up (kernels, allocator) for all engines on a few short requests
    minillm_run(llm, prompts[:4], [4] * 4)
    if static_llm is not None:
        minillm_run(static_llm, prompts[:4], [4] * 4)
    hf_static_run(eng, prompts[:4], [4] * 4, 4)

    secs, ref, _ = minillm_run(llm, prompts, olens)
    checks = [{"what": "minillm continuous", "requests": len(ref), "tokens": useful, "identical": True,
               "mismatches": [], "note": "the reference the others are checked against"}]
    screen = {"minillm_continuous": useful / secs}
    _log(f"throughput: minillm continuous {useful / secs:.0f} tok/s (check run)")
    hf_sizes = {}
    for bs in s.batch_sizes:
        n = len(prompts) if bs >= 16 else min(len(prompts), max(s.small_batch_requests, bs))
        t, got = hf_static_run(eng, prompts[:n], olens[:n], bs)
        checks.append(check_identical(f"generate() batch {bs}", got, ref[:n], s.strict))
        tps = sum(olens[:n]) / t
        hf_sizes[bs] = {"batch_size": bs, "requests": n, "seconds": t, "tokens_per_s": tps}
        _log(f"throughput: generate() batch {bs} on {n} requests: {tps:.0f} tok/s")
    if static_llm is not None:
        t, got = minillm_run(static_llm, prompts, olens)[:2]
        checks.append(check_identical("minillm static", got, ref, s.strict))
        screen["minillm_static"] = useful / t
        _log(f"throughput: minillm static {useful / t:.0f} tok/s (check run)")
    best = max(hf_sizes.values(), key=lambda r: r["tokens_per_s"])
    bbs, bn = best["batch_size"], best["requests"]

    # the check runs (after the warm-up) are round 1; the other rounds alternate the order of
    # the engines from one round to the next
    m_tps, h_tps = [screen["minillm_continuous"]], [best["tokens_per_s"]]
    st_tps = [screen["minillm_static"]] if static_llm is not None else []
    _log(f"throughput round 1/{s.runs}: the check runs")
    for r in range(1, s.runs):
        jobs = ["m", "h"] + (["s"] if static_llm is not None else [])
        k = r % len(jobs)
        for who in jobs[k:] + jobs[:k]:
            if who == "m":
                t, got, _ = minillm_run(llm, prompts, olens)
                m_tps.append(useful / t)
            elif who == "s":
                t, got, _ = minillm_run(static_llm, prompts, olens)
                st_tps.append(useful / t)
            else:
                t, got = hf_static_run(eng, prompts[:bn], olens[:bn], bbs)
                h_tps.append(sum(olens[:bn]) / t)
            if got != ref[:len(got)]:
                check_identical(f"throughput round {r} ({who})", got, ref[:len(got)], s.strict)
        _log(f"throughput round {r + 1}/{s.runs}: minillm {m_tps[-1]:.0f}, generate(bs={bbs}) {h_tps[-1]:.0f}"
             + (f", minillm static {st_tps[-1]:.0f}" if st_tps else "") + " tok/s")
    best["tokens_per_s_rounds"] = summarize(h_tps)
    out = {
        "num_requests": len(prompts), "prompt_lens": [len(p) for p in prompts], "output_lens": olens,
        "useful_output_tokens": useful, "checks": checks,
        "generate_batch_sizes": list(hf_sizes.values()), "generate_best_batch_size": bbs,
        "minillm_continuous_tokens_per_s": summarize(m_tps),
        "generate_best_tokens_per_s": summarize(h_tps),
        "ratio_minillm_vs_generate_best": median(m_tps) / median(h_tps),
        "ratio_per_round": summarize([a / b for a, b in zip(m_tps, h_tps)]),
        "rounds": s.runs, "round_1": "the check runs",
        "kv_cache_tokens": eng.llm.cache_stats().total_blocks * eng.llm.cache_stats().block_size,
        "max_num_seqs": eng.llm.scheduler.max_num_seqs,
        "max_num_batched_tokens": eng.llm.scheduler.max_num_batched_tokens,
    }
    if st_tps:
        out["minillm_static_tokens_per_s"] = summarize(st_tps)
        out["ratio_continuous_vs_static"] = median(m_tps) / median(st_tps)
        out["ratio_continuous_vs_static_per_round"] = summarize([a / b for a, b in zip(m_tps, st_tps)])
    return out


def make_static_llm(eng: Engines, kv_cache_tokens: int):
    llm = eng.llm
    return make_llm(llm.model_path, str(llm.device), llm.dtype, kv_cache_tokens,
                    llm.scheduler.max_num_seqs, scheduling="static", num_threads=llm.num_threads,
                    attention_backend=llm.attention_backend)


# --- 3. KV cache on / off ------------------------------------------------------------------------
def _recompute_last(model, ids: torch.Tensor) -> torch.Tensor:
    """The no-cache decode step: run the whole context again, logits for the last token only."""
    from minillm.models.llama import AttentionBatch, PrefillSeq

    n = ids.shape[0]
    batch = AttentionBatch(positions=torch.arange(n, device=ids.device), slot_mapping=None,
                           prefills=[PrefillSeq(q_start=0, q_len=n, ctx_len=n)])
    with torch.inference_mode():
        return model(ids, batch, None, logits_rows=torch.tensor([n - 1], device=ids.device))[0]


def kv_cache(eng: Engines, s: Settings) -> dict:
    """At each context length L: the engine's decode step (cache on; median of
    ``kv_decode_steps`` steps ending at context L) against recomputing all L tokens (cache
    off), both as one request at batch 1. Checks the recomputed argmax equals the engine's token."""
    from minillm import SamplingParams

    llm = eng.llm
    k = s.kv_decode_steps
    points = sorted({min(p, llm.max_model_len - 1) for p in s.kv_points if p > k})
    seq = random_prompts(llm.tokenizer, eng.vocab_size, [max(points)], seed=s.seed + 4)[0]
    device = llm.device

    def cached(L):
        req = llm.add_request(prompt_token_ids=seq[:L - k],
                              params=SamplingParams(max_tokens=k + 1, temperature=0.0, ignore_eos=True))
        llm.step()  # prefill of L - k tokens
        times = []
        while req.is_live:
            sync(device)
            t0 = time.perf_counter()
            llm.step()
            sync(device)
            times.append(time.perf_counter() - t0)
        out = list(req.output_token_ids)
        forget_finished(llm)
        return median(times), out

    def uncached(ids_t, fn):
        sync(device)
        t0 = time.perf_counter()
        tok = int(fn(ids_t).argmax())
        sync(device)
        return time.perf_counter() - t0, tok

    full_last = lambda ids_t: llm.model.full_logits(ids_t)[-1]  # noqa: E731
    last_only = lambda ids_t: _recompute_last(llm.model, ids_t)  # noqa: E731
    rows = []
    for L in points:
        _, out = cached(L)  # warm-up and the reference tokens
        ids_t = torch.tensor(seq[:L - k] + out[:k], dtype=torch.long, device=device)  # L tokens
        _, tok_a = uncached(ids_t, last_only)
        _, tok_b = uncached(ids_t, full_last)
        check = check_identical(f"kv_cache L={L}", [[tok_a], [tok_b]], [[out[k]], [out[k]]], s.strict)
        c, u, f = [], [], []
        for r in range(s.runs):
            jobs = [("c", None), ("u", last_only), ("f", full_last)]
            j = r % 3
            for who, fn in jobs[j:] + jobs[:j]:
                if who == "c":
                    c.append(cached(L)[0])
                else:
                    (u if who == "u" else f).append(uncached(ids_t, fn)[0])
        row = {"context": L, "check": check, "cached_s": summarize(c), "recompute_s": summarize(u),
               "recompute_full_logits_s": summarize(f), "ratio": median(u) / median(c),
               "ratio_full_logits": median(f) / median(c)}
        rows.append(row)
        _log(f"kv cache L={L}: cached {median(c) * 1e3:.2f} ms, recompute {median(u) * 1e3:.2f} ms "
             f"(x{row['ratio']:.1f}), full_logits {median(f) * 1e3:.2f} ms")
    return {"decode_steps_per_point": k, "points": rows}
