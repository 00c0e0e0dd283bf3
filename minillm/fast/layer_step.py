"""A decode step's decoder layers in one C call (``kernels/decoder_layer.c``), on eager CPU steps.

An eager decode step of a few rows spends most of its time streaming weights, but each layer
also made ~10 ``ctypes`` calls and ~25 torch operations (norms, projections, rotary, the KV
write, attention, residual adds), each with Python's and torch's per-call cost: measured on an
AMD EPYC Zen 4 core, one thread, SmolLM2-135M (30 layers) spent ~5 ms of a ~28 ms step there,
the shipped 4-layer model most of its step. ``StepDecoderLayer`` runs such a layer as one call
of a C function that calls the same kernels (``gemv``'s projections, ``small_ops``' norms and
SiLU·mul, the paged attention kernel) through pointers taken from their own libraries, in the
same order on the same values: the layer's output is what the eager path computes, bit for bit
(``tests/test_layer_step.py``). ``StepLlamaForCausalLM`` goes one further and runs all the
layers of such a step in one call (``stack_call``): even one call a layer left ~50 us of Python
a layer, run cold after each layer's weights went through the caches. What the cached C
structs were read from is checked at each step in a few C-level passes (``model_watch``).

Its case: a decode-only step of at most ``gemv.MAX_ROWS`` rows on the "kernel" attention
backend, float32 activations and KV pool, every projection on the streaming kernel (float32
``StreamLinear`` or a streamed ``Int8Linear``), outside autograd and compiling, and no hook on
any module inside the layer (a hook on the layer itself runs as usual, and turns the stack call
off: that layer then runs its own one call). Anything else, or a library that cannot be built,
runs ``FusedDecoderLayer``'s forward, unchanged. The C functions check every slot, block id and
context length before they write anything (a refusal falls back too, whose own checks then raise).
"""

from __future__ import annotations

import ctypes
import weakref
from pathlib import Path

import torch
import torch.nn.modules.module as _module

from . import cpu_kernel, gemv, small_ops
from .attention import PagedKernel
from .model_watch import ModelWatch
from ..models.llama import LlamaForCausalLM, RotaryEmbedding
from .small_ops import FusedDecoderLayer

SOURCE = Path(__file__).with_name("kernels") / "decoder_layer.c"
#: -march=native for a hardware fmaf (torch's addcmul fuses its product into the sum on a vector
#: CPU: decoder_layer.c); -ffp-contract=off so the compiler fuses nothing else
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-ffp-contract=off", "-fPIC", "-shared")
_F32 = torch.float32
_ptr, _i64 = ctypes.c_void_p, ctypes.c_int64


class _Kernels(ctypes.Structure):
    _fields_ = [("gemv_f32", _ptr), ("gemv_i8", _ptr), ("rms_norm", _ptr), ("silu_mul", _ptr),
                ("paged_decode", _ptr)]


class _Projection(ctypes.Structure):
    _fields_ = [("w", _ptr), ("scale", _ptr), ("bias", _ptr), ("n", _i64), ("k", _i64), ("ldw", _i64)]


class _Weights(ctypes.Structure):
    _fields_ = [("qkv", _Projection), ("o", _Projection), ("gate_up", _Projection), ("down", _Projection),
                ("norm1", _ptr), ("norm2", _ptr), ("eps1", ctypes.c_float), ("eps2", ctypes.c_float),
                ("attn_scale", ctypes.c_float), ("hidden", _i64), ("heads", _i64), ("kv_heads", _i64),
                ("head_dim", _i64), ("inter", _i64)]


class _Head(ctypes.Structure):
    _fields_ = [("norm", _ptr), ("eps", ctypes.c_float), ("proj", _Projection)]


class _Ends(ctypes.Structure):
    _fields_ = [("embed", _ptr), ("vocab", _i64), ("dim", _i64), ("cos", _ptr), ("sin", _ptr), ("table_rows", _i64),
                ("head", _Head)]


