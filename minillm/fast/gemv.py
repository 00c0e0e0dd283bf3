"""Decode's few-row projections at the weight-streaming floor: a C kernel (``kernels/gemv.c``).

A batch-1 decode step multiplies one activation row by every weight of the model, so its time
is the weight bytes divided by the read bandwidth a core gets. The kernel here reads each weight
once, in order, in tiles of four weight rows with the activations in registers (AVX-512 or
AVX2 + FMA, chosen at run time and checked against plain C when loaded; plain C elsewhere),
float32 or int8 (``w[o, :] * scale[o]``, widened in registers: only a quarter of the bytes
cross the bus, and the activations are not rounded). A tile's 4 rows come from the 4 quarters of
the rows being computed (4 far-apart streams): on an AMD EPYC Zen 3 core that read SmolLM2-135M's
weights at ~19.5 GB/s against torch's ``F.linear`` at ~11 (one stream; ``ONE_THREAD_F32`` below).

With ``threads`` > 1 the output rows are shared between the calling thread and persistent
workers of the C library (no start-up per call: they spin a moment between calls, then
sleep on a futex): a second core adds its own bandwidth. Every output element is computed the
same way whichever thread computes it, so results do not depend on the thread count.

Built on first use with the system's C compiler into the private kernel cache
(``kernel_cache``: owner, mode and SHA-256 checked before every load) and called through
``ctypes`` (which releases the GIL). Compiled graphs call it as the operator
``torch.ops.minillm_gemv.linear`` / ``linear_int8`` (``kernels/gemv_op.cpp``, built on first
use of a compiled graph). ``StreamLinear`` is the ``nn.Linear`` that uses it.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
from pathlib import Path

import torch
import torch.nn.functional as F
import torch.nn.modules.module as _module
from torch import nn

from . import cpu_kernel, packed

KERNELS = Path(__file__).with_name("kernels")
SOURCE = KERNELS / "gemv.c"  # and the gemv_body.h it includes (in the cache key too)
OP_SOURCE = KERNELS / "gemv_op.cpp"
#: no -march=native: the library picks AVX-512 / AVX2 / plain C itself when loaded
FLAGS = ("-O3", "-fno-math-errno", "-fPIC", "-shared", "-pthread")
#: the most activation rows a call takes to the kernel: decode steps of a few requests (more
#: rows are a GEMM, where torch's blocked kernels reuse each weight across rows)
MAX_ROWS = 8
#: ``MINILLM_GEMV=0`` leaves every projection on ``F.linear`` (the reference, for comparison)
ENV_SWITCH = "MINILLM_GEMV"
#: whether an eager float32 ``StreamLinear`` uses the kernel when it would run on one thread.
#: Measured on an AMD EPYC Zen 3 share, SmolLM2-135M's 121 projections at batch 1, one thread,
#: 10 alternating rounds (load 2): the kernel 29.7 ms (18.1 GB/s) against torch's ``F.linear``
#: 49.2 ms (10.9 GB/s), since its tiles read 4 far-apart streams (before that change the two
#: were level within noise)
ONE_THREAD_F32 = True
#: a product with more than ``MAX_ROWS`` rows and at least ``WIDE_OUT`` outputs (an lm head over
#: a large vocabulary) runs as ``F.linear`` over slices of ``WIDE_CHUNK`` weight rows, joined:
#: measured on an AMD EPYC Zen 3 share (quiet, 30 alternating calls, CPU time), SmolLM2's
#: 49,152 x 576 head at 16-64 rows took 0.84-0.91x the time of one ``F.linear`` call at one
#: thread, 0.73-0.95x at two (MKL handles one very wide, short product poorly)
WIDE_OUT, WIDE_CHUNK = 16384, 1024

_lib = None  # the kernel once ``_library`` loaded it: StreamLinear's eager path reads it directly
_threads: int | None = None  # set_threads(): the kernel's own thread count (None: torch's)
_op_error: str | None = None
_op_loaded = False


def _declare(lib):
    i64, ptr, cint = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.minillm_gemv_f32.argtypes = [ptr, i64, i64, ptr, i64, i64, i64, ptr, ptr, i64, cint]
    lib.minillm_gemv_i8.argtypes = [ptr, i64, i64, ptr, ptr, i64, i64, i64, ptr, ptr, i64, cint]
    lib.minillm_gemv_f32.restype = lib.minillm_gemv_i8.restype = cint
    lib.minillm_gemv_isa.restype = ctypes.c_char_p
    lib.minillm_gemv_set_spin_us.argtypes, lib.minillm_gemv_set_spin_us.restype = [cint], cint
    lib.minillm_gemv_workers.restype = cint
    lib.minillm_gemv_read_probe.argtypes, lib.minillm_gemv_read_probe.restype = [ptr, i64], ctypes.c_float
    return lib


_library = cpu_kernel.LazyLibrary(globals(), "gemv", SOURCE, FLAGS, _declare)
available, unavailable_reason = _library.available, _library.unavailable_reason


def isa() -> str | None:
    """The instruction set the kernel runs with here: "avx512", "avx2" or "plain" (None: unavailable)."""
    lib = _library.get()
    return None if lib is None else lib.minillm_gemv_isa().decode()


def read_probe(buffer: torch.Tensor) -> float:
    """The sum of a contiguous float32 CPU tensor, read the way the kernel reads weights (4 far-apart
    streams): the benchmarks time it for the read-bandwidth floor. Releases the GIL (ctypes), so
    several Python threads can probe halves of a buffer at once."""
    lib = _library.require("the gemv kernel")
    if buffer.dtype != torch.float32 or buffer.device.type != "cpu" or not buffer.is_contiguous():
        raise ValueError("gemv.read_probe: buffer must be a contiguous float32 CPU tensor")
    return float(lib.minillm_gemv_read_probe(buffer.data_ptr(), buffer.numel()))


def workers() -> int:
    """Worker threads the kernel's pool has started in this process (0 until a split call)."""
    lib = _library.get()
    return 0 if lib is None else lib.minillm_gemv_workers()


