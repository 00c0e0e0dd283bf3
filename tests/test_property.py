"""Random add / step / cancel / release sequences under a tiny KV budget (hypothesis), with
exceptions and KeyboardInterrupts injected inside the forward pass and cancels issued from a
second thread.

After every action: blocks in use = blocks held by requests, each block's refcount = the
number of requests holding it (more than one only through the prefix cache), queues hold
exactly the live requests. At the end every request is RELEASED with a stop reason, every
block is free, and every output equals the same request run alone (``minillm.apps.fuzz``; run
``python -m minillm.apps.fuzz --programs 2000 --seed 1`` for many more programs).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from minillm import LLM
from minillm.apps.fuzz import PREFIXES, EngineFuzzer


@pytest.fixture(scope="module")
def engine_factory(model_factory):
    folder, _ = model_factory("llama")
    make = lambda **kw: LLM(str(folder), block_size=4, max_model_len=48, **kw)  # noqa: E731
    return (lambda **kw: make(num_kv_blocks=10, max_num_seqs=4, max_num_batched_tokens=24, **kw),
            lambda: make(num_kv_blocks=64, max_num_seqs=1))


def build_machine(make_llm, make_reference):
    reference = make_reference()  # one engine that runs each request alone, shared by all examples

    class EngineMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.fz = EngineFuzzer(make_llm(), lambda: reference)

        @rule(prefix=st.sampled_from(PREFIXES), tail=st.lists(st.integers(2, 40), min_size=1, max_size=10),
              max_tokens=st.integers(1, 12), temperature=st.sampled_from([0.0, 0.8]),
              seed=st.integers(0, 1000), auto_release=st.booleans())
        def add(self, prefix, tail, max_tokens, temperature, seed, auto_release):
            self.fz.add(prefix + tail, max_tokens, temperature, seed, auto_release)

        @rule(n=st.integers(1, 4))
        def step(self, n):
            self.fz.step(n)

        @rule(index=st.integers(0, 100))
        def cancel(self, index):
            self.fz.cancel(index)

        @rule(index=st.integers(0, 100))
        def release(self, index):
            self.fz.release(index)

        @rule(layer=st.integers(0, 7), interrupt=st.booleans())
        def failing_step(self, layer, interrupt):
            self.fz.failing_step(layer, interrupt)

        @rule(index=st.integers(0, 100), steps=st.integers(1, 3))
        def cancel_from_another_thread(self, index, steps):
            self.fz.cancel_from_thread(index, steps)

        @invariant()
        def blocks_and_queues_are_exact(self):
            self.fz.check()

        def teardown(self):
            self.fz.drain()  # also: every output equals the same request run alone

    return EngineMachine


def test_random_programs_keep_the_invariants_and_the_outputs(engine_factory):
    machine = build_machine(*engine_factory)
    machine.TestCase.settings = settings(max_examples=25, stateful_step_count=25, deadline=None,
                                         suppress_health_check=list(HealthCheck), derandomize=True)
    machine.TestCase().runTest()


def test_random_programs_with_the_cpu_kernel(engine_factory):
    """The same programs with decode attention in the CPU kernel (``attention_backend="kernel"``),
    against the same reference (the default "auto", which is "gather" for this model's 16-wide heads:
    the kernel's vectorised path is for heads of 64 or 128)."""
    from minillm.fast import cpu_kernel

    if not cpu_kernel.available():
        pytest.skip(f"the kernel cannot be built here: {cpu_kernel.unavailable_reason()}")
    make_llm, make_reference = engine_factory
    machine = build_machine(lambda: make_llm(attention_backend="kernel"), make_reference)
    machine.TestCase.settings = settings(max_examples=12, stateful_step_count=25, deadline=None,
                                         suppress_health_check=list(HealthCheck), derandomize=True)
    machine.TestCase().runTest()


def test_random_programs_through_decode_graphs(engine_factory):
    """The same programs with decode-only steps through fixed-shape graphs (``decode_graphs="eager"``:
    padded buffers, scratch-block writes, paged reads), against the same plain reference."""
    make_llm, make_reference = engine_factory
    machine = build_machine(lambda: make_llm(decode_graphs="eager"), make_reference)
    machine.TestCase.settings = settings(max_examples=12, stateful_step_count=25, deadline=None,
                                         suppress_health_check=list(HealthCheck), derandomize=True)
    machine.TestCase().runTest()


def test_random_programs_on_the_reference_path(engine_factory):
    """The same programs on the reference path (``LLM(fast=False)``: the plain runner, the
    one-row sampler, the model's own attention) against the same reference, which runs the
    fast path: the two paths give the same tokens, and the reference keeps every invariant."""
    make_llm, make_reference = engine_factory
    machine = build_machine(lambda: make_llm(fast=False), make_reference)
    machine.TestCase.settings = settings(max_examples=12, stateful_step_count=25, deadline=None,
                                         suppress_health_check=list(HealthCheck), derandomize=True)
    machine.TestCase().runTest()
