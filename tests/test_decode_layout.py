"""Eager decode-only CPU steps through buffers kept from step to step (``minillm.fast.decode_layout``):
the integers laid out right, the logits of the per-step layout bit for bit (rows leaving, tables
widening), the whole-model call's argmax taken for plainly greedy rows only and never past a hook
that may edit the logits, the model's forward called directly only when no hook would do anything,
and the layers' step struct kept across steps until the threads change."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.fast import gemv, layer_step
from minillm.fast.attention import NULL_BLOCK
from minillm.fast.decode_layout import decode_values, layout_width
from conftest import run_to_end

PROMPTS = [[5, 17, 42, 99, 7, 3] * 4, [5, 17], list(range(20, 50))]


def engine(folder, **kw):
    return LLM(str(folder), device="cpu", dtype="float32", enable_prefix_caching=False, attention_backend="kernel",
               block_size=4, num_kv_blocks=128, **kw)


def test_decode_values_lay_out_the_rows():
    a = SimpleNamespace(prompt_token_ids=[1, 2, 3, 4, 5], output_token_ids=[9, 8], block_table=[7, 3, 11])
    b = SimpleNamespace(prompt_token_ids=list(range(3, 12)), output_token_ids=[], block_table=[2, 4, 6])
    values, width = decode_values([a, b], 4)
    # a: position 6 (block 1, offset 2), context 7; b: position 8 (block 2, offset 0), context 9: 3 blocks -> 4
    assert width == 4 == layout_width(3)
    assert values == [8, 11, 6, 8, 3 * 4 + 2, 6 * 4, 7, 9] + [7, 3, NULL_BLOCK, NULL_BLOCK] + [2, 4, 6, NULL_BLOCK]
    assert decode_values([a, b], 4, width=8)[1] == 8 and decode_values([a, b], 4, width=2)[1] == 4
    assert [layout_width(n) for n in (1, 2, 3, 4, 5, 9)] == [1, 2, 4, 4, 8, 16]


def _logits_of(llm, layouts: bool):
    """Each step's logits, greedy, rows leaving at different steps (through the kept layout or not)."""
    llm.runner._layouts = layouts
    run, seen = llm.runner.run, []

    def kept(*args):
        out = run(*args)
        seen.append(out.clone())
        return out

    llm.runner.run = kept
    for prompt, n in zip(PROMPTS, (14, 5, 9)):
        llm.add_request(prompt_token_ids=prompt, params=SamplingParams(max_tokens=n, temperature=0, ignore_eos=True))
    run_to_end(llm)
    return seen


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_the_kept_layout_gives_the_per_step_layouts_logits(model_factory, family):
    """Rows in the scheduler's order through the kept buffers against the per-step layout (rows
    sorted longest first, logits put back in order): the same logits, bit for bit."""
    kept, fresh = engine(model_factory(family)[0]), engine(model_factory(family)[0])
    got, want = _logits_of(kept, True), _logits_of(fresh, False)
    assert len(got) == len(want) >= 14 and all(torch.equal(a, b) for a, b in zip(got, want))
    assert kept.runner._layout is not None and fresh.runner._layout is None
    assert kept.runner._layout.width == 16  # 24 + 14 tokens in blocks of 4: tables widened to 16


def test_a_greedy_step_takes_the_model_calls_argmax(model_factory):
    """Plainly greedy rows: the whole-model call's argmax is the sampler's answer (no ``choose``
    on a decode step); a sampled row: the sampler chooses; a hook on the model that edits the
    logits in place: its logits are sampled, not the argmax the call made before it ran."""
    llm = engine(model_factory("llama")[0])
    if not layer_step.available():
        pytest.skip(f"unavailable: {layer_step.unavailable_reason()}")
    chosen, choose = [], llm.sampler.choose
    llm.sampler.choose = lambda logits, reqs: chosen.append(len(reqs)) or choose(logits, reqs)
    greedy = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    first = llm.add_request(prompt_token_ids=PROMPTS[0], params=greedy)
    run_to_end(llm)
    assert len(chosen) == 1  # the prefill's step only
    llm.add_request(prompt_token_ids=PROMPTS[0], params=greedy)
    llm.add_request(prompt_token_ids=PROMPTS[1], params=SamplingParams(max_tokens=4, temperature=0.8, seed=1))
    run_to_end(llm)
    assert len(chosen) == 1 + 4  # a sampled row in every step: the sampler's own choice

    def favour(module, args, logits):
        logits[:, 7] = float("inf")

    handle = llm.model.register_forward_hook(favour)
    hooked = llm.add_request(prompt_token_ids=PROMPTS[0], params=greedy)
    run_to_end(llm)
    handle.remove()
    assert hooked.output_token_ids == [7] * 4 != first.output_token_ids


def test_forward_is_called_directly_only_when_no_hook_would_act(model_factory, monkeypatch):
    llm = engine(model_factory("llama")[0], num_threads=1)
    model = llm.model
    assert model._gemv_hooks and gemv.thread_hooks_idle(model)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert not gemv.thread_hooks_idle(model)  # the thread hooks would act
    monkeypatch.undo()
    ran = []
    for register in (model.register_forward_pre_hook, model.register_forward_hook,
                     torch.nn.modules.module.register_module_forward_hook):
        handle = register(lambda *a: ran.append(1))
        assert not gemv.thread_hooks_idle(model)
        before = len(ran)
        llm.add_request(prompt_token_ids=PROMPTS[1], params=SamplingParams(max_tokens=3, temperature=0))
        run_to_end(llm)
        handle.remove()
        assert len(ran) - before >= 3  # the prefill and each decode step ran the hook
    assert gemv.thread_hooks_idle(model)


def test_the_step_struct_is_kept_until_the_threads_change(model_factory):
    if not layer_step.available():
        pytest.skip(f"unavailable: {layer_step.unavailable_reason()}")
    llm = engine(model_factory("llama")[0], num_threads=1)
    # 24 prompt tokens: contexts of 25 to 28 tokens, all in tables 8 blocks wide
    llm.add_request(prompt_token_ids=PROMPTS[0], params=SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
    llm.step()
    llm.step()
    meta = llm.runner._layout.meta
    st = meta.layer_step[1]
    llm.step()
    assert llm.runner._layout.meta is meta and meta.layer_step[1] is st
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        llm.step()
    finally:
        torch.set_num_threads(before)
    assert llm.runner._layout.meta is meta
    assert meta.layer_step[1] is not st and meta.layer_step[1].gemv_threads == 2
