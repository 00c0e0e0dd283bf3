"""Each logits processor on hand-made logits, and the sampler's seeding."""

from __future__ import annotations

import math

import torch

from minillm import SamplingParams
from minillm.request import Request
from minillm.fast.sampler import BatchedSampler as Sampler
from minillm.sampler import (apply_penalties, make_generator, min_p_filter, processed_logits,
                             top_k_filter, top_p_filter)

INF = float("inf")


def probs_of(*p):
    return torch.tensor(p).log()


def kept(logits):
    return torch.isfinite(logits).nonzero().flatten().tolist()


def test_top_k_keeps_the_k_largest():
    logits = torch.tensor([1.0, 5.0, 3.0, 4.0, 2.0])
    assert kept(top_k_filter(logits, 2)) == [1, 3]
    assert kept(top_k_filter(logits, 0)) == [0, 1, 2, 3, 4]
    assert kept(top_k_filter(logits, 99)) == [0, 1, 2, 3, 4]
    batch = top_k_filter(torch.stack([logits, -logits]), torch.tensor([1, 3]))
    assert kept(batch[0]) == [1] and kept(batch[1]) == [0, 2, 4]


def test_top_p_smallest_set_reaching_p():
    logits = probs_of(0.25, 0.5, 0.1, 0.15)
    assert kept(top_p_filter(logits, 0.5)) == [1]         # 0.5 alone reaches 0.5
    assert kept(top_p_filter(logits, 0.55)) == [0, 1]     # 0.5 + 0.25
    assert kept(top_p_filter(logits, 0.8)) == [0, 1, 3]   # 0.5 + 0.25 + 0.15
    assert kept(top_p_filter(logits, 0.95)) == [0, 1, 2, 3]
    assert kept(top_p_filter(logits, 1e-6)) == [1]        # never empty
    assert kept(top_p_filter(logits, 1.0)) == [0, 1, 2, 3]


def test_top_p_rows_have_their_own_p():
    logits = torch.stack([probs_of(0.6, 0.3, 0.1), probs_of(0.1, 0.3, 0.6)])
    out = top_p_filter(logits, torch.tensor([0.6, 0.85]))
    assert kept(out[0]) == [0] and kept(out[1]) == [1, 2]


def test_min_p_relative_to_the_top_token():
    logits = probs_of(0.5, 0.3, 0.15, 0.05)
    assert kept(min_p_filter(logits, 0.2)) == [0, 1, 2]  # threshold 0.1
    assert kept(min_p_filter(logits, 0.7)) == [0]        # threshold 0.35
    assert kept(min_p_filter(logits, 0.0)) == [0, 1, 2, 3]


def test_repetition_penalty_divides_positive_multiplies_negative():
    logits = torch.tensor([2.0, -2.0, 1.0, 0.5])
    p = SamplingParams(repetition_penalty=2.0)
    out = apply_penalties(logits, p, prompt_ids=[0], output_ids=[1])
    assert out.tolist() == [1.0, -4.0, 1.0, 0.5]


def test_presence_and_frequency_penalties_count_output_only():
    logits = torch.zeros(4)
    p = SamplingParams(presence_penalty=0.5, frequency_penalty=0.25)
    out = apply_penalties(logits, p, prompt_ids=[3, 3, 3], output_ids=[1, 1, 2])
    assert out.tolist() == [0.0, -1.0, -0.75, 0.0]


def test_temperature_zero_is_greedy_in_the_pipeline():
    logits = torch.tensor([0.1, 3.0, 2.9])
    out = processed_logits(logits, SamplingParams(temperature=0))
    assert kept(out) == [1]


def test_pipeline_order_is_temperature_then_topk_then_topp_then_minp():
    logits = torch.tensor([4.0, 3.0, 2.0, 1.0, 0.0])
    p = SamplingParams(temperature=0.5, top_k=4, top_p=0.999, min_p=0.01)
    manual = min_p_filter(top_p_filter(top_k_filter(logits / 0.5, 4), 0.999), 0.01)
    assert torch.equal(processed_logits(logits, p), manual)


def _req(rid, params, seed):
    r = Request(rid, "x", params, prompt_token_ids=[1])
    r._generator = make_generator(seed)
    return r


def test_same_seed_same_tokens_alone_or_batched():
    torch.manual_seed(0)
    logits = torch.randn(8, 50)
    p = SamplingParams(temperature=1.0, top_p=0.9)
    sampler = Sampler()
    alone = [sampler(logits[3:4], [_req("a", p, 7)])[0][0] for _ in range(1)]
    batch_reqs = [_req(str(i), SamplingParams(temperature=0.7 + i / 10), 100 + i) for i in range(8)]
    batch_reqs[3] = _req("a", p, 7)
    batched = sampler(logits, batch_reqs)[0][3]
    assert alone[0] == batched
    # and over many steps the sequence is the same
    r1, r2 = _req("x", p, 11), _req("y", p, 11)
    seq1 = [sampler(logits[:1], [r1])[0][0] for _ in range(20)]
    seq2 = [sampler(logits[:2], [r2, _req("z", p, 5)])[0][0] for _ in range(20)]
    assert seq1 == seq2


