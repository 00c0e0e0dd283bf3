"""``LLM(compile=True)`` (``minillm.fast.compiled``) against the eager engine.

One eager and one compiled engine on the shipped model, float32, a small KV pool and step
budget so that a mixed batch preempts and chunks a prefill. The compiled forward may round
differently from eager (inductor fuses and reorders float32 sums): its logits are checked
within ``LOGIT_TOLERANCE`` of eager's at every step (measured: ~1e-5 of the largest |logit|
or less), and greedy tokens must be identical. One graph serves every step
(``MAX_COMPILES``): the count does not grow after many steps of varying batch size.

Inductor needs a C++ compiler: without one ``LLM(compile=True)`` raises a ``ValueError`` saying
so, and these tests fail with that message (they are not skipped).
"""

from __future__ import annotations

import pytest
from conftest import record_logits

from minillm import LLM, SamplingParams
from minillm.engine_args import check_engine_options
from minillm.fast.compiled import MAX_COMPILES, CompiledModel

#: max |logit| difference compiled vs eager, as a fraction of eager's largest |logit|
LOGIT_TOLERANCE = 1e-4
KW = dict(device="cpu", dtype="float32", num_threads=1, max_num_seqs=4, max_num_batched_tokens=32,
          block_size=16, num_kv_blocks=10, enable_prefix_caching=False)


recording = record_logits


@pytest.fixture(scope="module")
def engines():
    eager, compiled = LLM(**KW), LLM(compile=True, **KW)
    graphs = compiled.warmup()
    return eager, compiled, graphs, recording(eager), recording(compiled)


def mixed(llm: LLM, lengths=(3, 17, 70, 40), max_tokens=24) -> tuple[list[list[int]], list]:
    """Greedy requests of different lengths queued at once; their tokens and the step events."""
    llm.clear_trace()
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    reqs = [llm.add_request(prompt_token_ids=[(7 * n + i) % 3000 + 5 for i in range(n)], params=params)
            for n in lengths]
    while llm.has_unfinished():
        llm.step()
    steps = [e.data for e in llm.trace if e.kind == "step"]
    return [list(r.output_token_ids) for r in reqs], steps


def test_warmup_compiles_one_graph(engines):
    _, compiled, graphs, _, _ = engines
    assert isinstance(compiled.runner.model, CompiledModel)
    assert compiled.runner.model.model is compiled.model  # llm.model stays the eager reference
    assert graphs == MAX_COMPILES == 1
    assert LLM(**{**KW, "num_kv_blocks": 4}).warmup() == 0  # nothing to compile for eager


def test_mixed_batch_same_tokens_and_logits_within_tolerance(engines):
    eager, compiled, _, seen_e, seen_c = engines
    seen_e.clear()
    seen_c.clear()
    ref, steps = mixed(eager)
    got, steps_c = mixed(compiled)
    assert any(s["num_preempted"] for s in steps), "the small KV pool should have preempted a request"
    assert any(0 < n < 70 for s in steps for n in s["prefill_tokens"].values()), "no chunked prefill"
    assert any(s["num_decode"] and s["num_prefill"] for s in steps), "no mixed step"
    assert got == ref
    assert len(seen_c) == len(seen_e) == len(steps) == len(steps_c)
    worst = max(((c - e).abs().max() / e.abs().max()).item() for e, c in zip(seen_e, seen_c) if e.numel())
    assert worst <= LOGIT_TOLERANCE, f"compiled logits differ by {worst:.2e} of the largest |logit|"


def test_graphs_stay_at_their_bound_over_varying_batches(engines):
    eager, compiled, _, _, _ = engines
    sizes = set()
    for lengths, n in (((5,), 6), ((9, 2, 30), 12), ((1, 1, 1, 1, 1), 5), ((64, 33, 8, 2), 10), ((31, 3), 20)):
        ref, _ = mixed(eager, lengths, n)
        got, steps = mixed(compiled, lengths, n)
        assert got == ref
        sizes |= {s["num_tokens"] for s in steps}
    assert len(sizes) >= 8 and 1 in sizes, sizes  # many step sizes went through the one graph
    assert compiled.runner.model.compiles == MAX_COMPILES


def test_weights_keep_their_layout_once_compiled(engines):
    _, compiled, _, _, _ = engines
    with pytest.raises(RuntimeError, match="after LLM\\(compile=True\\)"):
        compiled.model.use_decode_layout()


def test_sampled_requests_with_logprobs_match_eager(engines):
    eager, compiled, _, _, _ = engines
    outs = []
    for llm in (eager, compiled):
        params = [SamplingParams(max_tokens=8, temperature=0.8, top_p=0.9, seed=s, logprobs=2) for s in (1, 2, 3)]
        reqs = [llm.add_request(prompt_token_ids=[11 + s, 12, 13] * s, params=p) for s, p in zip((1, 2, 3), params)]
        while llm.has_unfinished():
            llm.step()
        outs.append([list(r.output_token_ids) for r in reqs])
    assert outs[0] == outs[1]
    assert compiled.runner.model.compiles == MAX_COMPILES


@pytest.mark.parametrize("bad", ["yes", 1, 0, None, 1.0])
def test_bad_compile_values(bad):
    with pytest.raises(ValueError, match="compile must be True or False"):
        check_engine_options("cpu", "float32", compile=bad)


def test_compile_with_int8_weights_is_refused():
    with pytest.raises(ValueError, match="compile=True needs weight_dtype=None"):
        check_engine_options("cpu", "float32", compile=True, weight_dtype="int8")


def test_compile_without_a_cxx_compiler_says_so(monkeypatch):
    monkeypatch.setenv("CXX", "no-such-c++-compiler")
    with pytest.raises(ValueError, match="compile=True on the CPU needs a C\\+\\+ compiler"):
        check_engine_options("cpu", "float32", compile=True)
    assert check_engine_options("cpu", "float32", compile=False).compile is False
