"""State the engine keeps on the device from step to step, so that a decode step's host work
does not grow with the requests' histories: the sampler's penalty counts (``PenaltyCounts``)
and the runner's block-table rows (``BlockTableRows``).

Both must give exactly what rebuilding from the requests' tokens and block tables every step
gives, and both must be empty once the requests are gone (finished, cancelled, preempted and
recomputed)."""

from __future__ import annotations

import random

import pytest
import torch

from minillm import LLM, SamplingParams
from minillm.request import Request
from minillm.fast.runner import BlockTableRows, StepUpload
from minillm.fast.sampler import BatchedSampler as Sampler
from minillm.sampler import apply_penalties, finite_or_best, make_generator


# --- penalty counts --------------------------------------------------------------------------
def _random_params(rng: random.Random) -> SamplingParams:
    kind = rng.choice(["none", "rep", "out", "all", "all"])
    kw = dict(temperature=rng.choice([0.0, 0.7, 1.3]))
    if kind in ("rep", "all"):
        kw["repetition_penalty"] = rng.choice([0.8, 1.3, 2.0])
    if kind in ("out", "all"):
        kw["presence_penalty"] = rng.choice([0.0, 0.5, -0.4])
        kw["frequency_penalty"] = rng.choice([0.2, 0.0, 1.1])
    return SamplingParams(**kw)


def _request(rid: str, params: SamplingParams, prompt: list[int], seed: int) -> Request:
    r = Request(rid, None, params, prompt_token_ids=prompt)
    r._generator = make_generator(seed)
    return r


def _reference_tokens(logits: torch.Tensor, reqs: list[Request]) -> list[int]:
    """Row by row with the functional ``apply_penalties`` (greedy rows only: their token is the
    argmax of the penalised logits, nothing random involved)."""
    out = []
    for row, r in zip(logits, reqs):
        x = finite_or_best(apply_penalties(row, r.params, r.prompt_token_ids, r.output_token_ids), row)
        out.append(int(x.argmax()))
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_device_counts_choose_exactly_what_rebuilding_from_the_tokens_chooses(seed):
    """Random programs: requests joining and finishing (rows reused), outputs growing, a step
    whose tokens were never appended (a rollback), a request sampled alone (the per-row retry).
    The incremental sampler picks the same tokens as a fresh sampler rebuilding every count
    from the tokens (same generators), and greedy rows match the functional reference."""
    rng = random.Random(seed)
    vocab = 64
    incremental = Sampler()
    live: list[tuple[Request, Request]] = []  # (request for the incremental sampler, its twin)
    next_id = 0
    for step in range(60):
        while len(live) < 6 and rng.random() < 0.5:
            params = _random_params(rng)
            prompt = [rng.randrange(vocab) for _ in range(rng.randrange(1, 20))]
            s = rng.randrange(1 << 30)
            live.append((_request(str(next_id), params, prompt, s), _request(str(next_id), params, prompt, s)))
            next_id += 1
        if not live:
            continue
        logits = torch.randn(len(live), vocab) * 3
        reqs, twins = [a for a, _ in live], [b for _, b in live]
        if rng.random() < 0.1:  # one request sampled alone, as the runner's per-row retry does
            i = rng.randrange(len(live))
            got = incremental(logits[i:i + 1], [reqs[i]])[0]
            want = Sampler()(logits[i:i + 1], [twins[i]])[0]
            assert got == want
            continue
        got = incremental(logits, reqs)[0]
        want = Sampler()(logits, twins)[0]
        assert got == want, step
        greedy = [i for i, r in enumerate(twins) if r.params.greedy]
        ref = _reference_tokens(logits[greedy], [twins[i] for i in greedy])
        assert [got[i] for i in greedy] == ref
        if rng.random() < 0.1:  # rolled back: the tokens are never appended
            continue
        for (a, b), t in zip(live, got):
            a.output_token_ids.append(t)
            b.output_token_ids.append(t)
        for pair in list(live):
            if rng.random() < 0.08:  # finished
                live.remove(pair)
                incremental.forget(pair[0])
    for a, _ in live:
        incremental.forget(a)
    assert len(incremental.penalty_counts) == 0