def test_sampling_follows_the_distribution():
    logits = probs_of(0.7, 0.2, 0.1)
    r = _req("a", SamplingParams(temperature=1.0), 0)
    counts = [0, 0, 0]
    for _ in range(3000):
        counts[Sampler()(logits[None], [r])[0][0]] += 1
    freqs = [c / 3000 for c in counts]
    for f, p in zip(freqs, (0.7, 0.2, 0.1)):
        assert abs(f - p) < 0.04


def test_top_k_one_is_greedy_even_at_high_temperature():
    logits = torch.tensor([[0.0, 1.0, 0.9, 0.5]])
    r = _req("a", SamplingParams(temperature=5.0, top_k=1), 3)
    assert {Sampler()(logits, [r])[0][0] for _ in range(50)} == {1}


def test_greedy_rows_ignore_their_generator():
    logits = torch.tensor([[0.0, 2.0, 1.0], [3.0, 0.0, 1.0]])
    ids, raw = Sampler()(logits, [_req("a", SamplingParams(temperature=0), 1), _req("b", SamplingParams(temperature=0), 2)])
    assert ids == [1, 0]
    assert torch.equal(raw, logits)
    assert math.isclose(raw.log_softmax(-1).exp().sum(-1)[0].item(), 1.0, rel_tol=1e-6)


def test_finite_or_best_never_leaves_nan_or_an_empty_row():
    from minillm.sampler import finite_or_best
    nan, inf = float("nan"), float("inf")
    raw = torch.tensor([[0.0, 3.0, 1.0]] * 4)
    rows = torch.tensor([[nan, 1.0, 2.0],      # NaN -> -inf, the rest stays
                         [inf, 1.0, inf],      # +inf entries win, tied
                         [-inf, -inf, -inf],   # nothing left: the model's own argmax
                         [nan, nan, nan]])
    out = finite_or_best(rows, raw)
    assert not out.isnan().any()
    assert kept(out[0]) == [1, 2] and out[0, 2] == 2.0
    assert kept(out[1]) == [0, 2]
    assert kept(out[2]) == [1] and kept(out[3]) == [1]
    assert not out.softmax(-1).isnan().any()


def test_huge_penalties_inside_the_sampler():
    logits = torch.tensor([[1.0, 2.0, 3.0, 0.5]])
    # every seen token pushed to +inf by a huge negative penalty: sampling stays among them
    p = SamplingParams(temperature=0.9, frequency_penalty=-3.4e38)
    r = _req("a", p, 0)
    r.output_token_ids = [0, 0, 1, 1]
    assert {Sampler()(logits, [r])[0][0] for _ in range(30)} <= {0, 1}
    # greedy with everything forbidden except one token
    g = _req("b", SamplingParams(temperature=0, presence_penalty=3e38), 0)
    g.output_token_ids = [2, 1]
    assert Sampler()(logits, [g])[0] == [0]


def test_top_k_beyond_the_vocabulary_is_off():
    logits = torch.tensor([1.0, 5.0, 3.0])
    assert kept(top_k_filter(logits, 2**63)) == [0, 1, 2]
    assert kept(top_k_filter(torch.stack([logits, logits]), [10**30, 1])[1]) == [1]
    r = _req("a", SamplingParams(temperature=1.0, top_k=2**63), 0)
    assert Sampler()(logits[None], [r])[0][0] in (0, 1, 2)


def test_one_shared_sort_filters_like_the_three_filters_in_turn():
    from minillm.fast.sampler import sorted_filters
    torch.manual_seed(5)
    logits = torch.randn(6, 200) * 3
    k = torch.tensor([0, 5, 50, 200, 1, 17])
    p = torch.tensor([0.9, 1.0, 0.5, 0.99, 0.3, 1.0])
    mp = torch.tensor([0.0, 0.1, 0.02, 0.0, 0.5, 0.3])
    got = sorted_filters(logits, k, p, mp)
    for i in range(6):
        want = logits[i]
        want = top_k_filter(want, int(k[i]))
        if p[i] < 1.0:  # a row with top_p = 1 is never trimmed, whatever shares its batch
            want = top_p_filter(want, float(p[i]))
        want = min_p_filter(want, float(mp[i]))
        assert kept(got[i]) == kept(want), i


