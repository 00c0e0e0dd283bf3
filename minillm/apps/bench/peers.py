"""``minillm bench --peers``: minillm beside the engines a user would pick instead.

Peers (each optional; ``pip install 'minillm[peers]'``):

* **CTranslate2** (``ctranslate2``): the Hugging Face folder converted to a float32 CT2 model
  once, into ``~/.cache/minillm/peers/``; greedy decoding (``sampling_topk=1``) with no end
  token, batch-1 through ``generate_tokens`` (a timestamp per token), the mixed workload
  through ``generate_batch`` at static batch sizes (its best one is timed against minillm).
* **llama.cpp** (``llama-cpp-python``, built from source): the same folder converted to a
  float32 GGUF once (and with ``--llama-cpp-types f32,q8_0`` also to llama.cpp's Q8_0, for the
  int8 comparison), by ``convert_hf_to_gguf.py`` from llama.cpp's source tree as vendored in the
  installed version's source distribution (fetched from PyPI into the cache), or the GGUF given
  with ``--llama-cpp-gguf``; float32 KV cache; batch 1 through ``Llama.generate``, the mixed
  workload through a continuous-batching loop on the low-level API (``LlamaCppBatcher``). Run
  when the package is installed, otherwise reported as not run.

Models: ``default`` (the shipped model) and ``smollm2`` (SmolLM2-135M-Instruct, the Q4_1 GGUF
the test set-up fetches; its weights are dequantised to float32 and written once as a Hugging
Face folder in the cache, which every engine then reads, so all run the same float32 weights).

Every engine gets the same prompt token ids; greedy outputs are compared with minillm's token by
token before timing (identical, or the first divergence is reported); the engines then run in
turn, the order rotating each round, at 1 and 2 threads; tables give medians and the range.
"""

from __future__ import annotations

import gc

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


def cached_random_llama(name: str, shape: dict | None = None, seed: int = 0, cache: Path | None = None) -> Path:
    """A random-weight model (``models.build_random_llama``) built once into the cache and reused:
    a fresh folder per run would give the peers' cached conversions a new key every time (a new
    GGUF and CTranslate2 model, ~0.5 GB each for the 135m shape). The folder's name carries a hash
    of the builder's source, the shape, the seed and torch's and transformers' versions."""
    import inspect
    import shutil

    import torch
    import transformers

    from . import models

    tag = hashlib.sha1(f"{inspect.getsource(models)}{shape}{seed}{torch.__version__}{transformers.__version__}"
                       .encode()).hexdigest()[:10]
    out = (cache or cache_root()) / f"{name}-{tag}"
    if (out / "config.json").is_file() and (out / "tokenizer.json").is_file():
        return out
    tmp = out.with_name(out.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    models.build_random_llama(tmp, shape, seed=seed)
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


# Two patches to the converter in llama.cpp's source tree, for the byte-level BPE tokenizers
# minillm builds (the engines here get token ids, never text, so neither changes a result):
# - it stops on a pre-tokenizer it does not know (the shipped model's): "gpt-2" then;
# - a BPE with no merges (the random models' byte tokenizer: every byte is a token) gets no
#   ``tokenizer.ggml.merges`` key at all (gguf-py refuses an empty array), and llama.cpp then
#   refuses the file ("cannot find tokenizer merges in model file"): one merge of two
#   multi-character strings is written instead, which can never fire, since BPE starts from
#   single characters and no other merge builds either side.
_CONVERT = """
import runpy, sys
src = sys.argv.pop(1)
sys.path[:0] = [src, src + "/gguf-py"]
import gguf
from conversion import base
known = base.TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    try:
        return known(self, tokenizer)
    except NotImplementedError:
        return "gpt-2"
base.TextModel.get_vocab_base_pre = pre
add = gguf.SpecialVocab.add_to_gguf
def add_to_gguf(self, gw, quiet=False):
    if self.load_merges and not self.merges:
        self.merges = ["%s %s" % (NO_MERGE, NO_MERGE)]
    return add(self, gw, quiet)
gguf.SpecialVocab.add_to_gguf = add_to_gguf
sys.argv[0] = src + "/convert_hf_to_gguf.py"
runpy.run_path(sys.argv[0], run_name="__main__")
""".replace("NO_MERGE", repr("<|minillm:no-merges|>"))
#: cached GGUFs carry this tag, so a file written before a change to the conversion is not reused
_CONVERT_TAG = hashlib.sha1(_CONVERT.encode()).hexdigest()[:6]
#: the GGUF types ``llama_cpp_gguf_for`` writes (convert_hf_to_gguf.py's ``--outtype``)
LLAMA_CPP_TYPES = ("f32", "q8_0")


def llama_cpp_source(cache: Path | None = None) -> Path:
    """llama.cpp's source tree as vendored in the llama-cpp-python source distribution of the
    installed version (its ``convert_hf_to_gguf.py``), fetched from PyPI once into the cache.
    ``MINILLM_LLAMA_CPP_SRC`` names another checkout."""
    import subprocess
    import sys
    import tarfile

    if os.environ.get("MINILLM_LLAMA_CPP_SRC"):
        return Path(os.environ["MINILLM_LLAMA_CPP_SRC"])
    import llama_cpp

    root = (cache or cache_root()) / f"llama-cpp-python-{llama_cpp.__version__}-src"
    src = root / "vendor" / "llama.cpp"
    if (src / "convert_hf_to_gguf.py").is_file():
        return src
    dl = root.with_name(root.name + ".download")
    dl.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-d", str(dl),
                    f"llama-cpp-python=={llama_cpp.__version__}"], check=True, capture_output=True)
    sdist = next(dl.glob("llama_cpp_python-*.tar.gz"))
    with tarfile.open(sdist) as tar:
        prefix = tar.getnames()[0].split("/")[0] + "/vendor/llama.cpp/"
        members = [m for m in tar.getmembers() if m.name.startswith(prefix) and
                   (m.name.endswith(".py") or "/gguf-py/" in m.name)]
        for m in members:
            m.name = m.name[len(prefix):]
        tar.extractall(src, members=members, filter="data")
    return src


