"""The streaming decode kernel (``minillm.fast.gemv``): the products it computes against
``F.linear``, results that do not depend on the thread count, int8 weights, refused
arguments, and the engine's float32 tokens with and without it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from minillm import LLM
from minillm.fast import gemv, packed
from minillm.models.weights import Int8Linear, stream_weights
from conftest import greedy_tokens

pytestmark = pytest.mark.skipif(not gemv.available(), reason=f"gemv kernel unavailable: {gemv.unavailable_reason()}")

# (out, in): SmolLM2-135M's kinds (qkv, o, gate_up, down) scaled down, and odd sizes that
# leave a tail of rows (out % 4) and of columns (in % 16)
SHAPES = [(96, 64), (64, 160), (7, 13), (5, 33), (1, 8), (1030, 72)]


@pytest.mark.parametrize("out_in", SHAPES)
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_float32_matches_f_linear_and_not_the_thread_count(out_in, rows):
    n, k = out_in
    g = torch.Generator().manual_seed(n * 100 + k + rows)
    w, b, x = torch.randn(n, k, generator=g), torch.randn(n, generator=g), torch.randn(rows, k, generator=g)
    ref = F.linear(x, w, b)
    one = gemv.linear(x, w, b, threads=1)
    torch.testing.assert_close(one, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(gemv.linear(x, w, b, threads=2), one)  # each row the same sums, whoever computes it
    assert torch.equal(gemv.linear(x, w, None, threads=3), gemv.linear(x, w, None, threads=1))


def test_big_split_calls_match_one_thread():
    """Big enough to be cut into chunks for the worker threads (>= 64 KiB of weights)."""
    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(4100, 96, generator=g), torch.randn(3, 96, generator=g)
    one = gemv.linear(x, w, threads=1)
    torch.testing.assert_close(one, F.linear(x, w), rtol=1e-5, atol=1e-4)
    for _ in range(20):  # many calls in a row: workers waking, spinning, sleeping
        assert torch.equal(gemv.linear(x, w, threads=2), one)
    assert gemv.workers() >= 1
    q = torch.randint(-127, 128, (4100, 96), dtype=torch.int8, generator=g)
    scale = torch.rand(4100, generator=g)
    assert torch.equal(gemv.linear_int8(x, q, scale, threads=2), gemv.linear_int8(x, q, scale, threads=1))


@pytest.mark.parametrize("n", [1, 31, 32, 4096 + 7])
def test_read_probe_sums_every_element_once(n):
    # the benchmarks' bandwidth probe reads 4 quarters at once plus a tail: every element once
    x = torch.arange(n, dtype=torch.float32) % 5
    assert gemv.read_probe(x) == float(x.double().sum())
    with pytest.raises(ValueError, match="contiguous float32"):
        gemv.read_probe(x.double())


@pytest.mark.parametrize("out_in", SHAPES)
@pytest.mark.parametrize("rows", [1, 5])
def test_int8_is_the_dequantized_float_product(out_in, rows):
    n, k = out_in
    g = torch.Generator().manual_seed(n + k + rows)
    q = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    scale, b, x = torch.rand(n, generator=g), torch.randn(n, generator=g), torch.randn(rows, k, generator=g)
    ref = F.linear(x, q.float() * scale[:, None], b)
    torch.testing.assert_close(gemv.linear_int8(x, q, scale, b, threads=2), ref, rtol=1e-4, atol=1e-4)


def test_leading_dims_and_strided_rows_are_kept():
    w = torch.randn(40, 24)
    x = torch.randn(2, 3, 48)[..., ::2]  # [2, 3, 24], rows not contiguous
    torch.testing.assert_close(gemv.linear(x, w), F.linear(x, w), rtol=1e-5, atol=1e-5)
    assert gemv.linear(x, w).shape == (2, 3, 40)


@pytest.mark.parametrize("bad, match", [
    (lambda: gemv.linear(torch.randn(2, 8), torch.randn(4, 9)), "weight must be"),
    (lambda: gemv.linear(torch.randn(2, 8, dtype=torch.float64), torch.randn(4, 8)), "x must be float32"),
    (lambda: gemv.linear(torch.randn(2, 8), torch.randn(4, 8).half()), "weight must be float32"),
    (lambda: gemv.linear(torch.randn(2, 8), torch.randn(8, 4).t()), "contiguous rows"),
    (lambda: gemv.linear(torch.randn(2, 8), torch.randn(4, 8), torch.randn(3)), "bias"),
    (lambda: gemv.linear(torch.randn(0, 8), torch.randn(4, 8)), "at least 1"),
    (lambda: gemv.linear_int8(torch.randn(2, 8), torch.zeros(4, 8, dtype=torch.int8), torch.rand(5)), "scale"),
    (lambda: gemv.linear_int8(torch.randn(2, 8), torch.zeros(4, 8), torch.rand(4)), "q must be int8"),
    (lambda: gemv.set_spin_us(-1), "us must be"),
    (lambda: stream_weights(nn.Module(), min_bytes=-1), "min_bytes"),
    (lambda: gemv.set_threads(0), "threads must be"),
])
def test_bad_arguments_are_value_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()


def test_stream_linear_keeps_parameters_and_falls_back_outside_decode():
    lin = nn.Linear(32, 48)
    w = lin.weight
    gemv.stream(lin)
    assert type(lin) is gemv.StreamLinear and lin.weight is w and set(lin.state_dict()) == {"weight", "bias"}
    x = torch.randn(3, 32)
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), F.linear(x, w, lin.bias), rtol=1e-5, atol=1e-5)
        big = torch.randn(20, 32)  # more than MAX_ROWS rows: torch's GEMM, bit for bit
        assert torch.equal(lin(big), F.linear(big, w, lin.bias))
        old, gemv.ONE_THREAD_F32 = gemv.ONE_THREAD_F32, False
        threads = gemv.set_threads(1)  # one thread with ONE_THREAD_F32 off: torch's F.linear, bit for bit
        try:
            assert torch.equal(lin(x), F.linear(x, w, lin.bias))
        finally:
            gemv.set_threads(threads)
            gemv.ONE_THREAD_F32 = old
    y = lin(x)  # with gradients wanted: F.linear, and they flow
    y.sum().backward()
    assert w.grad is not None
    gemv.unstream(lin)
    assert type(lin) is nn.Linear


def test_a_wide_product_of_many_rows_runs_in_slices_equal_to_one_call(monkeypatch):
    """An lm head over a large vocabulary (at least WIDE_OUT outputs) with more than MAX_ROWS
    rows is computed slice by slice; the result equals one F.linear up to float32 rounding, the
    slices' edges included, and a bias is sliced with its rows."""
    monkeypatch.setattr(gemv, "WIDE_OUT", 96)  # small enough for a test, the slices kept uneven
    monkeypatch.setattr(gemv, "WIDE_CHUNK", 40)
    lin = gemv.stream(nn.Linear(24, 100))
    calls = []
    monkeypatch.setattr(gemv, "_wide", lambda *a, _w=gemv._wide: calls.append(1) or _w(*a))
    x = torch.randn(12, 24)
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
        assert calls, "a wide product of more than MAX_ROWS rows went to one F.linear"
        narrow = gemv.stream(nn.Linear(24, 60))
        assert torch.equal(narrow(x), F.linear(x, narrow.weight, narrow.bias)) and len(calls) == 1


