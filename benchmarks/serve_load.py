"""Load test of ``minillm serve`` over loopback, with and without disconnect handling.

N streaming clients arrive at seeded exponential intervals; a seeded fraction of them, who
asked for long answers (384-640 tokens), leave after a few chunks (they closed the tab). The same arrival pattern runs against two servers:

* ``cancel``: the real server; a disconnect cancels the request in the engine;
* ``stop-sending``: the bug of the chapter's scenario 2; a disconnect only stops sending.

Measured on the client side: TTFT (request sent -> first text chunk) and TPOT (mean gap
between later chunks) percentiles of the clients that stayed, and the output tokens per second
they received; on the server side, from ``/metrics``: tokens generated in all (the gap is work
done for clients that had left) and the KV gauge over time (plotted). Bounded in count (N) and
time (``--time-limit``); only 127.0.0.1 is contacted.

    .venv/bin/python benchmarks/serve_load.py            # 48 clients, 3 rounds of both modes, ~4 min
    .venv/bin/python benchmarks/serve_load.py --quick    # 12 clients, a smoke run
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from minillm.apps.serve.launch import ServerProcess  # noqa: E402

STOP_SENDING_ONLY = '''
class StopSendingOnly(OpenAIServer):
    "The bug of scenario 2, for comparison only: a disconnect stops sending, nothing else."

    def client_gone(self, stream):
        pass
'''
SUMMARY_KEYS = ("wall_s", "ttft_p50", "ttft_p90", "ttft_p99", "tpot_p50", "tpot_p90", "tpot_p99",
                "received_tokens_per_s", "tokens_generated_by_engine", "tokens_received_by_staying_clients",
                "engine_steps",
                "peak_used_blocks", "kv_block_seconds")
PROMPTS = ["Once upon a time", "One day, Mia went to the beach", "The little robot found a key",
           "Tom and his dog ran to the park", "There was a big tree in the garden"]


def plan(n: int, rate: float, leave_fraction: float, seed: int) -> list[dict]:
    """The seeded workload: arrival offsets, prompts, output lengths, who leaves and when."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for i in range(n):
        t += rng.expovariate(rate)
        leaves = rng.random() < leave_fraction
        max_tokens = rng.randint(32, 256)
        if leaves:  # the users who give up are those waiting on a long answer
            max_tokens = rng.randint(384, 640)
        out.append({"i": i, "at": t, "prompt": rng.choice(PROMPTS), "max_tokens": max_tokens,
                    "leave_after": rng.randint(2, 12) if leaves else None})
    return out


