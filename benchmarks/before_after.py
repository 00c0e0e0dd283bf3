"""The engine before and after the hot-path work, side by side in one process.

    python benchmarks/before_after.py --ref 3615572 --model default --runs 5

Extracts ``minillm/`` as it was at git ``--ref`` into a temporary folder as the package
``minillm_before``, loads both engines (and transformers ``generate()``) on the same
checkpoint, checks all three give the same greedy tokens, then times them alternately:

- batch-1 decode: TPOT of a 128-token prompt generating 128 tokens;
- the mixed workload of ``minillm bench`` (64 requests, continuous batching), against
  ``generate()`` at ``--hf-batch``.

Prints a table and writes ``before_after_<model>.json`` next to this script.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def load_before(ref: str) -> object:
    tmp = Path(tempfile.mkdtemp(prefix="minillm-before-"))
    data = subprocess.run(["git", "-C", str(REPO), "archive", ref, "minillm"], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=BytesIO(data)) as tar:
        tar.extractall(tmp, filter="data")
    (tmp / "minillm").rename(tmp / "minillm_before")
    sys.path.insert(0, str(tmp))
    return importlib.import_module("minillm_before")


def profile_decode(llm, prompts, olens, warm_steps: int = 40, steps: int = 20, top: int = 8) -> list[dict]:
    """Self CPU time of the top operators over ``steps`` engine steps in the middle of the
    mixed workload (all requests admitted and decoding)."""
    from torch.profiler import ProfilerActivity, profile

    from minillm.apps.bench.harness import _sampling_params, forget_finished

    SP = _sampling_params(llm)
    reqs = [llm.add_request(prompt_token_ids=p, params=SP(max_tokens=n, temperature=0.0, ignore_eos=True))
            for p, n in zip(prompts, olens)]
    for _ in range(warm_steps):
        llm.step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            llm.step()
    while any(r.is_live for r in reqs):
        llm.step()
    forget_finished(llm)
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in rows)
    name = type(llm).__module__.split(".")[0]
    print(f"\n{name}: {total / steps / 1e3:.2f} ms of operator time per step (20 steps, ~64 decoding)")
    out = []
    for e in rows[:top]:
        out.append({"op": e.key, "ms_per_step": e.self_cpu_time_total / steps / 1e3, "calls_per_step": e.count / steps,
                    "share": e.self_cpu_time_total / total})
        print(f"  {e.key:<52} {out[-1]['ms_per_step']:7.2f} ms/step {out[-1]['share'] * 100:5.1f}%  "
              f"{out[-1]['calls_per_step']:6.1f} calls/step")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ref", default="3615572", help="git ref of the engine before (default: the commit "
                                                     "before the benchmark work)")
    ap.add_argument("--model", default="default", help="default, 135m or a model folder")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--hf-batch", type=int, default=16, help="generate() static batch size for the workload")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--skip", action="append", default=[], choices=["decode", "workload"])
    ap.add_argument("--profile", action="store_true",
                    help="also print torch.profiler's top operators for 20 decode steps of the workload "
                         "(64 requests running) in each engine")
    args = ap.parse_args(argv)

    import torch

    from minillm import LLM
    from minillm.apps.bench import prepare_model
    from minillm.apps.bench.harness import (check_identical, hf_latency, hf_static_run, load_engines, machine_info,
                                       make_llm, median, minillm_latency, minillm_run, summarize)
    from minillm.apps.bench.workloads import Settings, make_workload

    if args.threads:
        torch.set_num_threads(args.threads)
    before_pkg = load_before(args.ref)
    s = Settings(runs=args.runs)
    workdir = Path(tempfile.mkdtemp(prefix="minillm-bench-models-"))
    path = prepare_model(args.model, workdir)
    kv = s.num_requests * (s.prompt_range[1] + s.output_range[1] + 16)
    eng = load_engines(path, "cpu", kv_cache_tokens=kv)
    engines = {"after": eng.llm, "before": make_llm(path, "cpu", "auto", kv, llm_class=before_pkg.LLM)}
    assert isinstance(engines["after"], LLM) and not isinstance(engines["before"], LLM)
    out = {"ref": args.ref, "model": str(path), "machine": machine_info(eng.device), "runs": args.runs}

    if "decode" not in args.skip:
        prompt = make_workload(eng, s)[0][0]
        prompt = (prompt * 8)[:128]
        ref = hf_latency(eng, prompt, 128)[2]
        for name, llm in engines.items():
            check_identical(f"decode {name}", [minillm_latency(llm, prompt, 128)[2]], [ref])
        tpot = {k: [] for k in ("before", "after", "generate")}
        for r in range(args.runs):
            order = ["before", "after", "generate"]
            for who in order[r % 3:] + order[:r % 3]:
                if who == "generate":
                    tpot[who].append(hf_latency(eng, prompt, 128)[1])
                else:
                    tpot[who].append(minillm_latency(engines[who], prompt, 128)[1])
        out["decode_tpot_s"] = {k: summarize(v) for k, v in tpot.items()}
        print("batch-1 TPOT (ms): " + ", ".join(f"{k} {median(v) * 1e3:.2f}" for k, v in tpot.items()), flush=True)

    if "workload" not in args.skip:
        prompts, olens = make_workload(eng, s)
        useful = sum(olens)
        ref = minillm_run(engines["after"], prompts, olens)[1]
        check_identical("workload before", minillm_run(engines["before"], prompts, olens)[1], ref)
        check_identical(f"workload generate(bs={args.hf_batch})",
                        hf_static_run(eng, prompts, olens, args.hf_batch)[1], ref)
        tps = {k: [] for k in ("before", "after", "generate")}
        for r in range(args.runs):
            order = ["before", "after", "generate"]
            for who in order[r % 3:] + order[:r % 3]:
                if who == "generate":
                    t = hf_static_run(eng, prompts, olens, args.hf_batch)[0]
                else:
                    t = minillm_run(engines[who], prompts, olens)[0]
                tps[who].append(useful / t)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.0f}" for k, v in tps.items()) + " tok/s", flush=True)
        out["workload_tokens_per_s"] = {k: summarize(v) for k, v in tps.items()}
        out["hf_batch"] = args.hf_batch

    print("\n| | before | after | after / before | generate() |\n|---|---:|---:|---:|---:|")
    if "decode_tpot_s" in out:
        d = {k: v["median"] for k, v in out["decode_tpot_s"].items()}
        print(f"| batch-1 TPOT, ms (lower is better) | {d['before'] * 1e3:.2f} | {d['after'] * 1e3:.2f} | "
              f"{d['after'] / d['before']:.2f}× | {d['generate'] * 1e3:.2f} |")
    if "workload_tokens_per_s" in out:
        w = {k: v["median"] for k, v in out["workload_tokens_per_s"].items()}
        print(f"| workload, output tok/s (higher is better) | {w['before']:.0f} | {w['after']:.0f} | "
              f"{w['after'] / w['before']:.2f}× | {w['generate']:.0f} (batch {args.hf_batch}) |")
    if args.profile:
        out["profile"] = {k: profile_decode(llm, *make_workload(eng, s)) for k, llm in engines.items()}
    name = args.model if args.model in ("default", "135m") else Path(args.model).name
    (HERE / f"before_after_{name}.json").write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