class _Step(ctypes.Structure):
    _fields_ = [("m", _i64), ("slots", _ptr), ("tables", _ptr), ("lens", _ptr), ("width", _i64),
                ("num_blocks", _i64), ("block_size", _i64), ("scratch", _ptr), ("scratch_floats", _i64),
                ("gemv_threads", ctypes.c_int), ("threads", ctypes.c_int)]


_lib = None  # the library once ``_library`` loaded it: the step's calls read it directly
_kernels: _Kernels | None = None  # the kernels it calls, by address (set with it: ``_declare``)
#: each layer's weights struct and what it was made from (outside the module: a ctypes struct
#: holding pointers cannot be copied or pickled with it)
_made: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _declare(lib):
    """The entry points, typed, and the addresses of the kernels they call (``needs``: loaded first)."""
    global _kernels
    lib.decoder_layer_f32.argtypes = [ctypes.POINTER(_Kernels), ctypes.POINTER(_Weights), ctypes.POINTER(_Step),
                                      _ptr, _ptr, _ptr, _ptr, _ptr, _ptr]
    lib.decoder_layer_f32.restype = ctypes.c_int
    lib.decoder_stack_f32.argtypes = [ctypes.POINTER(_Kernels), _ptr, _i64, ctypes.POINTER(_Step),
                                      _ptr, _ptr, _ptr, _ptr, _ptr, _ptr, _ptr]
    lib.decoder_stack_f32.restype = ctypes.c_int
    lib.decoder_stack_rope_f32.argtypes = [ctypes.POINTER(_Kernels), _ptr, _i64, ctypes.POINTER(_Step), _ptr, _ptr,
                                           _ptr, _ptr, _ptr, _ptr, _ptr, _i64, _ptr, _ptr, ctypes.POINTER(_Head),
                                           _ptr, _ptr]
    lib.decoder_stack_rope_f32.restype = ctypes.c_int
    lib.decoder_model_f32.argtypes = [ctypes.POINTER(_Kernels), _ptr, _i64, ctypes.POINTER(_Step), _ptr, _ptr,
                                      ctypes.POINTER(_Ends), _ptr, _ptr, _ptr, _ptr]
    lib.decoder_model_f32.restype = ctypes.c_int
    lib.layer_scratch_floats.argtypes = [_i64] * 6
    lib.layer_scratch_floats.restype = _i64
    lib.model_scratch_floats.argtypes = [_i64, _i64]
    lib.model_scratch_floats.restype = _i64
    lib.rows_argmax_f32.argtypes = [_ptr, _i64, _i64, _ptr]
    lib.rows_argmax_f32.restype = None
    g, s = gemv._lib, small_ops._lib
    _kernels = _Kernels(_address(g.minillm_gemv_f32), _address(g.minillm_gemv_i8), _address(s.rms_norm_f32),
                        _address(s.silu_mul_f32), _address(cpu_kernel._lib))
    return lib


def _address(fn) -> int:
    return ctypes.cast(fn, ctypes.c_void_p).value


_library = cpu_kernel.LazyLibrary(globals(), "decoder_layer", SOURCE, FLAGS, _declare, libs=["-lm"],
                                  needs=(gemv._library, small_ops._library, cpu_kernel._library))
available, unavailable_reason = _library.available, _library.unavailable_reason


def _projection(module) -> tuple[_Projection, tuple] | None:
    """The C view of a streamed projection and the tensors it points into; None when
    ``module`` is not on the streaming kernel."""
    if type(module) is gemv.StreamLinear:
        w, scale, bias = module._parameters["weight"], None, module._parameters["bias"]
        if w.dtype is not _F32:
            return None
    elif getattr(module, "_stream", None) is not None:  # a streamed Int8Linear
        w, scale, bias = module._stream
    else:
        return None
    if (w.dim() != 2 or not w.is_cpu or w.stride(1) != 1 or min(w.shape) < 1
            or (bias is not None and (bias.dtype is not _F32 or not bias.is_contiguous()))):
        return None
    n, k = w.shape
    proj = _Projection(w.data_ptr(), None if scale is None else scale.data_ptr(),
                       None if bias is None else bias.data_ptr(), n, k, w.stride(0) if n > 1 else k)
    return proj, (w, scale, bias)


