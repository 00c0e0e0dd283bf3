"""The transposed decode layout (``LlamaForCausalLM.use_decode_layout``) against the readable
row-major reference: the same ``F.linear`` calls, so the same float32 results up to rounding,
and the same greedy tokens; and the linear-paths benchmark's own exactness check."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
import torch
import torch.nn.functional as F

from minillm import LLM, SamplingParams
from conftest import REPO, run_to_end

FAMILIES = ["llama", "llama3rope", "qwen2", "qwen3"]  # untied / tied head, biases, q/k norms


def projection_weights(model):
    for layer in model.model.layers:
        yield from (layer.self_attn.qkv_proj.weight, layer.self_attn.o_proj.weight,
                    layer.mlp.gate_up_proj.weight, layer.mlp.down_proj.weight)
    yield model.lm_head.weight


@pytest.mark.parametrize("family", FAMILIES)
def test_transposed_layout_matches_the_reference(model_factory, family):
    folder, _ = model_factory(family)
    ref = LLM(str(folder), device="cpu", dtype="float32", enable_prefix_caching=False)
    llm = LLM(str(folder), device="cpu", dtype="float32", enable_prefix_caching=False)
    tied = llm.model.lm_head.weight is llm.model.model.embed_tokens.weight
    llm.model.use_decode_layout(True)
    for w in projection_weights(llm.model):
        assert w.stride() == (1, w.shape[0]), "each weight [out, in] is a view of [in, out] memory"
    assert (llm.model.lm_head.weight is llm.model.model.embed_tokens.weight) == tied
    ids = [5, 17, 42, 99, 7, 3, 250, 11, 64]
    torch.testing.assert_close(llm.model.full_logits(ids), ref.model.full_logits(ids), atol=1e-5, rtol=1e-5)
    prompts = [ids, ids[:4], list(range(20, 60))]
    outs = []
    for engine in (ref, llm):
        reqs = [engine.add_request(prompt_token_ids=p, params=SamplingParams(max_tokens=12, temperature=0,
                                                                             ignore_eos=True)) for p in prompts]
        run_to_end(engine)
        outs.append([r.output_token_ids for r in reqs])
    assert outs[0] == outs[1]
    llm.model.use_decode_layout(False)  # and back: row-major again, same values
    for w in projection_weights(llm.model):
        assert w.is_contiguous()
    torch.testing.assert_close(llm.model.full_logits(ids), ref.model.full_logits(ids), atol=1e-5, rtol=1e-5)


def test_linear_paths_benchmark_checks_its_exact_paths(tmp_path):
    out = tmp_path / "lp.json"
    subprocess.run([sys.executable, str(REPO / "benchmarks" / "linear_paths.py"), "--models", "shipped",
                    "--batches", "1,4", "--threads", "1,2", "--rounds", "1", "--sample-mb", "1", "--out", str(out)],
                   check=True, cwd=REPO, capture_output=True, timeout=300)
    rows = json.loads(out.read_text())["rows"]
    assert {r["proj"] for r in rows} == {"qkv", "o", "gate_up", "down", "lm_head"}
    for r in rows:
        exact = ["F.linear", "transposed", "mkldnn", "mkldnn_linear"] + ["mv"] * (r["batch"] == 1) + \
            ["rowsplit"] * (r["threads"] == 2)
        assert set(exact) <= set(r["paths"]) and ("mv" in r["paths"]) == (r["batch"] == 1)
        for name in exact:
            assert r["paths"][name]["rel_error"] < 1e-5, (r["proj"], name)
        assert 0 < r["paths"]["int8"]["rel_error"] < 0.1
        assert r["paths"]["F.linear"]["speedup_vs_F.linear"] == 1.0


# --- the row split across threads (minillm.fast.threaded) ---------------------------------

from minillm.fast.threaded import RowSplitLinear, ShardPool, shard_bounds, use_row_split  # noqa: E402


def shard_threads():
    return [t for t in threading.enumerate() if t.name.startswith("minillm-shard")]


@pytest.fixture
def keep_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_shard_bounds_cover_the_rows_on_aligned_cuts():
    assert shard_bounds(960, 2) == [(0, 512), (512, 960)]
    assert shard_bounds(49152, 3) == [(0, 16384), (16384, 32768), (32768, 49152)]
    assert shard_bounds(100, 2) == [(0, 100)]  # too few rows for two aligned shards: whole
    for rows, parts in [(576, 2), (3072, 4), (1728, 3), (65, 2), (1, 2)]:
        b = shard_bounds(rows, parts)
        assert b[0][0] == 0 and b[-1][1] == rows and all(x[1] == y[0] for x, y in zip(b, b[1:]))
        assert all(a % 64 == 0 for a, _ in b)


@pytest.mark.parametrize("in_out", [(576, 960), (576, 576), (576, 3072), (1536, 576), (576, 49152)])
def test_row_split_is_bit_identical_to_f_linear(in_out, keep_threads):
    k, n = in_out  # SmolLM2-135M's projections
    g = torch.Generator().manual_seed(n)
    lin = torch.nn.Linear(k, n, bias=True)
    with torch.no_grad():
        lin.weight.copy_(torch.randn(n, k, generator=g) / k ** 0.5)
        lin.bias.copy_(torch.randn(n, generator=g))
    pool = ShardPool(2)
    try:
        split = RowSplitLinear(lin, pool, max_rows=4)
        with torch.inference_mode():
            for rows in (1, 2, 4, 9):  # 9 > max_rows: one unsplit call
                x = torch.randn(rows, k, generator=g)
                assert torch.equal(split(x), F.linear(x, lin.weight, lin.bias)), rows
            x3 = torch.randn(2, 1, k, generator=g)  # [batch, seq, in] inputs too
            assert torch.equal(split(x3), F.linear(x3, lin.weight, lin.bias))
    finally:
        pool.close()
    assert not shard_threads()


def test_shard_pool_keeps_order_and_hands_errors_back(keep_threads):
    pool = ShardPool(3)
    try:
        for i in range(300):  # whichever thread computes a job, results come back in job order
            assert pool.run(lambda a, b: a * b, [(i, 1), (i, 2), (i, 3)]) == [i, 2 * i, 3 * i]

        def boom(which):
            if which == threading.current_thread().name or which == "any":
                raise KeyError(which)
            return which
        with pytest.raises(KeyError):
            pool.run(boom, [("x",), ("any",), ("y",)])
        assert pool.run(lambda v: v + 1, [(1,), (2,), (3,)]) == [2, 3, 4]  # still usable
    finally:
        pool.close()
    pool.close()  # idempotent
    assert not shard_threads()
    with pytest.raises(RuntimeError, match="closed"):
        pool.run(lambda v: v, [(1,), (2,), (3,)])


def test_pool_start_leaves_the_callers_thread_count(keep_threads):
    torch.set_num_threads(2)
    pool = ShardPool(2)
    assert torch.get_num_threads() == 2
    pool.close()


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_bad_pool_sizes_raise(bad):
    with pytest.raises(ValueError, match="num_threads"):
        ShardPool(bad)


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # biases in qwen2's q/k/v
def test_engine_row_split_gives_the_unsplit_tokens_and_leaves_no_thread(model_factory, family, keep_threads):
    folder, _ = model_factory(family)
    ref = LLM(str(folder), device="cpu", dtype="float32", num_threads=2, row_split=False)
    assert ref.shard_pool is None
    assert LLM(str(folder), device="cpu", dtype="float32", num_threads=2).shard_pool is None  # off by default
    llm = LLM(str(folder), device="cpu", dtype="float32", num_threads=2, row_split=True)
    assert llm.shard_pool is None  # a tiny model's projections are below MIN_SPLIT_BYTES: nothing split
    pool = use_row_split(llm.model, 2, min_bytes=0)
    split = [m for m in llm.model.modules() if isinstance(m, RowSplitLinear)]
    assert split and any(m._split for m in split)
    assert (llm.model.lm_head.weight is llm.model.model.embed_tokens.weight) == \
        (ref.model.lm_head.weight is ref.model.model.embed_tokens.weight)
    prompts = [[5, 17, 42, 99, 7, 3, 250, 11, 64], [5, 17], list(range(20, 60))]
    outs = []
    for engine in (ref, llm):
        reqs = [engine.add_request(prompt_token_ids=p, params=SamplingParams(max_tokens=12, temperature=0,
                                                                             ignore_eos=True)) for p in prompts]
        run_to_end(engine)  # prefill of 3 (many rows: unsplit) then decodes of <= 3 rows (split)
        outs.append([r.output_token_ids for r in reqs])
        one = engine.add_request(prompt_token_ids=prompts[0], params=SamplingParams(max_tokens=8, temperature=0,
                                                                                   ignore_eos=True))
        run_to_end(engine)  # batch 1 throughout
        outs[-1].append(one.output_token_ids)
    assert outs[0] == outs[1]
    assert use_row_split(llm.model, None) is None and pool.closed
    assert not any(isinstance(m, RowSplitLinear) for m in llm.model.modules())
    assert not shard_threads()


def test_engine_row_split_threads_end_with_the_engine(model_factory, keep_threads):
    import gc

    folder, _ = model_factory("llama")
    llm = LLM(str(folder), device="cpu", dtype="float32", num_threads=2)
    use_row_split(llm.model, 2, min_bytes=0)
    assert shard_threads()
    del llm
    gc.collect()
    assert not shard_threads()


@pytest.mark.parametrize("kw", [dict(row_split="yes"), dict(row_split=1)])
def test_bad_row_split_option_names_it(tiny_llama, kw):
    with pytest.raises(ValueError, match="row_split"):
        LLM(str(tiny_llama[0]), block_size=4, num_kv_blocks=16, **kw)


@pytest.mark.parametrize("kw,name", [(dict(num_threads=0), "num_threads"), (dict(num_threads=2, max_rows=0), "max_rows"),
                                     (dict(num_threads=2, min_bytes=-1), "min_bytes")])
def test_bad_use_row_split_values_raise(tiny_llama, kw, name):
    llm = LLM(str(tiny_llama[0]), block_size=4, num_kv_blocks=16, num_threads=1)
    with pytest.raises(ValueError, match=name):
        use_row_split(llm.model, **kw)
