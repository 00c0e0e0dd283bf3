"""Random add / step / cancel / release sequences under a tiny KV budget (hypothesis).

After every action: blocks in use = blocks held by requests, each block's refcount = the
number of requests holding it (more than one only through the prefix cache), queues hold
exactly the live requests. At the end every request is RELEASED with a stop reason and
every block is free.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from minillm import LLM, RequestState, SamplingParams
from conftest import check_block_invariants

S = RequestState


@pytest.fixture(scope="module")
def engine_factory(model_factory):
    folder, _ = model_factory("llama")
    return lambda: LLM(str(folder), block_size=4, num_kv_blocks=10, max_num_seqs=4,
                       max_num_batched_tokens=24, max_model_len=48)


def build_machine(make_llm):
    class EngineMachine(RuleBasedStateMachine):
        def __init__(self):
            super().__init__()
            self.llm = make_llm()
            self.ids: list[str] = []

        @rule(prefix=st.sampled_from([[], [5, 6, 7, 8], [5, 6, 7, 8, 9, 10, 11, 12]]),
              tail=st.lists(st.integers(2, 40), min_size=1, max_size=10),
              max_tokens=st.integers(1, 12), temperature=st.sampled_from([0.0, 0.8]),
              auto_release=st.booleans())
        def add(self, prefix, tail, max_tokens, temperature, auto_release):
            params = SamplingParams(max_tokens=max_tokens, temperature=temperature, ignore_eos=True, seed=len(self.ids))
            req = self.llm.add_request(prompt_token_ids=prefix + tail, params=params, auto_release=auto_release)
            self.ids.append(req.request_id)

        @rule(n=st.integers(1, 4))
        def step(self, n):
            for _ in range(n):
                self.llm.step()

        @precondition(lambda self: self.ids)
        @rule(data=st.data())
        def cancel(self, data):
            self.llm.cancel(data.draw(st.sampled_from(self.ids)))

        @precondition(lambda self: any(self.llm.requests[i].state == S.FINISHED for i in self.ids))
        @rule(data=st.data())
        def release(self, data):
            done = [i for i in self.ids if self.llm.requests[i].state == S.FINISHED]
            self.llm.release(data.draw(st.sampled_from(done)))

        @invariant()
        def blocks_match_holders(self):
            check_block_invariants(self.llm)

        @invariant()
        def queues_hold_exactly_the_scheduled_requests(self):
            sched = self.llm.scheduler
            queued = [r.request_id for r in sched.waiting] + [r.request_id for r in sched.running]
            assert len(queued) == len(set(queued))
            for rid in self.ids:
                req = self.llm.requests[rid]
                assert (rid in queued) == (req.state in (S.WAITING, S.PREEMPTED, S.PREFILL, S.DECODE)), req
                if req.state in (S.WAITING, S.PREEMPTED):
                    assert not req.block_table
                if req.state == S.FINISHED:
                    assert req.stop_reason is not None and not req.auto_release

        def teardown(self):
            # finished-but-unreleased requests hold blocks that waiting ones may need: release as we go
            for _ in range(1000):
                for rid in self.ids:
                    if self.llm.requests[rid].state == S.FINISHED:
                        self.llm.release(rid)
                if not self.llm.has_unfinished():
                    break
                self.llm.step()
                check_block_invariants(self.llm)
            for rid in self.ids:
                req = self.llm.requests[rid]
                assert req.state == S.RELEASED and req.stop_reason is not None, req
            check_block_invariants(self.llm)
            assert self.llm.cache_stats().used_blocks == 0

    return EngineMachine


def test_random_add_step_cancel_keep_the_block_invariants(engine_factory):
    machine = build_machine(engine_factory)
    machine.TestCase.settings = settings(max_examples=25, stateful_step_count=25, deadline=None,
                                         suppress_health_check=list(HealthCheck), derandomize=True)
    machine.TestCase().runTest()
