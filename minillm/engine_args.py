"""Every ``LLM(...)`` option checked and normalised before anything is loaded or allocated.

An option that can never work fails here with a ``ValueError`` naming it and what is allowed,
instead of deep inside torch (``dtype=torch.int8``, ``device="meta"``) or silently
(``enable_prefix_caching="no"`` is truthy). Integers may be Python or NumPy integers (the same
rule as ``SamplingParams``) and come back as ``int``; ``True``/``False`` are never integers.

Two steps, because some limits depend on the model:

* ``check_engine_options(...)`` -> ``EngineOptions``: types and ranges, device and dtype picked;
* ``plan_kv_cache(options, config)`` -> ``KVPlan``: ``max_model_len`` against the model, and
  the number of KV blocks, where one block must fit the memory budget.
"""

from __future__ import annotations

import numbers
import os
from dataclasses import dataclass

import numpy as np
import torch

DTYPE_NAMES = {"float32": torch.float32, "fp32": torch.float32, "float": torch.float32,
               "float16": torch.float16, "fp16": torch.float16, "half": torch.float16,
               "bfloat16": torch.bfloat16, "bf16": torch.bfloat16}
ALLOWED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DEVICE_TYPES = ("cpu", "cuda")
SCHEDULING = ("continuous", "static")
#: names of ``minillm.fast.attention.BACKENDS`` (kept here so checking options imports no model code),
#: and "auto": "flex" on CUDA, the CPU kernel where it builds for a float32 cache, else "gather"
ATTENTION_BACKENDS = ("gather", "paged", "kernel", "flex", "auto")
#: values of ``weight_dtype`` (``minillm.models.weights``): None keeps the weights in ``dtype``;
#: "int8" stores the projections as int8 with per-output-channel scales (CPU, float32 only)
WEIGHT_DTYPES = (None, "int8")
# default KV budget on CPU (the pool is zero-filled, so it is resident memory at once)
CPU_KV_BUDGET_BYTES = 256 << 20
# default KV budget on CUDA: this fraction of the free memory after the weights are loaded
CUDA_KV_FRACTION = 0.5
MAX_BLOCK_SIZE = 1 << 16


