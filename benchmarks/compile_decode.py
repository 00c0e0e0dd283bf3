"""``LLM(compile=True)`` against eager on the shipped model: compile time, batch-1 decode, mixed workload.

Two engines in one process, one eager and one with ``compile=True`` (``minillm.fast.compiled``:
the whole forward through inductor, attention eager as one opaque op, dynamic token count).
First the compiled engine's warm-up (``LLM.warmup()``) is timed with an empty inductor cache
(a fresh ``TORCHINDUCTOR_CACHE_DIR``): that is the compile time a user pays once per process.
Then rounds alternate the engines (the order flips every round):

* batch-1 decode: one request (a ``--prompt``-id prompt, ``--new-tokens`` greedy tokens),
  TPOT = the round's median step;
* the mixed workload of ``minillm bench`` (``--requests`` requests, prompts 16-256 and outputs
  16-256 tokens, seeded), output tokens/s.

Greedy tokens are compared (every request, every round), the max |logit| difference of the
compiled forward is measured on one teacher-forced sequence, and the number of graphs compiled is
printed before and after the rounds (it must not grow). ``--json`` writes everything.

    python benchmarks/compile_decode.py [--rounds 5] [--new-tokens 64] [--requests 64] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="minillm-inductor-"))

import torch  # noqa: E402  (after the cache directory is chosen)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from weight_options import one_round  # noqa: E402  (median decode step + tokens of one request)


def mixed_round(llm, prompts, olens):
    from minillm.apps.bench.harness import minillm_run

    secs, out, _ = minillm_run(llm, prompts, olens)
    return sum(olens) / secs, out


def logit_gap(eager, compiled, ids) -> float:
    """Max |logit| difference of one prefill over ``ids`` (every position's logits), eager
    model vs the compiled forward, on the same batch layout."""
    from minillm.models.llama import AttentionBatch, PrefillSeq

    n = len(ids)
    t = torch.tensor(ids)
    batch = AttentionBatch(positions=torch.arange(n), slot_mapping=None,
                           prefills=[PrefillSeq(q_start=0, q_len=n, ctx_len=n)])
    with torch.inference_mode():
        ref = eager.model(t, batch)
        got = compiled.runner.model(t, batch)
    return (ref - got).abs().max().item()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from minillm import LLM
    from minillm.apps.bench.harness import random_prompts
    from minillm.apps.bench.workloads import Settings, make_workload

    kw = dict(device="cpu", dtype="float32", enable_prefix_caching=False, num_threads=args.threads)
    eager, compiled = LLM(**kw), LLM(compile=True, **kw)
    load = [os.getloadavg()]
    t0 = time.perf_counter()
    graphs = compiled.warmup()
    compile_s = time.perf_counter() - t0
    print(f"warm-up (compile, empty inductor cache): {compile_s:.1f} s, {graphs} graph(s)", flush=True)

    class _E:  # what make_workload reads
        llm, vocab_size = eager, eager.model_config.vocab_size
    s = Settings(num_requests=args.requests)
    prompts, olens = make_workload(_E, s)
    ids = random_prompts(eager.tokenizer, eager.model_config.vocab_size, [args.prompt], seed=1)[0]
    gap = logit_gap(eager, compiled, random_prompts(eager.tokenizer, eager.model_config.vocab_size, [256], 2)[0])
    print(f"max |logit| difference compiled vs eager (256-token prefill): {gap:.3g}", flush=True)

    tpot = {"eager": [], "compiled": []}
    tps = {"eager": [], "compiled": []}
    same_decode, same_mixed = True, True
    ref_decode = ref_mixed = None
    engines = {"eager": eager, "compiled": compiled}
    for r in range(args.rounds):
        order = ("eager", "compiled") if r % 2 == 0 else ("compiled", "eager")
        for name in order:
            t, out = one_round(engines[name], ids, args.new_tokens)
            tpot[name].append(t)
            ref_decode = out if ref_decode is None else ref_decode
            same_decode &= out == ref_decode
        for name in order:
            v, out = mixed_round(engines[name], prompts, olens)
            tps[name].append(v)
            ref_mixed = out if ref_mixed is None else ref_mixed
            same_mixed &= out == ref_mixed
        print(f"round {r + 1}: TPOT eager {tpot['eager'][-1] * 1e3:.2f} ms compiled {tpot['compiled'][-1] * 1e3:.2f} ms;"
              f" mixed eager {tps['eager'][-1]:.0f} tok/s compiled {tps['compiled'][-1]:.0f} tok/s", flush=True)
    load.append(os.getloadavg())
    med = {k: statistics.median(v) for k, v in tpot.items()}
    medt = {k: statistics.median(v) for k, v in tps.items()}
    after = compiled.runner.model.compiles
    result = {
        "threads": args.threads, "rounds": args.rounds, "load_average": load, "compile_seconds": compile_s,
        "graphs_after_warmup": graphs, "graphs_after_rounds": after,
        "max_logit_difference": gap,
        "batch1_tpot_ms": {k: [x * 1e3 for x in v] for k, v in tpot.items()},
        "mixed_tokens_per_s": tps, "mixed_useful_tokens": sum(olens),
        "greedy_identical": {"batch1": same_decode, "mixed": same_mixed},
    }
    print("load average", load)
    print(f"batch-1 TPOT medians: eager {med['eager'] * 1e3:.2f} ms, compiled {med['compiled'] * 1e3:.2f} ms"
          f" -> {med['eager'] / med['compiled']:.2f}x; ranges eager {min(tpot['eager']) * 1e3:.2f}-"
          f"{max(tpot['eager']) * 1e3:.2f}, compiled {min(tpot['compiled']) * 1e3:.2f}-{max(tpot['compiled']) * 1e3:.2f}")
    print(f"mixed {args.requests} requests ({sum(olens)} tokens) medians: eager {medt['eager']:.0f} tok/s, compiled "
          f"{medt['compiled']:.0f} tok/s -> {medt['compiled'] / medt['eager']:.2f}x; ranges eager "
          f"{min(tps['eager']):.0f}-{max(tps['eager']):.0f}, compiled {min(tps['compiled']):.0f}-{max(tps['compiled']):.0f}")
    print(f"greedy tokens identical: batch-1 {same_decode}, mixed {same_mixed}; graphs after the rounds {after}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
