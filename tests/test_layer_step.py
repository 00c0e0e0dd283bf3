"""A decode step's decoder layers in one C call (``minillm.fast.layer_step``: all layers at once,
or one call a layer): the eager layers' output bit for bit, float32 and int8, one thread and two;
the cases left to the eager layers (prefills, more rows than the kernel takes, a hook inside a
layer, q/k norms) and to one call a layer (a hook on a layer); a weight replaced under it; a slot
outside the pool refused before anything is written; and the engine without the library."""

from __future__ import annotations

import pytest
import torch

from minillm import LLM
from minillm.fast import layer_step, small_ops
from minillm.fast.attention import DecodeMeta, PagedKernel
from minillm.models.llama import AttentionBatch, LlamaForCausalLM
from conftest import greedy_tokens

pytestmark = pytest.mark.skipif(not layer_step.available(), reason=f"unavailable: {layer_step.unavailable_reason()}")

PROMPTS = [[5, 17, 42, 99, 7, 3] * 4, [5, 17], list(range(20, 50))]


def engine(folder, **kw):
    return LLM(str(folder), device="cpu", dtype="float32", enable_prefix_caching=False, attention_backend="kernel",
               block_size=4, num_kv_blocks=128, **kw)


@pytest.fixture
def checked_calls(monkeypatch):
    """Every C call made is checked against the eager layers on the same inputs (the same bits
    out): a layer's one call against ``FusedDecoderLayer``'s forward, a decode step's stack call
    by the logits of the model's own forward with the library hidden. Counts the stack calls
    made and the one calls made and refused (None)."""
    seen = {"stack": 0, "one": 0, "none": 0}
    one_call, stack_call, forward = layer_step.one_call, layer_step.stack_call, layer_step.StepLlamaForCausalLM.forward
    model_call = layer_step.model_call

    def checked_one(layer, x, cos, sin, batch, k_cache, v_cache):
        out = one_call(layer, x, cos, sin, batch, k_cache, v_cache)
        seen["none" if out is None else "one"] += 1
        if out is not None:
            assert torch.equal(out, small_ops.FusedDecoderLayer.forward(layer, x, cos, sin, batch, k_cache, v_cache))
        return out

    def counted_stack(*args):
        out = stack_call(*args)
        seen["stack"] += out is not None
        return out

    def counted_model(*args):
        out = model_call(*args)
        seen["stack"] += out is not None
        return out

    def checked_forward(self, input_ids, batch, kv_cache=None, logits_rows=None):
        got = forward(self, input_ids, batch, kv_cache, logits_rows)
        if batch.decode_meta is not None:
            lib = layer_step._lib
            monkeypatch.setattr(layer_step, "_lib", None)  # the eager layers (their KV writes: the same values)
            try:
                assert torch.equal(got, LlamaForCausalLM.forward(self, input_ids, batch, kv_cache, logits_rows))
            finally:
                monkeypatch.setattr(layer_step, "_lib", lib)
        return got

    monkeypatch.setattr(layer_step, "one_call", checked_one)
    monkeypatch.setattr(layer_step, "stack_call", counted_stack)
    monkeypatch.setattr(layer_step, "model_call", counted_model)
    monkeypatch.setattr(layer_step.StepLlamaForCausalLM, "forward", checked_forward)
    return seen


@pytest.mark.parametrize("family, weight_dtype, threads", [("llama", None, 1), ("qwen2", None, 2),
                                                           ("llama3rope", None, 1), ("llama", "int8", 2)])