def _inner_modules(layer) -> tuple:
    attn, mlp = layer._modules["self_attn"], layer._modules["mlp"]
    return (attn, mlp, attn._modules["qkv_proj"], attn._modules["o_proj"], mlp._modules["gate_up_proj"],
            mlp._modules["down_proj"], layer._modules["input_layernorm"], layer._modules["post_attention_layernorm"])


def _weights(mods) -> _Weights | None:
    """The layer's C weights struct (None: not the one call's case)."""
    attn, mlp, qkv, o, gate_up, down, norm1, norm2 = mods
    projs = [_projection(p) for p in (qkv, o, gate_up, down)]
    norms = (norm1._parameters["weight"], norm2._parameters["weight"])
    if (None in projs or attn.qk_norm or type(mlp) is not small_ops.FusedMLP
            or any(n.dtype is not _F32 or not n.is_cpu or not n.is_contiguous() for n in norms)):
        return None
    w = _Weights(*(p for p, _ in projs), norms[0].data_ptr(), norms[1].data_ptr(), norm1.eps, norm2.eps,
                 attn.scale, norms[0].shape[0], attn.num_heads, attn.num_kv_heads, attn.head_dim, mlp.intermediate)
    w.keep = tuple(t for _, ts in projs for t in ts)  # alive while the struct points into them
    w.per_row = _lib.layer_scratch_floats(1, w.hidden, w.heads, w.kv_heads, w.head_dim, w.inter)  # floats a row
    return w


def _current(mods) -> tuple:
    """The tensors a layer's weights struct points into, read afresh (dict lookups), and
    their addresses (a parameter's ``.data`` can be replaced under the same object)."""
    out = []
    for p in mods[2:6]:
        if type(p) is gemv.StreamLinear:
            out += (p._parameters["weight"], p._parameters["bias"])
        else:
            out += getattr(p, "_stream", None) or (None,)
    out += (mods[6]._parameters["weight"], mods[7]._parameters["weight"])
    return tuple(out), tuple(0 if t is None else t.data_ptr() for t in out)


def _same(a: tuple, b: tuple) -> bool:
    return a[1] == b[1] and len(a[0]) == len(b[0]) and all(x is y for x, y in zip(a[0], b[0]))


def _hooked(mods) -> bool:
    """Whether a forward hook would run inside the layer (the one call would skip it)."""
    if _module._global_forward_hooks or _module._global_forward_pre_hooks:
        return True
    return any(m._forward_hooks or m._forward_pre_hooks for m in mods)


def _step(meta, m: int, k_cache: torch.Tensor, per_row: int):
    """The step's shared C struct (slots, tables, lengths, scratch of ``per_row`` floats a row),
    made by the first layer and kept on the step's ``DecodeMeta`` (unless it points into copies
    of them); None when the step is not the one call's case. A meta the runner keeps from step
    to step (``DecodeLayout``) keeps its struct while its tensors, the pool's shape and the
    threads stay."""
    slots, tables, lens = meta.slot_mapping, meta.block_tables, meta.context_lens
    key = (m, k_cache.shape, gemv._threads or torch.get_num_threads(), torch.get_num_threads())
    cached = meta.layer_step
    if (cached is not None and cached[0] == key and cached[1].scratch_floats >= m * per_row
            and cached[2] is slots and cached[3] is tables and cached[4] is lens):
        return cached[1]
    if (slots is None or tables is None or lens is None or slots.dtype is not torch.int64
            or tables.dtype is not torch.int64 or lens.dtype is not torch.int64
            or tuple(slots.shape) != (m,) or tuple(lens.shape) != (m,) or tables.dim() != 2 or tables.shape[0] != m
            or tables.shape[1] < 1 or not (slots.is_cpu and tables.is_cpu and lens.is_cpu)):
        return None
    c_slots, c_tables, c_lens = slots.contiguous(), tables.contiguous(), lens.contiguous()
    size = m * per_row
    scratch = torch.empty(size, dtype=_F32)
    st = _Step(m, c_slots.data_ptr(), c_tables.data_ptr(), c_lens.data_ptr(), tables.shape[1], k_cache.shape[0],
               k_cache.shape[1], scratch.data_ptr(), size, key[2], key[3])
    st._keep = (c_slots, c_tables, c_lens, scratch)
    if c_slots is slots and c_tables is tables and c_lens is lens:  # (a copy would not see later writes)
        meta.layer_step = (key, st, slots, tables, lens)
    return st


