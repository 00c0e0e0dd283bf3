"""The fused small ops of the fast layer (``minillm.fast.small_ops``): the kernels against torch's
ops, the fused residual add (never into the layer's input), the reference fallback, and the
engine's tokens with them on."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minillm import LLM
from minillm.fast import small_ops
from minillm.models.llama import MLP, DecoderLayer, RMSNorm
from conftest import greedy_tokens

pytestmark = pytest.mark.skipif(not small_ops.available(), reason=f"unavailable: {small_ops.unavailable_reason()}")


@pytest.mark.parametrize("rows, dim", [(1, 256), (5, 13), (64, 256), (300, 576)])  # tails; a parallel region
def test_rms_norm_and_its_residual_add_match_torch(rows, dim):
    g = torch.Generator().manual_seed(rows * dim)
    x, a, w = torch.randn(rows, dim, generator=g), torch.randn(rows, dim, generator=g), torch.randn(dim, generator=g)
    norm = RMSNorm(dim, 1e-5)
    norm.weight.data.copy_(w)
    with torch.inference_mode():
        x0, a0 = x.clone(), a.clone()
        torch.testing.assert_close(small_ops.rms_norm(x, w, 1e-5), norm(x), rtol=1e-5, atol=1e-5)
        total, out = small_ops.add_rms_norm(x, a, w, 1e-5)
        assert torch.equal(total, x + a)  # the same float32 sum
        torch.testing.assert_close(out, norm(x + a), rtol=1e-5, atol=1e-5)
        assert torch.equal(x, x0) and torch.equal(a, a0)  # inputs only read


@pytest.mark.parametrize("rows, inter", [(1, 688), (3, 13), (64, 688), (100, 1536)])
def test_silu_mul_matches_torch_across_the_exp_range(rows, inter):
    g = torch.Generator().manual_seed(rows + inter)
    gate_up = torch.randn(rows, 2 * inter, generator=g) * 8
    gate_up[0, :4] = torch.tensor([-120.0, 120.0, 0.0, -0.0])  # exp's clamps, both signs of zero
    gate, up = gate_up.split(inter, dim=-1)
    with torch.inference_mode():
        torch.testing.assert_close(small_ops.silu_mul(gate_up), F.silu(gate) * up, rtol=1e-5, atol=1e-5)


def test_fused_modules_fall_back_to_the_reference_outside_their_case():
    """Gradients wanted, another dtype or a 3-D input: the reference forward, same results."""
    norm, mlp = RMSNorm(8, 1e-6), MLP(type("C", (), {"hidden_size": 8, "intermediate_size": 6, "mlp_bias": False})())
    ref_norm, ref_mlp = type(norm).forward, type(mlp).forward
    small_ops.use_small_ops(torch.nn.ModuleList([norm, mlp]))
    assert type(norm) is small_ops.FusedRMSNorm and type(mlp) is small_ops.FusedMLP
    x = torch.randn(4, 8, requires_grad=True)
    assert torch.equal(norm(x), ref_norm(norm, x)) and torch.equal(mlp(x), ref_mlp(mlp, x))
    with torch.inference_mode():
        x3 = torch.randn(2, 3, 8)
        assert torch.equal(norm(x3), ref_norm(norm, x3))
        xb = torch.randn(4, 8).bfloat16()
        assert torch.equal(norm.bfloat16()(xb), ref_norm(norm, xb))


def test_the_engine_uses_them_with_the_reference_tokens(model_factory):
    """The fast path swaps the classes in (decode and prefill steps, one and many rows) and
    gives the reference path's greedy tokens; the reference path keeps the plain classes."""
    folder, _ = model_factory("llama")
    prompts = [[(5 * i + j) % 60 + 3 for j in range(2 + 3 * i)] for i in range(6)]
    fast = LLM(str(folder), device="cpu", dtype="float32", enable_prefix_caching=False, num_threads=2)
    assert {type(m) for m in fast.model.modules()} >= {small_ops.FusedDecoderLayer, small_ops.FusedMLP,
                                                          small_ops.FusedRMSNorm}
    ref = LLM(str(folder), device="cpu", dtype="float32", enable_prefix_caching=False, fast=False)
    assert not any(type(m).__name__.startswith("Fused") for m in ref.model.modules())
    assert {type(m) for m in ref.model.modules()} >= {DecoderLayer, MLP, RMSNorm}
    assert greedy_tokens(fast, prompts) == greedy_tokens(ref, prompts)


def test_a_fused_layer_leaves_its_input_as_it_was(model_factory):
    """The fused layer once added the attention output into its input ``x`` in place. Nothing in
    the engine reads ``x`` again, but anything holding the input does: here forward hooks on every
    layer (what a look at the residual stream would use), through prefill and decode steps, with
    the reference path's tokens."""
    folder, _ = model_factory("llama")
    llm = LLM(str(folder), device="cpu", dtype="float32", enable_prefix_caching=False, num_threads=1)
    layers = llm.model.model.layers
    assert all(type(layer) is small_ops.FusedDecoderLayer for layer in layers)
    seen, changed = [], []

    def before(module, args):
        seen.append((args[0], args[0].clone()))

    def after(module, args, output):
        held, copy = seen.pop()
        assert held is args[0] and output is not held
        if not torch.equal(held, copy):
            changed.append(module)

    hooks = [h for layer in layers for h in (layer.register_forward_pre_hook(before),
                                             layer.register_forward_hook(after))]
    prompts = [[(3 * i + j) % 60 + 3 for j in range(2 + 4 * i)] for i in range(3)]
    try:
        got = greedy_tokens(llm, prompts)
    finally:
        for h in hooks:
            h.remove()
    assert not changed, f"{len(changed)} layer calls changed their input"
    ref = LLM(str(folder), device="cpu", dtype="float32", enable_prefix_caching=False, fast=False)
    assert got == greedy_tokens(ref, prompts)