def test_one_call_is_the_eager_layer_bit_for_bit(model_factory, checked_calls, family, weight_dtype, threads):
    before = torch.get_num_threads()
    try:
        llm = engine(model_factory(family)[0], weight_dtype=weight_dtype, num_threads=threads)
        assert {type(layer) for layer in llm.model.model.layers} == {layer_step.StepDecoderLayer}
        assert type(llm.model) is layer_step.StepLlamaForCausalLM
        # three rows decoding together, then rows leaving: 3, 2 and 1-row steps
        got = greedy_tokens(llm, PROMPTS, n=10)
        assert checked_calls["stack"] >= 9  # every decode step
        # a hook on one layer: the others' one calls, the hooked one's own one call too
        handle = llm.model.model.layers[0].register_forward_hook(lambda *a: None)
        stacks = checked_calls["stack"]
        again = greedy_tokens(llm, PROMPTS, n=10)
        handle.remove()
    finally:
        torch.set_num_threads(before)
    assert again == got and checked_calls["stack"] == stacks and checked_calls["one"] >= 2 * 9
    # float32: the reference path's tokens; int8 (a fast-path option): the gather backend's eager layers
    kw = {"fast": False} if weight_dtype is None else {"attention_backend": "gather", "weight_dtype": weight_dtype}
    reference = LLM(str(model_factory(family)[0]), device="cpu", dtype="float32", enable_prefix_caching=False, **kw)
    assert got == greedy_tokens(reference, PROMPTS, n=10)


def test_steps_outside_its_case_run_the_eager_layer(model_factory, checked_calls):
    """Nine rows decoding together (more than gemv.MAX_ROWS) and every prefill: no one call."""
    llm = engine(model_factory("llama")[0], max_num_seqs=16)
    prompts = [[(3 * i + j) % 50 + 3 for j in range(2 + i)] for i in range(9)]
    greedy_tokens(llm, prompts, n=3)
    assert checked_calls["stack"] == checked_calls["one"] == 0 and checked_calls["none"] > 0


def test_a_hook_inside_the_layer_turns_it_off_and_runs(model_factory, checked_calls):
    llm = engine(model_factory("llama")[0])
    ran = []
    handle = llm.model.model.layers[1].mlp.down_proj.register_forward_hook(lambda m, a, out: ran.append(a[0].shape))
    greedy_tokens(llm, PROMPTS[:1], n=4)
    # the prefill and three decode steps, each decode step twice (the checking fixture's eager rerun)
    assert len(ran) == 1 + 2 * 3
    assert checked_calls["one"] == 3 and checked_calls["stack"] == 0  # layer 0's decode steps, one call each
    handle.remove()
    greedy_tokens(llm, PROMPTS[:1], n=4)
    assert checked_calls["stack"] == 3


def test_a_weight_replaced_under_it_is_read(model_factory, checked_calls):
    """New parameter data (same Parameter object) and a new Parameter: the next step uses them
    (the checked fixture compares with the eager layer, which reads them afresh)."""
    llm = engine(model_factory("llama")[0])
    first = greedy_tokens(llm, PROMPTS, n=4)
    layer = llm.model.model.layers[0]
    with torch.no_grad():
        layer.self_attn.qkv_proj.weight.data = layer.self_attn.qkv_proj.weight.data * 0.5
    second = greedy_tokens(llm, PROMPTS, n=4)
    with torch.no_grad():
        layer.mlp.down_proj.weight = torch.nn.Parameter(layer.mlp.down_proj.weight * -1.0)
    assert first != second != greedy_tokens(llm, PROMPTS, n=4)
    assert checked_calls["stack"] == 3 * 3


def test_q_k_norms_stay_on_the_eager_layer(model_factory, checked_calls):
    llm = engine(model_factory("qwen3")[0])
    greedy_tokens(llm, PROMPTS, n=3)
    assert checked_calls["one"] == checked_calls["stack"] == 0