def _case(layer, x, cos, sin, batch, k_cache, v_cache) -> bool:
    """The one call's case, everything but the weights and the step's metadata."""
    m = x.shape[0]
    return (_lib is not None and type(batch.attention) is PagedKernel and batch.decode_meta is not None
            and batch.num_decode == m and not batch.prefills and 0 < m <= gemv.MAX_ROWS and x.dtype is _F32
            and x.dim() == 2 and x.is_cpu and x.is_contiguous() and not torch.is_grad_enabled()
            and not torch.compiler.is_compiling() and k_cache is not None and k_cache.dtype is _F32
            and v_cache.dtype is _F32 and k_cache.dim() == 4 and v_cache.shape == k_cache.shape
            and k_cache.is_contiguous() and v_cache.is_contiguous() and cos.dtype is _F32 and sin.dtype is _F32
            and cos.is_contiguous() and sin.is_contiguous() and cos.numel() == sin.numel() == m * k_cache.shape[3]
            and (gemv.ONE_THREAD_F32 or (gemv._threads or torch.get_num_threads()) > 1))


def _layer_weights(layer) -> _Weights | None:
    """``layer``'s C weights struct, remade when a weight changed; None when the layer is not
    the one call's case or a hook would run inside it."""
    mods = _inner_modules(layer)
    if _hooked(mods):
        return None
    cached = _made.get(layer)
    now = _current(mods)
    if cached is None or not _same(cached[0], now):
        _made[layer] = cached = (now, _weights(mods))
    return cached[1]


def one_call(layer, x, cos, sin, batch, k_cache, v_cache) -> torch.Tensor | None:
    """The layer's output by one C call, or None when this step or layer is not its case."""
    if not _case(layer, x, cos, sin, batch, k_cache, v_cache):
        return None
    weights = _layer_weights(layer)
    if weights is None or weights.hidden != x.shape[1] or weights.head_dim != k_cache.shape[3]:
        return None
    st = _step(batch.decode_meta, x.shape[0], k_cache, weights.per_row)
    if st is None:
        return None
    out = torch.empty_like(x)
    status = _lib.decoder_layer_f32(_kernels, weights, st, x.data_ptr(), out.data_ptr(), k_cache.data_ptr(),
                                    v_cache.data_ptr(), cos.data_ptr(), sin.data_ptr())
    return out if status == 0 else None


class StepDecoderLayer(FusedDecoderLayer):
    """``FusedDecoderLayer`` whose decode steps of a few rows run as one C call (``one_call``)."""

    def forward(self, x, cos, sin, batch, k_cache, v_cache):
        out = one_call(self, x, cos, sin, batch, k_cache, v_cache)
        return out if out is not None else super().forward(x, cos, sin, batch, k_cache, v_cache)


def use_layer_step(model: torch.nn.Module) -> bool:
    """Give ``model``'s ``FusedDecoderLayer`` modules the one-call decode step, in place (False,
    nothing changed, where the library cannot be built)."""
    if not available():
        return False
    for module in model.modules():
        if type(module) is FusedDecoderLayer:
            module.__class__ = StepDecoderLayer
    if type(model) is LlamaForCausalLM:
        model.__class__ = StepLlamaForCausalLM
    return True


