"""One LLM shared by threads: public methods are serialised by the engine's lock, so two
threads' generate() calls each get exactly their single-threaded tokens, and a cancel from
another thread takes effect between two steps."""

from __future__ import annotations

import threading
import time

import pytest

from minillm import LLM, RequestState, SamplingParams, StopReason
from conftest import check_block_invariants

PROMPTS = {
    "a": ["Once upon a time there was", "The robot found a shiny key", "Mia and her dog"],
    "b": ["A small bird sang", "the fox lived in a green forest near a river", "the waves were big"],
}


def _params(thread: str) -> list[SamplingParams]:
    return [SamplingParams(max_tokens=12, temperature=0.0 if i % 2 == 0 else 0.8, seed=i + (10 if thread == "b" else 0),
                           ignore_eos=True) for i in range(3)]


@pytest.fixture(scope="module")
def make_llm(model_factory):
    folder, _ = model_factory("llama")
    return lambda: LLM(str(folder), block_size=4, num_kv_blocks=40, max_num_seqs=4, max_num_batched_tokens=24)


def test_two_threads_generating_on_one_engine_get_their_single_threaded_tokens(make_llm):
    alone = {}
    for name, prompts in PROMPTS.items():
        alone[name] = [o.token_ids for o in make_llm().generate(prompts, _params(name))]
    for trial in range(5):
        llm = make_llm()
        got, errors = {}, []
        start = threading.Barrier(2)

        def work(name, llm=llm, got=got, errors=errors, start=start):
            try:
                start.wait()
                got[name] = [o.token_ids for o in llm.generate(PROMPTS[name], _params(name))]
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in PROMPTS]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not errors, errors
        assert got == alone, f"trial {trial}"
        assert llm.cache_stats().used_blocks == 0
        check_block_invariants(llm)
        # the two generations really ran side by side in shared steps at least once
        steps = [e for e in llm.trace if e.kind == "step"]
        assert len(llm.requests) == 6 and steps


def test_cancel_from_another_thread_takes_effect_between_steps(make_llm):
    llm = make_llm()
    req = llm.add_request("Once upon a time", SamplingParams(max_tokens=200, temperature=0.0, ignore_eos=True))
    result = {}

    def run():
        result["out"] = llm.generate(["The robot found"], SamplingParams(max_tokens=40, temperature=0.0,
                                                                         ignore_eos=True))

    t = threading.Thread(target=run)
    t.start()
    while len(req.output_token_ids) < 3:
        time.sleep(0.001)
        if not t.is_alive():
            llm.step()
    llm.cancel(req.request_id)
    # returned: cancelled and freed, whatever the other thread is doing
    assert req.state == RequestState.RELEASED and req.stop_reason == StopReason.CANCELLED and not req.block_table
    t.join(60)
    assert result["out"][0].stop_reason == StopReason.MAX_TOKENS and len(result["out"][0].token_ids) == 40
    assert llm.cache_stats().used_blocks == 0


def test_streams_in_two_threads(make_llm):
    llm = make_llm()
    ref = make_llm().generate(PROMPTS["a"][:2], [SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)] * 2)
    texts = {}

    def work(i):
        texts[i] = "".join(llm.stream(PROMPTS["a"][i], SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert [texts[0], texts[1]] == [o.text for o in ref]
    assert llm.cache_stats().used_blocks == 0