def test_a_slot_outside_the_pool_is_refused_before_any_write(model_factory):
    llm = engine(model_factory("llama")[0])
    greedy_tokens(llm, PROMPTS[:1], n=2)  # the structs are made
    model, kv = llm.model, llm.kv_cache
    slots = kv.k[0].shape[0] * kv.k[0].shape[1]
    for slot, length, block in ((slots, 3, 0), (5, 3, kv.k[0].shape[0]), (5, 9, 0)):
        meta = DecodeMeta(torch.tensor([[block, 1]]), torch.tensor([length]), torch.tensor([slot]), 2)
        batch = AttentionBatch(positions=torch.tensor([2]), slot_mapping=meta.slot_mapping, num_decode=1,
                               attention=PagedKernel(), decode_meta=meta)
        x = torch.randn(1, model.config.hidden_size)
        cos, sin = model.rotary(batch.positions, torch.float32)
        before = [t.clone() for t in kv.k + kv.v]
        with torch.inference_mode():
            assert layer_step.one_call(model.model.layers[0], x, cos, sin, batch, kv.k[0], kv.v[0]) is None
            stack = layer_step._stack(model, kv)
            assert stack is not None and layer_step.stack_call(stack, x, cos, sin, meta) is None
        assert all(torch.equal(a, b) for a, b in zip(before, kv.k + kv.v))


@pytest.fixture
def rope_calls(monkeypatch):
    """The stack calls that gathered the rotary rows themselves: the tables' rows, and whether
    the call ran the final norm and lm head too (as a whole model call does, with the embedding)."""
    seen = []
    gather, whole = layer_step._lib.decoder_stack_rope_f32, layer_step._lib.decoder_model_f32

    def counted(*args):
        seen.append((args[11], args[14] is not None))
        return gather(*args)

    def counted_whole(*args):
        seen.append((args[6].table_rows, True))
        return whole(*args)

    monkeypatch.setattr(layer_step._lib, "decoder_stack_rope_f32", counted)
    monkeypatch.setattr(layer_step._lib, "decoder_model_f32", counted_whole)
    return seen


@pytest.mark.parametrize("family, weight_dtype", [("llama", None), ("qwen2", None), ("llama", "int8")])
def test_the_stack_call_runs_the_rotary_and_head_unless_hooked(model_factory, checked_calls, rope_calls, family,
                                                               weight_dtype):
    """The stack call gathers the rotary rows and (float32 lm head) runs the final norm and lm
    head: its logits checked against the model's own forward (fixture). A hook on the lm head:
    the modules run it; on the rotary: the rotary module runs (its hook sees every step)."""
    llm = engine(model_factory(family)[0], weight_dtype=weight_dtype)
    got = greedy_tokens(llm, PROMPTS, n=6)
    steps = checked_calls["stack"]
    assert steps == len(rope_calls) >= 5
    assert set(rope_calls) == {(llm.model.rotary.cos.shape[0], weight_dtype is None)}
    handle = llm.model.lm_head.register_forward_hook(lambda *a: None)
    assert greedy_tokens(llm, PROMPTS, n=6) == got and not any(head for _, head in rope_calls[steps:])
    handle.remove()
    assert len(rope_calls) == checked_calls["stack"] == 2 * steps
    ran = []
    handle = llm.model.rotary.register_forward_hook(lambda m, a, out: ran.append(a[0].shape[0]))
    again = greedy_tokens(llm, PROMPTS, n=6)
    handle.remove()
    assert again == got and len(rope_calls) == 2 * steps and checked_calls["stack"] == 3 * steps
    assert len(ran) >= 2 * steps  # each decode step: the stack's rotary and the fixture's eager rerun


def test_a_position_outside_the_rotary_tables_is_refused_before_any_write(model_factory):
    llm = engine(model_factory("llama")[0])
    greedy_tokens(llm, PROMPTS[:1], n=2)
    model, kv = llm.model, llm.kv_cache
    cos, sin = model.rotary.cos, model.rotary.sin
    for position in (cos.shape[0], -1):
        meta = DecodeMeta(torch.tensor([[0, 1]]), torch.tensor([3]), torch.tensor([5]), 2)
        x = torch.randn(1, model.config.hidden_size)
        before = [t.clone() for t in kv.k + kv.v]
        with torch.inference_mode():
            stack = layer_step._stack(model, kv)
            assert stack is not None
            assert layer_step.stack_call(stack, x, cos, sin, meta, torch.tensor([position])) is None
            assert all(torch.equal(a, b) for a, b in zip(before, kv.k + kv.v))
            # the same call at a position inside the tables runs (writes slot 5: the engine is done)
            assert layer_step.stack_call(stack, x, cos, sin, meta, torch.tensor([2])) is not None