def llama_cpp_gguf_for(hf_folder: Path, cache: Path | None = None, outtype: str = "f32") -> Path:
    """The Hugging Face folder as a GGUF for llama.cpp (``outtype`` f32, or q8_0 for the int8
    comparison: the same weights, quantised by llama.cpp), written once by the converter in
    llama.cpp's own source tree (``llama_cpp_source``)."""
    import subprocess
    import sys

    if outtype not in LLAMA_CPP_TYPES:
        raise ValueError(f"outtype must be one of {', '.join(LLAMA_CPP_TYPES)}, got {outtype!r}")
    out = (cache or cache_root()) / f"{_key(hf_folder)}-{outtype}-c{_CONVERT_TAG}.gguf"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".building")
    done = subprocess.run([sys.executable, "-c", _CONVERT, str(llama_cpp_source(cache)), str(hf_folder),
                           "--outtype", outtype, "--outfile", str(tmp)], capture_output=True, text=True)
    if done.returncode != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama.cpp's convert_hf_to_gguf.py failed on {hf_folder}:\n{done.stderr[-2000:]}")
    os.replace(tmp, out)
    return out


class MinillmEngine:
    """minillm itself; with ``decode_graphs`` a second variant (``LLM(decode_graphs=True)``),
    reported under its own name and compared like the others."""

    def __init__(self, folder: Path, threads: int, kv_tokens: int, decode_graphs: bool = False,
                 attention_backend: str = "auto", weight_dtype: str | None = None):
        from minillm import LLM

        self.name = {(False, None): "minillm", (True, None): MINILLM_GRAPHS, (False, "int8"): MINILLM_INT8,
                     (True, "int8"): MINILLM_INT8_GRAPHS}[(bool(decode_graphs), weight_dtype)]
        self.llm = LLM(str(folder), device="cpu", dtype="float32", enable_prefix_caching=False,
                       kv_cache_tokens=kv_tokens, max_num_seqs=64, num_threads=threads,
                       decode_graphs=decode_graphs, attention_backend=attention_backend, weight_dtype=weight_dtype)
        #: bytes a decode step streams when not float32 (int8: levels and scales of every
        #: projection, the lm head's own copy included); None: the float32 weights
        self.weight_bytes = _int8_bytes(self.llm.model) if weight_dtype else None

    def latency(self, prompt: list[int], new_tokens: int):
        from .harness import minillm_latency

        return minillm_latency(self.llm, prompt, new_tokens, collect=False)  # the caller collects

    def workload(self, prompts, max_tokens, batch_size=None):
        from .harness import minillm_run

        seconds, out, _ = minillm_run(self.llm, prompts, max_tokens, collect=False)  # the caller collects
        return seconds, out


