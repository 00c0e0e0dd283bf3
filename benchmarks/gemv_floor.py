"""How close decode's projections come to the weight-streaming floor, per layer kind.

A batch-1 decode step reads every weight once, so no kernel can beat ``weight bytes / read
bandwidth``. This measures that fraction for each projection kind of SmolLM2-135M (qkv, o,
gate_up, down: 30 layers' worth of weights each, so they come from memory, not cache; the lm
head once) with ``minillm.fast.gemv`` and with torch's ``F.linear`` (float32), and the int8
kernel against torch's dynamic int8 linear, at 1 and 2 threads, the read bandwidth measured in
the same rounds (``harness.read_bandwidth``). Then, when the SmolLM2 GGUF is there
(``scripts/fetch_test_models.sh``), the engine's batch-1 TPOT with the kernel and without
(``stream_weights(model, False)``), alternating, with CPU time per token and greedy tokens
compared.

Engines and kernels alternate round by round; medians. On a shared machine read the load
averages and the CPU time beside the wall time.

    python benchmarks/gemv_floor.py --rounds 5 --out benchmarks/gemv_floor.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from minillm.apps.bench.harness import machine_info, read_bandwidth
from minillm.fast import gemv, huge_pages

HIDDEN, QKV, INTER, VOCAB, LAYERS = 576, 960, 1536, 49152, 30  # SmolLM2-135M
KINDS = {"qkv": (QKV, HIDDEN, LAYERS), "o": (HIDDEN, HIDDEN, LAYERS), "gate_up": (2 * INTER, HIDDEN, LAYERS),
         "down": (HIDDEN, INTER, LAYERS), "lm_head": (VOCAB, HIDDEN, 1)}
GGUF = Path.home() / ".cache" / "minillm" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def timed(fn):
    """(wall seconds, process CPU seconds) of one call."""
    w0, c0 = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w0, time.process_time() - c0


def kind_paths(kind: str, threads: int, rows: int):
    """{path: fn} for one layer kind: every copy's product once per call."""
    n, k, copies = KINDS[kind]
    g = torch.Generator().manual_seed(len(kind))
    ws = [torch.randn(n, k, generator=g) * 0.05 for _ in range(copies)]
    x = torch.randn(rows, k, generator=g)
    qs = [torch.randint(-63, 64, (n, k), dtype=torch.int8, generator=g) for _ in range(copies)]
    scale = torch.rand(n, generator=g) * 0.01
    with _quiet():
        packed = [torch.ops.quantized.linear_prepack(
            torch.quantize_per_channel(q.float() * scale[:, None], scale.double(), torch.zeros(n, dtype=torch.long),
                                       0, torch.qint8), None) for q in qs]
    # the weights in 2 MB pages where the system allows, as the engine's fast layer keeps them
    # (``minillm.fast.huge_pages.rehome``; the read probe's buffer is in them too)
    held = torch.nn.ParameterList([torch.nn.Parameter(t, requires_grad=False) for t in ws + qs])
    huge_pages.rehome(held)
    ws, qs = [p.data for p in held[:copies]], [p.data for p in held[copies:]]
    assert torch.allclose(gemv.linear(x, ws[0], threads=threads), F.linear(x, ws[0]), rtol=1e-4, atol=1e-4)
    return {
        "kernel f32": lambda: [gemv.linear(x, w, threads=threads) for w in ws],
        "F.linear f32": lambda: [F.linear(x, w) for w in ws],
        "kernel int8": lambda: [gemv.linear_int8(x, q, scale, threads=threads) for q in qs],
        "torch int8": lambda: [torch.ops.quantized.linear_dynamic(x, p, False) for p in packed],
    }, n * k * copies


class _quiet:
    def __enter__(self):
        import warnings
        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc):
        self._w.__exit__(*exc)


