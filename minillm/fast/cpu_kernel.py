"""The CPU's paged decode attention kernel (``kernels/paged_decode.c``), built on first use.

torch has no CPU op that attends a paged pool in place, and a Python loop over blocks is
slower than copying the context out (``benchmarks/attention_backends.py``). So the kernel is
a page of C: built once per machine with the system's C compiler (``-O3 -march=native
-fopenmp``, about a second) into a private per-user cache (``kernel_cache``: owner, mode and
content checked before every load), keyed by the source, the flags, the compiler and the CPU,
and called through ``ctypes`` (which releases the GIL). It
links the OpenMP runtime torch has already loaded (``libgomp.so.1``), so its threads are
torch's, sized by ``torch.get_num_threads()``.

``available()`` says whether it could be built here; ``paged_decode`` is the call. Every kernel
module loads its library the same way, through a ``LazyLibrary``.

Compiled decode graphs cannot trace a ``ctypes`` call, so the same kernel is also built as a
torch operator, ``torch.ops.minillm.paged_decode`` (``kernels/paged_decode_op.cpp`` with the C
source, against torch's header-only stable ABI: a few seconds more, on first use of a compiled
graph only): inductor's C++ wrapper calls it through the dispatcher, without Python.
``op_available()`` builds and loads it.
"""

from __future__ import annotations

import ctypes
import hashlib
import math
import os
import platform
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from . import kernel_cache

SOURCE = Path(__file__).with_name("kernels") / "paged_decode.c"
OP_SOURCE = Path(__file__).with_name("kernels") / "paged_decode_op.cpp"
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fPIC", "-shared")
_lib = None  # the kernel once ``_library`` loaded it (see ``LazyLibrary``)
_op = None
_op_error: str | None = None