#: the names of minillm's variants in the results: decode graphs, int8 projections
MINILLM_GRAPHS = "minillm, decode graphs"
MINILLM_INT8 = "minillm int8"
MINILLM_INT8_GRAPHS = "minillm int8, decode graphs"


def _int8_bytes(model) -> int:
    from minillm.models.weights import Int8Linear

    return sum(m.weight_bytes for m in model.modules() if isinstance(m, Int8Linear))


def weight_kind(name: str) -> str:
    """"int8" for an engine running 8-bit weights (minillm int8, llama.cpp Q8_0, CTranslate2
    int8), else "float": the mixed workload's "best peer" is chosen among engines of the same
    kind, so float32 minillm is never set against an 8-bit peer, nor int8 against a float32 one."""
    low = name.lower()
    return "int8" if ("int8" in low or "q8" in low) else "float"


def is_minillm(name: str) -> bool:
    return name.startswith("minillm")


class CTranslate2Engine:
    """A float32 CT2 generator; ids are passed as the vocabulary's token strings."""

    batch_sizes = (8, 16, 32, 64)
    weight_bytes = None  # float32

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
    """llama-cpp-python on a float32 GGUF of the same weights, float32 KV cache (llama.cpp's
    default is float16), greedy. Batch 1 through the high-level ``Llama.generate``; the mixed
    workload through ``LlamaCppBatcher``, a continuous-batching loop over the low-level API
    (the Python binding has no batched generation of its own), at a few sequence limits."""

    batch_sizes = (8, 16, 32, 64)

    def __init__(self, gguf: Path, threads: int, n_ctx: int):
        import llama_cpp

        self.path, self.threads = gguf, threads
        with LlamaCppErrors() as errors:
            try:
                self.llm = llama_cpp.Llama(model_path=str(gguf), n_threads=threads, n_threads_batch=threads,
                                           n_ctx=n_ctx, n_batch=512, verbose=False,
                                           type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32)
            except ValueError as exc:  # its message says only "Failed to load model from file"
                raise ValueError(f"{exc} ({' '.join(errors) or 'llama.cpp logged no error'})") from None
        kind = GGUF_FILE_TYPES.get(int(self.llm.metadata.get("general.file_type", -1)))
        #: the model's tensor bytes (a decode step streams them all but the embedding rows)
        self.weight_bytes = None if kind == "F32" else int(llama_cpp.llama_model_size(self.llm._model.model))
        self.name = f"llama.cpp (llama-cpp-python {llama_cpp.__version__}) {kind or 'GGUF ' + gguf.name}"
        self._batchers: dict[int, LlamaCppBatcher] = {}

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

    def workload(self, prompts, max_tokens, batch_size=64):
        if batch_size not in self._batchers:
            ctx = batch_size * (max(map(len, prompts)) + max(max_tokens) + 8)
            self._batchers[batch_size] = LlamaCppBatcher(self.llm._model.model, ctx, batch_size, self.threads)
        t0 = time.perf_counter()
        outs = self._batchers[batch_size].run(prompts, max_tokens)
        return time.perf_counter() - t0, outs


#: GGUF ``general.file_type`` -> the name llama.cpp gives it (the types compared here)
GGUF_FILE_TYPES = {0: "F32", 1: "F16", 7: "Q8_0", 32: "BF16"}


class LlamaCppErrors:
    """Collect the errors llama.cpp logs meanwhile (with ``verbose=False`` the binding hides
    them, and a failed load then says only "Failed to load model from file")."""

    def __enter__(self) -> list[str]:
        import ctypes

        import llama_cpp
        from llama_cpp import _logger

        self.lines: list[str] = []

        def keep(level, text, user_data):
            if level == 4:  # GGML_LOG_LEVEL_ERROR in ggml.h (the binding's _logger still says 3)
                self.lines.append(text.decode("utf-8", "replace").strip())

        self._keep = llama_cpp.llama_log_callback(keep)  # referenced while installed
        self._restore = lambda: llama_cpp.llama_log_set(_logger.llama_log_callback, ctypes.c_void_p(0))
        llama_cpp.llama_log_set(self._keep, ctypes.c_void_p(0))
        return self.lines

    def __exit__(self, *exc) -> None:
        self._restore()


