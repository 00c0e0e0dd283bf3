"""``LLM(decode_graphs=...)`` (``minillm.fast.decode_graphs``): decode-only steps at fixed shapes.

The fixed-shape path is checked against the eager engine (the reference: decode groups,
``GatherSDPA``) on the shipped model, float32: the same greedy and seeded tokens, logits within
rounding, through preemption, chunked prefill, cancel and Ctrl-C; padding rows write only the
pool's scratch block; buckets are chosen as documented; steps with a prefill stay eager. Most
tests use ``"eager"`` (the same buffers, padding and paged reads, no compiler); one compiles a
bucket with inductor on the CPU. The CUDA-graph test runs wherever CUDA is available, whatever
``MINILLM_TEST_DEVICE`` says, and is skipped elsewhere.
"""

from __future__ import annotations

import pytest
import torch
from conftest import record_logits

from minillm import LLM, SamplingParams, StopReason
from minillm.fast.decode_graphs import CPU_MAX_BATCH, DecodeGraph, bucket_for, buckets
from minillm.engine_args import check_engine_options
from minillm.kv_cache import KVCache

KW = dict(device="cpu", dtype="float32", num_threads=1, max_num_seqs=6, max_num_batched_tokens=48,
          block_size=16, num_kv_blocks=24, enable_prefix_caching=False)
#: max |logit| difference graph vs eager, as a fraction of eager's largest |logit|
LOGIT_TOLERANCE = 1e-4


def prompts(lengths):
    return [[(11 * n + 3 * i) % 3000 + 5 for i in range(n)] for n in lengths]


