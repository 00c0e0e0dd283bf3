"""The transposed decode layout (``LlamaForCausalLM.use_decode_layout``) against the readable
row-major reference: the same ``F.linear`` calls, so the same float32 results up to rounding,
and the same greedy tokens; and the linear-paths benchmark's own exactness check."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

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
                    "--batches", "1,4", "--threads", "1", "--rounds", "1", "--sample-mb", "1", "--out", str(out)],
                   check=True, cwd=REPO, capture_output=True, timeout=300)
    rows = json.loads(out.read_text())["rows"]
    assert {r["proj"] for r in rows} == {"qkv", "o", "gate_up", "down", "lm_head"}
    for r in rows:
        for name in ("F.linear", "transposed", "mkldnn"):
            assert r["paths"][name]["rel_error"] < 1e-5, (r["proj"], name)
        assert 0 < r["paths"]["int8"]["rel_error"] < 0.1
        assert r["paths"]["F.linear"]["speedup_vs_F.linear"] == 1.0
