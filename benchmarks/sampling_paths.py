"""Decode throughput per sampling setting, this tree against an older commit.

    python benchmarks/sampling_paths.py --ref 526248c --rounds 2

The host-side cost of a step (building its index tensors, sampling, log-probabilities)
is what changes between greedy, sampled and logprobs runs of the same batch. Each round
runs both trees (a ``git worktree`` of ``--ref`` in a temporary folder, and this one) in
fresh processes, alternating which goes first: the shipped model, 1 thread, 32 requests with
prompts of 16-127 random ids, 64 new tokens each; best of 3 passes per setting. Prints
output tokens/s per setting and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SETTINGS = {"greedy": dict(temperature=0), "top_p": dict(temperature=0.8, top_p=0.9),
            "logprobs": dict(temperature=0.8, logprobs=5)}

CHILD = r"""
import json, random, sys, time, torch
sys.path.insert(0, sys.argv[1])
torch.set_num_threads(1)
import minillm
from minillm import LLM, SamplingParams
assert minillm.__file__.startswith(sys.argv[1]), minillm.__file__
settings = json.loads(sys.argv[2])
llm = LLM(None, enable_prefix_caching=False, max_num_seqs=32)
rng = random.Random(0)
prompts = [[rng.randrange(3, 2000) for _ in range(rng.randrange(16, 128))] for _ in range(32)]
out = {}
for name, kw in settings.items():
    best = 1e9
    for _ in range(3):
        for i, p in enumerate(prompts):
            llm.add_request(prompt_token_ids=p, params=SamplingParams(max_tokens=64, ignore_eos=True, seed=i, **kw))
        t0 = time.perf_counter()
        while llm.has_unfinished():
            llm.step()
        best = min(best, time.perf_counter() - t0)
    out[name] = 32 * 64 / best
print(json.dumps(out))
"""


def run(tree: Path) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run([sys.executable, "-c", CHILD, str(tree), json.dumps(SETTINGS)], env=env,
                         capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", required=True, help="the older commit")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "ref"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(old), args.ref], check=True)
        try:
            results = {"ref": [], "this": []}
            for r in range(args.rounds):
                order = [("ref", old), ("this", REPO)] if r % 2 == 0 else [("this", REPO), ("ref", old)]
                for label, tree in order:
                    results[label].append(run(tree))
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(old)], check=False)
    print(f"load average {os.getloadavg()[0]:.1f}; output tokens/s, median of {args.rounds} rounds")
    for name in SETTINGS:
        a = statistics.median(x[name] for x in results["ref"])
        b = statistics.median(x[name] for x in results["this"])
        print(f"{name:9s} {args.ref}: {a:7.0f}   this tree: {b:7.0f}   ratio {b / a:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
