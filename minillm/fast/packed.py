"""Wide products of a decode batch (an lm head over 9-256 rows) on oneDNN, the weight packed once.

MKL's ``F.linear`` handles a short, very wide product poorly: the shipped model's 3,879 x 256
head at 64 rows ran at about half the rate of its 1,376-wide MLP projection, and it was a
quarter of a 64-row decode step. oneDNN's linear with the weight reordered once into its own
blocked layout (``torch.ops.mkldnn._reorder_linear_weight``, what inductor uses on the CPU)
took 0.53-0.73x the CPU time of ``F.linear`` for that head at 9-64 rows, and 0.49-0.63x for
SmolLM2's 49,152 x 576 head at 16-64 rows (the 1,024-row slices ``gemv._wide`` used there:
0.77-0.87x). Measured on an AMD EPYC Zen 3 share (2 cores, loaded), alternating calls, CPU
time; the narrower projections were not faster this way (0.8-1.9x), hence ``MIN_OUT``.

The results are float32 products summed in another order than MKL's (differences of ~1e-6 on
logits of ~10, like the other fast kernels'); tokens stay the reference's (the parity tests).
The packed copy is remade when the weight changes (its storage or its version counter), and
the first product is checked against ``F.linear``: a failure or a mismatch turns the path off
for the process (``error`` says why) and ``F.linear`` serves as before. Once the check passes
the first call returns the packed product too: the same input gives the same bits every call
(the sampling notebook and its widget compare two calls' logits with ``torch.equal``).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

#: products with at least this many outputs (an lm head) take this path
MIN_OUT = 2048
#: ... and on a CPU with AVX-512, projections from this many outputs: on an AMD EPYC Zen 4 core oneDNN's
#: packed product took 0.64-0.92x MKL's CPU time for SmolLM2's and the shipped model's projections of 512
#: outputs and more at 16-64 rows (256 x 256: 1.02-1.22x), where on Zen 3 (AVX2) it lost (0.8-1.9x)
MIN_OUT_AVX512 = 512
#: and more than ``gemv.MAX_ROWS`` but at most this many rows (decode batches; measured to 64)
MAX_ROWS = 256
#: why the path is off in this process (None: on, or not tried yet)
error: str | None = None


@functools.lru_cache(maxsize=None)
def _avx512() -> bool:
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512")


def min_out() -> int:
    """The fewest outputs a product needs to take this path on this CPU: ``MIN_OUT``, or
    ``MIN_OUT_AVX512`` where torch runs its AVX-512 kernels, whichever is smaller."""
    return min(MIN_OUT, MIN_OUT_AVX512) if _avx512() else MIN_OUT


def usable() -> bool:
    """Whether torch has oneDNN's packed linear here (and it has not failed its check)."""
    return (error is None and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight") and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def linear(module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor | None:
    """``module(x)`` through the packed weight, or None when the path is off (the caller runs
    ``F.linear``). ``x``: [rows, in] float32 on the CPU, outside autograd."""
    global error
    w, bias = module.weight, module.bias
    key = (_stamp(w), None if bias is None else _stamp(bias))
    kept = module.__dict__.get("_packed_weight")
    if kept is not None and kept[0] == key:
        return torch.ops.mkldnn._linear_pointwise(x, kept[1], bias, "none", [], "")
    if not usable():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(w.detach().contiguous(), 64)
        y = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
        ref = F.linear(x, w, bias)
        if y.shape != ref.shape or not torch.allclose(y, ref, rtol=1e-4, atol=1e-4):
            raise ValueError(f"its product differs from F.linear's by {(y - ref).abs().max().item():.3g}")
    except (RuntimeError, ValueError, TypeError) as exc:
        error = f"{type(exc).__name__}: {exc}"
        return None
    module.__dict__["_packed_weight"] = (key, packed)  # a plain attribute: not in the state dict
    return y  # not ``ref``: the same input must give the same bits on its first call as on later ones


def _stamp(t: torch.Tensor) -> tuple[int, int]:
    """Where ``t``'s data lives and its version counter (bumped by every in-place change; an
    inference tensor has none, and can only be changed inside inference mode: -1)."""
    try:
        return t.data_ptr(), t._version
    except RuntimeError:
        return t.data_ptr(), -1