def set_spin_us(us: int) -> int:
    """How long an idle worker spins before it sleeps, in microseconds; returns the old value."""
    if isinstance(us, bool) or not isinstance(us, int) or us < 0:
        raise ValueError(f"us must be an int >= 0, got {us!r}")
    lib = _library.require("the gemv kernel")
    return lib.minillm_gemv_set_spin_us(us)


def set_threads(threads: int | None) -> int | None:
    """Threads the eager kernel calls use (None: ``torch.get_num_threads()`` at each call, the
    default); returns the previous setting. Lets torch's own ops run on one thread while the
    projections use two."""
    global _threads
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be None or an int >= 1, got {threads!r}")
    old, _threads = _threads, threads
    return old


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as a [m, k] matrix whose rows are contiguous (a view where it can be)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _check(x, weight, what: str) -> None:
    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)):
        raise ValueError(f"{what}: x and the weight must be tensors")
    if x.device.type != "cpu" or weight.device.type != "cpu":
        raise ValueError(f"{what}: x and the weight must be CPU tensors, got {x.device} and {weight.device}")
    if x.dtype != torch.float32:
        raise ValueError(f"{what}: x must be float32, got {x.dtype}")
    if weight.dim() != 2 or x.dim() < 1 or x.shape[-1] != weight.shape[1] or weight.stride(1) != 1:
        raise ValueError(f"{what}: the weight must be [out, in] with contiguous rows and x [..., in], got "
                         f"{tuple(weight.shape)} and {tuple(x.shape)}")
    if min(weight.shape) < 1 or x.numel() == 0:
        raise ValueError(f"{what}: sizes must be at least 1, got weight {tuple(weight.shape)}, x {tuple(x.shape)}")