class _Stack:
    """A model's layers as the C stack call takes them: pointer arrays to each layer's weights
    struct and KV pools, the model's ends where ``model_call`` can run them (else None), and
    the ``ModelWatch`` that says when to remake them."""

    def __init__(self, model, kv_cache, weights: list):
        n, head_dim = len(weights), kv_cache.k[0].shape[3]
        self.watch = ModelWatch(model, kv_cache)
        self.structs = weights  # (kept alive: the arrays point into them)
        self.weights = (ctypes.POINTER(_Weights) * n)(*(ctypes.pointer(w) for w in weights))
        self.k = (_ptr * n)(*(t.data_ptr() for t in kv_cache.k))
        self.v = (_ptr * n)(*(t.data_ptr() for t in kv_cache.v))
        self.ends = _model_ends(model, weights, head_dim)
        # scratch floats a row: the layers' and the model call's own
        self.per_row = max(w.per_row for w in weights) + _lib.model_scratch_floats(weights[0].hidden, head_dim)
        self.n, self.pool = n, kv_cache.k[0]


def _pools_ok(k_pools: list, v_pools: list) -> bool:
    shape = k_pools[0].shape
    return len(shape) == 4 and all(t.dtype is _F32 and t.shape == shape and t.is_cpu and t.is_contiguous()
                                   for t in k_pools + v_pools)


def _stack(model, kv_cache) -> _Stack | None:
    """The model's ``_Stack`` for this step: the last one while its watch holds, else made
    afresh (None: a layer is not the one call's case or has a hook of its own, which the stack
    call would skip)."""
    cached = _made.get(model)
    if cached is not None and cached.watch.holds(model, kv_cache):
        return cached
    weights = []
    for layer in model.model.layers:
        if type(layer) is not StepDecoderLayer or layer._forward_hooks or layer._forward_pre_hooks:
            return None
        w = _layer_weights(layer)
        if w is None:
            return None
        weights.append(w)
    k_pools, v_pools = list(kv_cache.k), list(kv_cache.v)
    if (len(k_pools) != len(weights) or len(v_pools) != len(weights) or not _pools_ok(k_pools, v_pools)
            or any(w.head_dim != k_pools[0].shape[3] for w in weights)):
        return None
    _made[model] = stack = _Stack(model, kv_cache, weights)
    return stack


def _stack_case(input_ids, batch, kv_cache) -> bool:
    m = input_ids.shape[0]
    return (_lib is not None and kv_cache is not None and type(batch.attention) is PagedKernel
            and not (_module._global_forward_hooks or _module._global_forward_pre_hooks)
            and batch.decode_meta is not None and batch.num_decode == m and not batch.prefills
            and 0 < m <= gemv.MAX_ROWS and input_ids.dim() == 1 and not torch.is_grad_enabled()
            and not torch.compiler.is_compiling()
            and (gemv.ONE_THREAD_F32 or (gemv._threads or torch.get_num_threads()) > 1))


def _rope_tables(rotary, positions, m: int, head_dim: int):
    """The rotary's cos and sin tables when the stack call can gather the step's rows from them
    itself (saving the per-step index, neg and cat: ~40 us of the shipped model's ~0.9 ms step),
    else None (no table, a hook or a subclass on the rotary, or an unusual positions tensor)."""
    if not _index_ok(positions, m):
        return None
    return _rotary_tables(rotary, head_dim)


def _index_ok(t, m: int) -> bool:
    """Whether ``t`` is ``m`` int64 indices the C calls can read."""
    return t.dtype is torch.int64 and t.dim() == 1 and t.shape[0] == m and t.is_cpu and t.is_contiguous()


def _rotary_tables(rotary, head_dim: int):
    """The rotary's float32 cos and sin tables ([positions, head_dim], contiguous, on the CPU) where
    no hook or subclass is on the rotary, else None (``_rope_tables`` checks the positions too)."""
    if type(rotary) is not RotaryEmbedding or rotary._forward_hooks or rotary._forward_pre_hooks:
        return None
    cos, sin = rotary._buffers.get("cos"), rotary._buffers.get("sin")
    if (cos is None or sin is None or cos.dtype is not _F32 or sin.dtype is not _F32 or cos.dim() != 2
            or cos.shape != sin.shape or cos.shape[1] != head_dim or not cos.is_cpu or not sin.is_cpu
            or not cos.is_contiguous() or not sin.is_contiguous()):
        return None
    return cos, sin


