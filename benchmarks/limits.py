"""The physical limits of this machine, and how close minillm's batch-1 decode gets to them.

A batch-1 decode step must read every weight once (and the context's keys and values), so
its time can never be below ``(weight bytes + KV bytes per token) / memory bandwidth``: that
is the *decode floor*. This script measures

* memory read bandwidth (a reduction over a tensor far larger than the caches) and copy
  bandwidth, at 1 thread and at every usable core;
* fp32 (on CUDA: the run's dtype) GEMM FLOP/s;
* per model: the bytes one decode token reads, the floor at each thread count, minillm's
  measured batch-1 TPOT and its fraction of the floor (floor / TPOT), optionally next to
  ``generate()``.

    python benchmarks/limits.py                        # shipped model, CPU, writes limits_<device>.json
    python benchmarks/limits.py --model 135m --generate
    python benchmarks/limits.py --device cuda --dtype bfloat16 --model 135m --generate   # (scripts/gpu_check.sh)

The machine this was written on is shared: the load average is recorded with every result.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best(fn, device, repeats=5):
    """Best of ``repeats`` timings (the least disturbed run on a shared machine), synchronised."""
    fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return min(times)


def memory_bandwidth(device, nbytes=512 << 20):
    """(read GB/s, copy GB/s): a sum over ``nbytes`` of float32, and a copy of half of it
    (each copied byte is read once and written once)."""
    if device.type == "cpu":  # in 2 MB pages where the system allows, as the engine's weights are
        from minillm.fast import huge_pages

        x = huge_pages.zeros((nbytes // 4,), torch.float32, device).uniform_()
    else:
        x = torch.ones(nbytes // 4, device=device)
    read = nbytes / _best(lambda: x.sum(), device) / 1e9
    src = x[: x.numel() // 2]
    dst = torch.empty_like(src)
    copy = 2 * src.numel() * 4 / _best(lambda: dst.copy_(src), device) / 1e9
    return read, copy  # x, src and dst are freed when this returns


def gemm_flops(device, dtype, n=2048):
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    return 2 * n ** 3 / _best(lambda: a @ b, device, repeats=3) / 1e9  # GFLOP/s


def decode_bytes(llm, context: int) -> tuple[int, int]:
    """(weight bytes, KV bytes) one decode token reads at ``context`` tokens. The embedding
    table is read one row at a time, unless it is also the (tied) output projection."""
    from minillm.models.weights import weight_bytes  # counts int8 projections too (weight_dtype="int8")

    model = llm.model
    weights = weight_bytes(model)["total"]
    embed, head = model.model.embed_tokens.weight, getattr(model.lm_head, "weight", None)
    if head is None or embed.data_ptr() != head.data_ptr():
        weights -= embed.numel() * embed.element_size()
    cfg = llm.model_config
    kv = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * llm.kv_cache.k[0].element_size() * context
    return weights, kv


def minillm_tpot(llm, prompt_len: int, new_tokens: int) -> float:
    """Median decode step time of one request (a random prompt of ``prompt_len`` ids)."""
    from minillm import SamplingParams

    g = torch.Generator().manual_seed(prompt_len)
    ids = torch.randint(3, llm.model_config.vocab_size, (prompt_len,), generator=g).tolist()
    times = []
    for _ in range(2):  # the first run warms up
        req = llm.add_request(prompt_token_ids=ids, params=SamplingParams(max_tokens=new_tokens, temperature=0,
                                                                          ignore_eos=True))
        llm.step()  # prefill
        times = []
        while req.is_live:
            _sync(llm.device)
            t0 = time.perf_counter()
            llm.step()
            _sync(llm.device)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def generate_tpot(llm, hf, prompt_len: int, new_tokens: int) -> float:
    """generate()'s median gap between output tokens (a streamer notes when each arrives)."""
    g = torch.Generator().manual_seed(prompt_len)
    ids = torch.randint(3, llm.model_config.vocab_size, (1, prompt_len), generator=g).to(llm.device)

    class Marks:
        def __init__(self):
            self.times = []

        def put(self, value):
            _sync(llm.device)
            self.times.append(time.perf_counter())

        def end(self):
            pass

    gaps = []
    with torch.inference_mode():
        for _ in range(2):  # the first run warms up
            marks = Marks()
            hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                        min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, streamer=marks)
            gaps = [b - a for a, b in zip(marks.times[1:], marks.times[2:])]  # put 0 is the prompt
    return statistics.median(gaps)


