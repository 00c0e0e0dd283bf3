"""A step is a transaction: Ctrl-C (a real SIGINT) or an exception raised inside the model at
any moment leaves the engine so that stepping on gives exactly the uninterrupted outputs,
later requests with the same prompts are right (the prefix cache holds no unwritten block),
and no KV block is left held."""

from __future__ import annotations

import os
import random
import signal
import threading
import time

import pytest

from minillm import LLM, RequestState, SamplingParams, StopReason
from minillm.fast import cpu_kernel
from conftest import check_block_invariants

PROMPTS = [[5 + (i * 7 + j) % 300 for j in range(n)] for i, n in enumerate((9, 23, 14, 31))]
SHARED = [[40, 41, 42, 43, 44, 45, 46, 47] + p for p in ([60, 61], [70, 71, 72])]  # a shared prefix


def _params(i: int) -> SamplingParams:
    if i % 2:
        return SamplingParams(max_tokens=10, temperature=0.9, top_k=50, seed=100 + i, ignore_eos=True)
    return SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def make_llm(model_factory):
    folder, _ = model_factory("llama")
    return lambda **kw: LLM(str(folder), block_size=4, num_kv_blocks=48, max_num_seqs=4, max_num_batched_tokens=16,
                            **kw)


def _add_all(llm, prompts):
    return [llm.add_request(prompt_token_ids=p, params=_params(i)) for i, p in enumerate(prompts)]


def _drive(llm, armed=None) -> int:
    """Step to the end, catching every KeyboardInterrupt like a learner re-running the cell.
    ``armed["on"]`` is switched on, and off once there is no work left, inside the loop's
    ``try`` (the handler disarms itself as it raises), so a signal arriving anywhere else is
    ignored instead of hitting the test's code."""
    caught = 0
    while True:
        try:
            if armed is not None and llm.has_unfinished():
                armed["on"] = True  # (re-)armed inside the try: no signal can hit the caller's code
            if not llm.has_unfinished():
                if armed is not None:
                    armed["on"] = False
                return caught
            llm.step()
        except KeyboardInterrupt:
            caught += 1


@pytest.fixture(scope="module")
def reference(make_llm):
    llm = make_llm()
    reqs = _add_all(llm, PROMPTS + SHARED)
    _drive(llm)
    return [r.output_token_ids for r in reqs]


def _raise_when_armed(armed):
    """What Python's default SIGINT handler does (raise KeyboardInterrupt), while armed. It disarms
    itself as it raises, so a second signal cannot land in the ``except`` of ``_drive`` before
    the loop is back inside its ``try`` (where it re-arms)."""
    def handler(signum, frame):
        if armed["on"]:
            armed["on"] = False
            raise KeyboardInterrupt
    return handler


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="needs the main thread")
@pytest.mark.parametrize("decode_graphs,attention", [(False, "reference"), (False, "auto"), ("eager", "auto"),
                                                     (False, "kernel"), ("compile", "kernel")])
def test_real_sigint_at_random_moments_never_changes_an_output(make_llm, reference, decode_graphs, attention):
    """24 runs, each hit by 3 real SIGINTs at random moments (a handler that raises
    KeyboardInterrupt exactly as Python's default one does, switched off once the run is done);
    also with decode-only steps through fixed-shape graphs (``minillm.fast.decode_graphs``), eager and
    compiled ahead of time (one engine serves every run there: compiling is slow, and an
    interrupted engine must be as good as new), and with decode attention in the CPU kernel (a
    SIGINT during the C call, or inside a compiled graph calling it, is raised when it returns),
    against the same plain reference; and on the reference path itself (``LLM(fast=False)``)."""
    if attention == "kernel" and not cpu_kernel.available():
        pytest.skip(f"the kernel cannot be built here: {cpu_kernel.unavailable_reason()}")
    rng = random.Random(0)
    rolled_back = interrupted = 0
    kw = {"fast": False} if attention == "reference" else {"decode_graphs": decode_graphs, "attention_backend": attention}
    make = lambda: make_llm(**kw)  # noqa: E731
    if decode_graphs == "compile":
        shared = make()
        assert shared.warmup() > 0 and shared.runner.graphs.compiler == "aot"
        make = lambda: shared  # noqa: E731
    # how long an uninterrupted run takes, so the signals land inside it
    llm = make()
    t0 = time.perf_counter()
    _add_all(llm, PROMPTS + SHARED)
    _drive(llm)
    span = time.perf_counter() - t0
    armed = {"on": False}
    previous = signal.signal(signal.SIGINT, _raise_when_armed(armed))
    try:
        for trial in range(24):
            llm = make()
            reqs = _add_all(llm, PROMPTS + SHARED)
            timers = [threading.Timer(rng.uniform(0, span), os.kill, (os.getpid(), signal.SIGINT))
                      for _ in range(3)]
            for t in timers:
                t.start()
            interrupted += _drive(llm, armed)
            for t in timers:
                t.join()
            _check_trial(llm, reqs, reference, trial)
            rolled_back += sum(1 for e in llm.trace if e.kind == "transition" and e.data.get("rolled_back"))
    finally:
        signal.signal(signal.SIGINT, previous)
    assert interrupted > 0  # the signals did arrive (24 x 3 of them)


