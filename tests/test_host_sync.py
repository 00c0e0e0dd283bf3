"""How often a step makes the host and the device wait for each other.

On a GPU every device->host transfer (``.item()``, ``.tolist()``, ``bool(tensor)``, ...) stalls
the host until the device has caught up, and every host->device tensor is a copy that must be
queued; a decode step should have one of the first (the chosen ids) and at most two of the
second (the step's indices, the sampler's parameters). On the CPU the same calls are counted
with a ``TorchFunctionMode`` around the two parts of a step that touch device tensors
(``ModelRunner.run`` and ``ModelRunner.sample``): a host->device copy is a tensor made from
host data *for the engine's device* (``torch.tensor(..., device=...)``, ``.to(device)``);
tensors the sampler builds for the host (the log-probability table) pass no device. Wherever CUDA
is available (whatever ``MINILLM_TEST_DEVICE`` says) one decode step also runs under
``torch.cuda.set_sync_debug_mode``.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torch.overrides import TorchFunctionMode

from minillm import LLM, SamplingParams

DEVICE_TO_HOST = {"item", "tolist", "cpu", "numpy", "__bool__", "__float__", "__int__", "__index__"}
CREATE_FROM_DATA = {"tensor", "as_tensor", "asarray", "from_numpy"}


class TransferCounter(TorchFunctionMode):
    """Counts device->host reads and host->device tensor creations/copies (and the number of
    values each host->device copy carries, in ``h2d_sizes``)."""

    def __init__(self):
        super().__init__()
        self.d2h: list[str] = []
        self.h2d: list[str] = []
        self.h2d_sizes: list[int] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        out = func(*args, **kwargs)
        if name in DEVICE_TO_HOST:
            self.d2h.append(name)
        elif name in CREATE_FROM_DATA and kwargs.get("device") is not None:
            self.h2d.append(name)
            self.h2d_sizes.append(out.numel())
        elif name in ("to", "cuda") and (kwargs.get("device") is not None
                                          or any(isinstance(a, (str, torch.device)) for a in args[1:])):
            self.h2d.append(name)
            self.h2d_sizes.append(args[0].numel())
        return out


def _count_steps(llm, steps, sizes=None):
    """Per step: (d2h, h2d, kinds) counted inside the runner's run and sample; the sizes of
    the step's host->device copies are appended to ``sizes`` when given."""
    runner = llm.runner
    real_run, real_sample = runner.run, runner.sample
    counter = TransferCounter()

    def run(*a, **k):
        with counter:
            return real_run(*a, **k)

    def sample(*a, **k):
        with counter:
            return real_sample(*a, **k)

    runner.run, runner.sample = run, sample
    out = []
    try:
        for _ in range(steps):
            if not llm.has_unfinished():
                break
            counter.d2h.clear(), counter.h2d.clear(), counter.h2d_sizes.clear()
            events = llm.step()
            step = [e for e in events if e.kind == "step"][0].data
            out.append((list(counter.d2h), list(counter.h2d), step))
            if sizes is not None:
                sizes.append(list(counter.h2d_sizes))
    finally:
        runner.run, runner.sample = real_run, real_sample
    return out


SETTINGS = {
    "greedy": dict(temperature=0),
    "sampled": dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.02),
    "logprobs": dict(temperature=0.8, top_p=0.9, logprobs=5),
    "greedy_logprobs": dict(temperature=0, logprobs=3),
    "penalties": dict(temperature=0.7, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.2),
}


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_a_step_of_16_requests_transfers_at_most_once_each_way(tiny_llama, setting):
    llm = LLM(str(tiny_llama[0]), block_size=4, num_kv_blocks=256, max_num_seqs=16)
    g = torch.Generator().manual_seed(3)
    for i in range(16):  # contexts of different lengths: several decode groups, padding masks
        prompt = torch.randint(2, 320, (3 + 5 * i,), generator=g).tolist()
        llm.add_request(prompt_token_ids=prompt,
                        params=SamplingParams(max_tokens=12, ignore_eos=True, seed=i, **SETTINGS[setting]))
    steps = _count_steps(llm, 40)
    decode_only = [s for s in steps if s[2]["num_prefill"] == 0 and s[2]["num_decode"] == 16]
    assert len(decode_only) >= 5
    for d2h, h2d, step in steps:  # prefill steps too
        assert len(d2h) <= 1, (step, d2h)
        assert len(h2d) <= 2, (step, h2d)
    assert all(len(d2h) == 1 for d2h, _, _ in decode_only)
    if setting.startswith("greedy"):  # nothing for the sampler to send: only the step's indices go up
        assert all(len(h2d) == 1 for _, h2d, _ in decode_only)


@pytest.mark.parametrize("setting", sorted(SETTINGS))
def test_what_a_decode_step_uploads_does_not_grow_with_the_context(tiny_llama, setting):
    """16 requests decoding at contexts ~20 and the same ones ~150 tokens longer (a whole number
    of blocks, so new blocks are needed at the same steps): every decode step uploads exactly
    as many values either way. The block tables live on the device (only new blocks go up),
    the penalty counts too (only the per-row parameters go up)."""
    per_shift = {}
    for shift in (0, 152):
        llm = LLM(str(tiny_llama[0]), block_size=4, num_kv_blocks=1024, max_num_seqs=16,
                  enable_prefix_caching=False)
        g = torch.Generator().manual_seed(4)
        for i in range(16):
            prompt = torch.randint(2, 320, (shift + 6 + (i % 5),), generator=g).tolist()
            llm.add_request(prompt_token_ids=prompt,
                            params=SamplingParams(max_tokens=16, ignore_eos=True, seed=i, **SETTINGS[setting]))
        sizes = []
        steps = _count_steps(llm, 40, sizes)
        per_shift[shift] = [sz for sz, (_, _, step) in zip(sizes, steps)
                            if step["num_prefill"] == 0 and step["num_decode"] == 16]
        for d2h, h2d, step in steps:
            assert len(d2h) <= 1 and len(h2d) <= 2, (step, d2h, h2d)
    assert len(per_shift[0]) >= 10
    assert per_shift[0] == per_shift[152]
    # and it is O(rows): a few values per request (ids, positions, slots, lengths, rows, parameters)
    assert max(sum(s) for s in per_shift[0]) <= 16 * (6 + 9) + 16 * 2


def test_counter_sees_what_it_counts():
    """The instrument itself: the calls it should count are counted, host-only work is not."""
    c = TransferCounter()
    t = torch.ones(3)
    with c:
        t.tolist(), t.sum().item(), bool(t.any()), float(t[0])
        torch.tensor([1, 2], device="cpu"), t.to("cpu")
        torch.tensor([1, 2]), torch.full((2,), 1.0)
    assert len(c.d2h) == 4 and len(c.h2d) == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (scripts/gpu_check.sh runs it)")
def test_cuda_decode_step_synchronises_once(tiny_llama):
    llm = LLM(str(tiny_llama[0]), device="cuda", block_size=4, num_kv_blocks=256, max_num_seqs=16)
    for i in range(16):
        llm.add_request(prompt_token_ids=list(range(2, 5 + 3 * i)),
                        params=SamplingParams(max_tokens=8, ignore_eos=True, seed=i, temperature=0.8,
                                              top_p=0.9, logprobs=2))
    while any(r.state.value != "DECODE" for r in llm.requests.values()):
        llm.step()
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            llm.step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message).lower()]
    assert len(syncs) <= 1, [str(w.message) for w in syncs]
