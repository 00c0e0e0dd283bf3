"""The fused small ops of the fast layer (``minillm.fast.small_ops``): the kernels against torch's
ops, the in-place residual add, the reference fallback, and the engine's tokens with them on."""

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
        torch.testing.assert_close(small_ops.rms_norm(x.clone(), w, 1e-5), norm(x), rtol=1e-5, atol=1e-5)
        y = x.clone()
        out = small_ops.rms_norm(y, w, 1e-5, residual=a)
        assert torch.equal(y, x + a)  # added in place
        torch.testing.assert_close(out, norm(x + a), rtol=1e-5, atol=1e-5)


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
