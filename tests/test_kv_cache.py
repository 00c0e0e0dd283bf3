"""The block allocator on its own: ordered free list (LRU eviction, O(1) revival), hashes
computed once per block, honest cached_blocks counts, and the invariants under random use."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import minillm.kv_cache as kv
from minillm import LLM
from minillm.kv_cache import BlockAllocator, block_hash, hash_blocks

BS = 4


def test_hash_blocks_extends_only_with_new_full_blocks():
    tokens = list(range(10))
    hashes: list[bytes] = []
    assert hash_blocks(tokens, BS, hashes) is hashes and len(hashes) == 2
    assert hashes[0] == block_hash(tokens[:4], None)
    assert hashes[1] == block_hash(tokens[4:8], hashes[0])
    first = list(hashes)
    hash_blocks(tokens + [10, 11], BS, hashes)
    assert hashes[:2] == first and len(hashes) == 3
    assert hashes[2] == block_hash([8, 9, 10, 11], hashes[1])


def test_the_same_block_after_a_different_prefix_hashes_differently():
    a = hash_blocks([1, 2, 3, 4, 9, 9, 9, 9], BS, [])
    b = hash_blocks([5, 6, 7, 8, 9, 9, 9, 9], BS, [])
    assert a[1] != b[1]


def _served(alloc, tokens, hashes=None):
    """Allocate, 'compute' and commit a whole prompt, as the engine does; returns the table."""
    table, cached = alloc.allocate(tokens, hashes)
    alloc.commit_full_blocks(table, tokens, len(tokens), hashes)
    return table, cached


def test_a_freed_prefix_is_hit_and_revived():
    alloc = BlockAllocator(8, BS)
    prompt = list(range(9))  # 2 full blocks + 1 token
    table, cached = _served(alloc, prompt)
    assert cached == 0
    alloc.free(table)
    assert alloc.num_cached_free() == 2
    table2, cached2 = alloc.allocate(prompt)
    assert cached2 == 8 and table2[:2] == [b for b in table2[:2] if alloc.ref_count[b] == 1]
    assert alloc.num_cached_free() == 0
    alloc.check_invariants()


def test_eviction_is_lru_and_uncached_blocks_go_first():
    alloc = BlockAllocator(6, BS)
    a, _ = _served(alloc, [1] * 5)      # 1 full block + 1 partial
    b, _ = _served(alloc, [2] * 5)
    alloc.free(a)                        # a's full block freed first: least recently used
    alloc.free(b)
    alloc.check_invariants()
    order = list(alloc.free_ids)
    cached = [x for x in order if alloc.block_hashes[x] is not None]
    assert cached == [a_full := alloc.hash_to_block[block_hash([1] * 4, None)], alloc.hash_to_block[block_hash([2] * 4, None)]]
    assert order[-2:] == cached          # uncached (partial and never-used) blocks first
    # taking 5 blocks evicts a's prefix (the LRU one) and keeps b's
    taken = [alloc._take_free() for _ in range(5)]
    assert a_full in taken
    assert alloc.match_prefix([1] * 5) == [] and len(alloc.match_prefix([2] * 5)) == 1
    alloc.check_invariants()


def test_block_hashes_are_computed_once(monkeypatch):
    calls = []
    real = kv.block_hash
    monkeypatch.setattr(kv, "block_hash", lambda t, p: calls.append(1) or real(t, p))
    alloc = BlockAllocator(64, BS)
    prompt = list(range(40))  # 10 full blocks
    hashes: list[bytes] = []
    assert alloc.can_allocate(prompt, hashes)
    alloc.match_prefix(prompt, hashes)
    table, _ = alloc.allocate(prompt, hashes)
    alloc.commit_full_blocks(table, prompt, len(prompt), hashes)
    assert len(calls) == 10 and len(hashes) == 10
    # decoding: each new full block is hashed once more, nothing else
    tokens = prompt + [1, 2, 3, 4]
    alloc.append_slot(table, len(tokens) - 1)
    alloc.commit_full_blocks(table, tokens, len(tokens), hashes)
    assert len(calls) == 11
    alloc.free(table)
    alloc.check_invariants()


def test_with_and_without_a_hash_list_the_results_agree():
    prompts = [list(range(13)), list(range(9)) + [7, 7, 7, 7], list(range(4)) + [5] * 9]
    with_list, without = BlockAllocator(32, BS), BlockAllocator(32, BS)
    for p in prompts:
        t1, c1 = _served(with_list, p, [])
        t2, c2 = _served(without, p)
        assert (t1, c1) == (t2, c2)
    assert with_list.hash_to_block == without.hash_to_block
    assert with_list.num_cached_free() == without.num_cached_free()


def test_same_prefix_computed_twice_in_one_step_is_counted_once():
    """Both requests were admitted before either committed, so neither could hit the other:
    the second copy stays private and the cache counts the prefix once."""
    alloc = BlockAllocator(16, BS)
    prompt = list(range(9))
    t1, _ = alloc.allocate(prompt)
    t2, _ = alloc.allocate(prompt)
    assert set(t1).isdisjoint(t2)
    alloc.commit_full_blocks(t1, prompt, len(prompt))
    alloc.commit_full_blocks(t2, prompt, len(prompt))
    alloc.check_invariants()
    alloc.free(t1)
    alloc.free(t2)
    alloc.check_invariants()
    assert alloc.num_cached_free() == 2  # the two full blocks of the prefix, once
    t3, cached = alloc.allocate(prompt)
    assert cached == 8 and alloc.num_cached_free() == 0
    alloc.free(t3)
    alloc.check_invariants()


def test_prefix_caching_off_never_indexes():
    alloc = BlockAllocator(8, BS, enable_prefix_caching=False)
    t, cached = _served(alloc, list(range(9)), [])
    alloc.free(t)
    assert cached == 0 and not alloc.hash_to_block and alloc.num_cached_free() == 0
    alloc.check_invariants()


def test_check_invariants_catches_corruption():
    alloc = BlockAllocator(8, BS)
    t, _ = _served(alloc, list(range(9)))
    alloc.check_invariants()
    alloc.ref_count[t[0]] = 0  # "free" but not on the free list
    with pytest.raises(AssertionError, match="free list"):
        alloc.check_invariants()
    alloc.ref_count[t[0]] = 1
    alloc._num_cached_free += 1
    with pytest.raises(AssertionError, match="cached_blocks"):
        alloc.check_invariants()


def test_not_enough_blocks_raises_and_changes_nothing():
    alloc = BlockAllocator(2, BS)
    assert not alloc.can_allocate(list(range(9)))
    with pytest.raises(RuntimeError, match="can_allocate"):
        alloc.allocate(list(range(9)))
    assert alloc.num_free == 2
    alloc.check_invariants()


class AllocatorMachine(RuleBasedStateMachine):
    """Random admissions (sharing prefixes on purpose), decode growth, commits and frees;
    after every rule all bookkeeping agrees and every held request's blocks are its own."""

    def __init__(self):
        super().__init__()
        self.alloc = BlockAllocator(12, BS)
        self.live: list[dict] = []

    @rule(prefix=st.sampled_from([(), (1, 2, 3, 4), (1, 2, 3, 4, 5, 6, 7, 8), (9, 9, 9, 9)]),
          tail=st.lists(st.integers(0, 3), min_size=1, max_size=6), keep_hashes=st.booleans(),
          commit_now=st.booleans())
    def admit(self, prefix, tail, keep_hashes, commit_now):
        tokens = list(prefix) + tail
        hashes = [] if keep_hashes else None
        if not self.alloc.can_allocate(tokens, hashes):
            return
        table, cached = self.alloc.allocate(tokens, hashes)
        assert cached % BS == 0 and cached < len(tokens)
        req = dict(tokens=tokens, table=table, hashes=hashes, committed=False)
        if commit_now:
            self._commit(req)
        self.live.append(req)

    def _commit(self, req):
        self.alloc.commit_full_blocks(req["table"], req["tokens"], len(req["tokens"]), req["hashes"])
        req["committed"] = True

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def commit(self, i):
        self._commit(self.live[i % len(self.live)])

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100), token=st.integers(0, 3))
    def decode(self, i, token):
        req = self.live[i % len(self.live)]
        if self.alloc.append_slot(req["table"], len(req["tokens"])):
            req["tokens"].append(token)
            self._commit(req)

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def finish(self, i):
        req = self.live.pop(i % len(self.live))
        self.alloc.free(req["table"])

    @invariant()
    def bookkeeping_agrees(self):
        self.alloc.check_invariants()
        holders: dict[int, int] = {}
        for req in self.live:
            assert len(req["table"]) == self.alloc.blocks_needed(len(req["tokens"]))
            for b in req["table"]:
                holders[b] = holders.get(b, 0) + 1
        for b in range(self.alloc.num_blocks):
            assert self.alloc.ref_count[b] == holders.get(b, 0)

    @invariant()
    def hits_hold_the_right_tokens(self):
        """A block registered for a hash holds the tokens that hash names (through a live
        committed request that owns it)."""
        for req in self.live:
            if not req["committed"]:
                continue
            for i, b in enumerate(req["table"][:len(req["tokens"]) // BS]):
                h = self.alloc.block_hashes[b]
                assert h == hash_blocks(req["tokens"], BS, [])[i]


AllocatorMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=30, deadline=None,
                                              suppress_health_check=[HealthCheck.too_slow])
test_allocator_random_programs = AllocatorMachine.TestCase


def _never_asked(nbytes):
    raise AssertionError("the reference path asked for huge pages")


def _thp_mode() -> str | None:
    """The system's transparent huge page setting ("always", "madvise", "never"), None off Linux."""
    from pathlib import Path

    f = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not f.exists():
        return None
    return f.read_text().split("[")[1].split("]")[0]


@pytest.mark.skipif(_thp_mode() in (None, "never"), reason="no transparent huge pages on this system")
def test_the_fast_layers_kv_pool_asks_for_huge_pages_and_the_reference_pool_does_not(tiny_llama, monkeypatch):
    """The fast layer's pool is advised MADV_HUGEPAGE before it is first touched (so the attention
    kernel's reads of scattered blocks walk fewer page tables); the reference path's is plain
    ``torch.zeros``. Both are zeroed pools of the same shape."""
    from minillm.fast import huge_pages

    pool = huge_pages.zeros((8, 16, 2, 64 * 1024), torch.float32, torch.device("cpu"))  # 64 MiB
    assert pool.shape == (8, 16, 2, 64 * 1024) and pool.dtype == torch.float32 and not pool.any()
    assert huge_pages.advised(pool), "the pool's mapping does not carry the huge-page advice"
    small = huge_pages.zeros((4, 4), torch.float32, torch.device("cpu"))
    assert not small.any() and not huge_pages.advised(small)  # below MIN_BYTES: left alone
    args = dict(model=str(tiny_llama[0]), device="cpu", dtype="float32", num_kv_blocks=8192, block_size=16)
    fast = LLM(**args)
    assert fast.kv_cache.k[0].numel() * 4 >= huge_pages.MIN_BYTES  # big enough to be advised
    assert all(huge_pages.advised(t) for t in fast.kv_cache.k + fast.kv_cache.v)
    assert not any(t.any() for t in fast.kv_cache.k + fast.kv_cache.v)
    # the reference path never asks (whether its memory carries the advice is not asked of smaps: in a long
    # test process another mapping's advice is not this path's doing, and a full-suite run once saw one)
    monkeypatch.setattr(huge_pages, "arena", _never_asked)
    ref = LLM(fast=False, **args)
    assert ref.kv_cache.k[0].shape == fast.kv_cache.k[0].shape and not any(t.any() for t in ref.kv_cache.k)


@pytest.mark.skipif(_thp_mode() in (None, "never"), reason="no transparent huge pages on this system")
def test_rehome_moves_weights_into_huge_pages_keeping_values_layout_and_ties():
    """``huge_pages.rehome`` copies a module's parameters and buffers into one advised arena: the
    same objects, values, shapes and strides (a transposed layout stays transposed), a tied weight
    still one tensor, and a storage two tensors share left where it is (copying either would
    untie them)."""
    from minillm.fast import huge_pages

    g = torch.Generator().manual_seed(0)
    m = torch.nn.Module()
    m.a = torch.nn.Linear(512, 1024, bias=True)
    m.b = torch.nn.Linear(1024, 512, bias=False)
    m.tied = torch.nn.Linear(1024, 512, bias=False)
    m.tied.weight = m.b.weight                                   # one Parameter in two modules
    m.t = torch.nn.Parameter(torch.randn(2048, 1024, generator=g).t(), requires_grad=False)  # transposed layout
    base = torch.randn(4096, 256, generator=g)
    m.register_buffer("half1", base[:2048])                      # two views of one storage
    m.register_buffer("half2", base[2048:])
    m.register_buffer("q", torch.randint(-127, 128, (1024, 1024), dtype=torch.int8, generator=g))
    before = {name: (t.clone(), t.stride(), t.data_ptr()) for name, t in
              list(m.named_parameters(remove_duplicate=False)) + list(m.named_buffers())}
    objects = {name: t for name, t in list(m.named_parameters(remove_duplicate=False)) + list(m.named_buffers())}
    assert huge_pages.rehome(m) >= huge_pages.MIN_BYTES
    for name, t in list(m.named_parameters(remove_duplicate=False)) + list(m.named_buffers()):
        value, stride, ptr = before[name]
        assert t is objects[name] and torch.equal(t, value) and t.stride() == stride, name
        moved = t.data_ptr() != ptr
        assert moved == (name not in ("half1", "half2")), name
        if moved:
            assert huge_pages.advised(t), f"{name} is not in the advised arena"
    assert m.tied.weight is m.b.weight and m.tied.weight.data_ptr() == m.b.weight.data_ptr()
    assert m.half2.data_ptr() == m.half1.data_ptr() + 2048 * 256 * 4  # still one storage
    small = torch.nn.Linear(4, 4)
    assert huge_pages.rehome(small) == 0  # below MIN_BYTES: left alone


@pytest.mark.skipif(_thp_mode() in (None, "never"), reason="no transparent huge pages on this system")
def test_the_fast_layer_keeps_weights_in_huge_pages_and_the_reference_path_does_not(tmp_path, monkeypatch):
    """A model above ``MIN_BYTES``: ``LLM()`` (fast layer, CPU) holds every weight in the advised
    arena, ``LLM(fast=False)`` holds them as loaded; the same greedy tokens either way."""
    from minillm import SamplingParams
    from minillm.fast import huge_pages

    from conftest import make_model

    folder = tmp_path
    make_model(folder, "llama", hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
               num_attention_heads=8, num_key_value_heads=4, vocab_size=4096)
    fast = LLM(str(folder), "cpu", "float32")
    assert sum(p.numel() * 4 for p in fast.model.parameters()) >= huge_pages.MIN_BYTES
    assert all(huge_pages.advised(p) for p in fast.model.parameters())
    monkeypatch.setattr(huge_pages, "arena", _never_asked)  # the reference path never asks
    ref = LLM(str(folder), "cpu", "float32", fast=False)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    prompts = ["hello there", "a b c d e f g h"]
    assert ([o.token_ids for o in fast.generate(prompts, params)] ==
            [o.token_ids for o in ref.generate(prompts, params)])