class LlamaCppBatcher:
    """Continuous batching on one llama.cpp context: up to ``max_seqs`` sequences at once, each
    step one token for every decoding sequence plus prompt tokens of waiting ones (chunked to the
    step's ``n_batch``), a finished sequence's KV removed and its id reused, greedy (argmax of
    the float32 logits)."""

    def __init__(self, model, n_ctx: int, max_seqs: int, threads: int, n_batch: int = 512):
        import llama_cpp as L

        self.L, self.n_batch, self.max_seqs = L, n_batch, max_seqs
        cp = L.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch = n_ctx, n_batch, n_batch
        cp.n_seq_max = min(max_seqs, L.llama_max_parallel_sequences())
        cp.n_threads = cp.n_threads_batch = threads
        cp.type_k = cp.type_v = L.GGML_TYPE_F32
        cp.kv_unified = True
        self.ctx = L.llama_init_from_model(model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create a context for the batched workload")
        self.max_seqs = cp.n_seq_max
        self.vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
        self.batch = L.llama_batch_init(n_batch, 0, 1)

    def __del__(self):
        try:
            self.L.llama_batch_free(self.batch)
            self.L.llama_free(self.ctx)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def run(self, prompts, max_tokens):
        import numpy as np

        L, b = self.L, self.batch
        mem = L.llama_get_memory(self.ctx)
        L.llama_memory_clear(mem, True)
        outs = [[] for _ in prompts]
        waiting = list(range(len(prompts)))
        free_ids = list(range(self.max_seqs))
        active = {}  # seq id -> [request, tokens fed so far, next token or None]
        while waiting or active:
            while waiting and free_ids:
                active[free_ids.pop()] = [waiting.pop(0), 0, None]
            n, rows = 0, []
            for sid, st in active.items():  # decoding sequences: one token each
                if st[2] is not None:
                    self._add(n, st[2], len(prompts[st[0]]) + len(outs[st[0]]) - 1, sid, True)
                    rows.append((n, sid))
                    n += 1
            for sid, st in active.items():  # then prompt tokens, as many as the step holds
                if st[2] is None and n < self.n_batch:
                    prompt = prompts[st[0]]
                    take = min(len(prompt) - st[1], self.n_batch - n)
                    for j in range(st[1], st[1] + take):
                        last = j == len(prompt) - 1
                        self._add(n, prompt[j], j, sid, last)
                        if last:
                            rows.append((n, sid))
                        n += 1
                    st[1] += take
            b.n_tokens = n
            if L.llama_decode(self.ctx, b) != 0:
                raise RuntimeError("llama_decode failed (KV cache full?)")
            for row, sid in rows:
                st = active[sid]
                logits = np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, row), shape=(self.vocab,))
                tok = int(logits.argmax())
                outs[st[0]].append(tok)
                st[2] = tok
                if len(outs[st[0]]) >= max_tokens[st[0]]:
                    L.llama_memory_seq_rm(mem, sid, -1, -1)
                    del active[sid]
                    free_ids.append(sid)
        return outs

    def _add(self, i, token, pos, seq_id, logits):
        b = self.batch
        b.token[i], b.pos[i], b.n_seq_id[i] = token, pos, 1
        b.seq_id[i][0] = seq_id
        b.logits[i] = logits


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


def _token_check(ref: list[list[int]], got: list[list[int]]) -> dict:
    """How many requests gave exactly minillm's tokens, and the first divergences (up to 8)."""
    div = [first_divergence(r, o) for r, o in zip(ref, got)]
    return {"identical_requests": sum(d is None for d in div), "requests": len(div),
            "first_divergences": [d for d in div if d is not None][:8]}


def _spread(xs):
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs}


