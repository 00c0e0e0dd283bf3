"""Decode attention backends against each other: does reading the pool block by block, or in
place with the CPU kernel ("kernel", ``minillm/fast/kernels/paged_decode.c``), pay?

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

``--prefix``: instead, prefill attention after a cached prefix (a ``--suffix``-token chunk after
``--prefix-len`` cached tokens, 512 after 1536 by default): one layer's ``prefill`` for each way
of attending (``PREFIX_WAYS``: the boolean mask the engine used before, an additive float mask,
``causal_lower_right``, and the split the engine ships: the prefix unmasked + the chunk causal,
merged by log-sum-exp), the SDPA kernel each one runs (``torch.profiler``), then whole prefill
steps of an engine with the prefix cached, the shipped split against the boolean mask.

1 thread unless ``--threads`` (``OMP_NUM_THREADS=1`` is set for the process). Prints one JSON line per measurement
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
import torch.nn.functional as F  # noqa: E402

from minillm.fast.attention import BACKENDS, AttentionBackend, DecodeMeta, GatherSDPA, PagedInPlace, make_backend  # noqa: E402
from minillm.models.llama import AttentionBatch, DecodeGroup, PrefillSeq  # noqa: E402

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


def _prefix_masked(q, k, v, k_pool, v_pool, seq, scale, float_mask=False):
    """Before: the whole context's keys from the pool and a [q_len, ctx] mask, boolean or
    additive float (0 / -inf)."""
    rows = slice(seq.q_start, seq.q_start + seq.q_len)
    heads, dim = k_pool.shape[2], k_pool.shape[3]
    keys = k_pool.view(-1, heads, dim).index_select(0, seq.slots)
    values = v_pool.view(-1, heads, dim).index_select(0, seq.slots)
    past = seq.ctx_len - seq.q_len
    allowed = torch.arange(seq.ctx_len)[None, :] <= past + torch.arange(seq.q_len)[:, None]
    mask = torch.zeros(seq.q_len, seq.ctx_len, dtype=q.dtype).masked_fill_(~allowed, float("-inf")) \
        if float_mask else allowed
    o = F.scaled_dot_product_attention(q[rows].transpose(0, 1).unsqueeze(0), keys.transpose(0, 1).unsqueeze(0),
                                       values.transpose(0, 1).unsqueeze(0), attn_mask=mask, scale=scale,
                                       enable_gqa=True)
    return o[0].transpose(0, 1)


def _prefix_bool_mask(*args):
    return _prefix_masked(*args)


def _prefix_float_mask(*args):
    return _prefix_masked(*args, float_mask=True)


def _prefix_lower_right(q, k, v, k_pool, v_pool, seq, scale):
    """``torch.nn.attention.bias.causal_lower_right``: the flash kernel's own lower-right causal
    on CUDA; on the CPU it is materialised as a boolean mask."""
    from torch.nn.attention.bias import causal_lower_right

    rows = slice(seq.q_start, seq.q_start + seq.q_len)
    heads, dim = k_pool.shape[2], k_pool.shape[3]
    keys = k_pool.view(-1, heads, dim).index_select(0, seq.slots)
    values = v_pool.view(-1, heads, dim).index_select(0, seq.slots)
    o = F.scaled_dot_product_attention(q[rows].transpose(0, 1).unsqueeze(0), keys.transpose(0, 1).unsqueeze(0),
                                       values.transpose(0, 1).unsqueeze(0),
                                       attn_mask=causal_lower_right(seq.q_len, seq.ctx_len), scale=scale,
                                       enable_gqa=True)
    return o[0].transpose(0, 1)


PREFIX_WAYS = {"bool_mask": _prefix_bool_mask, "float_mask": _prefix_float_mask,
               "lower_right": _prefix_lower_right,
               "split": lambda *a: AttentionBackend.prefill(GatherSDPA(), *a)}


def prefix_case(prefix_len: int, suffix: int, heads: int, kv_heads: int, head_dim: int, block_size: int, seed=0):
    """A pool holding a cached prefix (scattered blocks) plus the chunk's own K/V, written as
    the model writes them, and the ``PrefillSeq`` the runner would make."""
    g = torch.Generator().manual_seed(seed)
    ctx = prefix_len + suffix
    width = -(-ctx // block_size)
    k_pool = torch.randn(width + 1, block_size, kv_heads, head_dim, generator=g)
    v_pool = torch.randn(width + 1, block_size, kv_heads, head_dim, generator=g)
    table = (torch.randperm(width, generator=g) + 1)
    slots = (table.view(width, 1) * block_size + torch.arange(block_size)).view(-1)[:ctx]
    q = torch.randn(suffix, heads, head_dim, generator=g)
    own = slots[prefix_len:]
    k = k_pool.view(-1, kv_heads, head_dim)[own].clone()
    v = v_pool.view(-1, kv_heads, head_dim)[own].clone()
    return q, k, v, k_pool, v_pool, PrefillSeq(q_start=0, q_len=suffix, ctx_len=ctx, slots=slots)


def sdpa_kernels(fn, *args) -> list[str]:
    """The aten attention ops one call runs (which SDPA kernel was chosen)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(*args)
    return sorted({e.key for e in prof.key_averages() if "attention" in e.key and e.key != "aten::scaled_dot_product_attention"})