def test_counts_on_the_device_match_the_tokens():
    """The row itself: counts of each output token and the seen mask of prompt + output."""
    vocab = 40
    s = Sampler()
    r = _request("a", SamplingParams(temperature=0, repetition_penalty=1.5, frequency_penalty=0.3),
                 [3, 3, 7], 0)
    for _ in range(25):
        r.output_token_ids.append(s.choose(torch.randn(1, vocab), [r]).item())
    state = s.penalty_counts
    row = state.rows[r]
    # the last choice was bumped on the device before anyone appended it: it is counted
    want_counts = torch.bincount(torch.tensor(r.output_token_ids), minlength=vocab).float()
    assert torch.equal(state.counts[row], want_counts)
    want_seen = torch.zeros(vocab, dtype=torch.bool)
    want_seen[r.prompt_token_ids + r.output_token_ids] = True
    assert torch.equal(state.seen[row], want_seen)
    assert state.counts[0].abs().sum() == 0 and not state.seen[0].any()  # the shared zero row


def test_a_penalised_step_uploads_o_rows_values_not_o_context():
    """After a request's first step its counts live on the device: the sampler's upload is
    the per-row parameter block, whatever the history's length."""
    sizes = []
    real = torch.tensor

    def recording(data, *a, **k):
        t = real(data, *a, **k)
        if t.dtype == torch.float64:
            sizes.append(t.numel())
        return t

    s = Sampler()
    reqs = [_request(str(i), SamplingParams(temperature=0.8, repetition_penalty=1.2, presence_penalty=0.3), 
                     list(range(5 + 300 * i)), i) for i in range(3)]
    torch.tensor = recording
    try:
        for _ in range(10):
            for r, t in zip(reqs, s(torch.randn(3, 4096), reqs)[0]):
                r.output_token_ids.append(t)
    finally:
        torch.tensor = real
    assert sizes[0] > 600  # the first step builds the rows from the prompts
    assert sizes[1:] == [3 * 9] * 9  # then 9 parameters per row, nothing else


# --- block-table rows -------------------------------------------------------------------------
class _Req:
    def __init__(self, table):
        self.block_table = table


def _sync(rows: BlockTableRows, reqs) -> tuple[list, StepUpload]:
    up = StepUpload()
    out, part = rows.plan(reqs, len(reqs), up)
    dev = up.send(torch.device("cpu"))
    return out, up, dev, part


def test_block_table_rows_mirror_the_tables_and_send_only_new_blocks():
    rows = BlockTableRows(torch.device("cpu"))
    a, b = _Req([5, 6]), _Req([9])
    out, up, dev, part = _sync(rows, [a, b])
    assert [rows.table[r.index, :len(q.block_table)].tolist() for r, q in zip(out, (a, b))] == [[5, 6], [9]]
    first_size = len(up.data)
    a.block_table.append(7)  # one new block
    out, up, dev, part = _sync(rows, [b, a])
    assert len(up.data) == 2 + 2  # (where, block) of the new block + the two row indices
    assert rows.table[out[1].index, :3].tolist() == [5, 6, 7]
    assert StepUpload.view(dev, part).tolist() == [out[0].index, out[1].index]
    assert first_size > len(up.data)
    # contiguity is tracked incrementally: [5, 6, 7] is consecutive, [9] too
    assert out[1].contiguous == 3 and out[0].contiguous == 1
    a.block_table.append(20)
    _sync(rows, [a])  # b left: its row is recycled
    assert len(rows) == 1 and rows.rows[a].contiguous == 3
    # a preempted and admitted again: a new list, other blocks; a new request takes b's row
    a.block_table.clear()
    a.block_table = [2]
    c = _Req([4, 4 + 1])
    out, up, dev, part = _sync(rows, [a, c])
    assert rows.table[out[0].index].tolist()[:2] == [2, 0]  # the rest of the row reset to the null block
    assert rows.table[out[1].index].tolist()[:3] == [4, 5, 0]
    # tables wider than the tensor, and more rows than it has: it grows, keeping what it holds
    many = [_Req(list(range(100 * i, 100 * i + 40))) for i in range(1, 12)]
    out, _, _, _ = _sync(rows, [a, c] + many)
    for r, q in zip(out, [a, c] + many):
        assert rows.table[r.index, :len(q.block_table)].tolist() == q.block_table
    for q in [a, c] + many:
        rows.forget(q)
    assert len(rows) == 0


def _fresh_every_step(llm):
    """A reference engine: the runner's block-table rows and the sampler's counts rebuilt from
    scratch every step (what the code did before they were kept)."""
    inner = llm.runner.run
    sampler = llm.sampler

    def run(*a, **k):
        llm.runner.block_rows = BlockTableRows(llm.runner.device)
        return inner(*a, **k)

    def sample(logits, reqs):
        sampler.penalty_counts.__init__()
        return sampler(logits, reqs)

    llm.runner.run = run
    llm.sampler = sample


