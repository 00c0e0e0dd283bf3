"""``minillm bench --peers``: minillm beside the engines a user would pick instead.

Peers (each optional; ``pip install 'minillm[peers]'``):

* **CTranslate2** (``ctranslate2``): the Hugging Face folder converted to a float32 CT2 model
  once, into ``~/.cache/minillm/peers/``; greedy decoding (``sampling_topk=1``) with no end
  token, batch-1 through ``generate_tokens`` (a timestamp per token), the mixed workload
  through ``generate_batch`` at static batch sizes (its best one is timed against minillm).
* **llama.cpp** (``llama-cpp-python``, built from source): given a float32 GGUF of the same
  weights (``--llama-cpp-gguf``, made with the converter in llama.cpp's source tree); run when
  the package is installed, otherwise reported as not run.

Models: ``default`` (the shipped model) and ``smollm2`` (SmolLM2-135M-Instruct, the Q4_1 GGUF
the test set-up fetches; its weights are dequantised to float32 and written once as a Hugging
Face folder in the cache, which every engine then reads, so all run the same float32 weights).

Every engine gets the same prompt token ids; greedy outputs are compared with minillm's token by
token before timing (identical, or the first divergence is reported); the engines then run in
turn, the order rotating each round, at 1 and 2 threads; tables give medians and the range.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import statistics
import time
from pathlib import Path

from .harness import random_prompts

PEERS_BEGIN = "<!-- bench:peers:begin -->"
PEERS_END = "<!-- bench:peers:end -->"


def cache_root() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "minillm" / "peers"


def _key(path: Path) -> str:
    """A cache key from the files' names, sizes and modification times."""
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    h = hashlib.sha1()
    for f in files:
        st = f.stat()
        h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return f"{path.stem}-{h.hexdigest()[:12]}"


def smollm2_gguf() -> Path:
    """Where the test set-up keeps SmolLM2-135M-Instruct (``MINILLM_TEST_GGUF`` overrides)."""
    if os.environ.get("MINILLM_TEST_GGUF"):
        return Path(os.environ["MINILLM_TEST_GGUF"])
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "minillm" / "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_as_hf_folder(gguf_path: Path, cache: Path | None = None) -> Path:
    """A Hugging Face folder (config.json, float32 model.safetensors, tokenizer) holding the
    GGUF's weights dequantised exactly as minillm's loader reads them. Built once."""
    from safetensors.torch import save_file

    from minillm.models.gguf import hf_config, load_gguf_tokenizer, read_gguf_tensors
    from minillm.models.loader import load_config

    out = (cache or cache_root()) / (_key(gguf_path) + "-hf-f32")
    if (out / "model.safetensors").is_file():
        return out
    tmp = out.with_name(out.name + ".building")
    tmp.mkdir(parents=True, exist_ok=True)
    cfg = hf_config(gguf_path)
    cfg.update(model_type="llama", torch_dtype="float32", hidden_act="silu")
    tensors = read_gguf_tensors(gguf_path, load_config(gguf_path))
    save_file({k: v.float().contiguous() for k, v in tensors.items()}, str(tmp / "model.safetensors"))
    (tmp / "config.json").write_text(json.dumps(cfg, indent=1))
    load_gguf_tokenizer(gguf_path).save_pretrained(str(tmp))
    os.replace(tmp, out)
    return out


def ct2_model(hf_folder: Path, cache: Path | None = None) -> Path:
    """The folder converted to a float32 CTranslate2 model (once, in the cache)."""
    from ctranslate2.converters import TransformersConverter

    out = (cache or cache_root()) / (_key(hf_folder) + "-ct2-f32")
    if (out / "model.bin").is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    TransformersConverter(str(hf_folder)).convert(str(out), quantization="float32", force=True)
    return out