def layer_floor(rounds: int, threads_list, rows: int) -> list[dict]:
    out = []
    for threads in threads_list:
        torch.set_num_threads(threads)
        for kind in KINDS:
            paths, weights = kind_paths(kind, threads, rows)
            for fn in paths.values():
                fn()  # warm
            runs = {name: [] for name in paths}
            bws = []
            for r in range(rounds):
                bws.append(read_bandwidth(threads, repeats=3))
                names = list(paths)
                for name in names[r % len(names):] + names[:r % len(names)]:  # rotate the order
                    runs[name].append(timed(paths[name]))
            bw = statistics.median(bws) * 1e9
            row = {"threads": threads, "kind": kind, "rows": rows, "weights": weights,
                   "read_GBps": round(bw / 1e9, 2), "read_GBps_rounds": [round(b, 2) for b in bws]}
            for name, ts in runs.items():
                wall = statistics.median(t[0] for t in ts)
                cpu = statistics.median(t[1] for t in ts)
                nbytes = weights * (1 if "int8" in name else 4)
                row[name] = {"ms": round(wall * 1e3, 3), "cpu_ms": round(cpu * 1e3, 3),
                             "floor_fraction": round(nbytes / bw / wall, 3),
                             "rounds_ms": [round(t[0] * 1e3, 3) for t in ts]}
            out.append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "read_GBps_rounds"}), flush=True)
    return out


def engine_tpot(rounds: int, threads_list, prompt_len: int, new_tokens: int, weight_dtype) -> list[dict]:
    from minillm import LLM, SamplingParams
    from minillm.models.weights import stream_weights

    out = []
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    prompt = [(i * 37) % 40000 + 100 for i in range(prompt_len)]
    for threads in threads_list:
        llm = LLM(str(GGUF), device="cpu", dtype="float32", enable_prefix_caching=False, num_threads=threads,
                  weight_dtype=weight_dtype)

        def run(on: bool, llm=llm):
            stream_weights(llm.model, on)  # float32 or int8; off: torch's kernels and threads
            req = llm.add_request(prompt_token_ids=prompt, params=params)
            llm.step()  # the prefill and the first token
            w, c = time.perf_counter(), time.process_time()
            while llm.has_unfinished():
                llm.step()
            n = len(req.output_token_ids) - 1
            return (time.perf_counter() - w) / n * 1e3, (time.process_time() - c) / n * 1e3, req.output_token_ids

        run(True), run(False)
        res = {True: [], False: []}
        tokens = {}
        load0 = os.getloadavg()
        for r in range(rounds):
            for on in ((True, False) if r % 2 == 0 else (False, True)):
                wall, cpu, toks = run(on)
                res[on].append((wall, cpu))
                tokens[on] = toks
        row = {"threads": threads, "weight_dtype": weight_dtype or "float32", "prompt": prompt_len,
               "new_tokens": new_tokens, "load_average": [list(load0), list(os.getloadavg())],
               "tokens_identical": tokens[True] == tokens[False]}
        for on, name in ((True, "kernel"), (False, "torch")):
            row[name] = {"tpot_ms": round(statistics.median(x[0] for x in res[on]), 2),
                         "cpu_ms_per_token": round(statistics.median(x[1] for x in res[on]), 2),
                         "rounds_ms": [round(x[0], 2) for x in res[on]]}
        out.append(row)
        print(json.dumps(row), flush=True)
        del llm
    return out


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rows", type=int, default=1, help="activation rows (decode batch) for the layer table")
    ap.add_argument("--tpot-rounds", type=int, default=3, help="0 skips the engine's batch-1 TPOT")
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--int8", action="store_true", help="also the engine's TPOT with weight_dtype='int8'")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    threads = [int(t) for t in args.threads.split(",")]
    info = machine_info(torch.device("cpu"))
    info["gemv_isa"] = gemv.isa()
    info["read_GBps_start"] = {str(t): round(read_bandwidth(t), 2) for t in threads}
    result = {"machine": info, "layers": layer_floor(args.rounds, threads, args.rows)}
    if args.tpot_rounds and GGUF.is_file():
        result["tpot"] = engine_tpot(args.tpot_rounds, threads, args.prompt, args.new_tokens, None)
        if args.int8:
            result["tpot"] += engine_tpot(args.tpot_rounds, threads, args.prompt, args.new_tokens, "int8")
    info["read_GBps_end"] = {str(t): round(read_bandwidth(t), 2) for t in threads}
    info["load_average_end"] = [round(x, 2) for x in os.getloadavg()]
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