def bench_peers(model: str, folder: Path, threads_list=(1, 2), rounds: int = 5, prompt_lens=(16, 128, 512),
                new_tokens: int = 128, num_requests: int = 64, seed: int = 0, llama_cpp_gguf: Path | None = None,
                log=print, workload_rounds: int | None = None, batch_sizes: tuple[int, ...] | None = None,
                decode_graphs: bool = False, attention_backend: str = "auto",
                llama_cpp_types: tuple[str, ...] = ("f32",), int8: bool = False) -> dict:
    """minillm beside CTranslate2 and llama.cpp (those installed) at each thread count; with
    ``decode_graphs`` also ``LLM(decode_graphs=True)``, whose graphs are compiled in the untimed
    check runs (each engine's first run of a prompt or of the workload). llama.cpp runs once per
    GGUF type in ``llama_cpp_types`` (f32; q8_0: the same weights quantised by llama.cpp, for the
    int8 comparison), or on ``llama_cpp_gguf`` alone when given; with ``int8`` also
    ``LLM(weight_dtype="int8")`` (its tokens checked against float32 minillm's like a peer's).

    The result names the machine: CPU model and features, the read bandwidth one core and two
    get (measured before and after the engines, in this process), the load average, and the
    weights' bytes, so each batch-1 TPOT can be set against the weight-streaming floor (bytes
    over bandwidth). Beside every wall time it records CPU time per output token."""
    import torch

    from .harness import _loadavg, bandwidth_by_threads, machine_info
    from .models import param_count

    status = available_peers()
    ggufs = [llama_cpp_gguf] if llama_cpp_gguf else []
    if status["llama.cpp"] is None and not ggufs:
        ggufs = _llama_cpp_files(folder, llama_cpp_types, status)
    machine = machine_info(torch.device("cpu"))
    machine["read_gbs_start"] = bandwidth_by_threads(threads_list)
    result = {"model": model, "folder": str(folder), "rounds": rounds, "new_tokens": new_tokens,
              "peers_not_run": {k: v for k, v in status.items() if v}, "threads": {},
              "load_average_start": _loadavg(), "torch": torch.__version__, "machine": machine,
              "weight_bytes": 4 * param_count(folder)}
    rng = random.Random(seed + 2)
    plens = [rng.randint(16, 256) for _ in range(num_requests)]
    olens = [rng.randint(16, 256) for _ in range(num_requests)]
    before = torch.get_num_threads()
    try:
        for threads in threads_list:
            kv_tokens = num_requests * (256 + 256 + 16)
            engines = [MinillmEngine(folder, threads, kv_tokens, attention_backend=attention_backend)]
            if decode_graphs:
                engines.append(MinillmEngine(folder, threads, kv_tokens, decode_graphs=True,
                                             attention_backend=attention_backend))
            if int8:
                engines.append(MinillmEngine(folder, threads, kv_tokens, attention_backend=attention_backend,
                                             weight_dtype="int8"))
            if int8 and decode_graphs:  # int8 projections traced as the streaming kernel's op
                engines.append(MinillmEngine(folder, threads, kv_tokens, decode_graphs=True,
                                             attention_backend=attention_backend, weight_dtype="int8"))
            result["attention_backend"] = engines[0].llm.attention_backend
            tok, vocab = engines[0].llm.tokenizer, engines[0].llm.model_config.vocab_size
            lens = [p for p in prompt_lens if p + new_tokens <= engines[0].llm.max_model_len]
            prompts = random_prompts(tok, vocab, lens, seed=seed + 1)
            work = random_prompts(tok, vocab, plens, seed=seed + 3)
            _add_peers(engines, folder, status, result, threads, ggufs, n_ctx=max(lens) + new_tokens + 16)
            result.setdefault("weight_bytes_by_engine", {}).update(
                {e.name: e.weight_bytes for e in engines if e.weight_bytes})
            entry = {"latency": [], "workload": {}, "engines": [e.name for e in engines], "rounds": rounds,
                     "load_average_start": _loadavg()}
            for plen, prompt in zip(lens, prompts):
                row = _latency_row(engines, plen, prompt, new_tokens, rounds, threads)
                entry["latency"].append(row)
                log(f"  [{model}] {threads} thread(s), prompt {plen}: TPOT ms " +
                    ", ".join(f"{k} {1e3 * v['median']:.2f}" for k, v in row["tpot"].items()) +
                    f" checks {row['checks']}")
            if workload_rounds == 0:  # batch-1 latency only
                entry["workload"] = None
            else:
                entry["workload"] = _workload(engines, work, olens, workload_rounds or rounds, batch_sizes)
                log(f"  [{model}] {threads} thread(s), mixed workload tok/s: " +
                    ", ".join(f"{k} {v['median']:.0f}" for k, v in entry["workload"]["tokens_per_s"].items()))
            entry["load_average_end"] = _loadavg()
            result["threads"][str(threads)] = entry
            del engines
    finally:
        torch.set_num_threads(before)
    machine["read_gbs_end"] = bandwidth_by_threads(threads_list)
    result["load_average_end"] = _loadavg()
    return result