@pytest.mark.parametrize("backend", ["gather", "paged"])
def test_kept_state_gives_the_tokens_of_rebuilding_it_every_step(tiny_llama, backend):
    """A small pool (preemptions with recompute), chunked prefill, a shared prefix (prefix
    caching), penalties and sampling, a cancel mid-decode: the same tokens as an engine that
    rebuilds all of it every step, and nothing left behind in either kept state."""
    outs = []
    for fresh in (False, True):
        llm = LLM(str(tiny_llama[0]), block_size=4, num_kv_blocks=40, max_num_seqs=8,
                  max_num_batched_tokens=32, attention_backend=backend)
        if fresh:
            _fresh_every_step(llm)
        g = torch.Generator().manual_seed(9)
        prefix = torch.randint(2, 320, (16,), generator=g).tolist()
        reqs = []
        for i in range(10):
            tail = torch.randint(2, 320, (int(torch.randint(1, 30, (1,), generator=g)),), generator=g).tolist()
            params = SamplingParams(max_tokens=24, ignore_eos=True, seed=i, temperature=0.0 if i % 3 == 0 else 0.9,
                                    repetition_penalty=1.0 if i % 2 else 1.4,
                                    presence_penalty=0.6 if i % 4 == 1 else 0.0,
                                    frequency_penalty=0.3 if i % 5 == 2 else 0.0)
            reqs.append(llm.add_request(prompt_token_ids=(prefix if i % 2 else []) + tail, params=params))
        steps = 0
        while llm.has_unfinished():
            llm.step()
            steps += 1
            if steps == 12:
                llm.cancel(reqs[4].request_id)
        preempted = sum(r.num_preemptions for r in reqs)
        outs.append([r.output_token_ids for r in reqs])
        if not fresh:
            assert preempted > 0  # the pool is small enough to preempt
            assert len(llm.sampler.penalty_counts) == 0
            assert len(llm.runner.block_rows) == 0
        assert llm.cache_stats().used_blocks == 0
    assert outs[0] == outs[1]


def test_a_step_cut_short_mid_bump_is_rebuilt_next_time(monkeypatch):
    """Ctrl-C can land between the device update of the counts and the host's record of it:
    the row is then rebuilt from the tokens, never trusted half-updated."""
    from minillm.fast.sampler import PenaltyCounts

    params = SamplingParams(temperature=0, repetition_penalty=1.7, frequency_penalty=0.9)
    g = torch.Generator().manual_seed(3)
    r, twin = _request("a", params, [1, 2, 3], 0), _request("a", params, [1, 2, 3], 0)
    s = Sampler()
    for _ in range(3):
        t = s(torch.randn(1, 16, generator=g), [r])[0][0]
        r.output_token_ids.append(t)
        twin.output_token_ids.append(t)

    def half(self, requests, penalised, rows, chosen):
        self.counts.index_put_((rows, chosen), (rows > 0).float(), accumulate=True)
        raise KeyboardInterrupt

    monkeypatch.setattr(PenaltyCounts, "bump", half)
    with pytest.raises(KeyboardInterrupt):
        s(torch.randn(1, 16, generator=g), [r])
    monkeypatch.undo()  # the step is undone: no token appended
    for _ in range(5):
        logits = torch.randn(1, 16, generator=g) * 2
        got, want = s(logits, [r])[0], Sampler()(logits, [twin])[0]
        assert got == want
        r.output_token_ids += got
        twin.output_token_ids += got
    row = s.penalty_counts.rows[r]  # the last bump was the last token appended
    assert torch.equal(s.penalty_counts.counts[row],
                       torch.bincount(torch.tensor(r.output_token_ids), minlength=16).float())


def test_block_rows_planned_but_never_sent_are_sent_next_time():
    """A step cut short between planning and its upload: the next step sends those blocks."""
    rows = BlockTableRows(torch.device("cpu"))
    a = _Req([3, 4])
    _sync(rows, [a])
    a.block_table += [8, 9]
    rows.plan([a], 1, StepUpload())  # planned, never sent
    out, up, dev, part = _sync(rows, [a])
    assert rows.table[out[0].index, :4].tolist() == [3, 4, 8, 9]