async def one_client(client: httpx.AsyncClient, job: dict, t0: float, deadline: float) -> dict:
    await asyncio.sleep(max(0.0, t0 + job["at"] - time.monotonic()))
    body = {"prompt": job["prompt"], "max_tokens": job["max_tokens"], "temperature": 0.8, "seed": job["i"],
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    sent = time.monotonic()
    times, tokens, status = [], None, None
    try:
        async with client.stream("POST", "/v1/completions", json=body) as r:
            status = r.status_code
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                event = json.loads(line[6:])
                if event.get("usage"):
                    tokens = event["usage"]["completion_tokens"]
                elif event["choices"] and event["choices"][0]["text"]:
                    times.append(time.monotonic())
                if job["leave_after"] is not None and len(times) >= job["leave_after"]:
                    break  # the client leaves: the connection closes with the `async with`
                if time.monotonic() > deadline:
                    break
    except httpx.HTTPError as exc:
        status = f"error: {exc!r}"
    return {"i": job["i"], "status": status, "left": job["leave_after"] is not None, "chunks": len(times),
            "end": time.monotonic() - t0,
            "tokens": tokens, "ttft": times[0] - sent if times else None,
            "tpot": (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else None}


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


async def run_mode(url: str, jobs: list[dict], time_limit: float) -> dict:
    limits = httpx.Limits(max_connections=len(jobs) + 4)
    async with httpx.AsyncClient(base_url=url, trust_env=False, timeout=time_limit, limits=limits) as client:
        before = (await client.get("/metrics")).text
        t0 = time.monotonic()
        deadline = t0 + time_limit
        tasks = [asyncio.create_task(one_client(client, j, t0, deadline)) for j in jobs]
        gauge = []
        while not all(t.done() for t in tasks) or gauge[-1][1] > 0:
            text = (await client.get("/metrics")).text
            gauge.append((time.monotonic() - t0, _metric(text, "minillm_kv_cache_used_blocks"),
                          _metric(text, "minillm_requests_running")))
            if time.monotonic() > deadline + 30:
                break
            await asyncio.sleep(0.05)
        results = [t.result() for t in tasks]
        after = (await client.get("/metrics")).text
    stayed = [r for r in results if not r["left"] and r["status"] == 200]
    wall = max((r["end"] for r in stayed), default=1e-9)  # first arrival -> last staying client served
    pct = lambda xs, q: statistics.quantiles(xs, n=100, method="inclusive")[q - 1] if len(xs) > 1 else (xs[0] if xs else None)  # noqa: E731
    ttft = sorted(r["ttft"] for r in stayed if r["ttft"] is not None)
    tpot = sorted(r["tpot"] for r in stayed if r["tpot"] is not None)
    received = sum(r["tokens"] or 0 for r in stayed)
    generated = _metric(after, "minillm_generation_tokens_total") - _metric(before, "minillm_generation_tokens_total")
    steps = _metric(after, "minillm_engine_steps_total") - _metric(before, "minillm_engine_steps_total")
    blocks_seconds = sum((b[0] - a[0]) * a[1] for a, b in zip(gauge, gauge[1:]))
    return {"wall_s": wall, "clients": len(results), "stayed": len(stayed), "left": sum(r["left"] for r in results),
            "errors": [r for r in results if r["status"] != 200],
            "ttft_p50": pct(ttft, 50), "ttft_p90": pct(ttft, 90), "ttft_p99": pct(ttft, 99),
            "tpot_p50": pct(tpot, 50), "tpot_p90": pct(tpot, 90), "tpot_p99": pct(tpot, 99),
            "tokens_received_by_staying_clients": received, "tokens_generated_by_engine": generated,
            "engine_steps": steps,
            "received_tokens_per_s": received / wall, "peak_used_blocks": max(g[1] for g in gauge),
            "kv_block_seconds": blocks_seconds, "gauge": gauge, "requests": results}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 3.5), layout="constrained")
    for mode, res in results.items():
        t = [g[0] for g in res["gauge"]]
        ax.plot(t, [g[1] for g in res["gauge"]], label=f"{mode} (peak {res['peak_used_blocks']:.0f} blocks)")
    ax.set(xlabel="seconds since the first arrival", ylabel="minillm_kv_cache_used_blocks",
           title="KV blocks in use under load (round 1): a disconnect cancels vs only stops sending")
    ax.legend()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=48)
    ap.add_argument("--rate", type=float, default=12.0, help="mean arrivals per second (default 12)")
    ap.add_argument("--leave-fraction", type=float, default=0.33, help="share of clients that leave early")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-num-seqs", type=int, default=16)
    ap.add_argument("--time-limit", type=float, default=120.0, help="seconds per mode, at most")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of both modes, alternating (default 3)")
    ap.add_argument("--quick", action="store_true", help="12 clients, one round: a smoke run")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks")
    args = ap.parse_args(argv)
    if args.quick:
        args.clients, args.rounds = 12, 1
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be an int >= 1, got {args.rounds}")
    if not 1 <= args.clients <= 1000:
        raise SystemExit(f"--clients must be an int in [1, 1000], got {args.clients}")
    if not 0 <= args.leave_fraction <= 1:
        raise SystemExit(f"--leave-fraction must be in [0, 1], got {args.leave_fraction}")
    jobs = plan(args.clients, args.rate, args.leave_fraction, args.seed)
    server_args = ["--max-num-seqs", str(args.max_num_seqs), "--max-waiting", str(args.clients + 1), "--device", "cpu"]
    modes = {"cancel": {}, "stop-sending": {"server_code": STOP_SENDING_ONLY, "server_class": "StopSendingOnly"}}
    rounds: dict[str, list] = {m: [] for m in modes}
    load = [os.getloadavg()[0] if hasattr(os, "getloadavg") else None]
    for rnd in range(args.rounds):  # modes alternate, the order flipping each round (a shared CPU drifts)
        for mode in (list(modes) if rnd % 2 == 0 else list(modes)[::-1]):
            with ServerProcess(server_args, **modes[mode]) as srv:
                asyncio.run(run_mode(srv.url, jobs[:2], args.time_limit))  # warm-up
                r = asyncio.run(run_mode(srv.url, jobs, args.time_limit))
            rounds[mode].append(r)
            load.append(os.getloadavg()[0] if hasattr(os, "getloadavg") else None)
            print(f"round {rnd + 1} {mode:13s} {r['wall_s']:6.1f} s | stayed {r['stayed']}, left {r['left']}, "
                  f"errors {len(r['errors'])} | TTFT p50/p90/p99 {1e3 * r['ttft_p50']:.0f}/{1e3 * r['ttft_p90']:.0f}/"
                  f"{1e3 * r['ttft_p99']:.0f} ms | TPOT p50/p90/p99 {1e3 * r['tpot_p50']:.1f}/{1e3 * r['tpot_p90']:.1f}/"
                  f"{1e3 * r['tpot_p99']:.1f} ms | received {r['received_tokens_per_s']:.0f} tok/s | engine generated "
                  f"{r['tokens_generated_by_engine']:.0f} tokens for {r['tokens_received_by_staying_clients']} "
                  f"delivered to staying clients | peak {r['peak_used_blocks']:.0f} blocks, "
                  f"{r['kv_block_seconds']:.0f} block-seconds", flush=True)
    summary = {m: {k: statistics.median(r[k] for r in rs) for k in SUMMARY_KEYS} for m, rs in rounds.items()}
    for m, row in summary.items():
        print(f"median of {args.rounds} {m:13s} " + ", ".join(f"{k} {v:.4g}" for k, v in row.items()))
    if args.quick and args.out == ROOT / "benchmarks":
        return 0  # a smoke run does not overwrite the recorded results
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"args": {k: str(v) for k, v in vars(args).items()}, "machine": {
        "cpu_count": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
        "loadavg": os.getloadavg() if hasattr(os, "getloadavg") else None}}
    meta["loadavg_1min_between_runs"] = load
    (args.out / "serve_load.json").write_text(json.dumps({"meta": meta, "median": summary, "rounds": rounds}, indent=1))
    plot({m: rs[0] for m, rs in rounds.items()}, args.out / "serve_load.png")
    print("wrote", args.out / "serve_load.json", "and", args.out / "serve_load.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