# --- single values ------------------------------------------------------------------------
def as_int(name: str, value, minimum: int | None = 1, maximum: int | None = None) -> int:
    """An int (Python or NumPy, never a bool) in [minimum, maximum], returned as ``int``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{name} must be an int{_range(minimum, maximum)}, got {value!r}")
    value = int(value)
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"{name} must be an int{_range(minimum, maximum)}, got {value}")
    return value


def as_optional_int(name: str, value, minimum: int | None = 1, maximum: int | None = None,
                    none_means: str = "the default") -> int | None:
    """None, or what ``as_int`` accepts."""
    if value is None:
        return None
    try:
        return as_int(name, value, minimum, maximum)
    except ValueError:
        raise ValueError(f"{name} must be None ({none_means}) or an int{_range(minimum, maximum)}, "
                         f"got {value!r}") from None


def as_bool(name: str, value) -> bool:
    """True or False only (NumPy's bool too): a string such as "no" is not a switch."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ValueError(f"{name} must be True or False, got {value!r}")


def _range(minimum, maximum) -> str:
    if minimum is not None and maximum is not None:
        return f" in [{minimum}, {maximum}]"
    if minimum is not None:
        return f" >= {minimum}"
    return f" <= {maximum}" if maximum is not None else ""


# --- device and dtype -----------------------------------------------------------------------
def pick_device(device: str | torch.device = "auto") -> torch.device:
    """"auto" is CUDA when available, else CPU; "cpu", "cuda", "cuda:N" or a torch.device of
    those types otherwise (an index must exist)."""
    allowed = "'auto', 'cpu', 'cuda' or 'cuda:N' (or a torch.device of type cpu or cuda)"
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if isinstance(device, str):
        try:
            dev = torch.device(device)
        except (RuntimeError, ValueError):
            raise ValueError(f"device must be {allowed}, got {device!r}") from None
    elif isinstance(device, torch.device):
        dev = device
    else:
        raise ValueError(f"device must be {allowed}, got {device!r}")
    if dev.type not in DEVICE_TYPES:
        raise ValueError(f"device must be {allowed}, got {device!r} (minillm runs on CPU or CUDA only)")
    if dev.type == "cpu":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError(f"device={str(dev)!r} was asked for but no CUDA device is available; use device='cpu'")
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise ValueError(f"device={str(dev)!r}: there are {count} CUDA device(s), so N must be in [0, {count - 1}]")
    return dev


def auto_dtype(device: torch.device) -> torch.dtype:
    """float32 on CPU; on CUDA bfloat16 where the GPU computes in it natively, else float16
    (pre-Ampere GPUs emulate bfloat16 slowly or not at all)."""
    if device.type != "cuda":
        return torch.float32
    return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16


def pick_dtype(dtype: str | torch.dtype = "auto", device: torch.device | None = None) -> torch.dtype:
    """"auto" (see ``auto_dtype``), a name from ``DTYPE_NAMES`` or one of ``ALLOWED_DTYPES``."""
    names = ", ".join(repr(n) for n in DTYPE_NAMES)
    allowed = f"'auto', {names} or torch.float32 / torch.float16 / torch.bfloat16"
    if isinstance(dtype, torch.dtype):
        if dtype not in ALLOWED_DTYPES:
            raise ValueError(f"dtype must be {allowed}, got {dtype} (weights and the KV cache are floating point)")
        return dtype
    if isinstance(dtype, str) and dtype == "auto":
        return auto_dtype(device if device is not None else torch.device("cpu"))
    if isinstance(dtype, str) and dtype in DTYPE_NAMES:
        return DTYPE_NAMES[dtype]
    raise ValueError(f"dtype must be {allowed}, got {dtype!r}")


# --- all options ----------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineOptions:
    """The ``LLM(...)`` options after checking: plain Python values, device and dtype resolved."""

    device: torch.device
    dtype: torch.dtype
    block_size: int
    num_kv_blocks: int | None
    kv_cache_tokens: int | None
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int | None
    enable_prefix_caching: bool
    enable_chunked_prefill: bool
    scheduling: str
    seed: int
    max_history: int | None
    trace_limit: int | None
    num_threads: int | None = None
    attention_backend: str = "auto"
    weight_dtype: str | None = None
    compile: bool = False
    row_split: bool = False
    decode_graphs: str | None = None
    fast: bool = True


def check_weight_dtype(weight_dtype, device: torch.device, dtype: torch.dtype):
    """``weight_dtype`` is one of ``WEIGHT_DTYPES``; "int8" needs the CPU (torch's quantized
    linear) and float32 activations."""
    if weight_dtype is not None and (not isinstance(weight_dtype, str) or weight_dtype not in WEIGHT_DTYPES):
        raise ValueError(f"weight_dtype must be one of {WEIGHT_DTYPES} (None: weights in dtype), got {weight_dtype!r}")
    if weight_dtype == "int8":
        if device.type != "cpu":
            raise ValueError(f"weight_dtype='int8' runs on the CPU only (torch's quantized linear), "
                             f"got device={str(device)!r}")
        if dtype != torch.float32:
            raise ValueError(f"weight_dtype='int8' needs dtype='float32' (float32 activations), got dtype={dtype}")
    return weight_dtype


def check_compile(compile, device: torch.device, weight_dtype=None) -> bool:
    """``compile`` is True or False; True needs what inductor compiles with on ``device``
    (a C++ compiler on the CPU, triton on CUDA), checked now rather than at the first step, and
    float weights (torch.compile cannot trace the int8 projections' packed weights)."""
    if not isinstance(compile, (bool, np.bool_)):
        raise ValueError(f"compile must be True or False (torch.compile of the forward, "
                         f"minillm.fast.compiled), got {compile!r}")
    if compile and weight_dtype is not None:
        raise ValueError(f"compile=True needs weight_dtype=None: torch.compile cannot trace the packed "
                         f"{weight_dtype} projections (use one option or the other)")
    if compile:
        import importlib.util
        import shutil

        if device.type == "cuda" and importlib.util.find_spec("triton") is None:
            raise ValueError("compile=True on CUDA needs the triton package (inductor's GPU code); "
                             "install it or use compile=False")
        cxx = os.environ.get("CXX") or "g++"  # the compiler inductor calls on the CPU
        if device.type == "cpu" and shutil.which(cxx) is None:
            raise ValueError(f"compile=True on the CPU needs a C++ compiler: inductor builds its kernels "
                             f"with {cxx!r} ($CXX, else g++), which is not on PATH; install it or use compile=False")
    return bool(compile)


#: ``decode_graphs`` values besides True / False (``minillm.fast.decode_graphs``)
DECODE_GRAPH_MODES = ("eager", "compile", "cuda")


def check_decode_graphs(value, device: torch.device, weight_dtype=None, row_split=False) -> str | None:
    """``decode_graphs`` is False (None: off), True (the device's way: "cuda" graphs on CUDA,
    "compile" on the CPU) or one of ``DECODE_GRAPH_MODES``. Returns the mode or None."""
    if value is None or (isinstance(value, (bool, np.bool_)) and not value):
        return None
    if isinstance(value, (bool, np.bool_)):
        value = "cuda" if device.type == "cuda" else "compile"
    if not isinstance(value, str) or value not in DECODE_GRAPH_MODES:
        raise ValueError(f"decode_graphs must be True, False or one of {DECODE_GRAPH_MODES} "
                         f"(minillm.fast.decode_graphs), got {value!r}")
    if value == "cuda" and device.type != "cuda":
        raise ValueError(f"decode_graphs='cuda' captures CUDA graphs and needs device='cuda', got "
                         f"device={str(device)!r} (use True or 'compile' on the CPU)")
    if value == "cuda" and weight_dtype is not None:
        raise ValueError(f"decode_graphs={value!r} needs weight_dtype=None: the packed {weight_dtype} "
                         f"projections cannot be traced (use decode_graphs='eager' or float weights)")
    if value != "eager" and row_split:
        raise ValueError(f"decode_graphs={value!r} and row_split=True exclude each other: the row split's "
                         f"threads cannot be traced into a graph")
    if value == "compile":
        check_compile(True, device)
    return value


def check_engine_options(device="auto", dtype="auto", *, block_size=16, num_kv_blocks=None, kv_cache_tokens=None,
                         max_num_seqs=64, max_num_batched_tokens=4096, max_model_len=None,
                         enable_prefix_caching=True, enable_chunked_prefill=True, scheduling="continuous",
                         seed=0, max_history=None, trace_limit=None, num_threads=None,
                         attention_backend="auto", weight_dtype=None, compile=False,
                         row_split=False, decode_graphs=False, fast=True) -> EngineOptions:
    """Check every option that does not depend on the model; raise ``ValueError`` naming the
    first bad one and its allowed values. Nothing is loaded or allocated."""
    dev = pick_device(device)
    check_reference_options(as_bool("fast", fast), attention_backend, weight_dtype, compile, row_split,
                            decode_graphs)
    if num_kv_blocks is not None and kv_cache_tokens is not None:
        raise ValueError("give the KV budget as num_kv_blocks or kv_cache_tokens, not both")
    if not isinstance(scheduling, str) or scheduling not in SCHEDULING:
        raise ValueError(f"scheduling must be one of {SCHEDULING}, got {scheduling!r}")
    if not isinstance(attention_backend, str) or attention_backend not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be one of {ATTENTION_BACKENDS}, got {attention_backend!r}")
    torch_dtype = pick_dtype(dtype, dev)
    return EngineOptions(
        device=dev,
        dtype=torch_dtype,
        block_size=as_int("block_size", block_size, 1, MAX_BLOCK_SIZE),
        num_kv_blocks=as_optional_int("num_kv_blocks", num_kv_blocks, 1, none_means="sized from memory"),
        kv_cache_tokens=as_optional_int("kv_cache_tokens", kv_cache_tokens, 1, none_means="sized from memory"),
        max_num_seqs=as_int("max_num_seqs", max_num_seqs, 1),
        max_num_batched_tokens=as_int("max_num_batched_tokens", max_num_batched_tokens, 1),
        max_model_len=as_optional_int("max_model_len", max_model_len, 2, none_means="the model's maximum"),
        enable_prefix_caching=as_bool("enable_prefix_caching", enable_prefix_caching),
        enable_chunked_prefill=as_bool("enable_chunked_prefill", enable_chunked_prefill),
        scheduling=scheduling,
        seed=as_int("seed", seed, None),
        max_history=as_optional_int("max_history", max_history, 0, none_means="keep everything"),
        trace_limit=as_optional_int("trace_limit", trace_limit, 0, none_means="keep everything"),
        num_threads=as_optional_int("num_threads", num_threads, 1, 4096, none_means="chosen from the model size"),
        attention_backend=attention_backend,
        weight_dtype=check_weight_dtype(weight_dtype, dev, torch_dtype),
        compile=check_compile(compile, dev, weight_dtype),
        row_split=as_bool("row_split", row_split),
        decode_graphs=check_decode_graphs(decode_graphs, dev, weight_dtype, row_split),
        fast=bool(fast),
    )


def check_reference_options(fast: bool, attention_backend, weight_dtype, compile, row_split, decode_graphs) -> None:
    """``fast=False`` (the reference path) takes none of the fast layer's options."""
    if fast:
        return
    asked = {"attention_backend": attention_backend not in ("auto", "gather"), "weight_dtype": weight_dtype is not None,
             "compile": compile is not False, "row_split": row_split is not False,
             "decode_graphs": decode_graphs is not False}
    for name, on in asked.items():
        if on:
            raise ValueError(f"{name} is an option of the fast path (minillm.fast); fast=False runs the "
                             f"reference path, which has none: leave {name} at its default or use fast=True")


# --- CPU threads ------------------------------------------------------------------------------
#: parameters per CPU thread: below this a thread's share of a decode step's matmuls is too
#: small to pay for the synchronisation between threads (measured in issue 16: two threads made
#: the shipped 3.4M model 10-30x slower under load, and bought the 135M model nothing)
PARAMS_PER_THREAD = 60_000_000
#: environment variables that mean "the user chose the thread count": the default leaves it
THREAD_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity mask, not the machine's total)."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except AttributeError:  # not on Linux
        return max(os.cpu_count() or 1, 1)


def default_num_threads(num_params: int, device: torch.device, cores: int | None = None) -> int | None:
    """Torch threads for a model of ``num_params`` parameters on ``device``: one per
    ``PARAMS_PER_THREAD`` parameters, at least 1, at most the usable cores. None (leave torch
    as it is) on CUDA, where the host threads only launch kernels, and when OMP_NUM_THREADS /
    MKL_NUM_THREADS is set."""
    if device.type != "cpu" or any(os.environ.get(v) for v in THREAD_ENV):
        return None
    cores = usable_cores() if cores is None else cores
    return max(1, min(cores, num_params // PARAMS_PER_THREAD))


def _size(nbytes: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift:
            return f"{nbytes / (1 << shift):.1f} {unit}"
    return f"{nbytes} B"


@dataclass(frozen=True)
class KVPlan:
    """What ``plan_kv_cache`` decided: the context limit and the pool's size."""

    max_model_len: int
    num_kv_blocks: int
    bytes_per_block: int


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """K and V of one token in every layer."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * elem


def available_memory(device: torch.device) -> int:
    """Bytes a KV pool may take at most: free GPU memory, or the machine's available RAM."""
    if device.type == "cuda":
        torch.cuda.empty_cache()  # blocks cached by the load would count as used otherwise
        return torch.cuda.mem_get_info(device)[0]
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:  # pragma: no cover - psutil comes with the course extra
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def plan_kv_cache(options: EngineOptions, config) -> KVPlan:
    """``max_model_len`` checked against the model, and the KV pool sized.

    Default pool: room for ``max_num_seqs`` full contexts, capped at ``CPU_KV_BUDGET_BYTES`` on
    CPU and at ``CUDA_KV_FRACTION`` of the free memory on CUDA (call this after the weights are
    on the device). One block must fit that budget, and an explicit ``num_kv_blocks`` /
    ``kv_cache_tokens`` must fit the memory there is."""
    limit = config.max_position_embeddings
    max_model_len = limit if options.max_model_len is None else options.max_model_len
    if max_model_len > limit:
        raise ValueError(f"max_model_len must be <= the model's max_position_embeddings ({limit}), "
                         f"got {max_model_len}")
    bs = options.block_size
    per_token = kv_bytes_per_token(config, options.dtype)
    per_block = per_token * bs
    if options.num_kv_blocks is None and options.kv_cache_tokens is None:
        if options.device.type == "cuda":
            budget = int(available_memory(options.device) * CUDA_KV_FRACTION)
            where = f"half the free GPU memory ({_size(budget)})"
        else:
            budget = CPU_KV_BUDGET_BYTES
            where = f"the CPU KV budget ({_size(budget)})"
        if per_block > budget:
            raise ValueError(f"block_size={bs} makes one KV block {_size(per_block)}, more than {where}: "
                             f"use block_size <= {max(budget // per_token, 1)}, or give num_kv_blocks / "
                             f"kv_cache_tokens")
        want = -(-options.max_num_seqs * max_model_len // bs)  # full contexts for every batch slot
        blocks = want if want * per_block <= budget else budget // per_block
    else:
        name = "num_kv_blocks" if options.num_kv_blocks is not None else "kv_cache_tokens"
        blocks = options.num_kv_blocks if options.num_kv_blocks is not None else -(-options.kv_cache_tokens // bs)
        have = available_memory(options.device)
        if blocks * per_block > have:
            raise ValueError(f"{name}: a pool of {blocks} blocks x {bs} tokens needs "
                             f"{_size(blocks * per_block)} but only {_size(have)} is available "
                             f"on {options.device.type}; give a smaller {name} or block_size")
    return KVPlan(max_model_len=max_model_len, num_kv_blocks=blocks, bytes_per_block=per_block)
