"""What each part of a compiled decode graph buys: batch-1 decode of the shipped model.

Three engines with ``LLM(decode_graphs=True)`` in one process, differing only in how their
compiled graphs are made (the step around them is the same code):

* ``reductions, jit``: attention as products and sums over the block table that inductor fuses
  into loops (``PagedReductions``), the graph called through ``torch.compile``'s guarded entry
  (what ``decode_graphs=True`` did before);
* ``kernel, jit``: attention is the C kernel, called from inductor's C++ wrapper as the operator
  ``torch.ops.minillm.paged_decode``; the same guarded entry;
* ``kernel, aot``: the same graph compiled ahead of time (``aot_compile``), called as a plain
  function without dynamo's per-call entry (the default now).

Every graph is made before timing (``llm.warmup()``). Rounds alternate the engines (the order
rotates each round); a round is one request of ``--new-tokens`` greedy tokens after a prompt of
each length, and its TPOT the median decode step. Greedy tokens are compared with the first
engine's every round. One thread by default (``--threads``).

    python benchmarks/decode_graph_paths.py [--rounds 5] [--prompts 16,128,512] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

VARIANTS = ("reductions, jit", "kernel, jit", "kernel, aot")


def engine(variant: str, threads: int):
    from minillm import LLM
    from minillm.fast.attention import PagedReductions

    llm = LLM(device="cpu", dtype="float32", enable_prefix_caching=False, kv_cache_tokens=4096,
              max_num_seqs=4, num_threads=threads, decode_graphs=True)
    graphs = llm.runner.graphs
    if variant.startswith("reductions"):
        graphs.attention = PagedReductions()
    graphs.aot = variant.endswith("aot")
    started = time.perf_counter()
    llm.warmup()
    made = time.perf_counter() - started
    want = "reductions" if variant.startswith("reductions") else "kernel"
    assert graphs.attention.name == want, (variant, graphs.attention.name)
    assert graphs.compiler == variant.split(", ")[1], (variant, graphs.compiler, graphs.aot_error)
    return llm, made


def one_round(llm, prompt: list[int], new_tokens: int) -> tuple[float, list[int]]:
    """(median decode step in seconds, the tokens) of one request."""
    from minillm import SamplingParams
    from minillm.apps.bench.harness import forget_finished

    req = llm.add_request(prompt_token_ids=prompt, params=SamplingParams(max_tokens=new_tokens, temperature=0.0,
                                                                         ignore_eos=True))
    steps = []
    while llm.has_unfinished():
        t = time.perf_counter()
        llm.step()
        steps.append(time.perf_counter() - t)
    out = list(req.output_token_ids)
    forget_finished(llm)
    return statistics.median(steps[1:]), out  # steps[0] is the prefill


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompts", default="16,128,512")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    load = [os.getloadavg()[0]]
    engines = {}
    for v in VARIANTS:
        engines[v], made = engine(v, args.threads)
        print(f"{v}: graphs made in {made:.1f} s", flush=True)
    vocab = engines[VARIANTS[0]].model_config.vocab_size
    rows = []
    for plen in (int(p) for p in args.prompts.split(",")):
        prompt = [(7 * i + 3) % vocab for i in range(plen)]
        for v in VARIANTS:  # untimed: first use of each width
            one_round(engines[v], prompt, args.new_tokens)
        tpot = {v: [] for v in VARIANTS}
        same = True
        order = list(VARIANTS)
        for _ in range(args.rounds):
            order = order[1:] + order[:1]
            outs = {}
            for v in order:
                t, outs[v] = one_round(engines[v], prompt, args.new_tokens)
                tpot[v].append(t)
            same &= all(outs[v] == outs[VARIANTS[0]] for v in VARIANTS)
        row = {"prompt": plen, "tokens_identical": same,
               "tpot_ms": {v: {"median": 1e3 * statistics.median(ts), "min": 1e3 * min(ts), "max": 1e3 * max(ts),
                               "runs": [1e3 * t for t in ts]} for v, ts in tpot.items()}}
        rows.append(row)
        print(f"prompt {plen}: " + ", ".join(f"{v} {row['tpot_ms'][v]['median']:.3f} ms" for v in VARIANTS)
              + f"; tokens identical: {same}", flush=True)
    load.append(os.getloadavg()[0])
    if args.json:
        Path(args.json).write_text(json.dumps({"threads": args.threads, "rounds": args.rounds,
                                               "new_tokens": args.new_tokens, "load_average": load,
                                               "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
