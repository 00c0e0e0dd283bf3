"""Does one client's huge prompt slow other clients' streams? ``minillm serve`` over loopback.

Alternating rounds on one server, so both see the same machine load: a client streams B
(greedy, ``--tokens`` tokens) alone; then the same stream while client A posts a prompt of
``--prompt-words`` words (~1 MB by default: tokenised, then refused for being longer than the
model's context; A runs in a process of its own). Reported for each round: how long B's
stream took from its first chunk to its last, the median and the longest gap between its chunks
(only the gaps while A was in flight, in the rounds with A) and how long A took. Before the
server tokenised prompts off the engine's thread, B stood still for the whole of A's
tokenisation. Only 127.0.0.1 is contacted.

    .venv/bin/python benchmarks/serve_big_prompt.py               # 3 rounds, ~2 min; writes serve_big_prompt.json
    .venv/bin/python benchmarks/serve_big_prompt.py --rounds 1    # a smoke run (writes nothing)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from minillm.apps.serve.launch import ServerProcess  # noqa: E402


SEND_A = """
import sys, httpx
r = httpx.post(sys.argv[1].rstrip("/") + "/v1/completions", trust_env=False, timeout=900,
               json={"prompt": "word " * int(sys.argv[2]), "max_tokens": 4})
print(r.status_code)
"""


def one_round(client: httpx.Client, tokens: int, prompt_words: int | None) -> dict:
    """Stream B; with ``prompt_words``, A posts its prompt once B has 20 chunks."""
    times, a = [], {}

    def send_a():  # from a process of its own: building and sending 1 MB must not hold B's reader
        a["t0"] = time.monotonic()
        out = subprocess.run([sys.executable, "-c", SEND_A, str(client.base_url), str(prompt_words)],
                             capture_output=True, text=True, timeout=900)
        a["t1"], a["status"] = time.monotonic(), int(out.stdout.strip() or 0)

    body = {"prompt": "Once upon a time", "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
            "stream": True}
    sender = None
    with client.stream("POST", "/v1/completions", json=body) as r:
        for line in r.iter_lines():
            if line.startswith("data:"):
                times.append(time.monotonic())
                if prompt_words and len(times) == 20:
                    sender = threading.Thread(target=send_a)
                    sender.start()
    if sender is not None:
        sender.join()
    pairs = list(zip(times, times[1:]))
    if prompt_words:
        pairs = [(x, y) for x, y in pairs if x < a["t1"] and y > a["t0"]]  # overlapping A's time in flight
    gaps = [(y - x) * 1000 for x, y in pairs]
    out = {"with_big_prompt": bool(prompt_words), "gaps": len(gaps), "median_gap_ms": statistics.median(gaps),
           "max_gap_ms": max(gaps), "stream_seconds": times[-1] - times[0]}
    if prompt_words:
        out.update(big_prompt_status=a["status"], big_prompt_seconds=a["t1"] - a["t0"])
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--tokens", type=int, default=500, help="B's length in tokens (default 500)")
    p.add_argument("--prompt-words", type=int, default=200_000, help="A's prompt in words (default 200000: ~1 MB)")
    p.add_argument("--out", default=str(Path(__file__).with_name("serve_big_prompt.json")))
    args = p.parse_args(argv)
    rows = []
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    with ServerProcess(["--max-num-seqs", "4"], env=env) as srv:  # the server runs this checkout's code
        with httpx.Client(base_url=srv.url, trust_env=False, timeout=900) as client:
            client.post("/v1/completions", json={"prompt": "warm", "max_tokens": 4})
            for i in range(args.rounds):
                for words in (None, args.prompt_words):
                    row = dict(one_round(client, args.tokens, words), round=i)
                    rows.append(row)
                    extra = (f" (A: HTTP {row['big_prompt_status']} after {row['big_prompt_seconds']:.1f} s)"
                             if words else "")
                    print(f"round {i} {'beside a big prompt' if words else 'alone              '}: "
                          f"B's {args.tokens} tokens in {row['stream_seconds']:.2f} s, median gap "
                          f"{row['median_gap_ms']:.1f} ms, longest {row['max_gap_ms']:.1f} ms{extra}",
                          flush=True)
    if args.rounds >= 3:
        meta = {"machine": platform.machine(), "cpus": os.cpu_count(), "load_average": os.getloadavg(),
                "prompt_words": args.prompt_words, "tokens": args.tokens}
        Path(args.out).write_text(json.dumps({"meta": meta, "rounds": rows}, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