class MinillmEngine:
    def __init__(self, folder: Path, threads: int, kv_tokens: int):
        from minillm import LLM

        self.name = "minillm"
        self.llm = LLM(str(folder), device="cpu", dtype="float32", enable_prefix_caching=False,
                       kv_cache_tokens=kv_tokens, max_num_seqs=64, num_threads=threads)

    def latency(self, prompt: list[int], new_tokens: int):
        from .harness import minillm_latency

        return minillm_latency(self.llm, prompt, new_tokens)

    def workload(self, prompts, max_tokens, batch_size=None):
        from .harness import minillm_run

        seconds, out, _ = minillm_run(self.llm, prompts, max_tokens)
        return seconds, out


class CTranslate2Engine:
    """A float32 CT2 generator; ids are passed as the vocabulary's token strings."""

    batch_sizes = (8, 16, 32, 64)

    def __init__(self, folder: Path, threads: int):
        import ctranslate2

        model = ct2_model(folder)
        self.name = f"CTranslate2 {ctranslate2.__version__} fp32"
        self.gen = ctranslate2.Generator(str(model), device="cpu", compute_type="float32",
                                         intra_threads=threads, inter_threads=1)
        self.vocab = json.loads((model / "vocabulary.json").read_text())

    def _tokens(self, ids):
        return [self.vocab[i] for i in ids]

    def latency(self, prompt: list[int], new_tokens: int):
        t0 = time.perf_counter()
        marks, out = [], []
        for step in self.gen.generate_tokens(self._tokens(prompt), max_length=new_tokens, sampling_topk=1,
                                             end_token=[]):
            marks.append(time.perf_counter() - t0)
            out.append(step.token_id)
        tpot = (marks[-1] - marks[0]) / (len(marks) - 1) if len(marks) > 1 else None
        return marks[0], tpot, out

    def workload(self, prompts, max_tokens, batch_size=64):
        """Static batches in arrival order; a batch runs to its longest output, and only each
        request's wanted tokens are kept (as ``generate()`` is measured)."""
        outs = []
        t0 = time.perf_counter()
        for i in range(0, len(prompts), batch_size):
            chunk = prompts[i:i + batch_size]
            want = max_tokens[i:i + batch_size]
            res = self.gen.generate_batch([self._tokens(p) for p in chunk], max_length=max(want), sampling_topk=1,
                                          end_token=[], include_prompt_in_result=False, max_batch_size=batch_size)
            outs.extend(r.sequences_ids[0][:n] for r, n in zip(res, want))
        return time.perf_counter() - t0, outs


