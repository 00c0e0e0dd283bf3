"""``torch.compile`` of the model's forward against eager, batch-1 decode on the shipped model.

Two engines in one process, one compiled (``torch.compile(model.forward)``, default automatic
dynamic shapes), rounds alternating; each round one request (a 64-id prompt, ``--new-tokens``
greedy tokens), TPOT = the round's median step. Tokens are compared first. The compile time
(the first round) is printed separately. ``--dynamic`` asks for dynamic shapes from the start
(with torch 2.13 on this CPU that failed in inductor's generated code: ``NameError: s61``).

    python benchmarks/compile_decode.py [--rounds 5] [--new-tokens 24] [--dynamic]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from weight_options import one_round  # noqa: E402  (median decode step + tokens of one request)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=24)
    ap.add_argument("--dynamic", action="store_true")
    args = ap.parse_args(argv)
    from minillm import LLM

    torch._dynamo.config.cache_size_limit = 64
    kw = dict(device="cpu", dtype="float32", enable_prefix_caching=False, num_threads=1, max_num_seqs=2,
              kv_cache_tokens=512)
    eager, compiled = LLM(**kw), LLM(**kw)
    compiled.model.forward = torch.compile(compiled.model.forward, dynamic=True if args.dynamic else None)
    ids = list(range(5, 69))
    print("load average", os.getloadavg())
    t0 = time.perf_counter()
    _, out_c = one_round(compiled, ids, args.new_tokens)
    print(f"compile + first round: {time.perf_counter() - t0:.1f} s")
    _, out_e = one_round(eager, ids, args.new_tokens)
    print("greedy tokens identical:", out_c == out_e)
    te, tc = [], []
    for _ in range(args.rounds):
        te.append(one_round(eager, ids, args.new_tokens)[0])
        tc.append(one_round(compiled, ids, args.new_tokens)[0])
    print("eager TPOT ms", [round(x * 1e3, 2) for x in te], "compiled", [round(x * 1e3, 2) for x in tc])
    print(f"eager / compiled (medians): {statistics.median(te) / statistics.median(tc):.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
