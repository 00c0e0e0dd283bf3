"""The engine loop alone (no HTTP): one thread steps the engine; streams, cancels, limits."""

from __future__ import annotations


import pytest

from minillm import SamplingParams, StopReason
from minillm.apps.serve.engine_loop import EngineLoop, Overloaded, ShuttingDown


def _params(n):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def test_streams_finish_cancel_lands_and_nothing_is_held(tiny_llm, run_async):
    loop = EngineLoop(tiny_llm, max_waiting=8).start()

    async def run():
        a = loop.submit("a", _params(12), prompt_token_ids=[5, 6, 7])
        b = loop.submit("b", _params(200), prompt_token_ids=[8, 9])
        assert await a.accepted == 3 and await b.accepted == 2
        got_a = [u async for u in a.updates()]
        seen = 0
        async for u in b.updates():
            seen += len(u.token_ids)
            if seen >= 3 and u.stop_reason is None:
                loop.cancel("b")
        return got_a, b

    got_a, b = run_async(run())
    assert sum(len(u.token_ids) for u in got_a) == 12 and got_a[-1].num_output_tokens == 12
    assert got_a[-1].stop_reason == StopReason.MAX_TOKENS and all(u.stop_reason is None for u in got_a[:-1])
    assert b.stop_reason == StopReason.CANCELLED
    snap = loop.stop()
    assert not loop.alive and snap["requests"] == [] and snap["kv_cache"]["used_blocks"] == 0
    assert tiny_llm.cache_stats().used_blocks == 0


def test_the_waiting_queue_is_bounded_and_shutdown_refuses(tiny_llm, run_async):
    loop = EngineLoop(tiny_llm, max_waiting=2)  # not started: nothing is admitted yet

    async def run():
        loop.submit("x", _params(4), prompt_token_ids=[1, 2])
        loop.submit("y", _params(4), prompt_token_ids=[1, 2])
        with pytest.raises(Overloaded, match="max-waiting 2"):
            loop.submit("z", _params(4), prompt_token_ids=[1, 2])
        assert loop.snapshot()["waiting"] == 2
        loop.begin_shutdown()
        with pytest.raises(ShuttingDown):
            loop.submit("w", _params(4), prompt_token_ids=[1, 2])

    run_async(run())
    loop.start()
    snap = loop.stop()
    assert snap["kv_cache"]["used_blocks"] == 0 and snap["waiting"] == 0


def test_an_engine_refusal_reaches_the_stream(tiny_llm, run_async):
    loop = EngineLoop(tiny_llm).start()

    async def run():
        s = loop.submit("long", _params(4), prompt_token_ids=[3] * (tiny_llm.max_model_len + 5))
        with pytest.raises(ValueError, match="max_model_len"):
            await s.accepted

    run_async(run())
    assert loop.stop()["waiting"] == 0


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "8"])
def test_max_waiting_is_checked(tiny_llm, bad):
    with pytest.raises(ValueError, match="max_waiting"):
        EngineLoop(tiny_llm, max_waiting=bad)


def test_the_gauges_are_set_before_the_snapshot_is_published(tiny_llm, run_async):
    """A client that reads a snapshot (no request left, say) and then /metrics must find gauges
    at least as new: the course's service notebook reads them in that order."""
    seen = []

    class Observer:
        def on_step(self, snap):  # what a reader of /v1/engine/requests sees while the gauges change
            seen.append((snap["steps"], loop.snapshot()["steps"]))

        def on_finish(self, req, stop_reason, timings):
            pass

        def on_reject(self):
            pass

    loop = EngineLoop(tiny_llm, observer=Observer()).start()

    async def run():
        s = loop.submit("a", _params(3), prompt_token_ids=[5, 6, 7])
        return [u async for u in s.updates()]

    run_async(run())
    loop.stop()
    # each publish that follows a step: the snapshot readers see is still the one before it
    after_a_step = [(new, visible) for (before, _), (new, visible) in zip([(0, 0)] + seen, seen) if new > before]
    assert len(after_a_step) >= 3
    assert all(visible < new for new, visible in after_a_step), after_a_step
