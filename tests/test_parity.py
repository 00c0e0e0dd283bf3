"""minillm's own model code against transformers: logits (fp32, 1e-4) and greedy tokens.

The engine runs on the ``device`` / ``dtype`` fixtures (CPU float32 unless
``MINILLM_TEST_DEVICE=cuda``); transformers stays the float32 CPU reference. In a lower
precision a greedy token only has to be the reference's argmax up to ``logits_atol``.
Every test runs on the reference path (``LLM(fast=False)``) and once per attention backend of the fast
path the device can run (``minillm.fast.attention``): all must match."""

from __future__ import annotations

import functools
import json
import sys

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.fast.attention import BACKENDS
from conftest import backends_on_test_device, make_model, run_to_end


@pytest.fixture(autouse=True, params=["reference", *backends_on_test_device()])
def attention_backend(request, monkeypatch):
    """Every ``LLM(...)`` built by a test here uses this backend of the fast path, or the
    reference path (``LLM(fast=False)``: the plain runner and sampler, the model's own attention)."""
    kw = {"fast": False} if request.param == "reference" else {"attention_backend": request.param}
    monkeypatch.setattr(sys.modules[__name__], "LLM", functools.partial(LLM, **kw))
    return request.param

FAMILIES = ["llama", "llama3rope", "qwen2", "qwen3"]


@pytest.fixture(scope="module")
def model_factory(tmp_path_factory):
    """Like conftest's, but the Qwen models get an embedding table larger than the tokenizer,
    as real Qwen checkpoints have: transformers' Qwen2Tokenizer adds ``<|endoftext|>`` after
    the 320 trained ids, and the loader refuses a tokenizer that can emit an id >= vocab_size."""
    cache: dict = {}

    def get(family: str):
        if family not in cache:
            folder = tmp_path_factory.mktemp(family)
            extra = {"vocab_size": 336} if family.startswith("qwen") else {}
            cache[family] = (folder, make_model(folder, family, **extra))
        return cache[family]

    return get


def assert_greedy(model, ids: list[int], got: list[int], atol: float) -> None:
    """``got`` is transformers' greedy continuation of ``ids``: exactly in float32; in a lower
    precision each token is, given the tokens before it, within ``atol`` of the best logit."""
    if atol <= 1e-4:
        assert got == hf_greedy(model, ids, len(got))
        return
    ref = model(torch.tensor([ids + got])).logits[0, len(ids) - 1:-1]
    for k, t in enumerate(got):
        assert ref[k].max() - ref[k, t] <= 2 * atol, (k, t, int(ref[k].argmax()))


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    model.generation_config.eos_token_id = None
    out = model.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0,
                         attention_mask=torch.ones(1, len(ids), dtype=torch.long))
    return out[0, len(ids):].tolist()


def prompts(n: int, seed: int = 0, lengths=(1, 5, 17, 40)) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 320, (lengths[i % len(lengths)],), generator=g).tolist() for i in range(n)]


class CapturingSampler:
    """Wraps the engine's sampler to keep the logits of every step."""

    def __init__(self, inner):
        self.inner, self.seen = inner, []

    def __call__(self, logits, requests):
        self.seen.append((logits.detach().clone(), [r.request_id for r in requests]))
        return self.inner(logits, requests)


@pytest.mark.parametrize("family", FAMILIES)
def test_dense_logits_match_transformers(model_factory, family, device, dtype, logits_atol):
    folder, hf = model_factory(family)
    llm = LLM(str(folder), device, dtype, block_size=4, num_kv_blocks=64)
    for ids in prompts(4, seed=1):
        ref = hf(torch.tensor([ids])).logits[0]
        got = llm.model.full_logits(ids).cpu()
        assert (ref - got).abs().max().item() < logits_atol


