"""A decoder layer's small steps fused in C (``kernels/small_ops.c``) for eager CPU steps.

Beside its projections and attention, each layer of a step runs ~20 small torch ops (two
RMSNorms of 6 ops each, the residual adds, SiLU times up): each a dispatch of ~5-10 us and a
pass over memory. Measured on an AMD EPYC Zen 3 share (loaded, one thread, CPU time) for the
shipped model: at 64 rows an RMSNorm took ~60 us and SiLU·mul ~130 us (~1.5 ms of a ~22 ms
decode step in all); at a 4,096-token prefill step SiLU·mul took 8.7 ms a layer. The kernels
here do each in one pass: ``rms_norm``, ``add_rms_norm`` (the residual add and the norm, into
new tensors) and ``silu_mul`` (a vectorised exp).

``use_small_ops(model)`` changes the classes of the model's RMSNorms, MLPs and decoder layers
in place (same parameters, state dict unchanged: what ``gemv.stream`` does for projections);
each falls back to the reference forward for anything but a float32 CPU tensor outside
autograd and compiling (decode graphs trace the reference ops). Results agree with torch's to
float32 rounding (another summation order and exp), and the tokens with the reference path's
(the parity tests run the fast path with these on). Built on first use with the system's C
compiler into the checked kernel cache (``cpu_kernel.LazyLibrary``) and called through ``ctypes``.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
import torch.nn.functional as F

from ..models.llama import MLP, DecoderLayer, RMSNorm
from . import cpu_kernel

SOURCE = Path(__file__).with_name("kernels") / "small_ops.c"
_lib = None  # the kernels once ``_library`` loaded them: the fused forwards call them directly
_F32 = torch.float32


def _declare(lib):
    i64, ptr, cint = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int
    lib.rms_norm_f32.argtypes = [ptr, ptr, ptr, ptr, ptr, i64, i64, ctypes.c_float, cint]
    lib.silu_mul_f32.argtypes = [ptr, ptr, i64, i64, cint]
    lib.rms_norm_f32.restype = lib.silu_mul_f32.restype = cint
    return lib


_library = cpu_kernel.LazyLibrary(globals(), "small_ops", SOURCE, cpu_kernel.FLAGS, _declare, libs=["-lm"])
available, unavailable_reason = _library.available, _library.unavailable_reason


def _plain(x: torch.Tensor) -> bool:
    """The kernels' case: a contiguous 2-D float32 CPU tensor, outside autograd and compiling."""
    return (x.dtype is _F32 and x.dim() == 2 and x.is_cpu and x.is_contiguous() and not torch.is_grad_enabled()
            and not torch.compiler.is_compiling())


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``RMSNorm`` of ``x`` [rows, dim] (float32, contiguous): a new tensor."""
    y = torch.empty_like(x)
    _lib.rms_norm_f32(x.data_ptr(), None, None, weight.data_ptr(), y.data_ptr(), x.shape[0], x.shape[1], eps,
                      torch.get_num_threads())
    return y


def add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                 eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x + residual, RMSNorm of that)`` in one pass (all [rows, dim], float32, contiguous): two
    new tensors; ``x`` and ``residual`` are only read."""
    total, y = torch.empty_like(x), torch.empty_like(x)
    _lib.rms_norm_f32(x.data_ptr(), residual.data_ptr(), total.data_ptr(), weight.data_ptr(), y.data_ptr(),
                      x.shape[0], x.shape[1], eps, torch.get_num_threads())
    return total, y


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up`` [rows, 2 * inter] (gate first), [rows, inter]."""
    rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = gate_up.new_empty((rows, inter))
    _lib.silu_mul_f32(gate_up.data_ptr(), out.data_ptr(), rows, inter, torch.get_num_threads())
    return out


class FusedRMSNorm(RMSNorm):
    def forward(self, x):
        if _plain(x) and self.weight.dtype is _F32:
            return rms_norm(x, self.weight, self.eps)
        return super().forward(x)


class FusedMLP(MLP):
    def forward(self, x):
        gate_up = self.gate_up_proj(x)
        if _plain(gate_up):
            return self.down_proj(silu_mul(gate_up))
        gate, up = gate_up.split(self.intermediate, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class FusedDecoderLayer(DecoderLayer):
    """The residual add after attention fused with the post-attention RMSNorm (one pass).

    Like every module, it never writes into its input: the sum goes to a tensor of its own
    (``add_rms_norm``), which then takes the MLP's output in place and is returned. (It once
    added into ``x``: nothing in the engine reads ``x`` again, but a forward hook on the layer,
    a learner's look at the residual stream, would have seen ``x + a`` as the layer's input.)"""

    def forward(self, x, cos, sin, batch, k_cache, v_cache):
        norm = self.post_attention_layernorm
        a = self.self_attn(self.input_layernorm(x), cos, sin, batch, k_cache, v_cache)
        if _plain(x) and _plain(a) and isinstance(norm, FusedRMSNorm) and norm.weight.dtype is _F32:
            total, h = add_rms_norm(x, a, norm.weight, norm.eps)
            return total.add_(self.mlp(h))
        x = x + a
        return x + self.mlp(norm(x))


_SWAPS = ((DecoderLayer, FusedDecoderLayer), (MLP, FusedMLP), (RMSNorm, FusedRMSNorm))


def use_small_ops(model: torch.nn.Module) -> bool:
    """Give ``model``'s exact ``RMSNorm``/``MLP``/``DecoderLayer`` modules the fused forwards, in
    place (False, nothing changed, where the kernels cannot be built)."""
    if not available():
        return False
    for module in model.modules():
        for plain, fused in _SWAPS:
            if type(module) is plain:
                module.__class__ = fused
    return True