def test_without_the_library_the_engine_keeps_the_eager_layers(model_factory, monkeypatch):
    monkeypatch.setattr(layer_step, "_lib", None)
    monkeypatch.setattr(layer_step._library, "reason", "RuntimeError: no C compiler here")
    assert not layer_step.available() and "compiler" in layer_step.unavailable_reason()
    llm = engine(model_factory("llama")[0])
    assert {type(layer) for layer in llm.model.model.layers} == {small_ops.FusedDecoderLayer}
    assert type(llm.model) is LlamaForCausalLM
    reference = LLM(str(model_factory("llama")[0]), device="cpu", dtype="float32", fast=False,
                    enable_prefix_caching=False)
    assert greedy_tokens(llm, PROMPTS, n=6) == greedy_tokens(reference, PROMPTS, n=6)


def test_the_rows_argmax_is_torch_argmax():
    """The argmax the whole-model call hands the sampler: the first of equal largest values, and
    a NaN counts as the largest (the first NaN), as ``torch.argmax``."""
    nan, inf = float("nan"), float("inf")
    rows = [[1.0, 3.0, 3.0, 2.0], [0.0, -0.0, 0.0, -1.0], [-0.0, 0.0, -inf, -inf], [-inf, -inf, -inf, -inf],
            [1.0, nan, 5.0, nan], [nan, 1.0, 2.0, 3.0], [2.0, inf, inf, 1.0], [-1.0, -2.0, -3.0, -0.5]]
    x = torch.tensor(rows, dtype=torch.float32)
    x = torch.cat([x, torch.randn(8, 4).round(decimals=0)])  # (rounded: ties)
    for row in range(0, x.shape[0], 8):  # up to MAX_ROWS rows a call
        part = x[row:row + 8].contiguous()
        got = torch.full((part.shape[0],), -5, dtype=torch.long)
        layer_step._lib.rows_argmax_f32(part.data_ptr(), part.shape[0], part.shape[1], got.data_ptr())
        assert got.tolist() == part.argmax(dim=-1).tolist()
    wide = torch.randn(3, 3879).round(decimals=1)
    got = torch.empty(3, dtype=torch.long)
    layer_step._lib.rows_argmax_f32(wide.data_ptr(), 3, 3879, got.data_ptr())
    assert got.tolist() == wide.argmax(dim=-1).tolist()


def test_the_model_ends_replaced_under_it_are_read(model_factory, checked_calls, rope_calls):
    """The whole-model call reads the embedding, the rotary's tables, the final norm and the lm
    head from structs made once: each replaced (new data, a new Parameter or buffer, the norm's
    eps, the lm head untied) is read by the next step (the checked fixture compares each step's
    logits with the model's own forward, which reads them afresh; each edit changes them), and
    the call keeps running."""
    llm = engine(model_factory("llama")[0])
    model, run = llm.model, llm.runner.run
    logits = []

    def kept(*args):
        out = run(*args)
        logits[-1].append(out.clone())
        return out

    llm.runner.run = kept
    gen = torch.Generator().manual_seed(0)
    edits = [lambda: None,
             lambda: setattr(model.model.embed_tokens.weight, "data",
                             torch.randn(model.model.embed_tokens.weight.shape, generator=gen)),
             lambda: setattr(model.model.norm, "eps", 0.5),
             lambda: setattr(model.model.norm, "weight", torch.nn.Parameter(model.model.norm.weight * -2.0)),
             lambda: setattr(model.rotary, "cos", model.rotary.cos * 0.5),
             lambda: setattr(model, "lm_head", _untied(model.lm_head))]
    for edit in edits:
        with torch.no_grad():
            edit()
        logits.append([])
        greedy_tokens(llm, PROMPTS, n=3)
    assert all(not torch.equal(a[-1], b[-1]) for a, b in zip(logits, logits[1:]))
    assert checked_calls["stack"] == len(edits) * 2 and len(rope_calls) == checked_calls["stack"]
    assert all(head for _, head in rope_calls)