def _llama_cpp_files(folder: Path, types, status: dict) -> list[Path]:
    """The folder converted for llama.cpp in each of ``types``; a failed conversion is reported
    (under "llama.cpp" when none converted), not fatal."""
    out, failed = [], {}
    for t in types:
        try:
            out.append(llama_cpp_gguf_for(folder, outtype=t))
        except Exception as exc:  # noqa: BLE001 - report it, run the other peers
            failed[t] = f"no {t} GGUF (give one with --llama-cpp-gguf): {exc}"
    for t, why in failed.items():
        status["llama.cpp" if not out else f"llama.cpp {t}"] = why
    return out


def _add_peers(engines: list, folder: Path, status: dict, result: dict, threads: int, ggufs: list[Path],
               n_ctx: int) -> None:
    """Append the installed peers to ``engines`` (a peer that cannot load is reported, not fatal,
    and dropped from ``ggufs`` for the next thread counts)."""
    if status["ctranslate2"] is None:
        engines.append(CTranslate2Engine(folder, threads))
    if status["llama.cpp"] is not None:
        return
    for gguf in list(ggufs):
        try:
            engines.append(LlamaCppEngine(gguf, threads, n_ctx=n_ctx))
        except ValueError as exc:  # llama.cpp could not load the converted file
            key = "llama.cpp" if len(ggufs) == 1 else f"llama.cpp {gguf.name}"
            status[key] = result["peers_not_run"][key] = f"llama.cpp could not load {gguf.name}: {exc}"
            ggufs.remove(gguf)


def _latency_row(engines: list, plen: int, prompt: list[int], new_tokens: int, rounds: int,
                 threads: int | None = None) -> dict:
    """Batch-1 latency of one prompt: check every engine's tokens against the first engine's,
    then ``rounds`` timed runs with the order rotating. CPU time is per output token over the
    whole request (prefill included), all of the process's threads. With ``threads``, the read
    bandwidth is probed in every round too (``read_gbs``), so the floor comes from the same minutes
    as the engines, not only from the run's start and end."""
    from .harness import CpuClock, read_bandwidth

    ref = None
    row = {"prompt": plen, "checks": {}}
    for e in engines:
        _, _, out = e.latency(prompt, new_tokens)
        if ref is None:
            ref = out
        else:
            div = first_divergence(ref, out)
            row["checks"][e.name] = {"identical": div is None, "first_divergence": div}
    order = list(engines)
    ttft, tpot, cpu = ({e.name: [] for e in engines} for _ in range(3))
    for _ in range(rounds):
        if threads:
            row.setdefault("read_gbs", []).append(round(read_bandwidth(threads, repeats=2), 2))
        order = order[1:] + order[:1]
        for e in order:
            gc.collect()  # for every engine, outside its CPU clock (a full collection of this
            with CpuClock() as clock:  # process took more CPU than a small model's request)
                a, b, out = e.latency(prompt, new_tokens)
            ttft[e.name].append(a)
            tpot[e.name].append(b)
            cpu[e.name].append(clock.cpu / max(1, len(out)))
    row["ttft"] = {k: _spread(v) for k, v in ttft.items()}
    row["tpot"] = {k: _spread(v) for k, v in tpot.items()}
    row["cpu_per_token"] = {k: _spread(v) for k, v in cpu.items()}
    return row


def _workload(engines: list, work, olens, rounds: int, batch_sizes) -> dict:
    """The mixed workload: each peer's best static batch size screened first (as its users
    would), token checks against minillm, then timed rounds with the order rotating."""
    from .harness import CpuClock

    out = {}
    wanted = sum(olens)
    ref_out = engines[0].workload(work, olens)[1]
    best = {engines[0].name: None}
    for e in engines[1:]:
        if isinstance(e, MinillmEngine):  # one untimed run: its graphs compile here
            out.setdefault("checks", {})[e.name] = _token_check(ref_out, e.workload(work, olens)[1])
            best[e.name] = None
            continue
        rates = {}
        for bsz in batch_sizes or e.batch_sizes:
            seconds, got = e.workload(work, olens, bsz)
            rates[bsz] = wanted / seconds
            out.setdefault("checks", {})[f"{e.name} batch {bsz}"] = _token_check(ref_out, got)
        best[e.name] = max(rates, key=rates.get)
        out.setdefault("batch_rates", {})[e.name] = rates
    rates = {e.name: [] for e in engines}
    cpu = {e.name: [] for e in engines}
    order = list(engines)
    for _ in range(rounds):
        order = order[1:] + order[:1]
        for e in order:
            gc.collect()  # every engine's, outside its CPU clock
            with CpuClock() as clock:
                seconds, _ = e.workload(work, olens, best[e.name]) if best[e.name] else e.workload(work, olens)
            rates[e.name].append(wanted / seconds)
            cpu[e.name].append(clock.cpu / wanted)
    out.update(rounds=rounds, requests=len(work), wanted_tokens=wanted, best_batch=best,
               tokens_per_s={k: _spread(v) for k, v in rates.items()},
               cpu_per_token={k: _spread(v) for k, v in cpu.items()})
    return out


