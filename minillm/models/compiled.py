"""``LLM(compile=True)``: the model's forward through ``torch.compile``, attention left eager.

A step's dense work (embedding, norms, the q/k/v, o and MLP projections, rotary, the lm head)
is the same code for every step and every layer; only attention depends on the step's layout
(``AttentionBatch``: decode groups, prefill sequences, Python objects that change every step).
So the whole forward is traced once, with attention as one opaque op (``minillm::attention``),
the way vLLM splits its graph at attention: inductor fuses everything around it, and at run
time the op calls the eager ``Attention.attend`` with the step's batch, read from a per-thread
context that ``CompiledModel`` sets around the call. The KV cache never enters the graph.

Shapes: the token count ``T`` (and the number of logits rows) is dynamic from the first
compile, so a step's size never causes a recompile; torch specialises a size of 1 on its own,
and a step asking for no logits-row selection is a different graph. That gives at most
``MAX_COMPILES`` graphs (``CompiledModel.compiles`` counts them: one call of the backend is one
graph). The compile happens lazily, in the first steps that meet each kind of shape (seconds
each on a CPU; ``benchmarks/compile_decode.py`` measures it).

The eager model stays the reference: ``llm.model`` is untouched (the course, ``full_logits``
and ``next_token_logits`` use it); only the runner calls through ``CompiledModel``.
"""

from __future__ import annotations

import threading

import torch

#: graphs one engine may compile: T == 1 or T > 1, times logits rows: none selected (a decode
#: -only step in order), one row, several rows
MAX_COMPILES = 6


class _StepContext(threading.local):
    """What the attention op needs and the graph does not carry: the step's model, batch and cache."""

    model = None
    batch = None
    kv_cache = None


_STEP = _StepContext()


@torch.library.custom_op("minillm::attention", mutates_args=())
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    """Layer ``layer``'s eager attention of the running step (``Attention.attend``): writes the
    new K/V into the cache (which is not an input of the graph: nothing in it reads the cache
    but this op), returns [T, heads * D]."""
    model, kv = _STEP.model, _STEP.kv_cache
    if model is None:
        raise RuntimeError("minillm::attention runs only inside CompiledModel's forward")
    k_cache = kv.k[layer] if kv is not None else None
    v_cache = kv.v[layer] if kv is not None else None
    out = model.model.layers[layer].self_attn.attend(q, k, v, _STEP.batch, k_cache, v_cache)
    return out if out.data_ptr() not in (q.data_ptr(), k.data_ptr(), v.data_ptr()) else out.clone()


@attention.register_fake
def _(q, k, v, layer):
    return q.new_empty(q.shape[0], q.shape[1] * q.shape[2])


class CompiledModel:
    """Called like ``LlamaForCausalLM`` by the runner: the same logits, through one compiled
    forward per kind of shape (see the module docstring). ``compiles`` counts the graphs made."""

    def __init__(self, model):
        self.model = model
        self.compiles = 0
        self._forward = torch.compile(model.forward, backend=self._inductor, dynamic=True)

    def _inductor(self, gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        self.compiles += 1
        if self.compiles > MAX_COMPILES:
            raise RuntimeError(f"minillm's compiled forward was compiled {self.compiles} times "
                               f"(bound {MAX_COMPILES}): some input makes it recompile")
        return compile_fx(gm, example_inputs)

    def __call__(self, input_ids, batch, kv_cache=None, logits_rows=None):
        _STEP.model, _STEP.batch, _STEP.kv_cache = self.model, batch, kv_cache
        try:
            return self._forward(input_ids, batch, None, logits_rows)
        finally:
            _STEP.model = _STEP.batch = _STEP.kv_cache = None