def test_batched_draws_follow_the_filtered_distribution():
    """The exponential race over a batch draws each row from softmax(processed_logits)."""
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.0, -1.0, -3.0]] * 2)
    params = [SamplingParams(temperature=0.7, top_k=4, top_p=0.95), SamplingParams(temperature=1.3, min_p=0.05)]
    reqs = [_req("a", params[0], 1), _req("b", params[1], 2)]
    n = 4000
    counts = torch.zeros(2, 6)
    sampler = Sampler()
    for _ in range(n):
        for row, t in enumerate(sampler(logits, reqs)[0]):
            counts[row, t] += 1
    for row in range(2):
        want = processed_logits(logits[row], params[row]).softmax(-1)
        assert (counts[row] / n - want).abs().max() < 0.03, (row, counts[row] / n, want)
        assert counts[row][~torch.isfinite(processed_logits(logits[row], params[row]))].sum() == 0


def test_logprobs_table_holds_the_chosen_and_the_top_tokens():
    """Only k values per row come back (the top k picked on the device), each row's chosen
    token's log-probability with them; a request records its own n of them."""
    from minillm.fast.sampler import TokenLogprobs
    from minillm.sampler import logprob_entry

    torch.manual_seed(2)
    logits = torch.randn(3, 40)
    reqs = [_req("a", SamplingParams(temperature=0.9, logprobs=4), 1), _req("b", SamplingParams(temperature=0), 2),
            _req("c", SamplingParams(temperature=0.5, logprobs=0), 3)]
    result = Sampler()(logits, reqs)
    ids, raw = result
    full = logits.log_softmax(-1)
    table = result.logprobs
    assert len(table) == 3 and all(isinstance(row, TokenLogprobs) for row in table)
    for i, t in enumerate(ids):
        assert table[i].logprob == float(full[i, t])
        want = torch.topk(full[i], 4)
        assert [tok for tok, _ in table[i].top] == want.indices.tolist()
        assert [lp for _, lp in table[i].top] == want.values.tolist()
        # the entry a request records is what a dense table of the same row gives
        for n in (0, 2, 4):
            assert logprob_entry(t, table[i], n) == logprob_entry(t, full[i], n)
    assert ids[1] == int(logits[1].argmax())


def _seeded(rid, params, gen_seed):
    """A request that gave a seed (``params.seed``), its generator seeded as the engine does."""
    import dataclasses

    return _req(rid, dataclasses.replace(params, seed=gen_seed), gen_seed)


class _CountExponential(torch.overrides.TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += getattr(func, "__name__", "") == "exponential_"
        return func(*args, **(kwargs or {}))


def test_shared_noise_is_one_launch_for_the_unseeded_rows_and_seeded_rows_stay_batch_invariant():
    """``shared_noise`` (CUDA's default): the rows without a seed get their noise in one
    ``exponential_`` launch; a seeded row still draws from its own generator, so its tokens are
    the same alone or next to any others, step after step."""
    torch.manual_seed(0)
    logits = torch.randn(6, 50)
    p = SamplingParams(temperature=1.0, top_p=0.9)
    sampler = Sampler()
    sampler.shared_noise = True
    unseeded = [_req(str(i), SamplingParams(temperature=0.8), 100 + i) for i in range(4)]
    mixed = unseeded[:2] + [_seeded("s", p, 7)] + unseeded[2:] + [_req("g", SamplingParams(temperature=0), 3)]
    with _CountExponential() as count:
        sampler(logits, mixed)
    assert count.calls == 1 + 1  # one for the unseeded rows, one for the seeded row
    with _CountExponential() as count:
        sampler(logits[:4], unseeded)
    assert count.calls == 1
    alone, batched = _seeded("x", p, 11), _seeded("y", p, 11)
    seq1 = [sampler(logits[2:3], [alone])[0][0] for _ in range(20)]
    seq2 = [sampler(logits[:4], [unseeded[0], unseeded[1], batched, unseeded[2]])[0][2] for _ in range(20)]
    assert seq1 == seq2
    # without shared noise (the CPU's default) every sampled row is a launch of its own
    plain = Sampler()
    with _CountExponential() as count:
        plain(logits, mixed)
    assert count.calls == 5


def test_shared_noise_follows_the_distribution_and_rewinds():
    logits = torch.tensor([[2.0, 1.5, 1.0, 0.0, -1.0, -3.0]] * 3)
    params = SamplingParams(temperature=0.9, top_k=5)
    reqs = [_req(str(i), params, i) for i in range(3)]
    sampler = Sampler()
    sampler.shared_noise, sampler.seed = True, 5
    state = sampler.rng_state()
    first = sampler(logits, reqs)[0]
    sampler.set_rng_state(state)  # (None: as if never used) -> the same draw again
    assert sampler(logits, reqs)[0] == first
    n = 1500
    counts = torch.zeros(6)
    for _ in range(n):
        for t in sampler(logits, reqs)[0]:
            counts[t] += 1
    want = processed_logits(logits[0], params).softmax(-1)
    assert (counts / (3 * n) - want).abs().max() < 0.03, (counts / (3 * n), want)