def peers_markdown(results: list[dict]) -> str:
    lines = []
    for r in results:
        lines.append(f"### Peers on `{r['model']}` (float32, greedy, same token ids; batch-1 TPOT over "
                     f"{r['new_tokens']} new tokens; medians of alternating rounds, range in brackets)\n")
        lines.extend(_machine_lines(r))
        for t, e in r["threads"].items():
            la0, la1 = e["load_average_start"], e["load_average_end"]
            names = e["engines"]
            lines.append(f"**{t} thread(s)**, batch-1 latency {e.get('rounds', r['rounds'])} rounds, load average "
                         f"{la0[0]:.1f} → {la1[0]:.1f}\n")
            lines.append("| prompt | " + " | ".join(f"TPOT {n} (ms)" for n in names) + " | greedy tokens |")
            lines.append("|---:|" + "---:|" * len(names) + "---|")
            for row in e["latency"]:
                cells = [f"{1e3 * row['tpot'][n]['median']:.2f} [{1e3 * row['tpot'][n]['min']:.2f}–"
                         f"{1e3 * row['tpot'][n]['max']:.2f}]" for n in names]
                checks = "; ".join(f"{n}: " + ("identical" if c["identical"] else f"first differs at {c['first_divergence']}")
                                   for n, c in row["checks"].items()) or "-"
                lines.append(f"| {row['prompt']} | " + " | ".join(cells) + f" | {checks} |")
            lines.extend(_cost_lines(r, t, e))
            w = e["workload"]
            lines.append("")
            if w is None:  # --workload-runs 0: batch-1 only
                peers = [n for n in names if not is_minillm(n)]
                for mine_name in [n for n in names if is_minillm(n)]:
                    lines.append(f"batch-1 TPOT, {mine_name} / " + "; ".join(f"{n}: " + " / ".join(
                        f"{row['tpot'][mine_name]['median'] / row['tpot'][n]['median']:.2f}×" for row in e["latency"])
                        for n in peers) + " (prompts " + " / ".join(str(row["prompt"]) for row in e["latency"])
                        + "); the mixed workload was not run (--workload-runs 0)\n")
                continue
            lines.append(f"Mixed workload ({w['requests']} requests, {w['wanted_tokens']} wanted output tokens, "
                         f"{w.get('rounds', e.get('rounds', r['rounds']))} timed rounds), "
                         "output tokens/s: " + "; ".join(
                             f"{n} {w['tokens_per_s'][n]['median']:.0f} [{w['tokens_per_s'][n]['min']:.0f}–"
                             f"{w['tokens_per_s'][n]['max']:.0f}]" + _batching(n, w['best_batch'].get(n))
                             for n in names))
            if "cpu_per_token" in w:
                lines[-1] += ("; CPU ms per output token: " + "; ".join(
                    f"{n} {1e3 * w['cpu_per_token'][n]['median']:.2f}" for n in names))
            peers = [n for n in names if not is_minillm(n)]
            prompts = " (prompts " + " / ".join(str(row["prompt"]) for row in e["latency"]) + ")"
            for mine_name in [n for n in names if is_minillm(n)]:
                best_peer = max((n for n in peers if weight_kind(n) == weight_kind(mine_name)),
                                key=lambda n: w["tokens_per_s"][n]["median"], default=None)
                if not best_peer:
                    continue
                mine = w["tokens_per_s"][mine_name]["median"]
                lines.append(f"\n{mine_name} / the best peer ({best_peer}) on the mixed workload: "
                             f"**{mine / w['tokens_per_s'][best_peer]['median']:.2f}×**; batch-1 TPOT, {mine_name} / "
                             + "; ".join(f"{n}: " + " / ".join(
                                 f"{row['tpot'][mine_name]['median'] / row['tpot'][n]['median']:.2f}×" for row in e["latency"])
                                 for n in peers) + prompts)
            for k, c in w.get("checks", {}).items():
                lines.append(f"- {k}: {c['identical_requests']}/{c['requests']} requests token-identical to minillm"
                             + (f" (first divergences at {c['first_divergences']})" if c["first_divergences"] else ""))
            lines.append("")
        for peer, why in r["peers_not_run"].items():
            lines.append(f"- {peer} was not run: {why}.")
        lines.append("")
    return "\n".join(lines)