def prefix_prefill_steps(folder, prefix_len: int, suffix: int, rounds: int, block_size: int) -> dict:
    """Seconds of one prefill step of a ``suffix``-token request after a cached
    ``prefix_len``-token prefix (the prefix cached once), the engine's attention against the
    boolean mask it used before, alternating; median and spread."""
    llm = LLM(None if folder is None else str(folder), "cpu", "float32", block_size=block_size,
              num_kv_blocks=4 * (-(-(prefix_len + suffix) // block_size)) + 8, num_threads=1,
              max_num_batched_tokens=prefix_len + suffix)
    rng = random.Random(0)
    vocab = llm.model_config.vocab_size
    prefix = [rng.randrange(3, vocab) for _ in range(prefix_len)]
    params = SamplingParams(max_tokens=1, temperature=0, ignore_eos=True)
    llm.add_request(prompt_token_ids=prefix + [5], params=params)
    while llm.has_unfinished():
        llm.step()
    backend = llm.runner.attention
    shipped = type(backend).prefill
    ways = {"bool_mask": lambda self, *a: _prefix_bool_mask(*a), "split": shipped}
    times = {w: [] for w in ways}
    for r in range(rounds):
        for w in (list(ways) if r % 2 == 0 else list(ways)[::-1]):
            backend.prefill = ways[w].__get__(backend)
            req = llm.add_request(prompt_token_ids=prefix + [rng.randrange(3, vocab) for _ in range(suffix)],
                                  params=params)
            t0 = time.perf_counter()
            llm.step()
            times[w].append(time.perf_counter() - t0)
            assert req.num_cached_prompt_tokens == prefix_len - prefix_len % block_size, req.num_cached_prompt_tokens
            while llm.has_unfinished():
                llm.step()
    del backend.prefill
    return times


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
    return q, k_pool, v_pool, {"gather": gather, "paged": paged, "kernel": paged, "online": paged}


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
    for _ in range(batch):
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
    from minillm.apps.bench.models import build_random_llama

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


def model_config(name: str, tmp: Path):
    """The attention shape's source: the config of the model called ``name``, as the engine loads it."""
    folder = model_folder(name, tmp)
    return LLM(None if folder is None else str(folder), "cpu", "float32", num_kv_blocks=8).model_config


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
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the kernel's too)")
    ap.add_argument("--new-tokens", type=int, default=12, help="decode steps per engine round")
    ap.add_argument("--skip-steps", action="store_true", help="only the kernel measurement")
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--prefix", action="store_true", help="prefill attention after a cached prefix instead "
                    "(use --step-model 135m: the shipped model's 1024 positions are too few)")
    ap.add_argument("--prefix-len", type=int, default=1536)
    ap.add_argument("--suffix", type=int, default=512)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.prefix:
        return prefix_main(args)
    contexts = [int(c) for c in args.context.split(",")]
    # "flex" on the CPU is torch's eager reference (scores over the whole pool): no contender here
    names = sorted((b for b in BACKENDS if b != "flex"), key=lambda b: b != REFERENCE)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = model_config(args.model, Path(tmp))
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
                           attention_backend=b, num_threads=args.threads) for b in names}
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
        Path(args.json).write_text(json.dumps({"load_average": load, "threads": args.threads, "rows": rows},
                                              indent=1))
    return 0


