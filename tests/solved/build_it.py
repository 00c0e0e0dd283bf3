"""Reference solutions of the build-it track (course/ch04/06b_build_it): kept out of the
installed package, like the other solved exercises. tests/test_build_it.py checks that each
gets full marks and that seeded bugs in each are caught with a short shrunk program."""

from __future__ import annotations

import torch

from minillm.request import RequestState as S
from minillm.request import StopReason

# (a) the request state machine's legal moves
MY_TRANSITIONS = {
    S.NEW: {S.WAITING, S.FINISHED},
    S.WAITING: {S.PREFILL, S.FINISHED},
    S.PREFILL: {S.PREFILL, S.DECODE, S.WAITING, S.PREEMPTED, S.FINISHED},
    S.DECODE: {S.PREEMPTED, S.FINISHED},
    S.PREEMPTED: {S.PREFILL, S.FINISHED},
    S.FINISHED: {S.RELEASED},
    S.RELEASED: set(),
}


# (b) a block pool with reference counts and free
class MyBlockPool:
    def __init__(self, num_blocks):
        self.free_ids = list(range(num_blocks))
        self.counts = [0] * num_blocks

    def allocate(self, n):
        if n > len(self.free_ids):
            raise RuntimeError(f"{n} blocks asked, {len(self.free_ids)} free")
        taken, self.free_ids = self.free_ids[:n], self.free_ids[n:]
        for b in taken:
            self.counts[b] = 1
        return taken

    def share(self, block_id):
        self.counts[block_id] += 1

    def free(self, block_ids):
        for b in block_ids:
            self.counts[b] -= 1
            if self.counts[b] == 0:
                self.free_ids.append(b)

    def num_free(self):
        return len(self.free_ids)

    def ref_count(self, block_id):
        return self.counts[block_id]


# (c) one engine step over the engine's own pieces
def my_step(llm):
    batch = llm.scheduler.schedule()
    for req in batch.context_full:
        llm.scheduler.finish(req, StopReason.CONTEXT_FULL)
    if batch:
        logits = llm.runner.run(batch.decodes, batch.prefills, batch.prefill_chunks)
        token_ids, logprobs, errors = llm.runner.sample(llm.sampler, logits, batch.sampled)
        llm.scheduler.update_from_output(batch, token_ids, logprobs, errors)
    return batch


# (d) top-k and top-p on one row of logits
def my_top_k_filter(logits, k):
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.sort(logits, descending=True).values[k - 1]
    return logits.masked_fill(logits < kth, float("-inf"))


def my_top_p_filter(logits, p):
    values, order = torch.sort(logits, descending=True)
    probs = values.softmax(-1)
    before = probs.cumsum(-1) - probs
    drop = before >= p
    drop[0] = False
    out = logits.clone()
    out[order[drop]] = float("-inf")
    return out