def _machine_lines(r: dict) -> list[str]:
    """The machine the figures come from (results written before it was recorded have none)."""
    m = r.get("machine")
    if not m:
        return ["Machine: not recorded with this result.\n"]
    bw0, bw1 = m.get("read_gbs_start", {}), m.get("read_gbs_end", {})
    bw = ", ".join(f"{t} thread(s) {bw0[t]:.1f}" + (f" → {bw1[t]:.1f}" if t in bw1 else "") for t in bw0)
    return [f"Machine: {m.get('cpu')} ({', '.join(m.get('cpu_features', [])) or 'no AVX2'}), "
            f"{m.get('logical_cpus')} logical CPUs; read bandwidth GB/s (before → after the engines): {bw}; "
            f"torch {m.get('torch')}.\n"]


def _cost_lines(r: dict, t: str, e: dict) -> list[str]:
    """Below a latency table: CPU time per output token, and TPOT against the weight-streaming
    floor (the weights' bytes over the best read bandwidth measured at this thread count: before,
    after and in every round)."""
    lines = []
    names = e["engines"]
    if all("cpu_per_token" in row for row in e["latency"]):
        lines.append("\nCPU time per output token (ms, whole request, every thread of the process), by prompt: " +
                     "; ".join(f"{n} " + " / ".join(f"{1e3 * row['cpu_per_token'][n]['median']:.1f}"
                                                   for row in e["latency"]) for n in names))
    m = r.get("machine") or {}
    # the best read rate seen at this thread count (start, end, every round): a probe that got
    # less of a shared machine than the engines would otherwise make the floor too generous
    probes = [m.get(k, {}).get(t) for k in ("read_gbs_start", "read_gbs_end")]
    probes += [g for row in e["latency"] for g in row.get("read_gbs", [])]
    bw = max((g for g in probes if g), default=None)
    if bw and r.get("weight_bytes"):
        floor = r["weight_bytes"] / (bw * 1e9)
        own = r.get("weight_bytes_by_engine", {})  # engines whose weights are not float32

        def share(n, row):
            return f"{own.get(n, r['weight_bytes']) / (bw * 1e9) / row['tpot'][n]['median']:.0%}"

        lines.append(f"\nWeight-streaming floor at {t} thread(s): {1e3 * floor:.2f} ms "
                     f"({r['weight_bytes'] / 2**20:.0f} MiB of float32 weights at {bw:.1f} GB/s, the best of "
                     f"{sum(1 for g in probes if g)} probes" +
                     "".join(f"; {n}: {1e3 * b / (bw * 1e9):.2f} ms for its {b / 2**20:.0f} MiB"
                             for n, b in own.items() if n in names) +
                     "); share of the floor reached (floor / TPOT), by prompt: " +
                     "; ".join(f"{n} " + " / ".join(share(n, row) for row in e["latency"]) for n in names))
    return lines


def _batching(name: str, size) -> str:
    if not size:
        return " (continuous batching)"
    if name.startswith("llama.cpp"):
        return f" (continuous batching, at most {size} sequences)"
    return f" (static batches of {size})"


def update_peers_readme(readme: Path, results: list[dict]) -> None:
    block = PEERS_BEGIN + "\n\n" + peers_markdown(results) + "\n" + PEERS_END
    text = readme.read_text() if readme.is_file() else "# Benchmarks\n"
    if PEERS_BEGIN in text and PEERS_END in text:
        head, rest = text.split(PEERS_BEGIN, 1)
        text = head + block + rest.split(PEERS_END, 1)[1]
    else:
        text = text.rstrip() + "\n\n## Peers: CTranslate2 and llama.cpp (`minillm bench --peers`)\n\n" + block + "\n"
    readme.write_text(text)
