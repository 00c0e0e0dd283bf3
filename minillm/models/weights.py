"""How a loaded model stores its projection weights: the options that trade bytes for accuracy.

A batch-1 decode step reads every weight once, so on a CPU its time is the weight bytes divided
by the memory bandwidth. Float32 (the reference) is exact; two options store fewer bytes:

* ``dtype="bfloat16"`` (an ``LLM`` dtype, weights *and* activations and the KV cache): half
  the bytes, 8 mantissa bits. Fast where the CPU has native bfloat16 (AVX512-BF16 / AMX;
  ``cpu_has_bf16()``); elsewhere torch emulates it, slowly.
* ``weight_dtype="int8"`` (this module): every projection (q/k/v, o, gate/up, down, the lm
  head) stored as int8 with one float scale per output channel (``w ≈ scale[o] * q[o, :]``),
  a quarter of the bytes. The matmul is torch's dynamic quantized linear (fbgemm / oneDNN):
  activations enter and leave in float32, but inside each call the input rows are quantized
  to 8 bits with a scale taken from that call's own range. The embedding table and the norms
  stay in float32 (a decode step reads one embedding row, not the table).

Both change the logits a little; ``tests/test_weight_options.py`` bounds how much on the
shipped model and reports where greedy tokens first diverge from float32.

Float32 weights on the CPU are *streamed* on the fast path (``stream_weights``, called by
``minillm.fast.prepare_model``; the reference path keeps ``nn.Linear``): a decode step's
few-row products run ``minillm.fast.gemv``, a C kernel that reads each weight once at the
core's bandwidth and shares the output rows between threads; the same float32 products in
another summation order. int8 decode steps use its int8 twin: the int8 weights widened to
float32 in registers (no rounding of the activations), prefills keep torch's int8 GEMM.
``MINILLM_GEMV=0`` turns both off (torch's kernels everywhere, the reference).
"""

from __future__ import annotations

import warnings

import torch
from torch import nn

from ..engine_args import WEIGHT_DTYPES, check_weight_dtype
from ..fast import gemv

#: the documented accuracy of each option: max |logit - float32 logit| as a fraction of the
#: float32 logits' largest magnitude (tests/test_weight_options.py checks it on the shipped model)
LOGIT_TOLERANCE = {"bfloat16": 0.05, "int8": 0.2}

__all__ = ["LOGIT_TOLERANCE", "WEIGHT_DTYPES", "WEIGHT_LEVELS", "Int8Linear", "check_weight_dtype", "cpu_has_bf16",
           "quantize_weights", "stream_weights", "weight_bytes", "MIN_STREAM_BYTES"]