def run(llm: LLM, lengths, params_for=None, max_tokens=30, cancel_at=None):
    """Queue requests of these prompt lengths at once, step to the end; (tokens, steps run
    through a graph). ``cancel_at``: (step, index) cancels that request at that step."""
    params_for = params_for or (lambda i: SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
    reqs = [llm.add_request(prompt_token_ids=p, params=params_for(i)) for i, p in enumerate(prompts(lengths))]
    graphs = llm.runner.graphs
    before = sum(g.runs for g in graphs.graphs.values()) if graphs else 0
    step = 0
    while llm.has_unfinished():
        if cancel_at and step == cancel_at[0]:
            llm.cancel(reqs[cancel_at[1]].request_id)
        llm.step()
        step += 1
    after = sum(g.runs for g in graphs.graphs.values()) if graphs else 0
    return [list(r.output_token_ids) for r in reqs], after - before


recording = record_logits


@pytest.fixture(scope="module")
def pair():
    return LLM(**KW), LLM(decode_graphs="eager", **KW)


def test_buckets():
    assert buckets(1) == [1]
    assert buckets(5) == [1, 2, 4, 5]
    assert buckets(64) == [1, 2, 4, 8, 16, 32, 64]
    assert [bucket_for(n, [1, 2, 4, 5]) for n in (1, 2, 3, 4, 5, 6)] == [1, 2, 4, 4, 5, None]


def test_greedy_tokens_and_logits_match_eager(pair):
    eager, graphed = pair
    seen_e, seen_g = recording(eager), recording(graphed)
    try:
        ref, _ = run(eager, (3, 17, 70, 40, 5))
        got, graph_steps = run(graphed, (3, 17, 70, 40, 5))
    finally:
        del eager.runner.run, graphed.runner.run
    assert got == ref
    assert graph_steps > 10  # most steps were decode-only and went through a graph
    assert len(seen_e) == len(seen_g)
    for a, b in zip(seen_e, seen_g):
        assert a.shape == b.shape
        assert (a - b).abs().max().item() <= LOGIT_TOLERANCE * a.abs().max().item()
    # every bucket used is (B, W) with B rows padded up and W blocks up to a power of two
    for (b, w), g in graphed.runner.graphs.graphs.items():
        assert b in graphed.runner.graphs.batch_sizes and w in graphed.runner.graphs.widths
        assert g.inputs.block_tables.shape == (b, w)
    graphed.kv_cache.allocator.check_invariants()
    assert graphed.cache_stats().used_blocks == 0


def test_preemption_and_chunked_prefill(pair):
    """A pool too small for everyone: requests are preempted and recomputed, long prompts are
    chunked next to running decodes; tokens still equal eager's."""
    small = dict(KW, num_kv_blocks=12, max_num_batched_tokens=32)
    eager, graphed = LLM(**small), LLM(decode_graphs="eager", **small)
    lengths = (60, 9, 33, 80, 21, 4)
    ref, _ = run(eager, lengths, max_tokens=40)
    got, graph_steps = run(graphed, lengths, max_tokens=40)
    assert got == ref and graph_steps > 0
    assert any(e.data.get("num_preempted") for e in graphed.trace if e.kind == "step")
    assert graphed.cache_stats().used_blocks == 0


def test_seeded_sampling_penalties_and_logprobs_match(pair):
    eager, graphed = pair

    def params(i):
        return SamplingParams(max_tokens=25, temperature=0.8, top_p=0.9, top_k=50, seed=100 + i,
                              presence_penalty=0.3, repetition_penalty=1.1, logprobs=3, ignore_eos=True)

    ref, _ = run(eager, (12, 30, 7), params)
    got, steps = run(graphed, (12, 30, 7), params)
    assert got == ref and steps > 0


def test_every_stop_reason_through_graphs():
    """EOS (a stop token id), a stop string, max_tokens and a full context end the same way, at
    the same token, with and without decode graphs; nothing stays allocated."""
    kw = dict(KW, max_model_len=64)
    eager, graphed = LLM(**kw), LLM(decode_graphs="eager", **kw)
    outs = {}

    def generate(llm, ps, params):
        reqs = [llm.add_request(prompt_token_ids=p, params=q) for p, q in zip(ps, params)]
        while llm.has_unfinished():
            llm.step()
        return reqs

    for name, llm in (("eager", eager), ("graphs", graphed)):
        probe = generate(llm, [prompts((6,))[0]], [SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)])[0]
        stop_id, text = probe.output_token_ids[5], llm.tokenizer.decode(probe.output_token_ids[8:10])
        params = [SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=[stop_id]),
                  SamplingParams(max_tokens=20, temperature=0.0, stop=[text], ignore_eos=True),
                  SamplingParams(max_tokens=7, temperature=0.0, ignore_eos=True),
                  SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True)]
        ps = [prompts((6,))[0]] * 3 + [prompts((50,))[0]]
        got = generate(llm, ps, params)
        outs[name] = [(list(r.output_token_ids), r.stop_reason, r.text) for r in got]
        assert llm.cache_stats().used_blocks == 0
    assert outs["graphs"] == outs["eager"]
    assert [r for _, r, _ in outs["graphs"]] == [StopReason.EOS, StopReason.STOP_STRING, StopReason.MAX_TOKENS,
                                                  StopReason.CONTEXT_FULL]
    assert sum(g.runs for g in graphed.runner.graphs.graphs.values()) > 10
    # a whole sequence in one block: the one width there is
    tiny = LLM(decode_graphs="eager", **dict(KW, max_model_len=12))
    assert tiny.runner.graphs.widths == [1]
    r = generate(tiny, [[5, 6, 7]], [SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)])[0]
    assert r.stop_reason == StopReason.CONTEXT_FULL and len(r.output_token_ids) == 12 - 3


def test_plainly_greedy_graph_steps_take_the_graphs_argmax(pair, monkeypatch):
    """A graph step whose rows are all plainly greedy takes the argmax made inside the graph:
    the batched sampler is not called; with log-probabilities it is, every step. Same tokens."""
    from minillm.fast.sampler import BatchedSampler

    eager, graphed = pair
    ref, _ = run(eager, (7, 19), max_tokens=12)
    real, calls = BatchedSampler.__call__, []

    def counting(self, logits, requests):
        calls.append(len(requests))
        return real(self, logits, requests)

    monkeypatch.setattr(BatchedSampler, "__call__", counting)
    before = graphed.step_count
    got, steps = run(graphed, (7, 19), max_tokens=12)
    assert got == ref and steps == 11
    assert len(calls) == graphed.step_count - before - steps == 1  # the prefill step's only
    calls.clear()
    got, steps = run(graphed, (7, 19), max_tokens=12, params_for=lambda i: SamplingParams(
        max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=2))
    assert got == ref and len(calls) == steps + 1