def _head_parts(model) -> tuple:
    """The final norm, and what the head's struct points into, read afresh: the lm head module,
    the parameters, their addresses and the norm's eps (kept under the norm in ``_made``, so without it: a value
    holding its own weak key would keep it alive)."""
    norm, lm_head = model.model._modules["norm"], model._modules["lm_head"]
    params = (norm._parameters.get("weight"), lm_head._parameters.get("weight"), lm_head._parameters.get("bias"))
    return norm, ((lm_head,) + params, tuple(0 if t is None else t.data_ptr() for t in params) + (norm.eps,))


def _head(model) -> _Head | None:
    """The model's final norm and lm head as the stack call can run them after the layers (the
    calls ``FusedRMSNorm`` and ``StreamLinear`` make), remade when one changed; None when either
    is another kind, not float32 or hooked (then they run as modules)."""
    norm, parts = _head_parts(model)
    lm_head, weight = parts[0][0], parts[0][1]
    if norm._forward_hooks or norm._forward_pre_hooks or lm_head._forward_hooks or lm_head._forward_pre_hooks:
        return None
    cached = _made.get(norm)
    if cached is not None and _same(cached[0], parts):
        return cached[1]
    head = None
    if (type(norm) is small_ops.FusedRMSNorm and type(lm_head) is gemv.StreamLinear and weight is not None
            and weight.dtype is _F32 and weight.dim() == 1 and weight.is_cpu and weight.is_contiguous()):
        proj = _projection(lm_head)
        if proj is not None and proj[0].k == weight.shape[0]:
            head = _Head(weight.data_ptr(), norm.eps, proj[0])
            head.keep = (weight,) + proj[1]
    _made[norm] = (parts, head)
    return head


def _rows_ok(logits_rows, m: int) -> bool:
    return logits_rows is None or _index_ok(logits_rows, m)


def _model_ends(model, stack_weights: list, head_dim: int) -> _Ends | None:
    """The embedding, the rotary's tables and the head as ``decoder_model_f32`` takes them, so
    that a step's ids go in and its logits come out of one call (None: one of them is not its
    case: hooked, another kind, not float32; the stack call then runs with the modules)."""
    embed, hidden = model.model._modules["embed_tokens"], stack_weights[0].hidden
    weight = embed._parameters.get("weight")
    tables, head = _rotary_tables(model._modules["rotary"], head_dim), _head(model)
    if (type(embed) is not torch.nn.Embedding or embed._forward_hooks or embed._forward_pre_hooks
            or embed.max_norm is not None or weight is None or weight.dtype is not _F32 or weight.dim() != 2
            or weight.shape[1] != hidden or not weight.is_cpu or not weight.is_contiguous() or tables is None
            or head is None):
        return None
    ends = _Ends(weight.data_ptr(), weight.shape[0], hidden, tables[0].data_ptr(), tables[1].data_ptr(),
                 tables[0].shape[0], head)
    ends.keep = (weight, tables, head)
    return ends


