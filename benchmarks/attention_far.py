"""Batch-1 decode attention reading a far KV pool, one kernel source against another.

A decode step streams every weight between two visits of a layer's KV blocks, so attention finds
its keys and values in memory, not in cache, and scattered in blocks the hardware prefetcher
cannot follow. ``attention_far.c`` reproduces that (SmolLM2-135M's heads, 30 layers, 17 MB read
between two layers' calls) and times only the attention calls. This builds it against the
working tree's ``minillm/fast/kernels/paged_decode.c`` and against the same file at a git
revision, runs the two builds alternately, and reports medians with the read bandwidth measured in
the same run; equal checksums mean equal outputs.

    python benchmarks/attention_far.py --against a103560 --rounds 5 --out benchmarks/attention_far.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from minillm.apps.bench.harness import machine_info, read_bandwidth

ROOT = Path(__file__).resolve().parent.parent
KERNELS = "minillm/fast/kernels"
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fno-math-errno"]


def build(name: str, folder: Path, rev: str | None) -> Path:
    """The harness linked with paged_decode.c (and vec.h) from the tree, or from ``rev``."""
    src = folder / name
    src.mkdir()
    for f in ("paged_decode.c", "vec.h"):
        text = ((ROOT / KERNELS / f).read_text() if rev is None else
                subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{KERNELS}/{f}"], check=True,
                               capture_output=True, text=True).stdout)
        (src / f).write_text(text)
    exe = folder / f"{name}.bin"
    subprocess.run(["gcc", *FLAGS, "-o", str(exe), str(ROOT / "benchmarks" / "attention_far.c"),
                    str(src / "paged_decode.c"), f"-I{src}", "-lm"], check=True)
    return exe


def run(exe: Path, length: int, rows: int, threads: int, rounds: int) -> dict:
    """One run of a build: its timings, checksum, and the whole process's CPU and wall seconds (set-up
    included: CPU well under wall means the core was shared)."""
    cpu0, wall0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    out = subprocess.run([str(exe), str(length), str(rounds), str(threads), str(rows)], check=True,
                         capture_output=True, text=True).stdout.split()
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"median_ms": float(out[2]), "min_ms": float(out[3]), "checksum": out[4],
            "cpu_s": cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime,
            "wall_s": time.perf_counter() - wall0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--against", required=True, help="git revision whose paged_decode.c is the baseline")
    ap.add_argument("--rounds", type=int, default=5, help="alternating rounds (each: 9 timed passes a build)")
    ap.add_argument("--lengths", default="128,512,1024")
    ap.add_argument("--rows", default="1,4", help="decode rows (batch sizes)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    import torch

    cases = [(int(n), int(r)) for r in args.rows.split(",") for n in args.lengths.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        exes = {"tree": build("tree", Path(tmp), None), args.against: build("base", Path(tmp), args.against)}
        got = {name: {c: [] for c in cases} for name in exes}
        sums = {name: {} for name in exes}
        clock = {name: [0.0, 0.0] for name in exes}  # CPU and wall seconds of the build's runs
        bandwidth = []
        for r in range(args.rounds):
            bandwidth.append(read_bandwidth(args.threads))
            for name in (list(exes) if r % 2 == 0 else list(exes)[::-1]):
                for c in cases:
                    m = run(exes[name], *c, args.threads, 9)
                    got[name][c].append(m["median_ms"])
                    sums[name][c] = m["checksum"]
                    clock[name][0] += m["cpu_s"]
                    clock[name][1] += m["wall_s"]
    kv_bytes = lambda n, rows: 30 * n * rows * 3 * 64 * 4 * 2  # noqa: E731 (keys and values, 30 layers)
    result = {"machine": machine_info(torch.device("cpu")), "threads": args.threads, "against": args.against,
              "read_bandwidth_gb_s": bandwidth, "load_average_end": os.getloadavg(),
              "cpu_wall_s": clock, "cases": []}
    print(f"read bandwidth {min(bandwidth):.1f}-{max(bandwidth):.1f} GB/s; CPU / wall s of the runs: " +
          ", ".join(f"{n} {c:.1f} / {w:.1f}" for n, (c, w) in clock.items()) + "; ms for 30 layers' attention (GB/s)")
    for c in cases:
        row = {"context": c[0], "rows": c[1], "same_outputs": len({sums[n][c] for n in exes}) == 1}
        for name in exes:
            ms = statistics.median(got[name][c])
            row[name] = {"median_ms": ms, "rounds_ms": got[name][c], "gb_s": kv_bytes(*c) / ms / 1e6}
        result["cases"].append(row)
        print(f"context {c[0]:5d} rows {c[1]}: " + "  ".join(
            f"{name} {row[name]['median_ms']:.3f} ({row[name]['gb_s']:.1f})" for name in exes)
            + ("" if row["same_outputs"] else "  OUTPUTS DIFFER"))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
