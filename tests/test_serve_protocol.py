"""OpenAI bodies -> engine inputs, without a server: the checks that need no HTTP."""

from __future__ import annotations

import pytest

pytest.importorskip("fastapi")

from minillm import SamplingParams, StopReason  # noqa: E402
from minillm.apps.serve import protocol as P  # noqa: E402


def test_completion_body_becomes_the_engine_s_sampling_params():
    parsed = P.parse_completion({"prompt": "hi", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "seed": 3,
                                 "stop": ["."], "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.2,
                                 "ignore_eos": True, "stop_token_ids": [4], "presence_penalty": 0.5,
                                 "frequency_penalty": 0.25, "stream": True,
                                 "stream_options": {"include_usage": True}, "user": "ignored"})
    p = parsed.params
    assert isinstance(p, SamplingParams)
    assert (p.max_tokens, p.temperature, p.top_p, p.seed, list(p.stop_strings), p.top_k, p.min_p) == \
        (7, 0.5, 0.9, 3, ["."], 5, 0.1)
    assert p.repetition_penalty == 1.2 and p.ignore_eos and list(p.stop_token_ids) == [4]
    assert p.presence_penalty == 0.5 and p.frequency_penalty == 0.25
    assert parsed.stream and parsed.include_usage and parsed.prompt == "hi" and parsed.top_logprobs is None


def test_prompt_forms():
    assert P.parse_completion({"prompt": ["hi"]}).prompt == "hi"
    assert P.parse_completion({"prompt": [1, 2, 3]}).prompt_token_ids == [1, 2, 3]
    assert P.parse_completion({"prompt": [[1, 2]]}).prompt_token_ids == [1, 2]
    for bad in ("", [], ["a", "b"], [1, "x"], [True], None, 5):
        with pytest.raises(P.BadRequest) as info:
            P.parse_completion({"prompt": bad})
        assert info.value.param == "prompt"


@pytest.mark.parametrize("body,param", [({"top_p": 0}, "top_p"), ({"temperature": "hot"}, "temperature"),
                                        ({"max_tokens": -1}, "max_tokens"), ({"seed": 1.5}, "seed"),
                                        ({"stop": [""]}, "stop"), ({"n": 3}, "n"), ({"stream": "yes"}, "stream"),
                                        ({"logprobs": 99}, "logprobs"), ({"echo": True}, "echo"),
                                        ({"stream_options": 1}, "stream_options")])
def test_bad_fields_name_themselves(body, param):
    with pytest.raises(P.BadRequest) as info:
        P.parse_completion({"prompt": "hi", **body})
    assert info.value.param == param and param in str(info.value)


def test_chat_body():
    encode = lambda msgs: [1] * (3 * len(msgs))  # noqa: E731
    parsed = P.parse_chat({"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 2},
                          max_model_len=100, encode=encode)
    assert parsed.prompt_token_ids == [1, 1, 1] and parsed.params.max_tokens == 97  # the rest of the context
    assert parsed.params.logprobs == 2 and parsed.top_logprobs == 2
    assert P.parse_chat({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 5},
                        100, encode).params.max_tokens == 5
    for body, param in [({"messages": []}, "messages"), ({"messages": [{"role": "x", "content": "y"}]}, "messages"),
                        ({"messages": [{"role": "user", "content": "y"}], "top_logprobs": 2}, "top_logprobs"),
                        ({"messages": [{"role": "user", "content": "y"}], "logprobs": 3}, "logprobs")]:
        with pytest.raises(P.BadRequest) as info:
            P.parse_chat(body, 100, encode)
        assert info.value.param == param


def test_finish_reasons_cover_every_stop_reason():
    assert set(P.FINISH_REASONS) == set(StopReason)
    assert P.finish_fields(StopReason.MAX_TOKENS) == {"finish_reason": "length", "minillm_stop_reason": "MAX_TOKENS"}
    assert P.finish_fields(StopReason.EOS)["finish_reason"] == "stop"
    assert P.finish_fields(StopReason.CANCELLED)["finish_reason"] == "abort"
    assert P.finish_fields(None) == {"finish_reason": None}
    assert P.usage(3, 4) == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