def stack_call(stack: _Stack, x, cos, sin, meta, positions=None, head=None, logits_rows=None) -> torch.Tensor | None:
    """The last layer's output for the step's hidden states ``x`` by one C call (None: refused).
    ``cos``/``sin`` are the step's rows, or with ``positions`` the rotary's tables (``_rope_tables``)
    that the call gathers the rows from; with ``positions`` and a ``head`` (``_head``), the
    logits of the rows ``logits_rows`` (a permutation, None: in order) instead."""
    m = x.shape[0]
    rows = m if positions is None else cos.shape[0]
    if (x.dtype is not _F32 or x.dim() != 2 or not x.is_contiguous() or cos.dtype is not _F32
            or sin.dtype is not _F32 or not cos.is_contiguous() or not sin.is_contiguous()
            or cos.numel() != rows * stack.pool.shape[3] or sin.numel() != cos.numel()):
        return None
    st = _step(meta, m, stack.pool, stack.per_row)
    if st is None:
        return None
    out, between = torch.empty_like(x), torch.empty_like(x)
    if positions is None:
        status = _lib.decoder_stack_f32(_kernels, stack.weights, stack.n, st, x.data_ptr(), out.data_ptr(),
                                        between.data_ptr(), stack.k, stack.v, cos.data_ptr(), sin.data_ptr())
    else:
        rope = torch.empty(2 * cos.numel() // rows * m, dtype=_F32)
        logits = None
        if head is not None:
            if head.proj.k != x.shape[1] or not _rows_ok(logits_rows, m):
                return None
            logits = torch.empty((m, head.proj.n), dtype=_F32)
        status = _lib.decoder_stack_rope_f32(_kernels, stack.weights, stack.n, st, x.data_ptr(), out.data_ptr(),
                                             between.data_ptr(), stack.k, stack.v, cos.data_ptr(), sin.data_ptr(),
                                             rows, positions.data_ptr(), rope.data_ptr(), head,
                                             None if logits_rows is None or head is None else logits_rows.data_ptr(),
                                             None if logits is None else logits.data_ptr())
        out = out if logits is None else logits
    return out if status == 0 else None


def model_call(stack: _Stack, input_ids, positions, meta) -> torch.Tensor | None:
    """The step's logits for the token ids ``input_ids`` at ``positions`` by one C call through
    the embedding, every layer and the head (``stack.ends``; None: refused). Where the runner
    gave the meta an ``argmax`` buffer, each row's argmax goes there too and ``meta.argmax_of``
    names these logits."""
    m = input_ids.shape[0]
    ends, argmax = stack.ends, meta.argmax
    if not (_index_ok(input_ids, m) and _index_ok(positions, m) and (argmax is None or _index_ok(argmax, m))):
        return None
    st = _step(meta, m, stack.pool, stack.per_row)
    if st is None:
        return None
    logits = torch.empty((m, ends.head.proj.n), dtype=_F32)
    status = _lib.decoder_model_f32(_kernels, stack.weights, stack.n, st, stack.k, stack.v, ends,
                                    input_ids.data_ptr(), positions.data_ptr(), logits.data_ptr(),
                                    None if argmax is None else argmax.data_ptr())
    if status != 0:
        return None
    if argmax is not None:
        meta.argmax_of = logits
    return logits


class StepLlamaForCausalLM(LlamaForCausalLM):
    """A model whose decode steps of a few rows run every decoder layer in one C call
    (``stack_call``) when each layer is ``StepDecoderLayer``'s case and no layer has a hook;
    otherwise (or when the call refuses its arguments) the model's own forward, layer by layer."""

    def forward(self, input_ids, batch, kv_cache=None, logits_rows=None):
        stack = _stack(self, kv_cache) if _stack_case(input_ids, batch, kv_cache) else None
        logits = None if stack is None else self._stacked(stack, input_ids, batch, logits_rows)
        return logits if logits is not None else super().forward(input_ids, batch, kv_cache, logits_rows)

    def _stacked(self, stack: _Stack, input_ids, batch, logits_rows) -> torch.Tensor | None:
        """The step's logits with the layers in one call (None: refused): with the embedding,
        rotary rows, final norm and lm head too where all are its case (``model_call``), else
        with the rotary rows, and the final norm and lm head where those are."""
        if stack.ends is not None and logits_rows is None:
            return model_call(stack, input_ids, batch.positions, batch.decode_meta)
        x = self.model.embed_tokens(input_ids)
        tables = _rope_tables(self.rotary, batch.positions, x.shape[0], stack.pool.shape[3])
        if tables is not None:
            head = _head(self) if _rows_ok(logits_rows, x.shape[0]) else None
            h = stack_call(stack, x, *tables, batch.decode_meta, batch.positions, head, logits_rows)
            if head is not None:
                return h
        else:
            cos, sin = self.rotary(batch.positions, x.dtype)
            h = stack_call(stack, x, cos, sin, batch.decode_meta)
        if h is None:
            return None
        if logits_rows is not None:
            h = h.index_select(0, logits_rows)
        return self.lm_head(self.model.norm(h))