class LlamaCppEngine:
    """llama-cpp-python on a float32 GGUF of the same weights (greedy: top_k=1, no stop)."""

    batch_sizes = (1,)

    def __init__(self, gguf_f32: Path, threads: int, n_ctx: int):
        import llama_cpp

        self.name = f"llama.cpp (llama-cpp-python {llama_cpp.__version__}) F32"
        self.llm = llama_cpp.Llama(model_path=str(gguf_f32), n_threads=threads, n_threads_batch=threads,
                                   n_ctx=n_ctx, n_batch=512, verbose=False)

    def latency(self, prompt: list[int], new_tokens: int):
        self.llm.reset()
        t0 = time.perf_counter()
        marks, out = [], []
        for tok in self.llm.generate(prompt, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
            marks.append(time.perf_counter() - t0)
            out.append(int(tok))
            if len(out) == new_tokens:
                break
        tpot = (marks[-1] - marks[0]) / (len(marks) - 1) if len(marks) > 1 else None
        return marks[0], tpot, out

    def workload(self, prompts, max_tokens, batch_size=1):
        """One request at a time (the Python binding has no batched generation)."""
        t0 = time.perf_counter()
        outs = [self.latency(p, n)[2] for p, n in zip(prompts, max_tokens)]
        return time.perf_counter() - t0, outs


def available_peers() -> dict[str, str | None]:
    """Peer name -> None when importable, else why not."""
    out = {}
    for name, module in (("ctranslate2", "ctranslate2"), ("llama.cpp", "llama_cpp")):
        try:
            __import__(module)
            out[name] = None
        except ImportError:
            out[name] = f"{module} is not installed"
    return out


def first_divergence(ref: list[int], got: list[int]):
    n = min(len(ref), len(got))
    i = next((i for i in range(n) if ref[i] != got[i]), None)
    if i is None and len(ref) != len(got):
        return n
    return i


def _spread(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def bench_peers(model: str, folder: Path, threads_list=(1, 2), rounds: int = 5, prompt_lens=(16, 128, 512),
                new_tokens: int = 128, num_requests: int = 64, seed: int = 0, llama_cpp_gguf: Path | None = None,
                log=print) -> dict:
    import torch

    from .harness import _loadavg

    status = available_peers()
    if status["llama.cpp"] is None and llama_cpp_gguf is None:
        status["llama.cpp"] = "llama-cpp-python is installed but no float32 GGUF was given (--llama-cpp-gguf)"
    result = {"model": model, "folder": str(folder), "rounds": rounds, "new_tokens": new_tokens,
              "peers_not_run": {k: v for k, v in status.items() if v}, "threads": {},
              "load_average_start": _loadavg(), "torch": torch.__version__}
    rng = random.Random(seed + 2)
    plens = [rng.randint(16, 256) for _ in range(num_requests)]
    olens = [rng.randint(16, 256) for _ in range(num_requests)]
    before = torch.get_num_threads()
    try:
        for threads in threads_list:
            kv_tokens = num_requests * (256 + 256 + 16)
            engines = [MinillmEngine(folder, threads, kv_tokens)]
            tok, vocab = engines[0].llm.tokenizer, engines[0].llm.model_config.vocab_size
            lens = [p for p in prompt_lens if p + new_tokens <= engines[0].llm.max_model_len]
            prompts = random_prompts(tok, vocab, lens, seed=seed + 1)
            work = random_prompts(tok, vocab, plens, seed=seed + 3)
            if status["ctranslate2"] is None:
                engines.append(CTranslate2Engine(folder, threads))
            if status["llama.cpp"] is None:
                engines.append(LlamaCppEngine(llama_cpp_gguf, threads, n_ctx=max(lens) + new_tokens + 16))
            entry = {"latency": [], "workload": {}, "engines": [e.name for e in engines], "rounds": rounds,
                     "load_average_start": _loadavg()}
            # batch-1 latency: check tokens, then rounds with the order rotating
            for plen, prompt in zip(lens, prompts):
                ref = None
                row = {"prompt": plen, "checks": {}, "ttft": {}, "tpot": {}}
                for e in engines:
                    _, _, out = e.latency(prompt, new_tokens)
                    if ref is None:
                        ref = out
                    else:
                        div = first_divergence(ref, out)
                        row["checks"][e.name] = {"identical": div is None, "first_divergence": div}
                order = list(engines)
                ttft = {e.name: [] for e in engines}
                tpot = {e.name: [] for e in engines}
                for _ in range(rounds):
                    order = order[1:] + order[:1]
                    for e in order:
                        a, b, _ = e.latency(prompt, new_tokens)
                        ttft[e.name].append(a)
                        tpot[e.name].append(b)
                row["ttft"] = {k: _spread(v) for k, v in ttft.items()}
                row["tpot"] = {k: _spread(v) for k, v in tpot.items()}
                entry["latency"].append(row)
                log(f"  [{model}] {threads} thread(s), prompt {plen}: TPOT ms " +
                    ", ".join(f"{k} {1e3 * v['median']:.2f}" for k, v in row["tpot"].items()) +
                    f" checks {row['checks']}")
            # the mixed workload: each peer's best static batch size, then timed rounds
            wanted = sum(olens)
            ref_out = engines[0].workload(work, olens)[1]
            best = {engines[0].name: None}
            for e in engines[1:]:
                rates = {}
                for bsz in e.batch_sizes:
                    seconds, out = e.workload(work, olens, bsz)
                    rates[bsz] = wanted / seconds
                    div = [first_divergence(r, o) for r, o in zip(ref_out, out)]
                    entry["workload"].setdefault("checks", {})[f"{e.name} batch {bsz}"] = {
                        "identical_requests": sum(d is None for d in div), "requests": len(div),
                        "first_divergences": [d for d in div if d is not None][:8]}
                best[e.name] = max(rates, key=rates.get)
                entry["workload"].setdefault("batch_rates", {})[e.name] = rates
            rates = {e.name: [] for e in engines}
            order = list(engines)
            for _ in range(rounds):
                order = order[1:] + order[:1]
                for e in order:
                    seconds, _ = e.workload(work, olens, best[e.name]) if best[e.name] else e.workload(work, olens)
                    rates[e.name].append(wanted / seconds)
            entry["workload"].update(requests=num_requests, wanted_tokens=wanted, best_batch=best,
                                     tokens_per_s={k: _spread(v) for k, v in rates.items()})
            log(f"  [{model}] {threads} thread(s), mixed workload tok/s: " +
                ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in rates.items()))
            entry["load_average_end"] = _loadavg()
            result["threads"][str(threads)] = entry
            del engines
    finally:
        torch.set_num_threads(before)
    result["load_average_end"] = _loadavg()
    return result


def peers_markdown(results: list[dict]) -> str:
    lines = []
    for r in results:
        lines.append(f"### Peers on `{r['model']}` (float32, greedy, same token ids; batch-1 TPOT over "
                     f"{r['new_tokens']} new tokens; medians of alternating rounds, range in brackets)\n")
        for t, e in r["threads"].items():
            la0, la1 = e["load_average_start"], e["load_average_end"]
            names = e["engines"]
            lines.append(f"**{t} thread(s)**, {e.get('rounds', r['rounds'])} rounds, load average "
                         f"{la0[0]:.1f} → {la1[0]:.1f}\n")
            lines.append("| prompt | " + " | ".join(f"TPOT {n} (ms)" for n in names) + " | greedy tokens |")
            lines.append("|---:|" + "---:|" * len(names) + "---|")
            for row in e["latency"]:
                cells = [f"{1e3 * row['tpot'][n]['median']:.2f} [{1e3 * row['tpot'][n]['min']:.2f}–"
                         f"{1e3 * row['tpot'][n]['max']:.2f}]" for n in names]
                checks = "; ".join(f"{n}: " + ("identical" if c["identical"] else f"first differs at {c['first_divergence']}")
                                   for n, c in row["checks"].items()) or "-"
                lines.append(f"| {row['prompt']} | " + " | ".join(cells) + f" | {checks} |")
            w = e["workload"]
            lines.append("")
            lines.append(f"Mixed workload ({w['requests']} requests, {w['wanted_tokens']} wanted output tokens), "
                         "output tokens/s: " + "; ".join(
                             f"{n} {w['tokens_per_s'][n]['median']:.0f} [{w['tokens_per_s'][n]['min']:.0f}–"
                             f"{w['tokens_per_s'][n]['max']:.0f}]" + (f" (static batch {w['best_batch'][n]})"
                                                                     if w['best_batch'].get(n) else " (continuous)")
                             for n in names))
            for k, c in w.get("checks", {}).items():
                lines.append(f"- {k}: {c['identical_requests']}/{c['requests']} requests token-identical to minillm"
                             + (f" (first divergences at {c['first_divergences']})" if c["first_divergences"] else ""))
            lines.append("")
        for peer, why in r["peers_not_run"].items():
            lines.append(f"- {peer} was not run: {why}.")
        lines.append("")
    return "\n".join(lines)


def update_peers_readme(readme: Path, results: list[dict]) -> None:
    block = PEERS_BEGIN + "\n\n" + peers_markdown(results) + "\n" + PEERS_END
    text = readme.read_text() if readme.is_file() else "# Benchmarks\n"
    if PEERS_BEGIN in text and PEERS_END in text:
        head, rest = text.split(PEERS_BEGIN, 1)
        text = head + block + rest.split(PEERS_END, 1)[1]
    else:
        text = text.rstrip() + "\n\n## Peers: CTranslate2 and llama.cpp (`minillm bench --peers`)\n\n" + block + "\n"
    readme.write_text(text)