@pytest.mark.parametrize("family", FAMILIES)
def test_paged_engine_logits_match_transformers(model_factory, family, device, dtype, logits_atol):
    """Every step's logits (prefill and each decode) equal transformers' at that position."""
    folder, hf = model_factory(family)
    llm = LLM(str(folder), device, dtype, block_size=4, num_kv_blocks=128)
    llm.sampler = CapturingSampler(llm.sampler)
    reqs = [llm.add_request(prompt_token_ids=ids, params=SamplingParams(max_tokens=6, temperature=0, ignore_eos=True))
            for ids in prompts(4, seed=2)]
    run_to_end(llm)
    for req in reqs:
        full = req.prompt_token_ids + req.output_token_ids
        ref = hf(torch.tensor([full])).logits[0]
        rows = [logits[ids.index(req.request_id)] for logits, ids in llm.sampler.seen if req.request_id in ids]
        assert len(rows) == len(req.output_token_ids)
        for k, row in enumerate(rows):
            pos = len(req.prompt_token_ids) - 1 + k
            assert (ref[pos] - row.float().cpu()).abs().max().item() < logits_atol, (family, req.request_id, k)


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_tokens_single_request(model_factory, family, device, dtype, logits_atol):
    folder, hf = model_factory(family)
    llm = LLM(str(folder), device, dtype, block_size=4, num_kv_blocks=64)
    ids = prompts(1, seed=3, lengths=(9,))[0]
    out = llm.add_request(prompt_token_ids=ids, params=SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
    run_to_end(llm)
    assert_greedy(hf, ids, out.output_token_ids, logits_atol)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_greedy_tokens_batch_of_mixed_lengths(model_factory, family, device, dtype, logits_atol):
    folder, hf = model_factory(family)
    llm = LLM(str(folder), device, dtype, block_size=4, num_kv_blocks=256)
    batch = prompts(5, seed=4, lengths=(3, 11, 26, 7, 1))
    reqs = [llm.add_request(prompt_token_ids=ids, params=SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
            for ids in batch]
    run_to_end(llm)
    for ids, req in zip(batch, reqs):
        assert_greedy(hf, ids, req.output_token_ids, logits_atol)
    # they really were decoded together: some step ran all five in one forward pass
    assert max(e.data["num_decode"] for e in llm.trace if e.kind == "step") == 5


def test_requests_joining_mid_decode_match(model_factory, device, dtype, logits_atol):
    """Continuous batching: a request added while others decode gets the same tokens."""
    folder, hf = model_factory("llama")
    llm = LLM(str(folder), device, dtype, block_size=4, num_kv_blocks=256)
    a, b = prompts(2, seed=5, lengths=(12, 4))
    ra = llm.add_request(prompt_token_ids=a, params=SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
    for _ in range(7):
        llm.step()
    rb = llm.add_request(prompt_token_ids=b, params=SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
    run_to_end(llm)
    assert_greedy(hf, a, ra.output_token_ids, logits_atol)
    assert_greedy(hf, b, rb.output_token_ids, logits_atol)
    mixed = [e for e in llm.trace if e.kind == "step" and e.data["num_prefill"] and e.data["num_decode"]]
    assert mixed, "the late request should have been prefilled in a step where the other decoded"


def test_preempted_and_recomputed_request_matches(model_factory, device, dtype, logits_atol):
    folder, hf = model_factory("qwen2")
    # 3 requests x (10 prompt + 32 output) tokens need ~33 blocks of 4; give 16
    llm = LLM(str(folder), device, dtype, block_size=4, num_kv_blocks=16)
    batch = prompts(3, seed=6, lengths=(10,))
    reqs = [llm.add_request(prompt_token_ids=ids, params=SamplingParams(max_tokens=32, temperature=0, ignore_eos=True))
            for ids in batch]
    run_to_end(llm)
    assert sum(r.num_preemptions for r in reqs) > 0
    assert any(e.kind == "transition" and e.data["to"] == "PREEMPTED" for e in llm.trace)
    for ids, req in zip(batch, reqs):
        assert_greedy(hf, ids, req.output_token_ids, logits_atol)
    assert llm.cache_stats().used_blocks == 0


def test_prefix_cache_hit_gives_same_tokens(model_factory, device, dtype, logits_atol):
    folder, hf = model_factory("llama")
    llm = LLM(str(folder), device, dtype, block_size=4, num_kv_blocks=64)
    ids = prompts(1, seed=7, lengths=(18,))[0]
    params = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    first = llm.add_request(prompt_token_ids=ids, params=params)
    run_to_end(llm)
    second = llm.add_request(prompt_token_ids=ids, params=params)
    run_to_end(llm)
    assert second.num_cached_prompt_tokens == 16  # four full blocks of the 18-token prompt
    assert len(first.output_token_ids) == len(second.output_token_ids) == 12
    for out in (first, second):
        assert_greedy(hf, ids, out.output_token_ids, logits_atol)


def test_legacy_config_style_is_read(tmp_path, model_factory, device, dtype, logits_atol):
    """Published checkpoints write rope_theta + rope_scaling instead of rope_parameters."""
    folder, hf = model_factory("llama3rope")
    cfg = json.loads((folder / "config.json").read_text())
    rope = cfg.pop("rope_parameters")
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    for f in folder.iterdir():
        (legacy / f.name).write_bytes(f.read_bytes())
    cfg["rope_theta"] = rope.pop("rope_theta")
    cfg["rope_scaling"] = rope
    (legacy / "config.json").write_text(json.dumps(cfg))
    llm = LLM(str(legacy), device, dtype, block_size=4, num_kv_blocks=32)
    assert llm.model_config.rope_scaling["rope_type"] == "llama3"
    ids = prompts(1, seed=8, lengths=(100,))[0]  # past original_max_position_embeddings=64
    ref = hf(torch.tensor([ids])).logits[0]
    assert (ref - llm.model.full_logits(ids).cpu()).abs().max().item() < logits_atol


def test_untied_and_tied_embeddings(tmp_path, device, dtype, logits_atol):
    tied = make_model(tmp_path / "tied", "llama", tie_word_embeddings=True)
    llm = LLM(str(tmp_path / "tied"), device, dtype, block_size=4, num_kv_blocks=16)
    assert llm.model.lm_head.weight.data_ptr() == llm.model.model.embed_tokens.weight.data_ptr()
    ids = prompts(1, seed=9)[0]
    assert (tied(torch.tensor([ids])).logits[0] - llm.model.full_logits(ids).cpu()).abs().max().item() < logits_atol


@pytest.mark.parametrize("forced", [False, True], ids=["natural-split", "forced-4-groups"])
def test_multi_group_decode_matches_transformers(tmp_path, monkeypatch, forced, device, dtype, logits_atol,
                                                 attention_backend):
    """Decode rows of very different context lengths are attended in several groups (one
    gather + one attention call each, see ``runner.split_by_length``): every step's logits
    still equal transformers'. ``natural-split``: contexts of ~1500 and of a few tokens, which
    the default cost model splits; ``forced-4-groups``: a zero group cost, so short contexts
    are split into the most groups too. The paged backend makes no groups (one fixed-shape
    block table for all rows): the same contexts check it over very different lengths."""
    import minillm.fast.runner as runner

    hf = make_model(tmp_path / "long", "llama", max_position_embeddings=2048)
    lengths = (1500, 1390, 37, 30, 9, 2) if not forced else (40, 33, 21, 12, 6, 2)
    if forced:
        monkeypatch.setattr(runner, "GROUP_COST_SLOTS", 0)
    splits = []
    real_split = runner.split_by_length

    def recording_split(ctx, *args, **kwargs):
        splits.append(real_split(ctx, *args, **kwargs))
        return splits[-1]

    monkeypatch.setattr(runner, "split_by_length", recording_split)
    llm = LLM(str(tmp_path / "long"), device, dtype, block_size=4, num_kv_blocks=1024, max_model_len=2048)
    llm.sampler = CapturingSampler(llm.sampler)
    batch = prompts(len(lengths), seed=11, lengths=lengths)
    reqs = [llm.add_request(prompt_token_ids=ids, params=SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
            for ids in batch]
    run_to_end(llm)
    if attention_backend == "reference" or BACKENDS[attention_backend].uses_block_tables:
        # the reference attends each request alone; a block-table backend makes one fixed-shape call
        assert not splits
    else:
        groups = max(len(s) for s in splits)
        assert groups >= (4 if forced else 2), splits
    for req in reqs:
        full = req.prompt_token_ids + req.output_token_ids
        with torch.no_grad():
            ref = hf(torch.tensor([full])).logits[0]
        rows = [logits[ids.index(req.request_id)] for logits, ids in llm.sampler.seen if req.request_id in ids]
        assert len(rows) == 5
        for k, row in enumerate(rows):
            pos = len(req.prompt_token_ids) - 1 + k
            assert (ref[pos] - row.float().cpu()).abs().max().item() < logits_atol, (req.request_id, k)


@pytest.mark.parametrize("family", FAMILIES)
def test_flex_gives_gathers_tokens_in_bfloat16(model_factory, family, attention_backend):
    """The GPU paged backend ("flex", run eagerly here) against the gather reference in bfloat16 on
    the CPU, batched over mixed lengths with requests joining mid-decode. The two sum in different
    orders, so in bfloat16 a greedy token may differ only where float32 transformers sees a tie
    within bfloat16's rounding (two units in the last place at that logit); anywhere else the
    tokens must be the same. (Float32 is exact: every test above runs once per backend.)"""
    if attention_backend != "flex":
        pytest.skip("one run per family: the comparison is flex against gather")
    folder, hf = model_factory(family)
    batch = prompts(6, seed=7, lengths=(3, 11, 26, 7, 1, 40))
    outs = {}
    for backend in ("gather", "flex"):
        llm = LLM(str(folder), "cpu", "bfloat16", block_size=4, num_kv_blocks=256, attention_backend=backend)
        params = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
        reqs = [llm.add_request(prompt_token_ids=ids, params=params) for ids in batch[:3]]
        for _ in range(3):
            llm.step()
        reqs += [llm.add_request(prompt_token_ids=ids, params=params) for ids in batch[3:]]
        run_to_end(llm)
        outs[backend] = [r.output_token_ids for r in reqs]
    same = 0
    for ids, g, f in zip(batch, outs["gather"], outs["flex"]):
        k = next((i for i, (a, b) in enumerate(zip(g, f)) if a != b), None)
        if k is None:
            same += 1
            continue
        ref = hf(torch.tensor([ids + g[:k]])).logits[0, -1]
        ulp = 2.0 ** -7 * max(1.0, ref.abs().max().item())  # bfloat16's spacing at these logits
        assert (ref[g[k]] - ref[f[k]]).abs().item() <= 2 * ulp, (family, k, g[k], f[k])
    assert same >= 1, outs  # (tiny random models have flat logits: ties are common here)
