"""Few-row projections: which way of computing ``x @ W.T`` streams the weights fastest.

A batch-1 decode step is a chain of matrix-vector products, so its speed is how fast the
weights come out of memory. This measures, for the projection shapes of SmolLM2-135M (576→960
q/k/v, 576→576 o, 576→3072 gate/up, 1536→576 down, 576→49152 lm head) and of the shipped model
(read from its config.json), at batch 1, 4 and 32 and at 1 and 2 threads:

* ``F.linear``      the readable reference: weight ``[out, in]`` contiguous (today's layout);
* ``transposed``    the same ``F.linear`` call on a weight stored ``[in, out]`` (a ``.t()``
                    view), i.e. ``torch.mm(x, Wt)`` against a contiguous transposed weight;
* ``mv``            (batch 1 only) ``torch.mv(W, x)``: the matrix-vector call itself;
* ``mkldnn``        oneDNN's prepacked linear (``_reorder_linear_weight`` for the batch size,
                    then ``_linear_pointwise``);
* ``mkldnn_linear`` ``torch._C._nn.mkldnn_linear`` on oneDNN tensors (the input converted
                    each call, as a model would have to);
* ``rowsplit``      (2+ threads) ``minillm.fast.threaded.RowSplitLinear``: the output rows
                    cut into one shard per thread, each computed by its own persistent thread
                    running torch with one intra-op thread (the engine's ``row_split``);
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

A matmul alone does not show the per-call hand-off cost, so ``--step`` also times whole
SmolLM2-135M decode steps (batch 1, ``weight_options.one_round``) for: 1 thread; N torch
threads; N threads with the row split. Variants alternate within each round; greedy tokens
must be identical; medians over rounds, with the load average (2 threads on a 2-core machine
that other jobs share are at the mercy of the scheduler: read the load next to the numbers).

    python benchmarks/linear_paths.py                # writes benchmarks/linear_paths.json
    python benchmarks/linear_paths.py --rounds 3 --threads 1 --stream-mb 128
    python benchmarks/linear_paths.py --step --rounds 7   # writes benchmarks/linear_paths_step.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
SMOLLM2 = dict(hidden=576, heads=9, kv_heads=3, head_dim=64, intermediate=1536, vocab=49152)
EXACT = ("F.linear", "transposed", "mv", "mkldnn", "mkldnn_linear", "rowsplit")
PATHS = EXACT + ("bf16", "int8")


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
        from minillm.fast.threaded import RowSplitLinear, ShardPool

        g = torch.Generator().manual_seed(k * 7919 + n)
        self.ws = [torch.randn(n, k, generator=g) / k ** 0.5 for _ in range(copies)]
        self.wts = [w.t().contiguous().t() for w in self.ws]  # [out, in] views of [in, out] storage
        self.packed = [torch.ops.mkldnn._reorder_linear_weight(w, batch) for w in self.ws]
        self.onednn = [w.to_mkldnn() for w in self.ws]
        self.bf16 = [w.bfloat16() for w in self.ws]
        self.int8 = []
        for w in self.ws:
            lin = torch.nn.Linear(k, n, bias=False)
            lin.weight.data = w
            self.int8.append(torch.ao.nn.quantized.dynamic.Linear.from_float(
                _with_qconfig(lin)))
        self.batch, self.threads = batch, threads
        self.pool = ShardPool(threads) if threads >= 2 else None
        self.split = []
        for w in self.ws if self.pool is not None else ():
            lin = torch.nn.Linear(k, n, bias=False)
            lin.weight = torch.nn.Parameter(w, requires_grad=False)
            self.split.append(RowSplitLinear(lin, self.pool, max_rows=max(batch, 1)))
        self.bytes = {p: 4 for p in EXACT} | {"bf16": 2, "int8": 1}

    def names(self):
        return [p for p in PATHS if (p != "rowsplit" or self.pool is not None) and (p != "mv" or self.batch == 1)]

    def run(self, name: str, x: torch.Tensor, i: int) -> torch.Tensor:
        if name == "F.linear":
            return F.linear(x, self.ws[i])
        if name == "transposed":
            return F.linear(x, self.wts[i])
        if name == "mv":
            return torch.mv(self.ws[i], x[0]).unsqueeze(0)
        if name == "mkldnn":
            return torch.ops.mkldnn._linear_pointwise(x, self.packed[i], None, "none", [], "")
        if name == "mkldnn_linear":
            return torch._C._nn.mkldnn_linear(x.to_mkldnn(), self.onednn[i]).to_dense()
        if name == "bf16":
            return F.linear(x.bfloat16(), self.bf16[i]).float()
        if name == "int8":
            return self.int8[i](x)
        if name == "rowsplit":
            return self.split[i](x)
        raise ValueError(name)

    def close(self):
        if self.pool is not None:
            self.pool.close()


def _with_qconfig(lin):
    lin.qconfig = torch.ao.quantization.default_dynamic_qconfig
    return lin


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
    for _ in range(rounds):
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
    ap.add_argument("--out", default=None, help="default: benchmarks/linear_paths.json (linear_paths_step.json with --step)")
    ap.add_argument("--step", action="store_true", help="time whole SmolLM2 decode steps instead of single matmuls")
    ap.add_argument("--model", default=None, help="with --step: the model folder (default: SmolLM2-135M float32)")
    ap.add_argument("--prompt", type=int, default=128, help="with --step: prompt tokens")
    ap.add_argument("--new-tokens", type=int, default=32, help="with --step: decode steps per sample")
    args = ap.parse_args(argv)
    import warnings

    warnings.filterwarnings("ignore")
    if args.step:
        return step_main(args)
    args.out = args.out or str(HERE / "linear_paths.json")
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
                        row = {"model": model, "proj": proj, "in": k, "out": n, "batch": batch, "threads": threads,
                               "copies": copies, "paths": measure(k, n, copies, batch, threads, args)}
                        result["rows"].append(row)
                        print(model, proj, f"{k}->{n}", f"b{batch}", f"t{threads}",
                              {p: (v["GBps_fp32_equiv"], v["speedup_vs_F.linear"]) for p, v in row["paths"].items()},
                              flush=True)
    finally:
        torch.set_num_threads(before)
    result["load_average_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", args.out)
    return 0


@torch.inference_mode()
def measure(k: int, n: int, copies: int, batch: int, threads: int, args) -> dict:
    """Each path's median time, GB/s and error for one shape, batch and thread count."""
    paths = Paths(k, n, copies, batch, threads)
    try:
        x = torch.randn(batch, k, generator=torch.Generator().manual_seed(batch))
        errors = check(paths, x)
        reps = max(1, (args.sample_mb << 20) // (copies * k * n * 4))
        times = time_paths(paths, x, args.rounds, reps)
    finally:
        paths.close()
    fp32_bytes = copies * k * n * 4
    base = statistics.median(times["F.linear"])
    out = {}
    for p, ts in times.items():
        med = statistics.median(ts)
        out[p] = {"median_ms": round(med * 1e3 / copies, 4), "GBps_fp32_equiv": round(fp32_bytes / med / 1e9, 2),
                  "bytes_GBps": round(fp32_bytes * paths.bytes[p] / 4 / med / 1e9, 2),
                  "speedup_vs_F.linear": round(base / med, 3), "rel_error": float(f"{errors[p]:.3g}")}
    return out


STEP_VARIANTS = ("1 thread", "torch threads", "row split")


def step_main(args) -> int:
    """Whole decode steps of one request: 1 thread vs N torch threads vs N threads row-split,
    alternating on one engine, tokens checked identical."""
    sys.path.insert(0, str(HERE))
    from weight_options import one_round, smollm2_path

    from minillm import LLM
    from minillm.fast.threaded import use_row_split

    path = args.model or smollm2_path()
    if not Path(path).exists():
        print(f"{path} is absent (bash scripts/fetch_test_models.sh)")
        return 1
    out = Path(args.out or HERE / "linear_paths_step.json")
    limits = json.loads((HERE / "limits_cpu.json").read_text()) if (HERE / "limits_cpu.json").exists() else {}
    llm = LLM(path, device="cpu", dtype="float32", kv_cache_tokens=4096, row_split=False)
    weight_bytes = sum(p.numel() * p.element_size() for p in {p.data_ptr(): p for p in llm.model.parameters()}.values())
    ids = [(i * 7919) % (llm.model_config.vocab_size - 10) + 5 for i in range(args.prompt)]
    result = {"torch": torch.__version__, "model": str(path), "prompt": args.prompt, "new_tokens": args.new_tokens,
              "rounds": args.rounds, "weight_MB": round(weight_bytes / 1e6, 1),
              "load_average_start": os.getloadavg(), "threads": {}}
    before = torch.get_num_threads()
    try:
        for threads in [int(t) for t in args.threads.split(",") if int(t) >= 2]:
            variants = {v: [] for v in STEP_VARIANTS}
            tokens, loads = {}, []
            handoffs = {"calls": 0, "helped": 0, "backups": 0}  # split calls; pieces a worker took; late ones redone
            for r in range(args.rounds):
                order = list(STEP_VARIANTS[r % 3:] + STEP_VARIANTS[:r % 3])  # rotate who goes first
                for v in order:
                    pool = use_row_split(llm.model, threads) if v == "row split" else None
                    torch.set_num_threads(1 if v == "1 thread" else threads)
                    try:
                        tpot, toks = one_round(llm, ids, args.new_tokens)
                    finally:
                        if pool is not None:
                            for key in handoffs:
                                handoffs[key] += getattr(pool, key)
                            use_row_split(llm.model, None)
                    variants[v].append(tpot * 1e3)
                    tokens[v] = toks
                loads.append(os.getloadavg()[0])
                print(f"t{threads} round {r}", {v: round(ts[-1], 1) for v, ts in variants.items()},
                      f"load {loads[-1]:.2f}", flush=True)
            base = statistics.median(variants["1 thread"])
            row = {"tokens_identical": all(t == tokens["1 thread"] for t in tokens.values()),
                   "load_1min_per_round": [round(x, 2) for x in loads], "row_split_handoffs": handoffs,
                   "variants": {}}
            for v, ts in variants.items():
                med = statistics.median(ts)
                n = 1 if v == "1 thread" else threads
                bw = limits.get("machine", {}).get(str(n), {}).get("read_GBps")
                row["variants"][v] = {
                    "threads": n, "tpot_ms_median": round(med, 2), "tpot_ms_min": round(min(ts), 2),
                    "tpot_ms_max": round(max(ts), 2), "speedup_vs_1_thread": round(base / med, 3),
                    "weights_GBps": round(weight_bytes / med / 1e6, 2),
                    "fraction_of_floor": None if bw is None else round(weight_bytes / (bw * 1e9) / (med / 1e3), 3)}
            result["threads"][str(threads)] = row
    finally:
        torch.set_num_threads(before)
    result["load_average_end"] = os.getloadavg()
    out.write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
