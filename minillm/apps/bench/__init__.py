"""``minillm bench``: minillm against transformers ``generate()`` on the same checkpoint.

    minillm bench                       # the shipped model, 5 timed rounds, results in ./benchmarks
    minillm bench --model all           # the shipped model and the 135M-shaped one (~30 min on 2 cores)
    minillm bench --quick               # small sizes, 2 rounds: a smoke run
    python -m minillm.apps.bench --model 135m --only throughput --runs 5
    minillm bench --peers --model smollm2   # beside CTranslate2 (and llama.cpp when installed): ``peers``

Four benchmarks (see ``workloads``): batch-1 latency (TTFT, TPOT), a mixed 64-request
workload (continuous batching vs ``generate()`` at static batch sizes, and minillm's own
static scheduling), and the KV cache on vs off. Both engines run in this one process, on the
same checkpoint, dtype and device; greedy outputs are checked token-identical before
anything is timed, then the engines are timed alternately and medians reported. Writes
``results_<model>.json``, PNG plots and the tables in ``<out>/README.md``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

MODELS = ("default", "135m", "tiny", "smollm2")
WORKLOADS = ("latency", "throughput", "kv_cache")
# timed rounds per measurement: the 135m model takes minutes per round of the mixed workload
# on a 2-core CPU, so it gets fewer by default (``--runs`` sets both)
DEFAULT_RUNS = {"default": 5, "135m": 3}
DESCRIPTIONS = {
    "default": "the model shipped with minillm (stories-3m, a trained ~4M-parameter Llama)",
    "135m": "random weights in the shape of SmolLM-135M (576 hidden, 30 layers, 9/3 heads, 49152 vocabulary)",
    "tiny": "a tiny random Llama (for tests)",
    "smollm2": "SmolLM2-135M-Instruct (the test set-up's Q4_1 GGUF, dequantised to a float32 folder)",
}


def parse_args(argv):
    from minillm.engine_args import ATTENTION_BACKENDS

    ap = argparse.ArgumentParser(prog="minillm bench", description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="default",
                    help="default (the shipped model), 135m, all (default + 135m), tiny, or a local "
                         "Hugging Face folder")
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--dtype", default="auto", help="auto (float32 on CPU; bfloat16 on CUDA, float16 where bf16 is not native), float32, bfloat16")
    ap.add_argument("--runs", type=int, default=None, help="timed rounds per measurement (default: 5 for the default model, 3 for 135m; "
                         "2 with --quick)")
    ap.add_argument("--quick", action="store_true", help="small sizes, a couple of rounds: a smoke run")
    ap.add_argument("--only", action="append", choices=WORKLOADS, help="run only this benchmark (repeatable)")
    ap.add_argument("--out", default=None, help="output folder (default ./benchmarks; a temp folder with --quick)")
    ap.add_argument("--no-readme", action="store_true", help="do not update <out>/README.md")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--threads", type=int, default=None,
                    help="CPU threads for both engines (LLM(num_threads=...), process-wide; default: the "
                         "engine's choice from the model size: 1 per 60M parameters, at most the usable cores)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--peers", action="store_true",
                    help="run minillm beside CTranslate2 (and llama.cpp when installed) instead of generate(): "
                         "batch-1 TPOT at prompts 16/128/512 and the 64-request mixed workload, at 1 and 2 threads "
                         "(or --threads); pip install 'minillm[peers]'")
    ap.add_argument("--workload-runs", type=int, default=None,
                    help="with --peers: timed rounds of the mixed workload (default: --runs; 0: batch-1 latency only)")
    ap.add_argument("--llama-cpp-gguf", default=None, help="with --peers: a float32 GGUF of the same model for llama.cpp")
    ap.add_argument("--llama-cpp-types", default="f32",
                    help="with --peers: the GGUF types llama.cpp runs, comma-separated, each converted from the same "
                         "folder by llama.cpp's convert_hf_to_gguf.py: f32 (default), q8_0 (llama.cpp's int8, for "
                         "comparing with minillm's weight_dtype='int8')")
    ap.add_argument("--int8", action="store_true",
                    help="with --peers: also minillm with LLM(weight_dtype='int8') (its tokens checked against "
                         "float32 minillm's; compare it with --llama-cpp-types f32,q8_0); with --decode-graphs "
                         "also int8 in decode graphs")
    ap.add_argument("--batch-sizes", default=None,
                    help="generate() static batch sizes for the mixed workload, comma-separated (default 1,4,16,32,64); "
                         "with --peers: the peers' batch sizes (CTranslate2 static batches, llama.cpp's sequence "
                         "limits; default 8,16,32,64 and 16,64)")
    ap.add_argument("--decode-graphs", action="store_true",
                    help="minillm with LLM(decode_graphs=True) (CUDA graphs on CUDA, inductor on the CPU for "
                         "batches up to 4; minillm.fast.decode_graphs); with --peers: beside the eager engine")
    ap.add_argument("--attention-backend", default="auto", choices=ATTENTION_BACKENDS,
                    help="minillm's LLM(attention_backend=...) (default auto: the CPU kernel where it builds)")
    ap.add_argument("--allow-mismatch", action="store_true",
                    help="report differing greedy tokens instead of stopping (e.g. bfloat16 on CUDA, where "
                         "the two implementations' kernels round differently)")
    args = ap.parse_args(argv)
    if args.runs is not None and args.runs < 1:
        ap.error("--runs must be >= 1")
    if args.threads is not None and args.threads < 1:
        ap.error("--threads must be >= 1")
    from .peers import LLAMA_CPP_TYPES

    args.llama_cpp_types = tuple(t.strip().lower() for t in args.llama_cpp_types.split(",") if t.strip())
    bad = [t for t in args.llama_cpp_types if t not in LLAMA_CPP_TYPES]
    if bad or not args.llama_cpp_types:
        ap.error(f"--llama-cpp-types must be a comma-separated list of {', '.join(LLAMA_CPP_TYPES)}, got {bad or 'none'}")
    return args


def _model_list(arg: str) -> list[str]:
    if arg == "all":
        return ["default", "135m"]
    return [arg]


def prepare_model(name: str, workdir: Path) -> Path:
    """The folder of a named benchmark model (building the random ones into ``workdir``)."""
    from minillm.models import DEFAULT_MODEL_DIR

    from .models import TINY_SHAPE, build_random_llama

    if name == "default":
        if not (DEFAULT_MODEL_DIR / "config.json").is_file():
            raise FileNotFoundError(f"the shipped model is missing from {DEFAULT_MODEL_DIR}")
        return DEFAULT_MODEL_DIR
    if name == "135m":
        return build_random_llama(workdir / "smollm-135m-shape-random")
    if name == "tiny":
        return build_random_llama(workdir / "tiny-random", TINY_SHAPE, init_std=0.08)
    if name == "smollm2":
        from .peers import gguf_as_hf_folder, smollm2_gguf

        gguf = smollm2_gguf()
        if not gguf.is_file():
            raise FileNotFoundError(f"{gguf} is absent: run `bash scripts/fetch_test_models.sh` to fetch it")
        return gguf_as_hf_folder(gguf)
    path = Path(name).expanduser()
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"--model {name!r}: not one of {', '.join(MODELS + ('all',))} nor a model folder")
    return path


def bench_model(name: str, path: Path, args, settings) -> dict:
    import torch

    from . import workloads as W
    from .harness import _loadavg, bandwidth_by_threads, load_engines, machine_info
    from .models import model_shape, param_count

    t0 = time.perf_counter()
    # room for every request of the mixed workload at its longest at once: minillm never preempts
    kv_tokens = settings.num_requests * (settings.prompt_range[1] + settings.output_range[1] + 16)
    eng = load_engines(path, args.device, args.dtype, kv_cache_tokens=kv_tokens, max_num_seqs=64,
                       num_threads=args.threads, decode_graphs=args.decode_graphs,
                       attention_backend=args.attention_backend)
    label = name if name in MODELS else path.name
    result = {
        "model": {"name": label, "path": str(path), "description": DESCRIPTIONS.get(name, f"the checkpoint in {path}"),
                  "parameters": param_count(path), "shape": model_shape(path),
                  "dtype": str(eng.dtype).replace("torch.", ""),
                  "attention_backend": eng.llm.attention_backend},
        "machine": machine_info(eng.device),
        "settings": settings.as_dict(),
        "notes": {
            "baseline": "transformers generate(), greedy, default DynamicCache, SDPA attention, "
                        "eos_token_id=None so it never stops early (the same as minillm's ignore_eos)",
            "minillm": "LLM(enable_prefix_caching=False, max_num_seqs=64, kv_cache_tokens big enough for the "
                       "whole workload), requests given as token ids",
        },
    }
    if eng.device.type == "cpu":  # the read bandwidth a core and two get, in this run
        result["machine"]["read_gbs_start"] = bandwidth_by_threads((1, 2))
    only = args.only or list(WORKLOADS)
    print(f"[{label}] {result['model']['parameters'] / 1e6:.1f}M parameters, {result['model']['dtype']} on "
          f"{eng.device}, {result['machine']['torch_threads']} threads", flush=True)
    def timed(section, fn):
        meta = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "runs": settings.runs,
                "torch_threads": torch.get_num_threads(), "load_average_start": _loadavg()}
        t1, c1 = time.perf_counter(), time.process_time()
        result[section] = fn()
        meta.update(seconds=round(time.perf_counter() - t1, 1), load_average_end=_loadavg(),
                    cpu_seconds=round(time.process_time() - c1, 1))
        result[section]["meta"] = meta

    if "latency" in only:
        timed("latency", lambda: W.latency(eng, settings))
    if "throughput" in only:
        static = W.make_static_llm(eng, kv_tokens)
        timed("throughput", lambda: W.throughput(eng, settings, static_llm=static))
        del static
    if "kv_cache" in only:
        timed("kv_cache", lambda: W.kv_cache(eng, settings))
    result["machine"]["load_average_end"] = machine_info(eng.device)["load_average_start"]
    if eng.device.type == "cpu":
        result["machine"]["read_gbs_end"] = bandwidth_by_threads((1, 2))
    result["wall_s"] = time.perf_counter() - t0
    return result


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from . import report
    from .workloads import Settings

    threads_before = torch.get_num_threads()
    if args.threads:
        torch.set_num_threads(args.threads)
    settings = Settings.quick_settings(args.runs) if args.quick else Settings()
    settings.seed = args.seed
    if args.batch_sizes:
        settings.batch_sizes = tuple(int(x) for x in args.batch_sizes.split(","))
    settings.strict = not args.allow_mismatch
    if args.out is None:
        out_dir = Path(tempfile.mkdtemp(prefix="minillm-bench-")) if args.quick else Path("benchmarks")
    else:
        out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="minillm-bench-models-"))
    if args.peers:
        try:
            return run_peers(args, out_dir, workdir)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
            torch.set_num_threads(threads_before)
    results = []
    try:
        for name in _model_list(args.model):
            path = prepare_model(name, workdir)
            if not args.quick:
                settings.runs = args.runs or DEFAULT_RUNS.get(name, 5)
            result = bench_model(name, path, args, settings)
            if args.only:  # keep the benchmarks not re-run from the last results of this model
                report.merge_previous(result, out_dir, sections=WORKLOADS)
            if not args.no_plots:
                try:
                    result["plots"] = report.plots(result, out_dir)
                except ImportError:
                    print("matplotlib is not installed: no plots (pip install matplotlib)", flush=True)
            print(f"[{result['model']['name']}] wrote {report.write_json(result, out_dir)} "
                  f"({result['wall_s']:.0f} s)", flush=True)
            results.append(result)
    except FileNotFoundError as exc:
        print(f"minillm bench: error: {exc}", file=sys.stderr)
        return 2
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        torch.set_num_threads(threads_before)
    if not args.no_readme:
        report.update_readme(out_dir / "README.md", report.load_all(out_dir, first=[r["model"]["name"] for r in results]))
    print()
    for r in results:
        print(report.markdown(r))
    return 0


def run_peers(args, out_dir: Path, workdir: Path) -> int:
    """``--peers``: each model beside CTranslate2 / llama.cpp; JSON per model and a README block."""
    import json

    from .peers import bench_peers, cached_random_llama, update_peers_readme

    threads = (args.threads,) if args.threads else (1, 2)
    results = []
    for name in _model_list(args.model):
        try:  # the 135m shape is built once: the peers' conversions of it are cached by folder
            path = cached_random_llama("smollm-135m-shape-random") if name == "135m" else prepare_model(name, workdir)
        except FileNotFoundError as exc:
            print(f"minillm bench: error: {exc}", file=sys.stderr)
            return 2
        runs = args.runs or (2 if args.quick else 5)
        kw = dict(prompt_lens=(16, 64), new_tokens=32, num_requests=16) if args.quick else {}
        result = bench_peers(name if name in MODELS else path.name, path, threads, runs, seed=args.seed,
                             llama_cpp_gguf=Path(args.llama_cpp_gguf) if args.llama_cpp_gguf else None,
                             log=lambda m: print(m, flush=True), workload_rounds=args.workload_runs,
                             batch_sizes=tuple(int(x) for x in args.batch_sizes.split(",")) if args.batch_sizes else None,
                             decode_graphs=args.decode_graphs, attention_backend=args.attention_backend,
                             llama_cpp_types=args.llama_cpp_types, int8=args.int8, **kw)
        out = out_dir / f"peers_{result['model']}.json"
        if args.threads and out.is_file():  # one thread count re-run: keep the others' results
            old = json.loads(out.read_text())
            result["threads"] = {**old.get("threads", {}), **result["threads"]}
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {out}", flush=True)
        results.append(result)
    if not args.no_readme:
        previous = []
        for f in sorted(out_dir.glob("peers_*.json")):
            r = json.loads(f.read_text())
            if r["model"] not in {x["model"] for x in results}:
                previous.append(r)
        update_peers_readme(out_dir / "README.md", results + previous)
    return 0
