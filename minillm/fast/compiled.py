"""``LLM(compile=True)``: the model's forward through ``torch.compile``, attention left eager.

A step's dense work (embedding, norms, the q/k/v, o and MLP projections, rotary, the lm head)
is the same code for every step and every layer; only attention depends on the step's layout
(``AttentionBatch``: decode groups, prefill sequences, Python objects that change every step).
So the whole forward is traced once, with attention as one opaque op (``minillm::attention``),
the way vLLM splits its graph at attention: inductor fuses everything around it, and at run
time the op calls the eager ``Attention.attend`` with the step's batch, read from a per-thread
context that ``CompiledModel`` sets around the call. The KV cache never enters the graph.

Shapes: the token count ``T`` and the number of logits rows are dynamic from the first compile
(size-oblivious, so a size of 1 is not a special case for them, and no two sizes are assumed
equal because they once were), and every step selects logits rows (all of them for a
decode-only step; one dropped row for a step that only prefills a chunk), so a step's size
never causes a recompile. A view's stride computation would still tell T = 1 from T > 1 (a
second graph, twice the compile time), so a single-token step is padded to two rows; the
padding row is cut off before attention, so its K/V never reach the cache, and its output is
dropped. One graph serves every step (``MAX_COMPILES``, ``CompiledModel.compiles`` counts it).
It is compiled in the first step, or at once by ``LLM.warmup()`` (tens of seconds of CPU:
``benchmarks/compile_decode.py`` measures it; inductor's on-disk cache makes a second process
much faster).

The eager model stays the reference: ``llm.model`` is untouched (the course, ``full_logits``
and ``next_token_logits`` use it); only the runner calls through ``CompiledModel``.
"""

from __future__ import annotations

import threading

import torch

from ..models.llama import AttentionBatch
from . import kernel_cache

#: graphs one engine compiles: one serves every step (see the module docstring); torch raises
#: past it (``recompile_limit`` with ``fullgraph``) instead of silently running eager
MAX_COMPILES = 1


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
    n = _STEP.batch.positions.shape[0]  # the step's real tokens: a padding row is cut off here,
    out = model.model.layers[layer].self_attn.attend(q[:n], k[:n], v[:n], _STEP.batch, k_cache, v_cache)
    if n < q.shape[0]:  # before its K/V could reach the cache; its output row is zeros
        return torch.cat((out, out.new_zeros(q.shape[0] - n, out.shape[1])))
    # a custom op's output may not alias its inputs
    return out if out.data_ptr() not in (q.data_ptr(), k.data_ptr(), v.data_ptr()) else out.clone()


@attention.register_fake
def _(q, k, v, layer):
    return q.new_empty(q.shape[0], q.shape[1] * q.shape[2])


class OpaqueAttention:
    """The backend of the batch the compiled graph is traced with: attention is the one opaque
    op above, which runs the eager backend of the real step (``_STEP.batch``) at every step."""

    @staticmethod
    def attend(layer, q, k, v, batch, k_cache=None, v_cache=None) -> torch.Tensor:
        return torch.ops.minillm.attention(q, k, v, layer.layer_idx)


_OPAQUE = OpaqueAttention()


class CompiledModel:
    """Called like ``LlamaForCausalLM`` by the runner: the same logits (up to rounding), through
    one compiled forward (see the module docstring). ``compiles`` counts the graphs made."""

    def __init__(self, model):
        self.model = model
        self.compiles = 0
        # fullgraph: one graph per call or an error, never a silent split into eager pieces;
        # recompile_limit with fullgraph: past the bound torch raises instead of running eager;
        # isolate_recompiles: this engine's graphs count against its own limit, not another's
        # guard_filter_fn: no guards on the model's modules (a few hundred checks per step on
        # attributes nothing changes after loading: ~0.3 ms of a ~6 ms step measured at load 4);
        # the inputs' guards stay. So the weights must not change layout from now on:
        # ``use_decode_layout`` refuses (``model.compiled``), int8 is refused by the options
        model.compiled = True
        kernel_cache.private_inductor_cache()  # inductor loads what it finds in its cache folder
        self._forward = torch.compile(model.forward, backend=self._inductor, dynamic=True, fullgraph=True,
                                      recompile_limit=MAX_COMPILES, isolate_recompiles=True,
                                      options={"guard_filter_fn": torch.compiler.skip_guard_on_all_nn_modules_unsafe})

    def _inductor(self, gm, example_inputs):
        from torch._inductor.compile_fx import compile_fx

        compiled = compile_fx(gm, example_inputs)
        self.compiles += 1  # counted once made: torch may abandon an attempt and retrace
        return compiled

    def __call__(self, input_ids, batch, kv_cache=None, logits_rows=None):
        # the graph gets fresh copies of its index inputs (the runner's are views into one
        # upload at offsets that change every step, and torch would guard on the offsets),
        # padded to 2 tokens when there is one (a second graph just for T = 1 would double the
        # compile time; the padding row is dropped before attention writes the cache)
        pad = 2 - input_ids.shape[0] if input_ids.shape[0] < 2 else 0
        ids, positions = input_ids, batch.positions
        if pad:
            ids, positions = ids.repeat(1 + pad), positions.repeat(1 + pad)
        else:
            ids, positions = ids.clone(), positions.clone()
        if logits_rows is None:  # a decode-only step: every (real) row
            rows = torch.arange(input_ids.shape[0], device=input_ids.device)
        elif logits_rows.shape[0] == 0:  # only a prefill chunk: one row computed and dropped
            rows = logits_rows.new_zeros(1)
        else:
            rows = logits_rows.clone()
        _STEP.model, _STEP.batch, _STEP.kv_cache = self.model, batch, kv_cache
        try:
            graph_batch = AttentionBatch(positions=positions, slot_mapping=None, attention=_OPAQUE)
            if self.compiles:  # compiled: only the guards run (the settings below cost ~0.1 ms)
                logits = self._forward(ids, graph_batch, None, rows)
            else:
                # size-oblivious, no duck sizing: see the module docstring; floats (eps, scales)
                # are constants of the graph, not inputs (torch would retrace once to learn it)
                with torch.fx.experimental._config.patch(backed_size_oblivious=True, use_duck_shape=False), \
                        torch._dynamo.config.patch(specialize_float=True):
                    logits = self._forward(ids, graph_batch, None, rows)
        finally:
            _STEP.model = _STEP.batch = _STEP.kv_cache = None
        return logits[:0] if logits_rows is not None and logits_rows.shape[0] == 0 else logits


def warm_up(llm) -> int:
    """Compile now instead of in the first step: one greedy request of two tokens through
    ``llm`` (a 2-token prefill, then a 1-token decode, padded), its output dropped and the
    request forgotten (its events stay in the trace). Returns the graphs compiled so far
    (0 for an eager engine, which has nothing to compile)."""
    from ..params import SamplingParams

    compiled = llm.runner.model
    if not isinstance(compiled, CompiledModel):
        return 0
    token = 1 % llm.model_config.vocab_size
    req = llm.add_request(prompt_token_ids=[token, token],
                          params=SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    while req.is_live:
        llm.step()
    llm.requests.pop(req.request_id, None)
    return compiled.compiles
