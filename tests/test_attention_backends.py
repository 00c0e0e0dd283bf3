"""The attention-backend seam (``minillm.fast.attention``): both backends compute the same attention,
the fixed-shape decode metadata says what it should, the choice is an ``LLM`` option checked
like the others, and the paged backend keeps a step's transfers to one upload.

Parity with transformers over both backends is ``tests/test_parity.py`` (parametrised)."""

from __future__ import annotations

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.fast.attention import (BACKENDS, NULL_BLOCK, DecodeMeta, FlexPaged, GatherSDPA, PagedInPlace,
                               PagedKernel, PagedReductions, make_backend)
from minillm.engine_args import ATTENTION_BACKENDS, check_engine_options
from minillm.models.llama import AttentionBatch, DecodeGroup
from conftest import run_to_end
from test_host_sync import _count_steps


def _naive(q, k_pool, v_pool, table, length, scale):
    """One request's decode attention the slow obvious way: its context token by token."""
    bs, kv_heads = k_pool.shape[1], k_pool.shape[2]
    keys = torch.stack([k_pool[table[j // bs], j % bs] for j in range(length)])    # [L, KVH, D]
    values = torch.stack([v_pool[table[j // bs], j % bs] for j in range(length)])
    per = q.shape[0] // kv_heads
    keys, values = keys.repeat_interleave(per, 1), values.repeat_interleave(per, 1)  # [L, H, D]
    weights = torch.softmax(torch.einsum("hd,lhd->hl", q, keys) * scale, -1)
    return torch.einsum("hl,lhd->hd", weights, values).reshape(-1)


@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_both_backends_equal_naive_attention_over_scattered_blocks(block_size):
    g = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, scale = 6, 2, 8, 8 ** -0.5
    lengths = [37, 37, 20, 9, 1]  # sorted longest first, as the runner sends them
    width = -(-max(lengths) // block_size)
    num_blocks = sum(-(-n // block_size) for n in lengths) + 3
    k_pool = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g)
    v_pool = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g)
    free = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()  # block 0 is the null block
    tables = [[free.pop() for _ in range(-(-n // block_size))] for n in lengths]
    q = torch.randn(len(lengths), heads, dim, generator=g)
    want = torch.stack([_naive(q[i], k_pool, v_pool, t, n, scale) for i, (t, n) in enumerate(zip(tables, lengths))])

    # the reference: one group per distinct length, slots expanded from the tables
    offsets = torch.arange(block_size)
    groups = []
    for start, end in [(0, 2), (2, 3), (3, 5)]:
        L = lengths[start]
        w = -(-L // block_size)
        rows = [t[:w] + [NULL_BLOCK] * (w - len(t[:w])) for t in tables[start:end]]
        slots = (torch.tensor(rows).view(end - start, w, 1) * block_size + offsets).view(end - start, -1)[:, :L]
        pad = torch.arange(L) >= torch.tensor(lengths[start:end])[:, None]
        mask = torch.zeros(end - start, 1, 1, L).masked_fill_(pad.view(end - start, 1, 1, L), float("-inf"))
        groups.append(DecodeGroup(start, end, slots.contiguous(), mask=mask if pad.any() else None, length=L))
    ref_batch = AttentionBatch(positions=None, slot_mapping=None, num_decode=5, decode_groups=groups)

    padded = torch.tensor([t + [NULL_BLOCK] * (width - len(t)) for t in tables])
    lens = torch.tensor(lengths)
    pad = torch.arange(width * block_size) >= lens[:, None]
    meta = DecodeMeta(padded, lens, None, width,
                      torch.zeros(5, 1, 1, width * block_size).masked_fill_(pad.view(5, 1, 1, -1), float("-inf")))
    paged_batch = AttentionBatch(positions=None, slot_mapping=None, num_decode=5, decode_meta=meta)

    got_ref = GatherSDPA().decode(q, k_pool, v_pool, ref_batch, scale)
    got_paged = PagedInPlace().decode(q, k_pool, v_pool, paged_batch, scale)
    got_kernel = PagedKernel().decode(q, k_pool, v_pool, paged_batch, scale)
    assert (got_ref - want).abs().max().item() < 1e-5
    assert (got_paged - want).abs().max().item() < 1e-5
    assert (got_kernel - want).abs().max().item() < 1e-5
    assert (FlexPaged(compiled=False).decode(q, k_pool, v_pool, paged_batch, scale) - want).abs().max().item() < 1e-5
    # the compiled decode graphs' reads (products and sums over the block table), here eagerly
    assert (PagedReductions().decode(q, k_pool, v_pool, paged_batch, scale) - want).abs().max().item() < 1e-5
    # what the null block holds does not leak into any row
    k_pool[NULL_BLOCK] = 1e4
    v_pool[NULL_BLOCK] = 1e4
    assert (PagedInPlace().decode(q, k_pool, v_pool, paged_batch, scale) - want).abs().max().item() < 1e-5
    assert (PagedKernel().decode(q, k_pool, v_pool, paged_batch, scale) - want).abs().max().item() < 1e-5
    assert (PagedReductions().decode(q, k_pool, v_pool, paged_batch, scale) - want).abs().max().item() < 1e-5
    paged_batch.decode_meta.flex_mask = None  # (made once per step: this is a new pool's step)
    assert (FlexPaged(compiled=False).decode(q, k_pool, v_pool, paged_batch, scale) - want).abs().max().item() < 1e-5


def _engine(tiny_llama, backend, **kw):
    return LLM(str(tiny_llama[0]), "cpu", "float32", block_size=4, num_kv_blocks=256, max_num_seqs=16,
               attention_backend=backend, **kw)


def test_decode_metadata_has_fixed_shapes_padded_with_the_null_block(tiny_llama):
    llm = _engine(tiny_llama, "paged")
    seen = []
    backend = llm.runner.attention
    real = backend.decode

    def recording(q, k_pool, v_pool, batch, scale):
        m = batch.decode_meta
        seen.append((m.block_tables.clone(), m.context_lens.clone(), m.slot_mapping.clone(), m.width,
                     None if m.mask is None else m.mask.clone(), list(batch.decode_groups)))
        return real(q, k_pool, v_pool, batch, scale)

    backend.decode = recording
    reqs = [llm.add_request(prompt_token_ids=list(range(2, 2 + n)),
                            params=SamplingParams(max_tokens=3, temperature=0, ignore_eos=True))
            for n in (2, 9, 14)]
    llm.step()  # the three prefills
    states = {r.request_id: (list(r.block_table), r.num_tokens) for r in reqs}
    llm.step()  # one decode step: every layer sees the same metadata
    assert len(seen) == llm.model_config.num_hidden_layers
    tables, lens, slots, width, mask, groups = seen[0]
    assert groups == []  # no decode groups: one fixed-shape call
    ordered = sorted(states.values(), key=lambda s: -s[1])  # longest context first
    assert width == -(-ordered[0][1] // 4) and tables.shape == (3, width) and lens.shape == slots.shape == (3,)
    for row, (table, n) in enumerate(ordered):
        w = -(-n // 4)
        assert tables[row, :w].tolist() == table[:w]
        assert (tables[row, w:] == NULL_BLOCK).all()
        assert lens[row] == n
        assert slots[row] == table[(n - 1) // 4] * 4 + (n - 1) % 4
        assert torch.isinf(mask[row, 0, 0, n:]).all() and (mask[row, 0, 0, :n] == 0).all()
    run_to_end(llm)
    assert llm.cache_stats().used_blocks == 0


def test_every_backend_gives_the_same_tokens_and_logits_on_a_mixed_workload(tiny_llama):
    """Chunked prefill, a shared prefix, requests joining mid-decode: same greedy tokens, and
    the same logits to float32 rounding."""
    outs = {}
    for backend in sorted(BACKENDS):
        llm = _engine(tiny_llama, backend, max_num_batched_tokens=24)
        seen = []
        inner = llm.sampler

        def capture(logits, requests, inner=inner, seen=seen):
            seen.append(logits.detach().clone())
            return inner(logits, requests)

        llm.sampler = capture
        g = torch.Generator().manual_seed(5)
        prefix = torch.randint(2, 320, (12,), generator=g).tolist()
        params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
        reqs = [llm.add_request(prompt_token_ids=prefix + torch.randint(2, 320, (n,), generator=g).tolist(),
                                params=params) for n in (1, 30, 5)]
        for _ in range(4):
            llm.step()
        reqs.append(llm.add_request(prompt_token_ids=prefix + [7, 8], params=params))
        run_to_end(llm)
        outs[backend] = ([r.output_token_ids for r in reqs], seen)
        assert llm.cache_stats().used_blocks == 0
    tok_a, logits_a = outs["gather"]
    for backend, (tok_b, logits_b) in outs.items():
        assert tok_a == tok_b, backend
        assert len(logits_a) == len(logits_b), backend
        for a, b in zip(logits_a, logits_b):
            assert (a - b).abs().max().item() < 1e-4, backend


def test_paged_backend_keeps_one_upload_per_greedy_decode_step(tiny_llama):
    llm = _engine(tiny_llama, "paged")
    for i in range(16):
        llm.add_request(prompt_token_ids=list(range(2, 5 + 3 * i)),
                        params=SamplingParams(max_tokens=8, temperature=0, ignore_eos=True))
    steps = _count_steps(llm, 30)
    decode_only = [s for s in steps if s[2]["num_prefill"] == 0 and s[2]["num_decode"] == 16]
    assert len(decode_only) >= 5
    for d2h, h2d, step in steps:
        assert len(d2h) <= 1 and len(h2d) <= 2, (step, d2h, h2d)
    assert all(len(d2h) == 1 and len(h2d) == 1 for d2h, h2d, _ in decode_only)


def test_flex_backend_keeps_one_transfer_each_way(tiny_llama):
    """The block mask is made on the device from the step's one upload: sampled steps with
    logprobs still send one packet down and at most two up (the step's indices, the sampler's)."""
    llm = _engine(tiny_llama, "flex")
    for i in range(16):
        llm.add_request(prompt_token_ids=list(range(2, 5 + 3 * i)),
                        params=SamplingParams(max_tokens=8, temperature=0.8, seed=i, logprobs=2, ignore_eos=True))
    steps = _count_steps(llm, 30)
    decode_only = [s for s in steps if s[2]["num_prefill"] == 0 and s[2]["num_decode"] == 16]
    assert len(decode_only) >= 5
    assert all(len(d2h) <= 1 and len(h2d) <= 2 for d2h, h2d, _ in steps), [(d, h, s) for d, h, s in steps]
    assert all(len(d2h) == 1 for d2h, _, _ in decode_only)


def test_attention_backend_option_is_checked():
    assert ATTENTION_BACKENDS == (*BACKENDS, "auto")  # the option's names are the backends' and "auto"
    assert check_engine_options(attention_backend="paged").attention_backend == "paged"
    assert check_engine_options().attention_backend == "auto"
    for bad in ("flash", "", None, 3):
        with pytest.raises(ValueError, match=r"attention_backend must be one of \('gather', 'paged', 'kernel', 'flex', 'auto'\)"):
            check_engine_options(attention_backend=bad)
        with pytest.raises(ValueError, match="attention_backend"):
            make_backend(bad if bad is not None else 3)
    assert isinstance(make_backend(), GatherSDPA) and isinstance(make_backend("paged"), PagedInPlace)


def test_llm_rejects_an_unknown_backend_before_loading(tiny_llama):
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        LLM(str(tiny_llama[0]), "cpu", "float32", attention_backend="flash_attn")


def test_the_benchmark_runs_and_checks_its_contenders(capsys):
    """``benchmarks/attention_backends.py`` on a tiny case: each contender's output is checked
    against the reference before it is timed, and the summary names every backend."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "attention_backends.py"
    spec = importlib.util.spec_from_file_location("attention_backends_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    threads = torch.get_num_threads()
    try:  # the benchmark sets one thread for its process
        assert bench.main(["--model", "default", "--batch", "4", "--context", "9,20", "--rounds", "1",
                           "--skip-steps"]) == 0
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "kernel B=4 ctx=20" in out and "paged/gather speed" in out and "online/gather speed" in out


# --- prefill after a cached prefix ---------------------------------------------------------------
def _naive_prefill(q, keys, values, past, scale):
    """Queries of a chunk after ``past`` cached tokens, the obvious way: scores over the whole
    context, -inf where a key is later than the query, softmax. [q_len, H, D] in, out."""
    per = q.shape[1] // keys.shape[1]
    keys, values = keys.repeat_interleave(per, 1), values.repeat_interleave(per, 1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), keys.double()) * scale
    later = torch.arange(keys.shape[0])[None, :] > past + torch.arange(q.shape[0])[:, None]
    weights = scores.masked_fill(later, float("-inf")).softmax(-1)
    return torch.einsum("hqk,khd->qhd", weights, values.double()).float()


@pytest.mark.parametrize("past,q_len", [(12, 5), (3, 1), (40, 40), (1, 17), (64, 3)])
def test_prefill_after_a_cached_prefix_equals_the_masked_definition(past, q_len):
    """``AttentionBackend.prefill`` with a cached prefix (read from scattered pool slots, the
    chunk's own keys as computed) against attention over the whole context with a causal
    mask; GQA (6 query heads, 2 KV heads)."""
    from minillm.models.llama import PrefillSeq

    g = torch.Generator().manual_seed(past * 100 + q_len)
    heads, kv_heads, dim, bs, scale = 6, 2, 8, 4, 8 ** -0.5
    ctx = past + q_len
    width = -(-ctx // bs)
    k_pool = torch.randn(width + 2, bs, kv_heads, dim, generator=g)
    v_pool = torch.randn(width + 2, bs, kv_heads, dim, generator=g)
    table = torch.randperm(width + 1, generator=g)[:width] + 1
    slots = (table.view(width, 1) * bs + torch.arange(bs)).view(-1)[:ctx]
    k_flat, v_flat = k_pool.view(-1, kv_heads, dim), v_pool.view(-1, kv_heads, dim)
    lead = 3  # the chunk's rows do not start at 0 in the flat batch
    q = torch.randn(lead + q_len, heads, dim, generator=g)
    k = torch.cat([torch.randn(lead, kv_heads, dim, generator=g), k_flat[slots[past:]]])
    v = torch.cat([torch.randn(lead, kv_heads, dim, generator=g), v_flat[slots[past:]]])
    seq = PrefillSeq(q_start=lead, q_len=q_len, ctx_len=ctx, slots=slots)
    want = _naive_prefill(q[lead:], k_flat[slots], v_flat[slots], past, scale)
    for backend in (GatherSDPA(), PagedInPlace()):
        got = backend.prefill(q, k, v, k_pool, v_pool, seq, scale)
        assert got.shape == (q_len, heads, dim)
        assert (got - want).abs().max().item() < 1e-5


def test_prefill_after_a_cached_prefix_runs_the_fused_kernel_on_the_cpu():
    """What ``torch.profiler`` sees: the CPU flash kernel, never SDPA's math fallback."""
    from torch.profiler import ProfilerActivity, profile

    from minillm.fast.attention import attend_after_prefix

    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 6, 20, 8, generator=g)
    past_k, past_v = torch.randn(1, 2, 30, 8, generator=g), torch.randn(1, 2, 30, 8, generator=g)
    own_k, own_v = torch.randn(1, 2, 20, 8, generator=g), torch.randn(1, 2, 20, 8, generator=g)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        attend_after_prefix(q, past_k, past_v, own_k, own_v, 0.3)
    ops = {e.key for e in prof.key_averages()}
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in ops
    assert not any("math" in op for op in ops), ops


def test_auto_picks_flex_on_cuda_and_never_on_the_cpu():
    from minillm.fast.attention import backends_for, flex_available, resolve_backend

    assert flex_available()  # the pinned torch has FlexAttention
    assert resolve_backend("auto", "cuda", torch.bfloat16) == "flex"
    assert resolve_backend("auto", "cpu", torch.float32, 64, 2) in ("kernel", "gather")
    assert "kernel" not in backends_for("cuda", torch.bfloat16) and "flex" in backends_for("cuda", torch.bfloat16)
    assert "kernel" not in backends_for("cpu", torch.bfloat16)
