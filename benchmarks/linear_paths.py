"""Few-row projections: which way of computing ``x @ W.T`` streams the weights fastest.

A batch-1 decode step is a chain of matrix-vector products, so its speed is how fast the
weights come out of memory. This measures, for the projection shapes of SmolLM2-135M (576→960
q/k/v, 576→576 o, 576→3072 gate/up, 1536→576 down, 576→49152 lm head) and of the shipped model
(read from its config.json), at batch 1, 4 and 32 and at 1 and 2 threads:

* ``F.linear``      the readable reference: weight ``[out, in]`` contiguous (today's layout);
* ``transposed``    the same ``F.linear`` call on a weight stored ``[in, out]`` (a ``.t()``
                    view), i.e. ``torch.mm(x, Wt)`` against a contiguous transposed weight;
* ``mkldnn``        oneDNN's prepacked linear (``_reorder_linear_weight`` for the batch size,
                    then ``_linear_pointwise``);
* ``rowsplit``      (2 threads only) the output rows split in two halves, each computed by its
                    own Python thread running torch with one intra-op thread;
* ``bf16``          bfloat16 weights and activations (half the bytes; not exact);
* ``int8``          torch's dynamic quantized linear (int8 weights, per-output-channel scales;
                    activations quantized per batch on the fly; a quarter of the bytes; not exact).

GB/s is the fp32 weight bytes (out × in × 4) divided by the time, so a path that stores fewer
bytes can exceed the machine's bandwidth; ``bytes_GBps`` is what it really read. For
SmolLM2's shapes each path cycles through enough copies of the weight to stream
``--stream-mb`` MB (more than the caches, as the 538 MB model does); for the shipped model
it cycles through one copy per layer, as the real decode does (13.7 MB: it sits in cache).
Every path is first checked against a float64 product: the exact paths must agree with
``F.linear`` to fp32 rounding. Paths alternate within each round; medians over rounds.

    python benchmarks/linear_paths.py                # writes benchmarks/linear_paths.json
    python benchmarks/linear_paths.py --rounds 3 --threads 1 --stream-mb 128
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
SMOLLM2 = dict(hidden=576, heads=9, kv_heads=3, head_dim=64, intermediate=1536, vocab=49152)
EXACT = ("F.linear", "transposed", "mkldnn", "rowsplit")


def model_shapes(hidden, heads, kv_heads, head_dim, intermediate, vocab) -> dict[str, tuple[int, int]]:
    """(in, out) of each projection of one decoder layer, and the lm head."""
    return {"qkv": (hidden, (heads + 2 * kv_heads) * head_dim), "o": (heads * head_dim, hidden),
            "gate_up": (hidden, 2 * intermediate), "down": (intermediate, hidden), "lm_head": (hidden, vocab)}


def shipped_shapes():
    from minillm.models import DEFAULT_MODEL_DIR

    c = json.loads((Path(DEFAULT_MODEL_DIR) / "config.json").read_text())
    hd = c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]
    return model_shapes(c["hidden_size"], c["num_attention_heads"], c["num_key_value_heads"], hd,
                        c["intermediate_size"], c["vocab_size"]), c["num_hidden_layers"]


class Paths:
    """Every path's weights for ``copies`` random [out, in] matrices, and one call per path."""

    def __init__(self, k: int, n: int, copies: int, batch: int, threads: int):
        g = torch.Generator().manual_seed(k * 7919 + n)
        self.ws = [torch.randn(n, k, generator=g) / k ** 0.5 for _ in range(copies)]
        self.wts = [w.t().contiguous().t() for w in self.ws]  # [out, in] views of [in, out] storage
        self.packed = [torch.ops.mkldnn._reorder_linear_weight(w, batch) for w in self.ws]
        self.bf16 = [w.bfloat16() for w in self.ws]
        self.int8 = []
        for w in self.ws:
            lin = torch.nn.Linear(k, n, bias=False)
            lin.weight.data = w
            self.int8.append(torch.ao.nn.quantized.dynamic.Linear.from_float(
                _with_qconfig(lin)))
        self.halves = [(w[: n // 2].contiguous(), w[n // 2:].contiguous()) for w in self.ws]
        self.threads = threads
        self.pool = ThreadPoolExecutor(2) if threads == 2 else None
        self.bytes = {"F.linear": 4, "transposed": 4, "mkldnn": 4, "rowsplit": 4, "bf16": 2, "int8": 1}

    def names(self):
        return [p for p in ("F.linear", "transposed", "mkldnn", "rowsplit", "bf16", "int8")
                if p != "rowsplit" or self.pool is not None]

    def run(self, name: str, x: torch.Tensor, i: int) -> torch.Tensor:
        if name == "F.linear":
            return F.linear(x, self.ws[i])
        if name == "transposed":
            return F.linear(x, self.wts[i])
        if name == "mkldnn":
            return torch.ops.mkldnn._linear_pointwise(x, self.packed[i], None, "none", [], "")
        if name == "bf16":
            return F.linear(x.bfloat16(), self.bf16[i]).float()
        if name == "int8":
            return self.int8[i](x)
        if name == "rowsplit":
            a, b = self.halves[i]
            fa = self.pool.submit(_one_thread_linear, x, a)
            return torch.cat((_one_thread_linear(x, b), fa.result())[::-1], dim=-1)
        raise ValueError(name)

    def close(self):
        if self.pool is not None:
            self.pool.shutdown()


def _with_qconfig(lin):
    lin.qconfig = torch.ao.quantization.default_dynamic_qconfig
    return lin


def _one_thread_linear(x, w):
    torch.set_num_threads(1)  # this Python thread's torch runs its share alone
    return F.linear(x, w)


def check(paths: Paths, x: torch.Tensor) -> dict[str, float]:
    """Max |error| of each path against a float64 product, relative to the output's max."""
    ref = F.linear(x.double(), paths.ws[0].double())
    scale = ref.abs().max().item()
    return {p: (paths.run(p, x, 0).double() - ref).abs().max().item() / scale for p in paths.names()}


def time_paths(paths: Paths, x: torch.Tensor, rounds: int, reps: int) -> dict[str, list[float]]:
    """Seconds per pass over every copy (``reps`` passes per sample, so a sample is long
    enough to time on a busy machine)."""
    times = {p: [] for p in paths.names()}
    order = paths.names()
    for p in order:  # warm-up
        for i in range(len(paths.ws)):
            paths.run(p, x, i)
    for r in range(rounds):
        order = order[1:] + order[:1]  # rotate which path goes first
        for p in order:
            torch.set_num_threads(paths.threads)
            t0 = time.perf_counter()
            for _ in range(reps):
                for i in range(len(paths.ws)):
                    paths.run(p, x, i)
            times[p].append((time.perf_counter() - t0) / reps)
    torch.set_num_threads(paths.threads)
    return times


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batches", default="1,4,32")
    ap.add_argument("--stream-mb", type=int, default=384, help="MB of fp32 weight streamed per SmolLM2 shape")
    ap.add_argument("--sample-mb", type=int, default=48, help="fp32 weight MB per timed sample (passes repeat)")
    ap.add_argument("--models", default="smollm2,shipped")
    ap.add_argument("--out", default=str(HERE / "linear_paths.json"))
    args = ap.parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore")
    limits = json.loads((HERE / "limits_cpu.json").read_text()) if (HERE / "limits_cpu.json").exists() else {}
    result = {"torch": torch.__version__, "load_average_start": os.getloadavg(), "rounds": args.rounds,
              "bandwidth_GBps_from_limits": {t: m["read_GBps"] for t, m in limits.get("machine", {}).items()},
              "rows": []}
    ship, ship_layers = shipped_shapes()
    models = {"smollm2": (model_shapes(**SMOLLM2), None), "shipped": (ship, ship_layers)}
    before = torch.get_num_threads()
    try:
        for threads in [int(t) for t in args.threads.split(",")]:
            torch.set_num_threads(threads)
            for model in args.models.split(","):
                shapes, layers = models[model]
                for proj, (k, n) in shapes.items():
                    copies = (1 if proj == "lm_head" else layers) if layers else \
                        max(1, (args.stream_mb << 20) // (k * n * 4))
                    for batch in [int(b) for b in args.batches.split(",")]:
                        paths = Paths(k, n, copies, batch, threads)
                        x = torch.randn(batch, k, generator=torch.Generator().manual_seed(batch))
                        errors = check(paths, x)
                        reps = max(1, (args.sample_mb << 20) // (copies * k * n * 4))
                        times = time_paths(paths, x, args.rounds, reps)
                        paths.close()
                        fp32_bytes = copies * k * n * 4
                        row = {"model": model, "proj": proj, "in": k, "out": n, "batch": batch, "threads": threads,
                               "copies": copies, "paths": {}}
                        base = statistics.median(times["F.linear"])
                        for p, ts in times.items():
                            med = statistics.median(ts)
                            row["paths"][p] = {"median_ms": round(med * 1e3 / copies, 4),
                                               "GBps_fp32_equiv": round(fp32_bytes / med / 1e9, 2),
                                               "bytes_GBps": round(fp32_bytes * paths.bytes[p] / 4 / med / 1e9, 2),
                                               "speedup_vs_F.linear": round(base / med, 3),
                                               "rel_error": float(f"{errors[p]:.3g}")}
                        result["rows"].append(row)
                        print(model, proj, f"{k}->{n}", f"b{batch}", f"t{threads}",
                              {p: (v["GBps_fp32_equiv"], v["speedup_vs_F.linear"]) for p, v in row["paths"].items()},
                              flush=True)
                        del paths
    finally:
        torch.set_num_threads(before)
    result["load_average_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