def model_path(name: str, workdir: Path) -> tuple[str, Path]:
    from minillm.apps.bench.models import build_random_llama
    from minillm.models import DEFAULT_MODEL_DIR

    if name == "default":
        return "default (stories-3m)", DEFAULT_MODEL_DIR
    if name == "135m":
        return "135m (SmolLM-135M shape, random)", build_random_llama(workdir / "smollm-135m-shape")
    return Path(name).name, Path(name)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default=None, help="engine dtype (default: dtype='auto', float32 on CPU, bfloat16 on CUDA, float16 where bf16 is not native)")
    ap.add_argument("--model", action="append", help="default, 135m or a folder (repeatable; default: default)")
    ap.add_argument("--prompt", type=int, default=128, help="prompt tokens before the timed decode")
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--threads", default=None, help="comma-separated CPU thread counts (default: 1 and all usable)")
    ap.add_argument("--generate", action="store_true", help="also time transformers generate() (batch 1)")
    ap.add_argument("--out", default=None, help="JSON file (default benchmarks/limits_<device>.json)")
    args = ap.parse_args(argv)
    from minillm import LLM
    from minillm.engine_args import auto_dtype, usable_cores

    device = torch.device(args.device)
    dtype = args.dtype or str(auto_dtype(device)).removeprefix("torch.")  # what LLM(dtype="auto") runs
    torch_dtype = getattr(torch, dtype)
    cores = usable_cores()
    threads = ([int(t) for t in args.threads.split(",")] if args.threads
               else sorted({1, cores}) if device.type == "cpu" else [torch.get_num_threads()])
    before = torch.get_num_threads()
    result = {"device": str(device), "dtype": dtype, "usable_cores": cores, "torch": torch.__version__,
              "load_average_start": os.getloadavg(), "machine": {}, "models": []}
    if device.type == "cuda":
        result["gpu"] = torch.cuda.get_device_name(device)
    try:
        for t in threads:
            torch.set_num_threads(t)
            read, copy = memory_bandwidth(device)
            flops = gemm_flops(device, torch.float32 if device.type == "cpu" else torch_dtype)
            result["machine"][str(t)] = {"read_GBps": round(read, 1), "copy_GBps": round(copy, 1),
                                         "gemm_GFLOPs": round(flops, 1)}
            print(f"{t} thread(s): read {read:.1f} GB/s, copy {copy:.1f} GB/s, GEMM {flops:.1f} GFLOP/s", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            for name in args.model or ["default"]:
                label, path = model_path(name, Path(tmp))
                entry = {"model": label, "prompt": args.prompt, "new_tokens": args.new_tokens, "threads": {}}
                for t in threads:
                    llm = LLM(str(path), device=str(device), dtype=dtype, enable_prefix_caching=False,
                              kv_cache_tokens=4 * (args.prompt + args.new_tokens + 16), max_num_seqs=4,
                              num_threads=t if device.type == "cpu" else None)
                    weights, kv = decode_bytes(llm, args.prompt + args.new_tokens // 2)
                    bw = result["machine"][str(t)]["read_GBps"] * 1e9
                    floor = (weights + kv) / bw
                    tpot = minillm_tpot(llm, args.prompt, args.new_tokens)
                    row = {"weight_MB": round(weights / 1e6, 1), "kv_MB_per_token": round(kv / 1e6, 3),
                           "floor_ms": round(floor * 1e3, 3), "minillm_tpot_ms": round(tpot * 1e3, 3),
                           "minillm_fraction_of_floor": round(floor / tpot, 3),
                           "minillm_tokens_per_s": round(1 / tpot, 1)}
                    if args.generate:
                        from transformers import AutoModelForCausalLM

                        hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=llm.dtype).to(device).eval()
                        hf.generation_config.eos_token_id = None
                        g = generate_tpot(llm, hf, args.prompt, args.new_tokens)
                        row.update(generate_tpot_ms=round(g * 1e3, 3), generate_fraction_of_floor=round(floor / g, 3))
                        del hf
                    entry["threads"][str(t)] = row
                    print(f"[{label}] {t} thread(s): {row}", flush=True)
                    del llm
                result["models"].append(entry)
    finally:
        torch.set_num_threads(before)
    result["load_average_end"] = os.getloadavg()
    out = Path(args.out) if args.out else HERE / f"limits_{device.type}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
