"""The CPU's paged decode attention kernel (``kernels/paged_decode.c``), built on first use.

torch has no CPU op that attends a paged pool in place, and a Python loop over blocks is
slower than copying the context out (``benchmarks/attention_backends.py``). So the kernel is
a page of C: built once per machine with the system's C compiler (``-O3 -march=native
-fopenmp``, about a second) into ``~/.cache/minillm/kernels`` (``MINILLM_KERNEL_CACHE``
overrides; the temporary directory where that cannot be written), keyed by the source, the
flags, the compiler and the CPU, and called through ``ctypes`` (which releases the GIL). It
links the OpenMP runtime torch has already loaded (``libgomp.so.1``), so its threads are
torch's, sized by ``torch.get_num_threads()``.

``available()`` says whether it could be built here; ``paged_decode`` is the call.

Compiled decode graphs cannot trace a ``ctypes`` call, so the same kernel is also built as a
torch operator, ``torch.ops.minillm.paged_decode`` (``kernels/paged_decode_op.cpp`` with the C
source, against torch's header-only stable ABI: a few seconds more, on first use of a compiled
graph only): inductor's C++ wrapper calls it through the dispatcher, without Python.
``op_available()`` builds and loads it.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("kernels") / "paged_decode.c"
OP_SOURCE = Path(__file__).with_name("kernels") / "paged_decode_op.cpp"
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fPIC", "-shared")
_lib = None
_error: str | None = None
_op = None
_op_error: str | None = None


def _cache_dir() -> Path:
    root = os.environ.get("MINILLM_KERNEL_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "minillm" / "kernels"


def _cpu_id() -> str:
    """What ``-march=native`` depends on: the CPU's model and flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags"))}))
    except OSError:
        return platform.processor()