def _check_trial(llm, reqs, reference, trial):
    assert [r.output_token_ids for r in reqs] == reference, f"trial {trial}"
    assert all(r.state == RequestState.RELEASED and r.stop_reason == StopReason.MAX_TOKENS for r in reqs)
    assert llm.cache_stats().used_blocks == 0
    # the same prompts again hit the prefix cache: the cached blocks must be real
    again = _add_all(llm, PROMPTS + SHARED)
    _drive(llm)
    assert [r.output_token_ids for r in again] == reference, f"trial {trial}, after"
    assert llm.cache_stats().used_blocks == 0
    check_block_invariants(llm)


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="needs the main thread")
@pytest.mark.parametrize("kw", [{"fast": False}, {}, {"decode_graphs": "eager"}])
def test_a_sigint_handled_only_as_the_forward_pass_closes_still_undoes_the_step(make_llm, reference, monkeypatch, kw):
    """Python runs a signal's handler at the next bytecode where it checks for one, and after a
    long C call (a compiled graph) that can be the first bytecode of ``StepInterrupts.close()``:
    the step must be undone then too (CI once saw seeded rows' generators left advanced by a step
    that was dropped, with compiled graphs and the kernel). Here the handler is run exactly
    there, every third step, instead of waiting for a timer to hit that window."""
    from minillm.engine import StepInterrupts

    real_close, count = StepInterrupts.close, {"n": 0}

    def close_with_a_signal_at_its_entry(self):
        count["n"] += 1
        if count["n"] % 3 == 0 and self._previous is not None:
            self._handle(signal.SIGINT, None)
        real_close(self)

    monkeypatch.setattr(StepInterrupts, "close", close_with_a_signal_at_its_entry)
    armed = {"on": False}
    previous = signal.signal(signal.SIGINT, _raise_when_armed(armed))
    try:
        llm = make_llm(**kw)
        reqs = _add_all(llm, PROMPTS + SHARED)
        assert _drive(llm, armed) > 0
        monkeypatch.undo()
        _check_trial(llm, reqs, reference, 0)
    finally:
        signal.signal(signal.SIGINT, previous)


class Boom(Exception):
    pass


@pytest.mark.skipif(threading.current_thread() is not threading.main_thread(), reason="needs the main thread")
def test_a_sigint_during_the_rollback_of_a_failed_step_does_not_cut_it_short(make_llm, reference, monkeypatch):
    """A model error undoes the step; Ctrl-C pressed while that happens must not stop the undoing
    halfway (it is dropped: the step raises its own error)."""
    llm = make_llm()
    reqs = _add_all(llm, PROMPTS + SHARED)
    llm.step()
    real_run, real_rollback = llm.runner.run, llm.scheduler.rollback

    def fail(*a, **k):
        raise Boom("model down")

    def rollback_hit_by_a_signal(batch):
        signal.raise_signal(signal.SIGINT)  # its handler runs here, before the rollback
        real_rollback(batch)

    armed = {"on": True}
    previous = signal.signal(signal.SIGINT, _raise_when_armed(armed))
    try:
        monkeypatch.setattr(llm.runner, "run", fail)
        monkeypatch.setattr(llm.scheduler, "rollback", rollback_hit_by_a_signal)
        with pytest.raises(Boom):
            llm.step()
    finally:
        signal.signal(signal.SIGINT, previous)
    monkeypatch.setattr(llm.runner, "run", real_run)
    monkeypatch.setattr(llm.scheduler, "rollback", real_rollback)
    check_block_invariants(llm)
    _drive(llm)
    _check_trial(llm, reqs, reference, 0)