def test_cancel_mid_decode(pair):
    eager, graphed = pair
    ref, _ = run(eager, (10, 20, 30), cancel_at=(6, 1))
    got, _ = run(graphed, (10, 20, 30), cancel_at=(6, 1))
    assert got == ref
    assert graphed.cache_stats().used_blocks == 0


def test_padding_rows_write_only_the_scratch_block():
    """A step of 3 decode rows runs in the 4-row bucket: the pool changes only at the three new
    tokens' slots and in the scratch block."""
    llm = LLM(decode_graphs="eager", **KW)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    reqs = [llm.add_request(prompt_token_ids=p, params=params) for p in prompts((5, 18, 33))]
    while any(r.num_computed_tokens < len(r.prompt_token_ids) for r in reqs):
        llm.step()
    kv = llm.kv_cache
    before = [t.clone() for t in kv.k + kv.v]
    slots = []
    for r in reqs:
        pos = r.num_tokens - 1
        slots.append(r.block_table[pos // kv.block_size] * kv.block_size + pos % kv.block_size)
    runs = sum(g.runs for g in llm.runner.graphs.graphs.values())
    llm.step()
    assert sum(g.runs for g in llm.runner.graphs.graphs.values()) == runs + 1
    assert any(b == 4 for b, _ in llm.runner.graphs.graphs)
    scratch = kv.scratch_slot
    for old, new in zip(before, kv.k + kv.v):
        o, n = old.view(-1, *old.shape[2:]), new.view(-1, *new.shape[2:])
        changed = set((o != n).flatten(1).any(1).nonzero().flatten().tolist())
        assert changed - set(slots) <= set(range(scratch, scratch + kv.block_size)), sorted(changed - set(slots))
        assert changed & set(slots)  # the real rows did write


def test_scratch_block_is_never_allocated():
    kv = KVCache(2, 5, 4, 2, 8, torch.float32, torch.device("cpu"), scratch_block=True)
    assert kv.k[0].shape[0] == 6 and kv.scratch_slot == 5 * 4
    assert kv.stats().total_blocks == 5
    blocks, _ = kv.allocator.allocate(list(range(20)))  # every block the allocator has
    assert sorted(blocks) == [0, 1, 2, 3, 4] and not kv.allocator.can_allocate([1])
    plain = KVCache(2, 5, 4, 2, 8, torch.float32, torch.device("cpu"))
    assert plain.k[0].shape[0] == 5 and plain.scratch_slot is None


def test_steps_with_a_prefill_and_large_batches_stay_eager(pair):
    _, graphed = pair
    g = graphed.runner.graphs
    assert g.graph_for(KW["max_num_seqs"] + 1, 1) is None   # more rows than the largest bucket
    assert g.graph_for(1, g.widths[-1] + 1) is None          # longer than any sequence can be
    # a step that prefills runs eager even when decodes are running
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    a = graphed.add_request(prompt_token_ids=prompts((10,))[0], params=params)
    for _ in range(3):
        graphed.step()
    runs = sum(x.runs for x in g.graphs.values())
    graphed.add_request(prompt_token_ids=prompts((25,))[0], params=params)
    graphed.step()  # a's decode next to the new prompt's prefill
    assert sum(x.runs for x in g.graphs.values()) == runs
    while graphed.has_unfinished():
        graphed.step()
    assert a.is_finished and len(a.output_token_ids) == 20


def test_interrupt_inside_a_graph_step_is_undone(pair, monkeypatch):
    """Ctrl-C while a graph step runs: the step is rolled back, and stepping on gives exactly
    the uninterrupted tokens."""
    eager, _ = pair
    graphed = LLM(decode_graphs="eager", **KW)
    ref, _ = run(eager, (8, 26))
    import minillm.fast.decode_graphs as dg

    real, calls = dg.decode_forward, {"n": 0}

    def flaky(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] in (3, 7):
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(dg, "decode_forward", flaky)
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    reqs = [graphed.add_request(prompt_token_ids=p, params=params) for p in prompts((8, 26))]
    interrupted = 0
    while graphed.has_unfinished():
        try:
            graphed.step()
        except KeyboardInterrupt:
            interrupted += 1
    assert interrupted == 2
    assert [list(r.output_token_ids) for r in reqs] == ref
    assert graphed.cache_stats().used_blocks == 0


@pytest.mark.parametrize("bad", ["yes", 1, "graphs", ["eager"]])
def test_bad_values_name_the_option(bad):
    with pytest.raises(ValueError, match="decode_graphs"):
        check_engine_options("cpu", decode_graphs=bad)


def test_incompatible_options_are_refused():
    with pytest.raises(ValueError, match="decode_graphs='cuda'.*device='cuda'"):
        check_engine_options("cpu", decode_graphs="cuda")
    # int8 weights trace as the streaming kernel's op (tests/test_gemv.py); CUDA has no int8
    assert check_engine_options("cpu", "float32", decode_graphs=True, weight_dtype="int8").decode_graphs == "compile"
    with pytest.raises(ValueError, match="row_split"):
        check_engine_options("cpu", decode_graphs="compile", row_split=True)
    assert check_engine_options("cpu", decode_graphs=True).decode_graphs == "compile"
    assert check_engine_options("cpu", decode_graphs=False).decode_graphs is None
    assert check_engine_options("cpu", "float32", decode_graphs="eager", weight_dtype="int8").decode_graphs == "eager"


def test_compiled_buckets_on_the_cpu(pair):
    """``decode_graphs=True`` on the CPU: inductor compiles each bucket used (batches up to
    ``CPU_MAX_BATCH``); tokens equal eager's, logits within rounding, one graph per bucket."""
    eager, _ = pair
    compiled = LLM(decode_graphs=True, **KW)
    g = compiled.runner.graphs
    assert g.mode == "compile" and g.batch_sizes == [1, 2, CPU_MAX_BATCH]
    # warmup() makes one graph per batch bucket before any request, and leaves nothing behind
    assert compiled.warmup() == 3 == g.compiles
    assert g.compiler == "aot", g.aot_error  # called without dynamo's per-call entry
    # and straight through inductor's entry with each bucket's recorded inputs (``graph_call``)
    assert g.direct_error is None and all(x._direct is not None for x in g.graphs.values() if x.runs)
    assert compiled.requests == {} and compiled.cache_stats().used_blocks == 0
    ref, _ = run(eager, (9, 40), max_tokens=20)
    got, steps = run(compiled, (9, 40), max_tokens=20)
    assert got == ref and steps >= 15
    # one request growing from 2 to 5 blocks, then to 10: widths 2, 4, 8, 16 share one graph
    ref, _ = run(eager, (3,), max_tokens=150)
    got, _ = run(compiled, (3,), max_tokens=150)
    assert got == ref
    assert {w for b, w in g.graphs if b == 1} >= {2, 4, 8, 16}
    assert g.compiles == 3  # nothing compiled after the warm-up: every width shares its batch's graph
    # batches above the CPU limit run eager
    assert compiled.runner.graphs.graph_for(CPU_MAX_BATCH + 1, 1) is None


def test_int8_weights_in_decode_graphs_give_the_eager_int8_tokens(tiny_llama):
    """int8 projections inside a CPU decode graph are ``torch.ops.minillm_gemv.linear_int8``:
    the same kernel as eager int8 decode, so the same tokens; where the op cannot be had the
    engine says so instead of failing inside the tracer."""
    from minillm.fast import gemv

    kw = dict(device="cpu", dtype="float32", num_threads=1, block_size=4, num_kv_blocks=32, max_num_seqs=1,
              weight_dtype="int8")
    if not gemv.op_available():
        with pytest.raises(ValueError, match="int8 weights needs the streaming kernel"):
            LLM(str(tiny_llama[0]), decode_graphs="compile", **kw)
        return
    graphed, ref = LLM(str(tiny_llama[0]), decode_graphs="compile", **kw), LLM(str(tiny_llama[0]), **kw)
    outs = [run(engine, (5, 11), max_tokens=12)[0] for engine in (ref, graphed)]
    assert outs[0] == outs[1]
    assert graphed.runner.graphs.compiles >= 1


def test_cpu_graphs_run_torch_on_one_thread_and_the_kernel_on_the_rest():
    from minillm.fast import gemv
    from minillm.fast.decode_graphs import kernel_threads_only

    if not gemv.op_available():
        pytest.skip("the gemv operator is unavailable here")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with kernel_threads_only(True):
            assert torch.get_num_threads() == 1
            assert gemv.set_op_threads(2) == 2  # (set to what torch had; setting it again returns that)
        assert torch.get_num_threads() == 2 and gemv.set_op_threads(None) is None  # both restored
        with kernel_threads_only(False):
            assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_int8_decode_graphs_without_the_kernel_are_refused(tiny_llama, monkeypatch):
    monkeypatch.setenv("MINILLM_GEMV", "0")
    with pytest.raises(ValueError, match="int8 weights needs the streaming kernel.*MINILLM_GEMV=0"):
        LLM(str(tiny_llama[0]), device="cpu", dtype="float32", weight_dtype="int8", decode_graphs="compile")


def test_where_ahead_of_time_compiling_fails_graphs_are_compiled_as_usual(tiny_llama):
    """``aot_compile`` needs inductor's caches; without them the graphs are the guarded
    ``torch.compile`` ones, say why, and give the same tokens."""
    kw = dict(device="cpu", dtype="float32", num_threads=1, block_size=4, num_kv_blocks=32, max_num_seqs=1)
    llm = LLM(str(tiny_llama[0]), decode_graphs="compile", **kw)
    ref = LLM(str(tiny_llama[0]), **kw)
    # (inductor's own patch: monkeypatch would delete the config entry when undoing)
    with torch._inductor.config.patch(force_disable_caches=True):
        outs = [run(engine, (5,), max_tokens=12)[0] for engine in (llm, ref)]
    assert outs[0] == outs[1]
    g = llm.runner.graphs
    assert g.compiler == "jit" and "force_disable_caches" in g.aot_error and g.compiles == 1


def test_warmup_captures_every_bucket_and_serving_captures_none(pair, monkeypatch):
    """"cuda" mode's warm-up without a GPU: the capture itself is replaced by the eager
    fixed-shape forward (counted as a capture), the rest is what CUDA runs. Every (B, W) bucket
    is made by ``warmup()``, before any request; a serving run through the graphs then makes
    none, and its tokens equal the eager engine's."""
    eager = pair[0]
    llm = LLM(decode_graphs="eager", **KW)
    graphs = llm.runner.graphs
    graphs.mode = "cuda"

    def fake_capture(self, forward):
        self._fn = forward
        self.graphs.captures += 1

    monkeypatch.setattr(DecodeGraph, "_capture", fake_capture)
    made = llm.warmup()
    assert made == len(graphs.batch_sizes) * len(graphs.widths) == graphs.captures == graphs.warmup["graphs"] > 1
    assert llm.cache_stats().used_blocks == 0 and not llm.requests  # no request was needed
    ref, _ = run(eager, (3, 17, 70, 40, 5))
    got, graph_steps = run(llm, (3, 17, 70, 40, 5))
    assert got == ref and graph_steps > 10
    assert graphs.captures == made  # nothing captured while serving


def test_flex_backend_through_decode_graphs_matches_eager(pair):
    """The engine's "flex" backend is what CUDA graphs run (read in place through its block
    mask, made inside the graph); here in "eager" decode graphs, against the reference."""
    flex = LLM(decode_graphs="eager", attention_backend="flex", **KW)
    assert flex.runner.graphs.attention.name == "flex"
    ref, _ = run(pair[0], (3, 17, 70, 40, 5))
    got, graph_steps = run(flex, (3, 17, 70, 40, 5))
    assert got == ref and graph_steps > 10


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_cuda_graphs_match_eager_on_cuda():
    kw = dict(KW, device="cuda")
    eager, graphed = LLM(**kw), LLM(decode_graphs=True, **kw)
    assert graphed.runner.graphs.mode == "cuda"
    made = graphed.warmup()
    assert made == graphed.runner.graphs.captures > 0
    ref, _ = run(eager, (3, 17, 70, 40, 5))
    got, steps = run(graphed, (3, 17, 70, 40, 5))
    assert got == ref and steps > 10
    assert graphed.runner.graphs.captures == made  # serving captured nothing