def prefix_main(args) -> int:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cfg = model_config(args.model, Path(tmp))
        shape = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim)
        case = prefix_case(args.prefix_len, args.suffix, *shape, args.block_size)
        scale = cfg.head_dim ** -0.5
        ref = _prefix_bool_mask(*case, scale)
        kernels = {}
        for w, fn in PREFIX_WAYS.items():  # a way that computes something else is not timed
            assert (fn(*case, scale) - ref).abs().max().item() < 1e-4, w
            kernels[w] = sdpa_kernels(fn, *case, scale)
        times = {w: [] for w in PREFIX_WAYS}
        with torch.inference_mode():
            for r in range(args.rounds):
                for w in (list(PREFIX_WAYS) if r % 2 == 0 else list(PREFIX_WAYS)[::-1]):
                    fn = PREFIX_WAYS[w]
                    fn(*case, scale)
                    t0 = time.perf_counter()
                    for _ in range(5):
                        fn(*case, scale)
                    times[w].append((time.perf_counter() - t0) / 5)
        med = {w: statistics.median(t) for w, t in times.items()}
        rows.append({"kind": "prefix_kernel", "prefix": args.prefix_len, "suffix": args.suffix, "heads": list(shape),
                     "median_ms": {w: round(1e3 * m, 3) for w, m in med.items()},
                     "spread_ms": {w: [round(1e3 * min(t), 3), round(1e3 * max(t), 3)] for w, t in times.items()},
                     "kernels": kernels, "speedup_vs_bool_mask": {w: round(med["bool_mask"] / m, 3) for w, m in med.items()}})
        print(json.dumps(rows[-1]), flush=True)
        if args.step_model == "135m":  # the SmolLM-135M shape, long enough for prefix + suffix
            from minillm.apps.bench.models import SMOLLM_135M_SHAPE, build_random_llama

            step_folder = build_random_llama(Path(tmp) / "smollm-135m-shape-long", dict(
                SMOLLM_135M_SHAPE, max_position_embeddings=max(4096, 2 * (args.prefix_len + args.suffix))))
        else:
            step_folder = model_folder(args.step_model, Path(tmp))
        steps = prefix_prefill_steps(step_folder, args.prefix_len, args.suffix, args.rounds, args.block_size)
        med = {w: statistics.median(t) for w, t in steps.items()}
        rows.append({"kind": "prefix_step", "model": args.step_model, "prefix": args.prefix_len, "suffix": args.suffix,
                     "median_ms": {w: round(1e3 * m, 2) for w, m in med.items()},
                     "spread_ms": {w: [round(1e3 * min(t), 2), round(1e3 * max(t), 2)] for w, t in steps.items()},
                     "speedup_vs_bool_mask": {w: round(med["bool_mask"] / m, 3) for w, m in med.items()}})
        print(json.dumps(rows[-1]), flush=True)
    load = os.getloadavg()[0]
    print(f"\nload average (1 min) at the end: {load:.2f}")
    for row in rows:
        print(f"{row['kind']} ({row.get('model', args.model)}): " + ", ".join(
            f"{w} {row['median_ms'][w]:.2f} ms ({row['speedup_vs_bool_mask'][w]:.2f}x)" for w in row["median_ms"]))
    if args.json:
        Path(args.json).write_text(json.dumps({"load_average": load, "threads": args.threads, "rows": rows},
                                              indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