def _untied(lm_head):
    """The lm head with its own weight (the rows reversed), on the streaming kernel as the engine made it."""
    head = torch.nn.Linear(lm_head.in_features, lm_head.out_features, bias=False)
    head.weight = torch.nn.Parameter(lm_head.weight.detach().flip(0).contiguous())
    head.__class__ = type(lm_head)
    return head


def test_a_kv_pool_list_replaced_under_it_is_written(model_factory, checked_calls):
    """The KV cache's lists of pools replaced by copies between steps: the next step writes its
    keys and values into the new pools, not the old ones."""
    from minillm import SamplingParams

    llm = engine(model_factory("llama")[0])
    req = llm.add_request(prompt_token_ids=PROMPTS[0], params=SamplingParams(max_tokens=4, temperature=0, ignore_eos=True))
    llm.step()
    llm.step()
    kv = llm.kv_cache
    old_k, old_v = kv.k, kv.v
    kv.k, kv.v = [t.clone() for t in old_k], [t.clone() for t in old_v]
    before = [t.clone() for t in old_k + old_v]
    llm.step()
    assert all(torch.equal(a, b) for a, b in zip(before, old_k + old_v))  # the old pools untouched
    assert not all(torch.equal(a, b) for a, b in zip(before, kv.k + kv.v))  # the step's K/V in the new ones
    assert checked_calls["stack"] == 2 and req.num_tokens == len(PROMPTS[0]) + 3


def test_another_kv_cache_is_written(model_factory):
    """The model called with another KV cache than the one its structs were made with: the step
    writes into that cache's pools."""
    import copy

    llm = engine(model_factory("llama")[0])
    greedy_tokens(llm, PROMPTS[:1], n=2)  # the structs are made
    model, kv = llm.model, llm.kv_cache
    other = copy.copy(kv)
    other.k, other.v = [t.clone() for t in kv.k], [t.clone() for t in kv.v]
    before = [t.clone() for t in kv.k + kv.v + other.k + other.v]
    meta = DecodeMeta(torch.tensor([[0, 1]]), torch.tensor([3]), torch.tensor([5]), 2)
    batch = AttentionBatch(positions=torch.tensor([2]), slot_mapping=meta.slot_mapping, num_decode=1,
                           attention=PagedKernel(), decode_meta=meta)
    with torch.inference_mode():
        model(torch.tensor([7]), batch, other)
    assert all(torch.equal(a, b) for a, b in zip(before, kv.k + kv.v))
    assert not all(torch.equal(a, b) for a, b in zip(before[2 * len(kv.k):], other.k + other.v))


def test_a_hook_added_after_the_stack_is_made_runs(model_factory, checked_calls):
    """A hook on a module inside a layer, added once the stack call has run: the next steps run
    the hook (the stack's watch sees it); removed, the stack call runs again. A hook on a module
    outside the model does not stop it."""
    llm = engine(model_factory("llama")[0])
    greedy_tokens(llm, PROMPTS[:1], n=4)
    assert checked_calls["stack"] == 3
    ran = []
    handle = llm.model.model.layers[1].mlp.down_proj.register_forward_hook(lambda m, a, out: ran.append(1))
    greedy_tokens(llm, PROMPTS[:1], n=4)
    assert checked_calls["stack"] == 3 and len(ran) == 1 + 2 * 3  # the prefill, each decode step and its check
    handle.remove()
    other = torch.nn.Linear(2, 2).register_forward_hook(lambda *a: None)
    greedy_tokens(llm, PROMPTS[:1], n=4)
    other.remove()
    assert checked_calls["stack"] == 6 and len(ran) == 7