@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
def test_exceptions_inside_the_forward_pass_are_rolled_back(make_llm, reference, monkeypatch, exc):
    rng = random.Random(1 if exc is Boom else 2)
    for trial in range(6):
        llm = make_llm()
        layers = llm.model.model.layers
        calls = {"n": 0}
        fail_at = set(rng.sample(range(1, 40), 5))

        def wrap(layer_forward, index, calls=calls, fail_at=fail_at):
            def forward(*args, **kwargs):
                calls["n"] += 1
                if calls["n"] in fail_at:
                    raise exc(f"injected in layer {index}")
                return layer_forward(*args, **kwargs)
            return forward

        for i, layer in enumerate(layers):
            monkeypatch.setattr(layer, "forward", wrap(layer.forward, i))
        reqs = _add_all(llm, PROMPTS + SHARED)
        failures = 0
        while llm.has_unfinished():
            try:
                llm.step()
            except (Boom, KeyboardInterrupt):
                failures += 1
                check_block_invariants(llm)
        assert failures == len([n for n in fail_at if n <= calls["n"]])
        assert [r.output_token_ids for r in reqs] == reference, f"trial {trial}"
        again = _add_all(llm, PROMPTS + SHARED)
        while llm.has_unfinished():
            llm.step()
        assert [r.output_token_ids for r in again] == reference
        assert llm.cache_stats().used_blocks == 0
        monkeypatch.undo()


def test_a_rolled_back_prefill_goes_back_to_waiting_with_its_blocks_freed(make_llm, monkeypatch):
    llm = make_llm()
    req = llm.add_request(prompt_token_ids=PROMPTS[1], params=_params(0))

    def fail(*a, **k):
        raise Boom("model down")

    monkeypatch.setattr(llm.runner, "run", fail)
    with pytest.raises(Boom):
        llm.step()
    assert req.state == RequestState.WAITING and not req.block_table and req.num_computed_tokens == 0
    assert req.first_scheduled_time is None
    assert llm.cache_stats().used_blocks == 0 and list(llm.scheduler.waiting) == [req]
    last = llm.trace[-1]
    assert last.data["from"] == "PREFILL" and last.data["to"] == "WAITING" and last.data["rolled_back"]
    monkeypatch.undo()
    while llm.has_unfinished():
        llm.step()
    assert req.stop_reason == StopReason.MAX_TOKENS and len(req.output_token_ids) == 10


def test_a_request_whose_sampling_raises_ends_alone(make_llm, monkeypatch):
    llm = make_llm()
    good = llm.add_request(prompt_token_ids=PROMPTS[0], params=_params(0))
    bad = llm.add_request(prompt_token_ids=PROMPTS[2], params=_params(1))
    real = llm.sampler.__class__.__call__

    def picky(self, logits, reqs):
        if bad in reqs:
            raise FloatingPointError("this request's parameters overflow")
        return real(self, logits, reqs)

    monkeypatch.setattr(llm.sampler.__class__, "__call__", picky)
    while llm.has_unfinished():
        llm.step()
    assert bad.stop_reason == StopReason.CANCELLED and "overflow" in bad.error and not bad.block_table
    finished = [e for e in llm.trace if e.request_id == bad.request_id and e.data.get("to") == "FINISHED"]
    assert "overflow" in finished[0].data["error"]
    assert good.stop_reason == StopReason.MAX_TOKENS and len(good.output_token_ids) == 10
    assert llm.cache_stats().used_blocks == 0
