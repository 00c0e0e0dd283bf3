"""Decode attention backends against each other: does reading the pool block by block pay?

    python benchmarks/attention_backends.py --rounds 5
    python benchmarks/attention_backends.py --model default --batch 32 --context 64,256 --rounds 3

Two measurements, each alternating the backends in rounds (which goes first alternates too),
medians and the ratio against the reference ``gather``:

* ``kernel``: one layer's decode attention alone (``backend.decode``, plus the benchmark-only
  ``online`` contender: an online softmax over block columns) on a pool filled with random K/V, B requests of the given context length, blocks of each request scattered over the
  pool (as after some churn); the model's head shape.
* ``step``: whole decode steps of an engine (``--step-model``, the shipped one by default),
  also with prompt lengths mixed from 16 to the longest context (where the reference's length
  groups save padding that the fixed-shape backend computes) (``LLM(attention_backend=...)``), B requests with
  prompts of the given length, median seconds of the decode-only steps.

1 thread (``OMP_NUM_THREADS=1`` is set for the process). Prints one JSON line per measurement
and a summary table; ``--json`` writes them to a file.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from minillm import LLM, SamplingParams  # noqa: E402
from minillm.attention import BACKENDS, DecodeMeta, PagedInPlace, make_backend  # noqa: E402
from minillm.models.llama import AttentionBatch, DecodeGroup  # noqa: E402

REFERENCE = "gather"


class OnlineSoftmaxBlocks(PagedInPlace):
    """Benchmark-only contender (kernel measurement): the copy-free way to read the pool on
    the CPU, one block column at a time (B blocks, one per row) folded into an online softmax
    (running max, denominator, weighted sum). Kept here so the README's number for it can be
    re-measured; the engine ships ``PagedInPlace``, which measured faster."""

    name = "online"

    def decode(self, q, k_pool, v_pool, batch, scale):
        meta = batch.decode_meta
        n, heads, dim = q.shape
        kv_heads, bs = k_pool.shape[2], k_pool.shape[1]
        mask = None if meta.mask is None else meta.mask.view(n, meta.width, 1, 1, bs)
        qd = (q * scale).view(n, kv_heads, heads // kv_heads, dim)
        run_max = qd.new_full((*qd.shape[:3], 1), float("-inf"))
        denom, acc = qd.new_zeros((*qd.shape[:3], 1)), torch.zeros_like(qd)
        for j in range(meta.width):  # column 0 is real for every row, so run_max is finite after it
            blocks = meta.block_tables[:, j]
            s = torch.matmul(qd, k_pool.index_select(0, blocks).permute(0, 2, 3, 1))   # [B, KVH, G, bs]
            if mask is not None:
                s = s + mask[:, j]
            new_max = torch.maximum(run_max, s.amax(-1, keepdim=True))
            p, correction = torch.exp(s - new_max), torch.exp(run_max - new_max)
            denom = denom * correction + p.sum(-1, keepdim=True)
            acc = acc * correction + torch.matmul(p, v_pool.index_select(0, blocks).transpose(1, 2))
            run_max = new_max
        return (acc / denom).view(n, heads * dim)


def kernel_case(batch: int, context: int, heads: int, kv_heads: int, head_dim: int, block_size: int, seed=0):
    """A pool and the per-backend batches for B decode rows of ``context`` tokens each."""
    g = torch.Generator().manual_seed(seed)
    width = -(-context // block_size)
    num_blocks = batch * width + 1
    k_pool = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    v_pool = torch.randn(num_blocks, block_size, kv_heads, head_dim, generator=g)
    perm = (torch.randperm(num_blocks - 1, generator=g) + 1).view(batch, width)
    q = torch.randn(batch, heads, head_dim, generator=g)
    offsets = torch.arange(block_size)
    slots = (perm.view(batch, width, 1) * block_size + offsets).view(batch, -1)[:, :context].contiguous()
    gather = AttentionBatch(positions=None, slot_mapping=None, num_decode=batch,
                            decode_groups=[DecodeGroup(0, batch, slots, length=context)])
    gather.k_workspace = torch.empty(batch * context, kv_heads, head_dim)
    gather.v_workspace = torch.empty(batch * context, kv_heads, head_dim)
    lens = torch.full((batch,), context)
    meta = DecodeMeta(perm, lens, slots[:, -1], width)
    if width * block_size != context:
        pad = torch.arange(width * block_size) >= lens[:, None]
        meta.mask = torch.zeros(batch, width * block_size).masked_fill_(pad, float("-inf")).view(
            batch, 1, 1, width * block_size)
    paged = AttentionBatch(positions=None, slot_mapping=None, num_decode=batch, decode_meta=meta)
    return q, k_pool, v_pool, {"gather": gather, "paged": paged, "online": paged}


@torch.inference_mode()
def time_kernel(backend, q, k_pool, v_pool, batch, scale, reps: int) -> float:
    backend.decode(q, k_pool, v_pool, batch, scale)  # warm up
    t0 = time.perf_counter()
    for _ in range(reps):
        backend.decode(q, k_pool, v_pool, batch, scale)
    return (time.perf_counter() - t0) / reps


def step_times(llm: LLM, batch: int, context: int | str, new_tokens: int, seed: int) -> float:
    """Median seconds of the decode-only steps of ``batch`` requests with ``context``-token
    prompts (``"mixed16-N"``: lengths drawn from 16..N, the same draw for every backend)."""
    rng = random.Random(seed)
    vocab = llm.model_config.vocab_size
    for i in range(batch):
        n = context if isinstance(context, int) else rng.randrange(16, int(context.split("-")[1]) + 1)
        llm.add_request(prompt_token_ids=[rng.randrange(3, vocab) for _ in range(n)],
                        params=SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True))
    times = []
    while llm.has_unfinished():
        t0 = time.perf_counter()
        llm.step()
        dt = time.perf_counter() - t0
        ev = [e for e in list(llm.trace)[-8:] if e.kind == "step"]
        if ev and not ev[-1].data["num_prefill"] and ev[-1].data["num_decode"] == batch:
            times.append(dt)
    return statistics.median(times)


def model_folder(name: str, workdir: Path) -> Path | None:
    from minillm.bench.models import build_random_llama

    if name == "default":
        return None
    if name == "135m":
        return build_random_llama(workdir / "smollm-135m-shape")
    return Path(name)


def summarise(kind: str, key: dict, times: dict[str, list[float]]) -> dict:
    med = {b: statistics.median(t) for b, t in times.items()}
    row = {"kind": kind, **key, "median_ms": {b: round(1e3 * m, 3) for b, m in med.items()},
           "spread_ms": {b: [round(1e3 * min(t), 3), round(1e3 * max(t), 3)] for b, t in times.items()},
           "speedup_vs_gather": {b: round(med[REFERENCE] / m, 3) for b, m in med.items()}}
    print(json.dumps(row), flush=True)
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="135m", help="kernel's head shape: default, 135m (SmolLM-135M shape, "
                    "random) or a folder")
    ap.add_argument("--step-model", default="default", help="engine of the step measurement (same choices; "
                    "the 135m prefill of 32 x 512 tokens takes minutes on one thread)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--context", default="128,512", help="comma-separated context lengths")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=12, help="decode steps per engine round")
    ap.add_argument("--skip-steps", action="store_true", help="only the kernel measurement")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    contexts = [int(c) for c in args.context.split(",")]
    names = sorted(BACKENDS, key=lambda b: b != REFERENCE)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(args.model, Path(tmp))
        probe = LLM(None if folder is None else str(folder), "cpu", "float32", num_kv_blocks=8)
        cfg = probe.model_config
        del probe
        shape = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        for context in contexts:
            q, kp, vp, batches = kernel_case(args.batch, context, *shape, args.block_size)
            backends = {**{b: make_backend(b) for b in names}, "online": OnlineSoftmaxBlocks()}
            contenders = [*names, "online"]
            ref = backends[REFERENCE].decode(q, kp, vp, batches[REFERENCE], cfg.head_dim ** -0.5)
            for b in contenders:  # a contender that computes something else is not timed
                got = backends[b].decode(q, kp, vp, batches[b], cfg.head_dim ** -0.5)
                assert (got - ref).abs().max().item() < 1e-4, b
            times = {b: [] for b in contenders}
            for r in range(args.rounds):
                for b in (contenders if r % 2 == 0 else contenders[::-1]):
                    times[b].append(time_kernel(backends[b], q, kp, vp, batches[b], cfg.head_dim ** -0.5, 20))
            rows.append(summarise("kernel", {"batch": args.batch, "context": context,
                                             "heads": list(shape)}, times))
        if not args.skip_steps:
            blocks = args.batch * (-(-(max(contexts) + args.new_tokens) // args.block_size)) + 8
            folder = model_folder(args.step_model, Path(tmp))
            llms = {b: LLM(None if folder is None else str(folder), "cpu", "float32", block_size=args.block_size,
                           num_kv_blocks=blocks, max_num_seqs=args.batch, enable_prefix_caching=False,
                           attention_backend=b, num_threads=1) for b in names}
            for context in [*contexts, f"mixed16-{max(contexts)}"]:
                times = {b: [] for b in names}
                for r in range(args.rounds):
                    for b in (names if r % 2 == 0 else names[::-1]):
                        times[b].append(step_times(llms[b], args.batch, context, args.new_tokens, seed=r))
                rows.append(summarise("step", {"model": args.step_model, "batch": args.batch, "context": context},
                                      times))
    load = os.getloadavg()[0]
    print(f"\nload average (1 min) at the end: {load:.2f}")
    cols = [*names, "online"]
    print(f"{'measurement':<28}" + "".join(f"{b + ' ms':>12}" for b in cols)
          + "".join(f"{b + '/gather speed':>22}" for b in cols[1:]))
    for row in rows:
        label = f"{row['kind']} B={row['batch']} ctx={row['context']}"
        med, speed = row["median_ms"], row["speedup_vs_gather"]
        print(f"{label:<28}" + "".join(f"{med[b]:>12.3f}" if b in med else f"{'-':>12}" for b in cols)
              + "".join(f"{speed[b]:>21.2f}x" if b in speed else f"{'-':>22}" for b in cols[1:]))
    if args.json:
        Path(args.json).write_text(json.dumps({"load_average": load, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
