"""Does the engine's per-step cost grow with the number of requests it has served?

Serves N requests (default 20,000) through ``generate()`` on one ``LLM`` set up the way a
server runs it (``max_history`` and ``trace_limit`` bounded), and measures, before and
after, the mean time of a decode step in a fixed probe workload (8 requests decoding 32
tokens each) and the process's resident memory. Run from the repository root:

    OMP_NUM_THREADS=1 python benchmarks/history_costs.py             # ~1-2 min on a loaded CPU
    python benchmarks/history_costs.py --requests 2000 --json out.json

Writes the numbers as JSON (default ``benchmarks/history_costs.json``). The acceptance bar
(issue 11): decode step after / before <= 1.3 and RSS growth < 60 MB.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from minillm import LLM, SamplingParams

PROMPTS = ["Once upon a time", "The robot found a shiny key", "Mia and her dog ran to the beach",
           "A small bird sang a happy song", "The little fox", "In the green forest", "The moon was big",
           "Tom had a red ball"]


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def decode_step_seconds(llm: LLM, rounds: int) -> float:
    """Median over rounds of the mean decode-only step time (8 requests, 32 tokens each)."""
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    per_round = []
    for _ in range(rounds):
        reqs = [llm.add_request(p, params) for p in PROMPTS]
        llm.step()  # the prefill step
        times = []
        while llm.has_unfinished():
            t0 = time.perf_counter()
            llm.step()
            times.append(time.perf_counter() - t0)
        per_round.append(statistics.mean(times[:-1] or times))
        for r in reqs:
            llm.requests.pop(r.request_id, None)
    return statistics.median(per_round)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--batch", type=int, default=32, help="prompts per generate() call")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", default=str(Path(__file__).with_name("history_costs.json")))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    llm = LLM(device="cpu", max_history=256, trace_limit=10_000)
    params = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    decode_step_seconds(llm, 2)  # warm up
    gc.collect()
    before_step, before_rss = decode_step_seconds(llm, args.rounds), rss_mb()
    t0, served = time.perf_counter(), 0
    while served < args.requests:
        n = min(args.batch, args.requests - served)
        llm.generate([PROMPTS[(served + i) % len(PROMPTS)] for i in range(n)], params)
        served += n
    serve_s = time.perf_counter() - t0
    gc.collect()
    after_step, after_rss = decode_step_seconds(llm, args.rounds), rss_mb()
    result = {
        "requests_served": served, "serve_seconds": round(serve_s, 1),
        "decode_step_ms_before": round(before_step * 1e3, 3), "decode_step_ms_after": round(after_step * 1e3, 3),
        "decode_step_ratio": round(after_step / before_step, 3),
        "rss_mb_before": round(before_rss, 1), "rss_mb_after": round(after_rss, 1),
        "rss_growth_mb": round(after_rss - before_rss, 1),
        "requests_kept": len(llm.requests), "trace_events_kept": len(llm.trace),
        "settings": {"model": "stories-3m (shipped)", "device": "cpu", "max_history": 256,
                     "trace_limit": 10_000, "batch": args.batch, "max_tokens": 2, "threads": 1},
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "cpu": platform.processor() or platform.machine()},
    }
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main()