@pytest.mark.skipif(not packed.usable(), reason="torch has no oneDNN packed linear here")
def test_a_wide_head_over_a_decode_batch_runs_on_the_packed_weight(monkeypatch):
    """At least MIN_OUT outputs and more than MAX_ROWS rows: oneDNN's packed weight (the first
    call checks it against F.linear), results within rounding of F.linear and the same bits on the
    first call as on later ones (the sampling notebook compares two calls with torch.equal), the
    packed copy remade when the weight changes; narrower products stay on F.linear."""
    monkeypatch.setattr(packed, "MIN_OUT", 96)
    lin = gemv.stream(nn.Linear(256, 100))  # wide enough that oneDNN's sums round unlike MKL's
    x = torch.randn(12, 256)
    with torch.inference_mode():
        first = lin(x)  # the checked first call
        kept = lin.__dict__["_packed_weight"]
        assert torch.equal(lin(x), first)
        assert torch.equal(first, torch.ops.mkldnn._linear_pointwise(x, kept[1], lin.bias, "none", [], ""))
        torch.testing.assert_close(first, F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
        assert lin.__dict__["_packed_weight"] is kept
    with torch.no_grad():
        lin.weight.mul_(-2)  # a changed weight: packed again, not the stale copy
    with torch.inference_mode():
        torch.testing.assert_close(lin(x), F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
        assert lin.__dict__["_packed_weight"] is not kept
        narrow = gemv.stream(nn.Linear(256, 60))
        assert torch.equal(narrow(x), F.linear(x, narrow.weight, narrow.bias))
        assert "_packed_weight" not in narrow.__dict__
    assert packed.error is None


@pytest.mark.skipif(not packed.usable(), reason="torch has no oneDNN packed linear here")
@pytest.mark.parametrize("avx512", [True, False])
def test_decode_batch_projections_take_the_packed_weight_on_avx512_only(monkeypatch, avx512):
    """On a CPU where torch runs AVX-512 kernels a decode batch's projections of MIN_OUT_AVX512
    outputs or more take oneDNN's packed weight (measured faster there, slower on AVX2); elsewhere
    only lm-head-wide ones (MIN_OUT) do. Either way the result is F.linear's within rounding."""
    monkeypatch.setattr(packed, "_avx512", lambda: avx512)
    assert packed.min_out() == (packed.MIN_OUT_AVX512 if avx512 else packed.MIN_OUT)
    proj = gemv.stream(nn.Linear(64, packed.MIN_OUT_AVX512))
    x = torch.randn(16, 64)
    with torch.inference_mode():
        torch.testing.assert_close(proj(x), F.linear(x, proj.weight, proj.bias), rtol=1e-5, atol=1e-5)
    assert ("_packed_weight" in proj.__dict__) is avx512


def test_engine_streams_float32_projections_with_the_reference_tokens(model_factory):
    folder, _ = model_factory("qwen2")  # biases on q/k/v
    llm = LLM(str(folder), device="cpu", dtype="float32", enable_prefix_caching=False, num_threads=2)
    kinds = {type(getattr(o, n)) for o, n in llm.model.projections()}
    assert kinds == {nn.Linear}  # a tiny model's projections are below MIN_STREAM_BYTES
    stream_weights(llm.model, min_bytes=0)
    assert {type(getattr(o, n)) for o, n in llm.model.projections()} == {gemv.StreamLinear}
    prompts = [[5, 17, 42, 99, 7, 3], [5, 17], list(range(20, 50))]
    got = greedy_tokens(llm, prompts, n=16)
    stream_weights(llm.model, False)
    assert {type(getattr(o, n)) for o, n in llm.model.projections()} == {nn.Linear}
    assert greedy_tokens(llm, prompts, n=16) == got
    ids = [5, 17, 42, 99, 7]
    ref = llm.model.full_logits(ids)
    stream_weights(llm.model, True)
    torch.testing.assert_close(llm.model.full_logits(ids), ref)  # prefill rows: torch's GEMM either way


@pytest.mark.skipif(not packed.usable(), reason="torch has no oneDNN packed linear here")
def test_a_decode_batch_through_the_packed_head_keeps_the_tokens(model_factory, monkeypatch):
    """Twelve requests decoding together (more rows than the kernel takes): the lm head on
    oneDNN's packed weight (MIN_OUT lowered to the tiny vocabulary) gives the tokens F.linear does."""
    monkeypatch.setattr(packed, "MIN_OUT", 1)
    folder, _ = model_factory("llama")
    llm = LLM(str(folder), device="cpu", dtype="float32", enable_prefix_caching=False, num_threads=1)
    stream_weights(llm.model, min_bytes=0)
    prompts = [[(7 * i + j) % 50 + 3 for j in range(3 + i)] for i in range(12)]
    got = greedy_tokens(llm, prompts, n=8)
    assert "_packed_weight" in llm.model.lm_head.__dict__ and packed.error is None
    stream_weights(llm.model, False)
    assert greedy_tokens(llm, prompts, n=8) == got


def test_env_switch_keeps_torch_kernels(model_factory, monkeypatch):
    monkeypatch.setenv("MINILLM_GEMV", "0")
    folder, _ = model_factory("llama")
    llm = LLM(str(folder), device="cpu", dtype="float32", num_threads=1)
    assert {type(getattr(o, n)) for o, n in llm.model.projections()} == {nn.Linear}
    int8 = LLM(str(folder), device="cpu", dtype="float32", num_threads=1, weight_dtype="int8")
    assert all(getattr(o, n)._stream is None for o, n in int8.model.projections())


def test_the_reference_path_keeps_torch_kernels(model_factory):
    folder, _ = model_factory("llama")
    llm = LLM(str(folder), device="cpu", dtype="float32", num_threads=1, fast=False)
    assert {type(getattr(o, n)) for o, n in llm.model.projections()} == {nn.Linear}


def test_int8_decode_rows_use_the_kernel_close_to_float():
    torch.manual_seed(0)
    lin = nn.Linear(64, 48, bias=True)
    q = Int8Linear(lin)
    assert q._stream is None  # torch's int8 linear until streamed
    x = torch.randn(2, 64)
    w = q.dequantized_weight()
    q.stream()
    torch.testing.assert_close(q(x), F.linear(x, w, lin.bias.detach()), rtol=1e-4, atol=1e-4)
    big = torch.randn(12, 64)  # prefill rows: torch's int8 GEMM (activations rounded to 8 bits)
    assert torch.equal(q(big), torch.ops.quantized.linear_dynamic(big, q._packed, False))


def test_engine_int8_decode_is_streamed(model_factory):
    folder, _ = model_factory("llama")
    llm = LLM(str(folder), device="cpu", dtype="float32", num_threads=1, weight_dtype="int8")
    assert all(getattr(o, n)._stream is not None for o, n in llm.model.projections())
    assert all(len(t) == 6 for t in greedy_tokens(llm, [[5, 17, 42], [9]], n=6))


def test_traced_decode_rows_call_the_operator():
    """Inside a compiled graph the kernel is ``torch.ops.minillm_gemv.linear`` (a ctypes call
    cannot be traced); prefill-sized inputs stay ``F.linear``."""
    if not gemv.op_available():
        pytest.skip(f"operator unavailable: {gemv.op_unavailable_reason()}")
    lin = gemv.stream(nn.Linear(32, 48))
    seen = []

    def backend(gm, example):
        seen.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm

    with torch.inference_mode():
        for rows in (2, 20):
            torch._dynamo.reset()
            x = torch.randn(rows, 32)
            got = torch.compile(lin, backend=backend, fullgraph=True)(x)
            torch.testing.assert_close(got, F.linear(x, lin.weight, lin.bias), rtol=1e-5, atol=1e-5)
    assert any("minillm_gemv.linear" in t for t in seen[0]), seen[0]
    assert not any("minillm_gemv" in t for t in seen[1]), seen[1]


def test_traced_int8_decode_rows_call_the_int8_operator():
    """A streamed ``Int8Linear`` traces its decode rows as ``torch.ops.minillm_gemv.linear_int8``
    (torch's packed int8 linear cannot be traced), equal to the eager kernel."""
    if not gemv.op_available():
        pytest.skip(f"operator unavailable: {gemv.op_unavailable_reason()}")
    lin = Int8Linear(nn.Linear(32, 48))
    lin.stream()
    seen = []

    def backend(gm, example):
        seen.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm

    with torch.inference_mode():
        torch._dynamo.reset()
        x = torch.randn(3, 32)
        got = torch.compile(lin, backend=backend, fullgraph=True)(x)
        assert torch.equal(got, lin(x))
    assert any("minillm_gemv.linear_int8" in t for t in seen[0]), seen[0]


def test_operator_threads_can_be_set_apart_from_torch():
    """``set_op_threads``: the operators' thread count without torch's (a CPU decode graph runs
    torch's kernels on one thread); results do not depend on it."""
    if not gemv.op_available():
        pytest.skip(f"operator unavailable: {gemv.op_unavailable_reason()}")
    g = torch.Generator().manual_seed(3)
    w, x = torch.randn(4100, 96, generator=g), torch.randn(2, 96, generator=g)
    one = torch.ops.minillm_gemv.linear(x, w, gemv.NO_BIAS)
    assert gemv.set_op_threads(2) is None
    try:
        assert torch.equal(torch.ops.minillm_gemv.linear(x, w, gemv.NO_BIAS), one)
    finally:
        assert gemv.set_op_threads(None) == 2
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="threads"):
            gemv.set_op_threads(bad)


def test_decode_steps_give_the_threads_to_the_kernel(model_factory):
    """With 2 threads a decode step runs torch's ops on one thread and the kernel on two (torch's
    OpenMP team collapses on a shared machine); prefills keep torch's threads; all restored after."""
    folder, _ = model_factory("llama")
    before = torch.get_num_threads()
    try:
        llm = LLM(str(folder), device="cpu", dtype="float32", enable_prefix_caching=False, num_threads=2)
        stream_weights(llm.model, min_bytes=0)
        seen = []
        llm.model.lm_head.register_forward_hook(
            lambda m, a, out: seen.append((a[0].shape[0], torch.get_num_threads(), gemv._threads)))
        greedy_tokens(llm, [list(range(5, 25))], n=3)
        assert seen[0][1:] == (2, None)  # the prefill (20 tokens): torch's two threads
        decode = seen[1:]
        assert decode and all(s[1:] == (1, 2) for s in decode), seen
        assert torch.get_num_threads() == 2 and gemv._threads is None
        stream_weights(llm.model, False)
        assert not llm.model._gemv_hooks
    finally:
        torch.set_num_threads(before)


def test_the_plain_c_copy_computes_the_same(tmp_path):
    """``MINILLM_GEMV_ISA=plain`` runs the portable loop (what a CPU without AVX2 gets); each
    vector copy is checked against it when the library loads (``agrees_with_plain``)."""
    import os
    import subprocess
    import sys

    code = ("import torch, torch.nn.functional as F\nfrom minillm.fast import gemv\nassert gemv.isa() == 'plain'\n"
            "for m in (1, 3, 8):\n    x, w, b = torch.randn(m, 70), torch.randn(13, 70), torch.randn(13)\n"
            "    torch.testing.assert_close(gemv.linear(x, w, b, threads=2), F.linear(x, w, b), rtol=1e-5, atol=1e-5)\n")
    env = dict(os.environ, MINILLM_GEMV_ISA="plain")
    subprocess.run([sys.executable, "-c", code], check=True, env=env, timeout=120)
    assert gemv.isa() in ("avx512", "avx2", "plain")


def test_op_available_carries_the_mark_torchs_decorator_sets():
    """gemv marks ``op_available`` as a tracing-time constant itself (torch's decorator imports
    torch._dynamo in every process); it must still be exactly what the decorator does."""
    def probe():
        return True

    marked = torch.compiler.assume_constant_result(probe)
    assert marked is probe and vars(probe) == {"_dynamo_marked_constant": True}
    assert {k: v for k, v in vars(gemv.op_available).items() if not k.startswith("__")} == vars(probe)
