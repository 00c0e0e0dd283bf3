"""KV bytes a decode step moves, per attention backend, counted from the steps' own metadata.

    python benchmarks/paged_kv_bytes.py [--device cpu] [--rows 16] [--new-tokens 16]

The same greedy workload (prompts of 8-200 random ids) runs on "gather" and "paged"; every
decode-only step's layout is recorded as the backend receives it (gather: its groups' rows and
padded lengths; paged: the block table's B x W), and "flex" is counted from the same contexts:
its fused kernel visits each row's ceil(context / block_size) blocks of the pool
(``attention.paged_block_mask``; ``tests/test_flex_compiled.py`` shows it reads no other block).
Per step, summed over layers, K and V:

* ``contexts``: the bytes the contexts hold (sum of context lengths x bytes per slot);
* ``read``: bytes read out of the pool; ``copied``: bytes written to a gathered copy (which
  attention then reads again). gather: each group's rows x its longest context (slot by
  slot); paged: B x W whole blocks (``paged_graph``: B and W rounded up to their CUDA-graph
  buckets, as a captured step reads them); flex: the blocks in use, no copy.

A model of the traffic from shapes, not a hardware counter: on a GPU the numbers to compare are
the step times ``scripts/gpu_check.sh`` measures."""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from minillm import LLM, SamplingParams  # noqa: E402
from minillm.fast.decode_graphs import bucket_for, buckets  # noqa: E402


def _record(llm: LLM, prompts, new_tokens: int) -> list:
    """Each decode-only step's layout as the engine's backend got it (first layer only)."""
    backend, seen, real = llm.runner.attention, [], llm.runner.attention.decode

    def recording(q, k_pool, v_pool, batch, scale):
        key = id(batch)
        if not seen or seen[-1][0] != key:
            if batch.decode_meta is not None:
                m = batch.decode_meta
                seen.append((key, "table", m.block_tables.shape[0], int(m.block_tables.shape[1]),
                             m.context_lens.tolist()))
            else:
                seen.append((key, "groups", [(g.end - g.start, g.length) for g in batch.decode_groups], None, None))
        return real(q, k_pool, v_pool, batch, scale)

    backend.decode = recording
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    for p in prompts:
        llm.add_request(prompt_token_ids=p, params=params)
    steps = []
    while llm.has_unfinished():
        before = len(seen)
        events = llm.step()
        step = next(e for e in events if e.kind == "step").data
        if step["num_prefill"] == 0 and len(seen) > before:
            steps.append(seen[-1][1:])
    del backend.decode
    return steps


def measure(model: str | None = None, device: str = "cpu", dtype: str = "float32", rows: int = 16,
            new_tokens: int = 16, prompts=None, block_size: int = 16) -> dict:
    """Mean bytes per decode-only step: contexts, and read / copied per backend."""
    kw = dict(block_size=block_size, max_num_seqs=max(rows, 1), enable_prefix_caching=False)
    gather = LLM(model, device, dtype, attention_backend="gather", **kw)
    paged = LLM(model, device, dtype, attention_backend="paged", **kw)
    cfg, kv = paged.model_config, paged.kv_cache
    if prompts is None:
        rng = random.Random(0)
        prompts = [[rng.randrange(3, cfg.vocab_size) for _ in range(rng.randrange(8, 200))] for _ in range(rows)]
    slot = kv.bytes_per_token  # K and V of every layer
    g_steps, p_steps = _record(gather, prompts, new_tokens), _record(paged, prompts, new_tokens)
    totals = {"contexts": 0, "gather_read": 0, "gather_copied": 0, "paged_read": 0, "paged_copied": 0,
              "paged_graph_read": 0, "flex_read": 0, "flex_copied": 0}
    # inside a CUDA graph "paged" pads B and W up to their buckets (``minillm.fast.decode_graphs``)
    batch_buckets = buckets(kw["max_num_seqs"])
    width_buckets = buckets(-(-paged.max_model_len // block_size))
    for (_, groups, _, _), (_, b, w, lens) in zip(g_steps, p_steps):
        copied = sum(m * length for m, length in groups)
        totals["gather_read"] += copied * slot
        totals["gather_copied"] += copied * slot
        totals["paged_read"] += b * w * block_size * slot
        totals["paged_copied"] += b * w * block_size * slot
        totals["paged_graph_read"] += bucket_for(b, batch_buckets) * bucket_for(w, width_buckets) * block_size * slot
        totals["contexts"] += sum(lens) * slot
        totals["flex_read"] += sum(-(-n // block_size) * block_size for n in lens) * slot
    n = max(len(p_steps), 1)
    out = {"decode_steps": len(p_steps), "rows": len(prompts), "block_size": block_size, "bytes_per_slot": slot}
    out.update({f"{k}_bytes_per_step": round(v / n) for k, v in totals.items()})
    out["flex_read_over_contexts"] = round(totals["flex_read"] / max(totals["contexts"], 1), 3)
    out["paged_read_over_contexts"] = round(totals["paged_read"] / max(totals["contexts"], 1), 3)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a model folder (default: the shipped one)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--block-size", type=int, default=16)
    args = ap.parse_args(argv)
    print(json.dumps(measure(args.model, args.device, args.dtype, args.rows, args.new_tokens,
                             block_size=args.block_size), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