def _compile(name: str, compiler: str, args: list[str], sources: list[Path]) -> Path:
    """Build ``sources`` with ``compiler`` and ``args`` into the cache (once per source text,
    flags, compiler version and CPU) and return the library's path."""
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("\0".join([*(s.read_text() for s in sources), " ".join(args), version, _cpu_id(),
                                    platform.machine()]).encode()).hexdigest()[:16]
    target = _cache_dir() / f"{name}-{key}.so"
    if target.exists():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError:  # a read-only home: build into the temporary directory instead
        target = Path(tempfile.gettempdir()) / "minillm-kernels" / target.name
        if target.exists():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        built = Path(tmp) / target.name
        proc = subprocess.run([compiler, *args, "-o", str(built)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"building {sources[-1].name} failed:\n{proc.stderr[-2000:]}")
        os.replace(built, target)  # atomic: a concurrent build leaves one whole file
    return target


def _build() -> Path:
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError("no C compiler (cc/gcc) on PATH")
    return _compile("paged_decode", cc, [*FLAGS, str(SOURCE), "-lm"], [SOURCE])


def _build_op() -> Path:
    """The operator library: the C kernel and its C++ registration, linked with libtorch."""
    cxx = os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        raise RuntimeError("no C++ compiler (c++/g++) on PATH")
    from torch.utils.cpp_extension import include_paths, library_paths

    inc = [f"-I{p}" for p in include_paths()]
    libs = library_paths()
    args = [*FLAGS, "-std=c++17", *inc, "-x", "c", str(SOURCE), "-x", "c++", str(OP_SOURCE), "-x", "none",
            *(f"-L{p}" for p in libs), *(f"-Wl,-rpath,{p}" for p in libs), "-ltorch_cpu", "-lc10", "-lm"]
    return _compile(f"paged_decode_op-torch{torch.__version__.replace('+', '_')}", cxx, args, [SOURCE, OP_SOURCE])


def _load():
    global _lib, _error
    if _lib is None and _error is None:
        try:
            lib = ctypes.CDLL(str(_build()))
            fn = lib.paged_decode_f32
            i64, ptr = ctypes.c_int64, ctypes.c_void_p
            fn.argtypes = [ptr, i64, i64, ptr, ptr, i64, ptr, i64, ptr, ptr, i64, i64, i64, i64, i64,
                           ctypes.c_float, ctypes.c_int]
            fn.restype = ctypes.c_int
            fast = lib.paged_decode_fast_path
            fast.argtypes, fast.restype = [i64, i64], ctypes.c_int
            fn.fast_path = fast
            _lib = fn
        except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
            _error = f"{type(exc).__name__}: {exc}"
    return _lib


def available() -> bool:
    """Whether the kernel is built and loaded on this machine (builds it on first call)."""
    return _load() is not None


def has_fast_path(head_dim: int, group: int) -> bool:
    """Whether this build runs heads of ``head_dim`` with ``group`` query heads per KV head on
    its vectorised path (AVX-512, head size 64 or 128, 1-8 query heads per KV head); other
    shapes run a plain C loop, correct but not measured faster than the gather."""
    fn = _load()
    return fn is not None and bool(fn.fast_path(head_dim, group))


def op_available() -> bool:
    """Whether ``torch.ops.minillm.paged_decode`` is built and loaded (builds it on first call)."""
    global _op, _op_error
    if _op is None and _op_error is None:
        try:
            if not hasattr(torch.ops.minillm, "paged_decode"):
                torch.ops.load_library(str(_build_op()))
                torch.library.register_fake("minillm::paged_decode")(_paged_decode_shape)
            _op = torch.ops.minillm.paged_decode
        except (OSError, RuntimeError, subprocess.SubprocessError, ImportError) as exc:
            _op_error = f"{type(exc).__name__}: {exc}"
    return _op is not None


def _paged_decode_shape(q, k_pool, v_pool, block_tables, context_lens, scale):
    """What the operator returns, for tracing: a new [n, heads, D] tensor like ``q``."""
    return q.new_empty(q.shape)


def op_unavailable_reason() -> str | None:
    """Why ``op_available()`` is False (None when it is not)."""
    op_available()
    return _op_error


def unavailable_reason() -> str | None:
    """Why ``available()`` is False (None when it is not)."""
    _load()
    return _error


def paged_decode(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                 block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Decode attention of ``q`` [n, heads, D] over the paged pool ([blocks, block_size,
    kv_heads, D]), row b reading the blocks ``block_tables[b]`` (int64 [n, W]) up to
    ``context_lens[b]`` tokens; returns [n, heads, D]. float32 CPU tensors only."""
    fn = _load()
    if fn is None:
        raise RuntimeError(f"the CPU paged attention kernel is unavailable: {_error}")
    n, heads, dim = q.shape
    blocks, block_size, kv_heads, _ = k_pool.shape
    if q.dtype != torch.float32 or k_pool.dtype != torch.float32 or v_pool.dtype != torch.float32:
        raise ValueError(f"the paged kernel takes float32 queries and pool, got {q.dtype} / {k_pool.dtype}")
    if q.stride(2) != 1:
        q = q.contiguous()
    if not (k_pool.is_contiguous() and v_pool.is_contiguous()):
        raise ValueError("the paged kernel reads a contiguous KV pool")
    tables = block_tables.contiguous()
    lens = context_lens.contiguous()
    if tables.dtype != torch.int64 or lens.dtype != torch.int64 or tables.shape[0] != n or lens.shape != (n,):
        raise ValueError(f"block_tables must be int64 [{n}, W] and context_lens int64 [{n}]")
    out = torch.empty((n, heads, dim), dtype=torch.float32)
    status = fn(q.data_ptr(), q.stride(0), q.stride(1), k_pool.data_ptr(), v_pool.data_ptr(), blocks,
                tables.data_ptr(), tables.shape[1], lens.data_ptr(), out.data_ptr(), n, heads,
                kv_heads, dim, block_size, scale, torch.get_num_threads())
    if status == -1:
        raise ValueError("block_tables holds a block id outside the KV pool, or fewer blocks than a context needs")
    if status != 0:
        raise MemoryError("the paged kernel could not allocate its scores")
    return out

