"""SamplingParams: numpy scalars normalised, immutable after construction, and every odd but
legal value runs on a real engine to a stop reason with no KV block left held."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
import torch

from minillm import SamplingParams
from minillm.params import GREEDY_EPS, MAX_LOGPROBS
from minillm.sampler import make_generator
from conftest import check_block_invariants


def test_numpy_scalars_become_python_numbers():
    p = SamplingParams(max_tokens=np.int64(5), temperature=np.float32(0.5), top_k=np.int32(3),
                       top_p=np.float64(0.9), seed=np.int64(7), logprobs=np.int8(2),
                       stop_token_ids=[np.int64(4)], ignore_eos=np.bool_(True))
    assert (p.max_tokens, p.temperature, p.top_k, p.seed, p.logprobs) == (5, 0.5, 3, 7, 2)
    for name in ("max_tokens", "top_k", "seed", "logprobs"):
        assert type(getattr(p, name)) is int, name
    for name in ("temperature", "top_p", "min_p", "repetition_penalty"):
        assert type(getattr(p, name)) is float, name
    assert p.stop_token_ids == (4,) and type(p.stop_token_ids[0]) is int
    assert p.ignore_eos is True
    assert SamplingParams(temperature=1).temperature == 1.0  # ints are fine for float fields


def test_assignment_raises_and_says_how_to_change_a_field():
    p = SamplingParams(temperature=0.7)
    with pytest.raises(dataclasses.FrozenInstanceError, match=r"params\.replace\(temperature="):
        p.temperature = -1
    with pytest.raises(AttributeError):  # FrozenInstanceError is an AttributeError
        del p.top_k
    assert p.temperature == 0.7


def test_replace_revalidates():
    p = SamplingParams(temperature=0.7, stop=["x"], seed=3)
    q = p.replace(temperature=0.0)
    assert q.greedy and q.stop_strings == ["x"] and q.seed == 3 and p.temperature == 0.7
    with pytest.raises(ValueError, match="temperature"):
        p.replace(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        dataclasses.replace(p, top_p=2.0)


def test_value_semantics_copy_and_hash():
    p = SamplingParams(stop=["a", "b"], stop_token_ids=[3, 4], seed=1)
    assert p == SamplingParams(stop=("a", "b"), stop_token_ids=(3, 4), seed=1)
    assert hash(p) == hash(p.replace())
    assert pickle.loads(pickle.dumps(p)) == p
    assert {p: 1}[p.replace()] == 1


def test_an_empty_stop_list_is_no_stop_strings():
    assert SamplingParams(stop=[]).stop_strings == [] and SamplingParams(stop=(), stop_token_ids=[]).stop_token_ids == ()


def test_containers_are_not_shared_with_the_caller():
    stops, ids = ["END"], [5]
    p = SamplingParams(stop=stops, stop_token_ids=ids)
    stops.append("MORE")
    ids.append(6)
    assert p.stop_strings == ["END"] and p.stop_token_ids == (5,)
    p.stop_strings.append("X")  # a fresh list each time: nothing to corrupt
    assert p.stop_strings == ["END"]


def test_temperature_below_epsilon_is_greedy():
    assert SamplingParams(temperature=0).greedy
    assert SamplingParams(temperature=GREEDY_EPS / 10).greedy
    assert SamplingParams(temperature=1e-40).greedy
    assert not SamplingParams(temperature=GREEDY_EPS).greedy


def test_defaults():
    p = SamplingParams()
    assert p.include_stop_str_in_output is False and p.stop_token_ids == () and p.stop is None
    assert SamplingParams(top_k=-1).top_k == 0
    assert SamplingParams(logprobs=MAX_LOGPROBS).logprobs == MAX_LOGPROBS


@pytest.mark.parametrize("seed", [7, np.int64(7), np.uint64(2**64 - 1), -1, 2**64, 2**200, -(2**100)])
def test_any_integer_seed_makes_a_generator(seed):
    gen = make_generator(seed)
    assert gen.initial_seed() == int(seed) % 2**64
    SamplingParams(seed=seed)


def test_seed_reduction_is_deterministic():
    a = torch.rand(4, generator=make_generator(-1))
    b = torch.rand(4, generator=make_generator(2**64 - 1))
    assert torch.equal(a, b)


# --- odd but legal values on a real engine ------------------------------------------------
ODD_BUT_LEGAL = [
    dict(temperature=1e-40),
    dict(temperature=GREEDY_EPS),
    dict(temperature=3e38),
    dict(top_k=2**63),
    dict(top_k=10**30, temperature=0.8),
    dict(top_p=1e-300),
    dict(min_p=1.0),
    dict(repetition_penalty=1e-4),
    dict(repetition_penalty=1e4),
    dict(repetition_penalty=1e-4, temperature=GREEDY_EPS),
    dict(presence_penalty=3e38, temperature=0),
    dict(presence_penalty=3e38, temperature=0.9),
    dict(presence_penalty=-3e38, temperature=0.9),
    dict(frequency_penalty=3.4e38),
    dict(frequency_penalty=-3.4e38, temperature=0),
    dict(frequency_penalty=-3.4e38, temperature=0.9),
    dict(presence_penalty=-3.4e38, temperature=GREEDY_EPS, top_p=0.5),
    dict(frequency_penalty=-3.4e38, presence_penalty=3.4e38, temperature=GREEDY_EPS),
    dict(seed=np.int64(7)),
    dict(seed=2**100),
    dict(logprobs=MAX_LOGPROBS),
    dict(logprobs=0, temperature=1e-30),
    dict(skip_special_tokens=False),
    dict(stop_token_ids=[10**12]),
]


@pytest.mark.parametrize("kw", ODD_BUT_LEGAL, ids=lambda kw: ",".join(f"{k}={v!r}" for k, v in kw.items()))
def test_odd_but_legal_values_run_to_a_stop_reason(tiny_llm, kw):
    kw = {"max_tokens": 6, "ignore_eos": True, **kw}
    outs = tiny_llm.generate(["the fox", "a small bird sang"], SamplingParams(**kw))
    vocab = tiny_llm.model_config.vocab_size
    for out in outs:
        assert out.stop_reason is not None
        assert len(out.token_ids) == 6
        assert all(0 <= t < vocab for t in out.token_ids)
    assert tiny_llm.cache_stats().used_blocks == 0 and not tiny_llm.has_unfinished()
    check_block_invariants(tiny_llm)


def test_huge_presence_penalty_greedy_is_not_nan_order(tiny_llm):
    """A huge presence penalty only forbids repeats: the same tokens as a large finite one,
    all distinct, and not the 0, 1, 2, ... that argmax over NaN logits gives."""
    base = dict(max_tokens=12, temperature=0, ignore_eos=True)
    huge = tiny_llm.generate(["the fox"], SamplingParams(presence_penalty=3e38, **base))[0].token_ids
    large = tiny_llm.generate(["the fox"], SamplingParams(presence_penalty=1e4, **base))[0].token_ids
    assert huge == large
    assert len(set(huge)) == len(huge)
    assert huge[:4] != [0, 1, 2, 3]


def test_huge_negative_frequency_penalty_repeats_the_first_token(tiny_llm):
    """Rewarding repeats without bound: once a token is seen it wins every later step."""
    out = tiny_llm.generate(["the fox"], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True,
                                                        frequency_penalty=-3.4e38))[0].token_ids
    assert out == [out[0]] * 8


def test_a_mutated_params_object_is_impossible_mid_request(tiny_llm):
    p = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    req = tiny_llm.add_request("the fox", p)
    with pytest.raises(AttributeError):
        req.params.max_tokens = 10**6
    while tiny_llm.has_unfinished():
        tiny_llm.step()
    assert len(tiny_llm.output(req.request_id).token_ids) == 4