def _cpu_id() -> str:
    """What ``-march=native`` depends on: the CPU's model and flags."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags"))}))
    except OSError:
        return platform.processor()


def _absolute_entries(value: str) -> str:
    return os.pathsep.join(p for p in value.split(os.pathsep) if os.path.isabs(p))


def trusted_path() -> str:
    """``PATH`` without its relative entries (an empty one, ``.``, ``bin``): the compiler looks up
    ``as`` and ``ld`` on ``PATH``, and with ``PATH=":/usr/bin"`` an ``as`` planted in the folder the
    process started in ran while the kernel was built."""
    return _absolute_entries(os.environ.get("PATH", os.defpath))


#: gcc's own search lists: tools (``COMPILER_PATH``), headers, libraries. A relative entry (an
#: empty one is the current folder) let a header planted where the process started be compiled in.
COMPILER_LISTS = ("COMPILER_PATH", "CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH",
                  "LIBRARY_PATH")


def compiler_env(tmp: str) -> dict:
    """The environment a kernel is built in: ``PATH`` and gcc's lists with absolute entries only,
    ``GCC_EXEC_PREFIX`` only when absolute, and ``TMPDIR`` the private folder ``tmp`` (the
    compiler writes each stage's output there before the next stage reads it back; in a folder
    others can write, that file could be swapped in between)."""
    env = {**os.environ, "PATH": trusted_path(), "TMPDIR": tmp, "TMP": tmp, "TEMP": tmp}
    for name in COMPILER_LISTS:
        kept = _absolute_entries(env.pop(name, ""))
        if kept:
            env[name] = kept
    if not os.path.isabs(env.get("GCC_EXEC_PREFIX", "/")):
        del env["GCC_EXEC_PREFIX"]
    return env


def find_compiler(env_name: str, names: tuple[str, ...], what: str) -> str:
    """``$CC``/``$CXX`` when set (the user's own choice), else the first of ``names`` on the
    absolute entries of ``PATH``; ``RuntimeError`` when there is none."""
    chosen = os.environ.get(env_name)
    if chosen:
        return chosen
    for name in names:
        found = shutil.which(name, path=trusted_path())
        if found:
            return found
    raise RuntimeError(f"no {what} compiler ({'/'.join(names)}) on PATH")


_LOCAL_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"', re.MULTILINE)


def key_sources(sources) -> list[Path]:
    """``sources`` and every header they include by quoted name from beside them (``#include
    "vec.h"``), and those headers' own, each once, in order of discovery: what a library's text
    depends on, so a changed header rebuilds every library that includes it."""
    found: list[Path] = []
    todo = [Path(s) for s in sources]
    while todo:
        source = todo.pop(0)
        if source in found:
            continue
        found.append(source)
        todo += [source.parent / name for name in _LOCAL_INCLUDE.findall(source.read_text())
                 if (source.parent / name).is_file()]
    return found


def _compile(name: str, compiler: str, args: list[str], sources: list[Path]) -> str:
    """Build ``sources`` with ``compiler`` and ``args`` into the private kernel cache (once per
    source text, the local headers included, flags, compiler version and CPU) and return a verified name to load it by
    (see ``kernel_cache``: owner, mode and recorded SHA-256 checked on the file loaded)."""
    version = subprocess.run([compiler, "--version"], check=False, capture_output=True, text=True,
                             env=compiler_env(tempfile.gettempdir())).stdout
    key = hashlib.sha256("\0".join([*(s.read_text() for s in key_sources(sources)), " ".join(args), version,
                                    _cpu_id(), platform.machine()]).encode()).hexdigest()[:16]

    def build(out: Path) -> None:
        tmp = tempfile.mkdtemp(prefix="build-", dir=out.parent)  # inside the private cache: 0700, ours
        try:
            proc = subprocess.run([compiler, *args, "-o", str(out)], check=False, capture_output=True, text=True,
                                  env=compiler_env(tmp))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        if proc.returncode != 0:
            raise RuntimeError(f"building {sources[-1].name} failed:\n{proc.stderr[-2000:]}")

    return kernel_cache.cached_library(f"{name}-{key}", build)


def build_library(name: str, source: Path, flags, libs=()) -> str:
    """The C file ``source`` built with ``flags`` (then ``libs``) by the system's C compiler into
    the checked cache (``_compile``: keyed by its text and its headers'); a name to load."""
    cc = find_compiler("CC", ("cc", "gcc"), "C")
    return _compile(name, cc, [*flags, str(source), *libs], [source])


def load_library(name: str, source: Path, flags, declare, libs=()):
    """``(library, None)``: ``source`` built (``build_library``), loaded through ``ctypes`` and
    given its signatures by ``declare(lib)`` (which returns what callers keep: the library or
    one function of it); ``(None, reason)`` when it cannot be built or loaded here, so a caller
    falls back to torch. Each kernel module calls it once and keeps both (its first-call check)."""
    try:
        return declare(ctypes.CDLL(build_library(name, source, flags, libs))), None
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        return None, f"{type(exc).__name__}: {exc}"


class LazyLibrary:
    """A kernel library built and loaded on first use, once (``load_library``): what each kernel
    module needs alike. ``get()`` returns it, or None where it cannot be built here (callers fall
    back to torch); the failure is remembered with its ``reason`` (a second call does not build
    again), and a library that calls into others (``needs``: their ``LazyLibrary``) is not built
    before they load.

    The library itself is kept in the module's ``_lib`` global (``home``: the module's
    ``globals()``), not here: a decode step's hot paths test and call that global directly, with
    no call or attribute look-up in between (the gemv kernel's is paid ~120 times a step), and
    tests swap it for another build or for None."""

    def __init__(self, home: dict, name: str, source: Path, flags, declare, libs=(), needs=()):
        self.home, self.name, self.source, self.flags = home, name, source, tuple(flags)
        self.declare, self.libs, self.needs = declare, tuple(libs), tuple(needs)
        self.reason: str | None = None

    def get(self):
        """The library (what ``declare`` returned), built and loaded on the first call; None when
        it cannot be (``reason`` says why)."""
        lib = self.home["_lib"]
        if lib is None and self.reason is None:
            missing = [need.name for need in self.needs if need.get() is None]
            if missing:
                self.reason = f"needs the {', '.join(missing)} kernel(s), unavailable here"
                return None
            lib, self.reason = load_library(self.name, self.source, self.flags, self.declare, self.libs)
            self.home["_lib"] = lib
        return lib

    def require(self, what: str):
        """The library, or a RuntimeError saying that ``what`` is unavailable here and why."""
        lib = self.get()
        if lib is None:
            raise RuntimeError(f"{what} is unavailable: {self.reason}")
        return lib

    def available(self) -> bool:
        """Whether the library is built and loaded on this machine (builds it on first call)."""
        return self.get() is not None

    def unavailable_reason(self) -> str | None:
        """Why ``available()`` is False (None when it is not)."""
        self.get()
        return self.reason


def _build() -> str:
    return build_library("paged_decode", SOURCE, FLAGS, libs=["-lm"])


def build_torch_op(name: str, flags, c_source: Path, op_source: Path, extra=()) -> str:
    """A torch operator library: ``c_source`` and its C++ registration ``op_source``, linked with
    libtorch, built into the checked cache (``_compile``) under ``name`` and this torch's version."""
    cxx = find_compiler("CXX", ("c++", "g++"), "C++")
    from torch.utils.cpp_extension import include_paths, library_paths

    inc = [f"-I{p}" for p in include_paths()]
    libs = library_paths()
    args = [*flags, "-std=c++17", *inc, "-x", "c", str(c_source), "-x", "c++", str(op_source), "-x", "none",
            *(f"-L{p}" for p in libs), *(f"-Wl,-rpath,{p}" for p in libs), "-ltorch_cpu", "-lc10", *extra]
    return _compile(f"{name}-torch{torch.__version__.replace('+', '_')}", cxx, args, [c_source, op_source])


def _build_op() -> str:
    """The operator library: the C kernel and its C++ registration, linked with libtorch."""
    return build_torch_op("paged_decode_op", FLAGS, SOURCE, OP_SOURCE, ["-lm"])


def _declare(lib):
    """The kernel's entry point, typed, with its shape probe as ``fast_path``."""
    fn = lib.paged_decode_f32
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn.argtypes = [ptr, i64, i64, ptr, ptr, i64, ptr, i64, ptr, ptr, i64, i64, i64, i64, i64,
                   ctypes.c_float, ctypes.c_int]
    fn.restype = ctypes.c_int
    fast = lib.paged_decode_fast_path
    fast.argtypes, fast.restype = [i64, i64], ctypes.c_int
    fn.fast_path = fast
    return fn


_library = LazyLibrary(globals(), "paged_decode", SOURCE, FLAGS, _declare, libs=["-lm"])
available, unavailable_reason = _library.available, _library.unavailable_reason


def has_fast_path(head_dim: int, group: int) -> bool:
    """Whether this build runs heads of ``head_dim`` with ``group`` query heads per KV head on
    its vectorised path (AVX-512 or AVX2 + FMA, head size 64 or 128, 1-8 query heads per KV head); other
    shapes run a plain C loop, correct but not measured faster than the gather."""
    fn = _library.get()
    return fn is not None and bool(fn.fast_path(head_dim, group))


def op_available() -> bool:
    """Whether ``torch.ops.minillm.paged_decode`` is built and loaded (builds it on first call)."""
    global _op, _op_error
    if _op is None and _op_error is None:
        try:
            if not hasattr(torch.ops.minillm, "paged_decode"):
                torch.ops.load_library(_build_op())
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


def paged_decode(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor,
                 block_tables: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    """Decode attention of ``q`` [n, heads, D] over the paged pool ([blocks, block_size,
    kv_heads, D]), row b reading the blocks ``block_tables[b]`` (int64 [n, W]) up to
    ``context_lens[b]`` tokens; returns [n, heads, D]. float32 CPU tensors only."""
    fn = _library.require("the CPU paged attention kernel")
    if not _plainly_valid(q, k_pool, v_pool, block_tables, context_lens, scale):
        _check_args(q, k_pool, v_pool, block_tables, context_lens, scale)  # raises, naming the argument
    n, heads, dim = q.shape
    blocks, block_size, kv_heads, _ = k_pool.shape
    if q.stride(2) != 1:
        q = q.contiguous()
    tables = block_tables.contiguous()
    lens = context_lens.contiguous()
    out = torch.empty((n, heads, dim), dtype=torch.float32)
    status = fn(q.data_ptr(), q.stride(0), q.stride(1), k_pool.data_ptr(), v_pool.data_ptr(), blocks,
                tables.data_ptr(), tables.shape[1], lens.data_ptr(), out.data_ptr(), n, heads,
                kv_heads, dim, block_size, scale, torch.get_num_threads())
    if status == -3:
        raise ValueError("the paged kernel refused its arguments (a size below 1 or heads not a multiple of kv_heads)")
    if status == -1:
        raise ValueError("block_tables holds a block id outside the KV pool, or fewer blocks than a context needs")
    if status != 0:
        raise MemoryError("the paged kernel could not allocate its scores")
    return out



_F32, _I64 = torch.float32, torch.int64


def _plainly_valid(q, k_pool, v_pool, block_tables, context_lens, scale) -> bool:
    """The common case in one expression (a few microseconds per layer): everything as the
    engine passes it. Anything else goes to ``_check_args``, which names what is wrong."""
    try:
        return (q.dtype is _F32 and k_pool.dtype is _F32 and v_pool.dtype is _F32 and block_tables.dtype is _I64
                and context_lens.dtype is _I64 and q.is_cpu and k_pool.is_cpu and v_pool.is_cpu
                and block_tables.is_cpu and context_lens.is_cpu
                and q.dim() == 3 and k_pool.dim() == 4 and v_pool.shape == k_pool.shape
                and block_tables.dim() == 2 and context_lens.dim() == 1
                and block_tables.shape[0] == context_lens.shape[0] == q.shape[0]
                and k_pool.shape[3] == q.shape[2] and min(k_pool.shape) > 0 and q.shape[1] > 0 and q.shape[2] > 0
                and q.shape[1] % k_pool.shape[2] == 0
                and k_pool.is_contiguous() and v_pool.is_contiguous()
                and type(scale) is float and math.isfinite(scale))
    except AttributeError:  # not tensors
        return False


def _check_args(q, k_pool, v_pool, block_tables, context_lens, scale) -> None:
    """Every shape, dtype, device and size the C code relies on, checked before it runs: a
    mismatched pool or a zero size must be a ``ValueError`` here, not a crash in C."""
    tensors = {"q": q, "k_pool": k_pool, "v_pool": v_pool, "block_tables": block_tables,
               "context_lens": context_lens}
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor) or t.device.type != "cpu":
            raise ValueError(f"paged_decode: {name} must be a CPU tensor, got {type(t).__name__}"
                             f"{'' if not isinstance(t, torch.Tensor) else ' on ' + str(t.device)}")
    if q.dim() != 3 or k_pool.dim() != 4:
        raise ValueError(f"paged_decode: q must be [n, heads, D] and k_pool [blocks, block_size, kv_heads, D], "
                         f"got {tuple(q.shape)} and {tuple(k_pool.shape)}")
    if v_pool.shape != k_pool.shape:
        raise ValueError(f"paged_decode: v_pool has shape {tuple(v_pool.shape)}, k_pool {tuple(k_pool.shape)}: "
                         f"they must match")
    for name, t in (("q", q), ("k_pool", k_pool), ("v_pool", v_pool)):
        if t.dtype != torch.float32:
            raise ValueError(f"paged_decode: the paged kernel takes float32 queries and pool, {name} is {t.dtype}")
    n, heads, dim = q.shape
    blocks, block_size, kv_heads, pool_dim = k_pool.shape
    for name, value in (("heads", heads), ("D", dim), ("blocks", blocks), ("block_size", block_size),
                        ("kv_heads", kv_heads)):
        if value < 1:
            raise ValueError(f"paged_decode: {name} must be at least 1, got {value}")
    if pool_dim != dim or heads % kv_heads:
        raise ValueError(f"paged_decode: q has {heads} heads of {dim}, the pool {kv_heads} KV heads of {pool_dim}: "
                         f"the sizes must match and heads be a multiple of kv_heads")
    if not (k_pool.is_contiguous() and v_pool.is_contiguous()):
        raise ValueError("paged_decode: the paged kernel reads a contiguous KV pool")
    if (block_tables.dtype != torch.int64 or context_lens.dtype != torch.int64 or block_tables.dim() != 2
            or block_tables.shape[0] != n or tuple(context_lens.shape) != (n,)):
        raise ValueError(f"paged_decode: block_tables must be int64 [{n}, W] and context_lens int64 [{n}], got "
                         f"{block_tables.dtype} {tuple(block_tables.shape)} and {context_lens.dtype} "
                         f"{tuple(context_lens.shape)}")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not math.isfinite(scale):
        raise ValueError(f"paged_decode: scale must be a finite number, got {scale!r}")
