"""Batch-1 decode with each way of storing the weights: float32 (the reference), bfloat16,
int8 weight-only (``minillm.models.weights``), and float32 in the transposed linear layout
(``LlamaForCausalLM.use_decode_layout``), on the shipped model and SmolLM2-135M-Instruct (the
GGUF the test set-up fetches, dequantised to float32 on load).

Every variant is one ``LLM`` in the same process; rounds alternate the variants (the order
rotating), each round one batch-1 request (a seeded prompt of ``--prompt`` ids, ``--new-tokens``
greedy tokens); TPOT is the median step time of a round, the table the median over rounds.
Each variant's greedy tokens are compared with float32's: identical, or the first position
where they differ. The weights' memory is what the model holds after the option is applied.

    python benchmarks/weight_options.py                    # both models, 1 thread
    python benchmarks/weight_options.py --models shipped --rounds 5 --threads 2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
VARIANTS = ("float32", "transposed", "bfloat16", "int8")


def smollm2_path() -> Path:
    """The float32 Hugging Face folder made once from the test set-up's GGUF (as ``minillm bench
    --peers`` does): four engines load it much faster than dequantising the GGUF four times."""
    from minillm.apps.bench.peers import gguf_as_hf_folder, smollm2_gguf

    gguf = smollm2_gguf()
    return gguf_as_hf_folder(gguf) if gguf.is_file() else gguf


def make_variant(path, variant: str, threads: int, tokens: int):
    from minillm import LLM
    from minillm.models.weights import quantize_weights

    llm = LLM(str(path), device="cpu", dtype="bfloat16" if variant == "bfloat16" else "float32",
              enable_prefix_caching=False, kv_cache_tokens=2 * tokens + 64, max_num_seqs=2, num_threads=threads)
    if variant == "int8":
        quantize_weights(llm.model, "int8")
    if variant == "transposed":
        llm.model.use_decode_layout(True)
    return llm


def one_round(llm, ids: list[int], new_tokens: int) -> tuple[float, list[int]]:
    from minillm import SamplingParams

    req = llm.add_request(prompt_token_ids=ids, params=SamplingParams(max_tokens=new_tokens, temperature=0,
                                                                      ignore_eos=True))
    llm.step()  # prefill
    times = []
    while req.is_live:
        t0 = time.perf_counter()
        llm.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), list(req.output_token_ids)


def first_divergence(ref: list[int], got: list[int]):
    return next((i for i, (a, b) in enumerate(zip(ref, got)) if a != b), None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="shipped,smollm2")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--out", default=str(HERE / "weight_options.json"))
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore")
    from minillm.models import DEFAULT_MODEL_DIR
    from minillm.models.weights import cpu_has_bf16, weight_bytes

    result = {"torch": torch.__version__, "threads": args.threads, "cpu_has_bf16": cpu_has_bf16(),
              "prompt": args.prompt, "new_tokens": args.new_tokens, "rounds": args.rounds,
              "load_average_start": os.getloadavg(), "models": {}}
    paths = {"shipped": DEFAULT_MODEL_DIR, "smollm2": smollm2_path()}
    for model in args.models.split(","):
        path = paths[model]
        if not Path(path).exists():
            print(f"skipping {model}: {path} is absent (bash scripts/fetch_test_models.sh)")
            continue
        variants = args.variants.split(",")
        llms = {v: make_variant(path, v, args.threads, args.prompt + args.new_tokens) for v in variants}
        vocab = llms[variants[0]].model_config.vocab_size
        g = torch.Generator().manual_seed(args.prompt)
        ids = torch.randint(3, vocab, (args.prompt,), generator=g).tolist()
        tpots = {v: [] for v in variants}
        tokens = {}
        for v in variants:  # warm-up, and each variant's greedy tokens
            tokens[v] = one_round(llms[v], ids, args.new_tokens)[1]
        order = list(variants)
        for _ in range(args.rounds):
            order = order[1:] + order[:1]
            for v in order:
                tpots[v].append(one_round(llms[v], ids, args.new_tokens)[0])
        ref_tokens = tokens.get("float32")
        base = statistics.median(tpots["float32"]) if "float32" in tpots else None
        entry = {}
        for v in variants:
            med = statistics.median(tpots[v])
            wb = weight_bytes(llms[v].model)
            div = None if ref_tokens is None else first_divergence(ref_tokens, tokens[v])
            entry[v] = {"tpot_ms": round(med * 1e3, 3), "tpot_ms_rounds": [round(t * 1e3, 3) for t in tpots[v]],
                        "speedup_vs_float32": None if base is None else round(base / med, 3),
                        "weight_MB": round(wb["total"] / 1e6, 1),
                        "greedy_identical_to_float32": div is None,
                        "first_divergence": div}
            print(model, v, entry[v], flush=True)
        result["models"][model] = entry
        del llms
    result["load_average_end"] = os.getloadavg()
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print("wrote", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