def _bias_ptr(bias, out_features: int, what: str) -> int | None:
    if bias is None:
        return None
    if (not isinstance(bias, torch.Tensor) or bias.dtype != torch.float32 or bias.device.type != "cpu"
            or tuple(bias.shape) != (out_features,) or not bias.is_contiguous()):
        raise ValueError(f"{what}: bias must be a contiguous float32 CPU tensor of shape ({out_features},)")
    return bias.data_ptr()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           threads: int | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` by the kernel: float32 CPU tensors, ``weight`` [out, in]
    with contiguous rows. ``threads``: the threads sharing the output rows (default torch's
    intra-op count). Equal to ``F.linear`` up to float32 rounding (another summation order)."""
    _check(x, weight, "gemv.linear")
    if weight.dtype != torch.float32:
        raise ValueError(f"gemv.linear: the weight must be float32, got {weight.dtype}")
    return _call(x, weight, None, bias, threads)


def linear_int8(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None,
                threads: int | None = None) -> torch.Tensor:
    """``x @ (scale[:, None] * q).T + bias`` with ``q`` int8 [out, in] (contiguous rows) and
    ``scale`` float32 [out]: the int8 weights widened to float32 in registers, the products and
    sums in float32 (no rounding of the activations)."""
    _check(x, q, "gemv.linear_int8")
    if q.dtype != torch.int8:
        raise ValueError(f"gemv.linear_int8: q must be int8, got {q.dtype}")
    if (not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32 or scale.device.type != "cpu"
            or tuple(scale.shape) != (q.shape[0],) or not scale.is_contiguous()):
        raise ValueError(f"gemv.linear_int8: scale must be a contiguous float32 CPU tensor of shape ({q.shape[0]},)")
    return _call(x, q, scale, bias, threads)


def _call(x, weight, scale, bias, threads):
    lib = _library.require("the gemv kernel")
    if threads is None:
        threads = _threads or torch.get_num_threads()
    n, k = weight.shape
    x2 = _rows(x)
    bias_ptr = _bias_ptr(bias, n, "gemv")
    y = torch.empty((x2.shape[0], n), dtype=torch.float32)
    ldx = x2.stride(0) if x2.shape[0] > 1 else k  # (a single row's stride may be anything)
    if scale is None:
        status = lib.minillm_gemv_f32(x2.data_ptr(), x2.shape[0], ldx, weight.data_ptr(), n, k,
                                      weight.stride(0), bias_ptr, y.data_ptr(), n, threads)
    else:
        status = lib.minillm_gemv_i8(x2.data_ptr(), x2.shape[0], ldx, weight.data_ptr(), scale.data_ptr(),
                                     n, k, weight.stride(0), bias_ptr, y.data_ptr(), n, threads)
    if status != 0:
        raise ValueError(f"the gemv kernel refused its arguments: x {tuple(x.shape)}, weight {tuple(weight.shape)}")
    return y.view(*x.shape[:-1], n)


def _build_op() -> str:
    """The operator library: gemv.c and its C++ registration, linked with libtorch."""
    return cpu_kernel.build_torch_op("gemv_op", FLAGS, SOURCE, OP_SOURCE)


_op_lib = None  # the operator library through ctypes (the same loaded copy torch calls)


def _op_library() -> str:
    global _op_lib
    path = _build_op()
    _op_lib = ctypes.CDLL(path)  # (dlopen of a loaded path: the same copy, the same pool)
    _op_lib.minillm_gemv_set_op_threads.argtypes = [ctypes.c_int]
    _op_lib.minillm_gemv_set_op_threads.restype = ctypes.c_int
    return path


def set_op_threads(threads: int | None) -> int | None:
    """Threads the operators (``torch.ops.minillm_gemv.*``, inside compiled graphs) use: None for
    torch's intra-op count at each call (the default). Returns the previous setting. A CPU decode
    graph runs torch's own kernels on one thread and gives the projections this many."""
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ValueError(f"threads must be None or an int >= 1, got {threads!r}")
    if not op_available():
        raise RuntimeError(f"the gemv operators are unavailable: {_op_error}")
    if _op_lib is None:
        _op_library()
    return _op_lib.minillm_gemv_set_op_threads(threads or 0) or None


def _constant_while_tracing(fn):
    """``torch.compiler.assume_constant_result(fn)`` without its import of torch._dynamo (~1.4 CPU-s
    in every process that loads a model, and most never compile): the same mark on the function,
    which tests/test_gemv.py checks is still all that torch's decorator sets."""
    fn._dynamo_marked_constant = True
    return fn


@_constant_while_tracing  # called while tracing: run it then, a constant in the graph
def op_available() -> bool:
    """Whether ``torch.ops.minillm_gemv.linear`` / ``linear_int8`` are built and loaded (builds
    them on first call: a few seconds)."""
    global _op_error, _op_loaded
    if not _op_loaded and _op_error is None:
        try:
            if not hasattr(torch.ops.minillm_gemv, "linear"):
                torch.ops.load_library(_op_library())
                torch.library.register_fake("minillm_gemv::linear")(_linear_shape)
                torch.library.register_fake("minillm_gemv::linear_int8")(_linear_int8_shape)
            _op_loaded = True
        except (OSError, RuntimeError, subprocess.SubprocessError, ImportError) as exc:
            _op_error = f"{type(exc).__name__}: {exc}"
    return _op_loaded


def op_unavailable_reason() -> str | None:
    """Why ``op_available()`` is False (None when it is not)."""
    op_available()
    return _op_error


def _linear_shape(x, weight, bias):
    return x.new_empty((x.shape[0], weight.shape[0]))


def _linear_int8_shape(x, q, scale, bias):
    return x.new_empty((x.shape[0], q.shape[0]))


def enabled_by_env() -> bool:
    """False when ``MINILLM_GEMV=0`` asks for the reference ``F.linear`` everywhere."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "no", "off")


NO_BIAS = torch.empty(0)  # the operators' "no bias" (an empty tensor)


def few_rows(x: torch.Tensor, in_features: int) -> bool:
    """Whether ``x`` is a float32 CPU input of at most ``MAX_ROWS`` rows: the kernel's case."""
    return (x.dtype is torch.float32 and x.device.type == "cpu" and x.shape[-1] == in_features
            and 0 < x.numel() <= MAX_ROWS * in_features)


class StreamLinear(nn.Linear):
    """An ``nn.Linear`` whose products of at most ``MAX_ROWS`` rows (decode) run the streaming
    kernel, through ``ctypes`` when eager and as ``torch.ops.minillm_gemv.linear`` inside a
    compiled graph; anything else (prefills, gradients, a transposed weight, and eager calls on
    one thread when ``ONE_THREAD_F32`` is off) is ``F.linear``. Same parameters as the ``nn.Linear`` it was (``stream`` changes the class in place), so
    the state dict and a tied lm head are unchanged."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight
        if (x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and x.dtype is _F32 and w.dtype is _F32 and x.is_cpu
                and not torch.is_grad_enabled() and not torch.compiler.is_compiling() and _lib is not None
                and w.stride(1) == 1 and x.shape[1] == self.in_features
                and (ONE_THREAD_F32 or (_threads or torch.get_num_threads()) > 1)):
            return _eager_2d(x, w, self.bias)  # the decode step's case, in as few Python ops as can be
        if (not few_rows(x, self.in_features) or w.dtype is not torch.float32 or w.stride(-1) != 1
                or (torch.is_grad_enabled() and (w.requires_grad or x.requires_grad))):
            if x.dim() == 2 and x.is_cpu and not torch.is_grad_enabled() and not torch.compiler.is_compiling():
                return _many_rows(self, x)
            return F.linear(x, w, self.bias)
        if torch.compiler.is_compiling():
            if not op_available():
                return F.linear(x, w, self.bias)
            x2 = x.reshape(-1, self.in_features).contiguous()
            y = torch.ops.minillm_gemv.linear(x2, w, NO_BIAS if self.bias is None else self.bias)
            return y.view(*x.shape[:-1], self.out_features)
        if not ONE_THREAD_F32 and (_threads or torch.get_num_threads()) == 1:
            return F.linear(x, w, self.bias)
        return _call(x, w, None, self.bias, None)


_F32 = torch.float32


def _eager_2d(x: torch.Tensor, w: torch.Tensor, bias) -> torch.Tensor:
    """The kernel on a [m, in] float32 input, no checks beyond ``StreamLinear.forward``'s: each
    microsecond here is paid ~120 times a step by SmolLM2-135M."""
    if not x.is_contiguous():
        x = x.contiguous()
    m, k = x.shape
    n = w.shape[0]
    y = torch.empty((m, n), dtype=_F32)
    _lib.minillm_gemv_f32(x.data_ptr(), m, k, w.data_ptr(), n, k, w.stride(0) if n > 1 else k,
                          None if bias is None else bias.data_ptr(), y.data_ptr(), n,
                          _threads or torch.get_num_threads())
    return y


def _many_rows(linear: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """A product of more rows than the kernel takes, outside autograd and compiling: a wide one
    (an lm head over a decode batch) on oneDNN's packed weight (``packed``), else in slices
    (``_wide``), else ``F.linear``."""
    w = linear.weight
    if (w.shape[0] >= packed.min_out() and x.shape[0] <= packed.MAX_ROWS and x.dtype is _F32
            and w.dtype is _F32):
        y = packed.linear(linear, x)
        if y is not None:
            return y
    if w.shape[0] >= WIDE_OUT:
        return _wide(x, w, linear.bias)
    return F.linear(x, w, linear.bias)


def _wide(x: torch.Tensor, w: torch.Tensor, bias) -> torch.Tensor:
    """``F.linear`` in slices of ``WIDE_CHUNK`` output features (see ``WIDE_OUT``)."""
    parts = [F.linear(x, w[i:i + WIDE_CHUNK], None if bias is None else bias[i:i + WIDE_CHUNK])
             for i in range(0, w.shape[0], WIDE_CHUNK)]
    return torch.cat(parts, dim=1)


def stream(linear: nn.Linear) -> nn.Linear:
    """Make ``linear`` (an exact ``nn.Linear`` or a ``StreamLinear``) a ``StreamLinear`` in place."""
    if type(linear) is nn.Linear:
        linear.__class__ = StreamLinear
    return linear


def unstream(linear: nn.Module) -> nn.Module:
    """The reverse of ``stream``: a plain ``nn.Linear`` again (same parameters)."""
    if type(linear) is StreamLinear:
        linear.__class__ = nn.Linear
    return linear


def keep_torch_on_one_thread(model: nn.Module) -> None:
    """Forward hooks on ``model``: a step of at most ``MAX_ROWS`` tokens (decode) runs torch's
    own ops on one intra-op thread and gives the kernel the thread count torch had. Measured on
    SmolLM2-135M with two threads on a shared 2-core machine (``benchmarks/gemv_floor.py``):
    torch's OpenMP team collapsed the step 4x (its barriers wait for a thread another process
    holds), while the kernel's workers, which the caller never waits for unless they hold a
    chunk, did not. Idempotent; ``release_torch_threads`` removes the hooks."""
    if getattr(model, "_gemv_hooks", None):
        return
    saved = []

    def before(module, args, kwargs):
        if torch.compiler.is_compiling():  # a graph being traced: no thread settings in it
            return
        ids = args[0] if args else kwargs.get("input_ids")
        threads = torch.get_num_threads()
        small = ids is not None and ids.numel() <= MAX_ROWS and threads > 1
        saved.append((threads, set_threads(threads)) if small else None)
        if small:
            torch.set_num_threads(1)

    def after(module, args, kwargs, output):
        if torch.compiler.is_compiling():
            return
        state = saved.pop() if saved else None
        if state is not None:
            torch.set_num_threads(state[0])
            set_threads(state[1])

    model._gemv_hooks = [model.register_forward_pre_hook(before, with_kwargs=True),
                         model.register_forward_hook(after, with_kwargs=True, always_call=True)]


def only_thread_hooks(model: nn.Module) -> bool:
    """Whether ``model``'s forward hooks, if any, are only ``keep_torch_on_one_thread``'s, which
    leave its output as it is."""
    return _only_own(model._forward_hooks, model.__dict__.get("_gemv_hooks"), 1)


def _only_own(hooks: dict, own, which: int) -> bool:
    return not hooks or (len(hooks) == 1 and own is not None and len(own) == 2 and own[which].id in hooks)


def thread_hooks_idle(model: nn.Module) -> bool:
    """Whether calling ``model`` would run no hook but ``keep_torch_on_one_thread``'s, and those
    would do nothing (one thread): its ``forward`` may then be called directly, saving
    ``Module.__call__``'s way through hooks (~13 us of the shipped model's ~0.5 ms decode step)."""
    own = model.__dict__.get("_gemv_hooks")
    return (torch.get_num_threads() == 1 and not (_module._global_forward_hooks or _module._global_forward_pre_hooks
                                                  or _module._global_backward_hooks
                                                  or _module._global_backward_pre_hooks)
            and not (model._backward_hooks or model._backward_pre_hooks)
            and _only_own(model._forward_pre_hooks, own, 0) and _only_own(model._forward_hooks, own, 1))


def release_torch_threads(model: nn.Module) -> None:
    """Remove ``keep_torch_on_one_thread``'s hooks (if any)."""
    for hook in getattr(model, "_gemv_hooks", None) or ():
        hook.remove()
    model._gemv_hooks = []