def cpu_has_vnni() -> bool:
    """Whether the CPU has VNNI (int8 dot products accumulated straight into int32)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


#: Without VNNI the int8 kernel multiplies uint8 activations by int8 weights and sums pairs of
#: products in 16 bits, which saturates at full range (255 * 127 * 2 > 32767). Either side can
#: give up a bit to avoid it; the weights give it up (levels +-63), because activations carry the
#: outliers: measured on the shipped model, 7-bit weights with 8-bit activations have half the
#: logit error of 8-bit weights with 7-bit activations (2.2 vs 4.5). With VNNI both keep 8 bits.
WEIGHT_LEVELS = 127 if cpu_has_vnni() else 63


def cpu_has_bf16() -> bool:
    """Whether this CPU computes bfloat16 natively (oneDNN's check: AVX512-BF16 or AMX)."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


class Int8Linear(nn.Module):
    """``y = x @ (scale * q).T + bias`` with ``q`` int8 ``[out, in]`` and one float32 scale per
    output row (symmetric: the row's largest |w| maps to ``WEIGHT_LEVELS``). Input and output are float32."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        w = linear.weight.detach().float()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        scale = (w.abs().amax(dim=1) / WEIGHT_LEVELS).clamp_min(torch.finfo(torch.float32).tiny).double()
        with warnings.catch_warnings():  # quantized tensors are deprecated in favour of torchao,
            warnings.simplefilter("ignore")  # but this is the int8 matmul torch itself ships
            q = torch.quantize_per_channel(w, scale, torch.zeros_like(scale, dtype=torch.long), 0, torch.qint8)
        bias = None if linear.bias is None else linear.bias.detach().float()
        self._packed = torch.ops.quantized.linear_prepack(q, bias)
        self.weight_bytes = q.numel() + 4 * scale.numel() + (0 if bias is None else 4 * bias.numel())
        self._stream = None  # (int8 levels, scales, bias) for the decode kernel: ``stream``

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._stream is not None and gemv.few_rows(x, self.in_features):
            q, scale, bias = self._stream
            if torch.compiler.is_compiling():  # a decode graph: the kernel as a traceable op
                x2 = x.reshape(-1, self.in_features).contiguous()
                y = torch.ops.minillm_gemv.linear_int8(x2, q, scale, gemv.NO_BIAS if bias is None else bias)
                return y.view(*x.shape[:-1], self.out_features)
            return gemv.linear_int8(x, q, scale, bias)
        return torch.ops.quantized.linear_dynamic(x, self._packed, False)

    def stream(self, enabled: bool = True) -> None:
        """Run products of at most ``gemv.MAX_ROWS`` rows (decode) on the streaming kernel: the
        same int8 levels and scales, widened to float32 in registers (the activations are not
        rounded to 8 bits, as torch's dynamic int8 linear does). A plain copy of the levels
        (a byte a weight) is kept for it. ``enabled=False`` drops it."""
        self._stream = None
        if enabled:
            q, bias = torch.ops.quantized.linear_unpack(self._packed)
            self._stream = (q.int_repr().contiguous(), q.q_per_channel_scales().float().contiguous(),
                            None if bias is None else bias.float().contiguous())

    @property
    def streaming(self) -> bool:
        """Whether decode's few-row products run on the streaming kernel (``stream``)."""
        return self._stream is not None

    def dequantized_weight(self) -> torch.Tensor:
        """The float32 weight the int8 one stands for (for checks and the course)."""
        q, _ = torch.ops.quantized.linear_unpack(self._packed)
        return q.dequantize()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per-channel"


def quantize_weights(model: nn.Module, weight_dtype) -> nn.Module:
    """Store ``model``'s projections as ``weight_dtype`` (in place; returns the model). With
    tied embeddings the lm head gets its own int8 copy and the embedding table stays float32."""
    check_weight_dtype(weight_dtype, model.model.embed_tokens.weight.device, model.model.embed_tokens.weight.dtype)
    if weight_dtype is None:
        return model
    for owner, name in model.projections():
        module = getattr(owner, name)
        if isinstance(module, nn.Linear):
            setattr(owner, name, Int8Linear(module))
    return model


#: float32 projections with fewer weight bytes keep ``nn.Linear``: they come from cache, and
#: the kernel's Python call costs ~10 us more than ``F.linear``'s (measured on the shipped model's
#: 0.25-0.7 MB projections, a few per cent of its ~2.5 ms step)
MIN_STREAM_BYTES = 1 << 20


def stream_weights(model: nn.Module, enabled: bool = True, min_bytes: int = MIN_STREAM_BYTES) -> nn.Module:
    """Run ``model``'s decode products (float32 or int8 CPU projections) on the streaming kernel
    (``minillm.fast.gemv``; float32 of at least ``min_bytes``: ``StreamLinear``, in place, same
    parameters), or put the plain ``nn.Linear`` / torch's int8 linear back (``enabled=False``).
    With anything streamed, decode steps run torch's own ops on one thread
    (``gemv.keep_torch_on_one_thread``). The fast layer calls it
    at load (``minillm.fast.prepare_model``); nothing changes where the kernel cannot be built
    (no C compiler) or ``MINILLM_GEMV=0``. Returns the model."""
    if isinstance(min_bytes, bool) or not isinstance(min_bytes, int) or min_bytes < 0:
        raise ValueError(f"min_bytes must be an int >= 0, got {min_bytes!r}")
    if enabled and not (gemv.enabled_by_env() and gemv.available()):
        enabled = False
    streamed = 0
    for owner, name in model.projections():
        module = getattr(owner, name)
        if isinstance(module, Int8Linear):
            module.stream(enabled)
            streamed += enabled
            continue
        if not isinstance(module, nn.Linear):
            continue
        w = module.weight
        if (enabled and w.device.type == "cpu" and w.dtype == torch.float32
                and w.numel() * w.element_size() >= min_bytes):
            gemv.stream(module)
            streamed += 1
        else:
            gemv.unstream(module)
    if streamed:
        gemv.keep_torch_on_one_thread(model)  # decode steps: the kernel's threads, not torch's team
    else:
        gemv.release_torch_threads(model)
    return model


def weight_bytes(model: nn.Module) -> dict[str, int]:
    """Bytes the model's weights take: float parameters (tied ones once) and int8 projections."""
    unique = {p.data_ptr(): p for p in model.parameters()}
    dense = sum(p.numel() * p.element_size() for p in unique.values())
    int8 = sum(m.weight_bytes for m in model.modules() if isinstance(m, Int8Linear))
    return {"dense": dense, "int8": int8, "total": dense + int8}
