"""The paged KV cache: a fixed pool of blocks, and the allocator that hands them out.

Memory for keys and values is allocated once, up front, as one pool per layer of shape
``[num_blocks, block_size, num_kv_heads, head_dim]`` (one for K, one for V). A request owns
a *block table*: the list of block ids that hold its tokens, in order. Token ``i`` of a
request lives in block ``block_table[i // block_size]`` at offset ``i % block_size``.

The allocator keeps a free list and a reference count per block. Prefix caching: a block
that is full gets a hash chained over its tokens and its parent's hash, so two requests
whose prompts start with the same full blocks share those blocks (refcount > 1). A freed
block keeps its hash until it is handed out again, so a later request can still hit it.

Costs do not depend on the pool size: the free list is ordered (blocks without a cached
prefix first, then cached ones from least to most recently freed, so eviction is LRU), and
reviving a cached free block removes it from the middle of that list in O(1). Block hashes
can be computed once per block and kept by the caller (``hash_blocks``): every method that
needs them takes an optional ``block_hashes`` list, extends it with any block not hashed yet,
and never hashes a block twice.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import asdict, dataclass

import torch


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes of K and V one token needs across all layers: 2 x layers x kv_heads x head_dim x bytes."""
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


def block_hash(token_ids: list[int], parent_hash: bytes | None) -> bytes:
    """Hash of one full block, chained over its parent so equal blocks at different
    positions (after different prefixes) never collide."""
    h = hashlib.blake2b(digest_size=16)
    h.update(parent_hash or b"root")
    h.update(b",".join(str(t).encode() for t in token_ids))
    return h.digest()


def hash_blocks(token_ids: list[int], block_size: int, hashes: list[bytes]) -> list[bytes]:
    """Extend ``hashes`` (the chained hashes of the first ``len(hashes)`` full blocks of
    ``token_ids``) with the hashes of the blocks that are full now. Returns ``hashes``.

    Kept on the request and passed back on every call, this hashes each block exactly once
    over the request's life, however often admission and commits look at it."""
    for i in range(len(hashes), len(token_ids) // block_size):
        parent = hashes[i - 1] if i else None
        hashes.append(block_hash(token_ids[i * block_size:(i + 1) * block_size], parent))
    return hashes


@dataclass
class CacheStats:
    """A snapshot of the pool. ``used_bytes`` is block-granular: a block is reserved whole."""

    total_blocks: int
    used_blocks: int
    free_blocks: int
    block_size: int
    bytes_per_token: int
    used_bytes: int
    total_bytes: int
    cached_blocks: int  # free blocks that still hold a reusable prefix (prefix cache)

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.bytes_per_token

    @property
    def usage(self) -> float:
        return self.used_blocks / self.total_blocks if self.total_blocks else 0.0

    def as_dict(self) -> dict:
        return asdict(self)


class BlockAllocator:
    """Free list + reference counts + prefix-cache index over ``num_blocks`` block ids.

    State, all O(1) to update:

    - ``ref_count[b]``: how many block tables hold block ``b`` (0 = free);
    - ``free_ids``: the free blocks in the order they are handed out (an ``OrderedDict`` used
      as an ordered set: first the blocks with no cached prefix, then the cached ones, least
      recently freed first);
    - ``block_hashes[b]``: the hash of the full block ``b`` holds, or None;
    - ``hash_to_block``: hash -> the one block registered for it (the prefix index).

    When two requests compute the same full block in the same step (neither could hit the
    other's), the first commit registers its block; the second request's copy keeps its hash
    for chaining but is not registered: it stays private to that request, is never counted
    as cached, and goes to the front of the free list (reused first) when freed.
    """

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_count = [0] * num_blocks
        self.block_hashes: list[bytes | None] = [None] * num_blocks
        self.hash_to_block: dict[bytes, int] = {}
        self.free_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.num_used = 0  # blocks with a reference count above 0
        self._num_cached_free = 0  # free blocks registered in the prefix index

    # --- counts --------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return self.num_blocks - self.num_used

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _is_registered(self, block_id: int) -> bool:
        h = self.block_hashes[block_id]
        return h is not None and self.hash_to_block.get(h) == block_id

    # --- allocation ----------------------------------------------------------------------
    def _take_free(self) -> int:
        block_id, _ = self.free_ids.popitem(last=False)
        old = self.block_hashes[block_id]
        if old is not None:  # evict the cached prefix this free block still carried
            del self.hash_to_block[old]  # a free block with a hash is always the registered one
            self.block_hashes[block_id] = None
            self._num_cached_free -= 1
        self.ref_count[block_id] = 1
        self.num_used += 1
        return block_id

    def _share(self, block_id: int) -> None:
        if self.ref_count[block_id] == 0:
            del self.free_ids[block_id]  # revive a cached free block: O(1)
            self.num_used += 1
            self._num_cached_free -= 1
        self.ref_count[block_id] += 1

    def _hashes(self, token_ids: list[int], block_hashes: list[bytes] | None, num_blocks: int) -> list[bytes]:
        """Hashes of the first ``num_blocks`` full blocks: from (and into) ``block_hashes``
        when given, else computed afresh (and then only as many as asked for)."""
        if block_hashes is None:
            return hash_blocks(token_ids[:num_blocks * self.block_size], self.block_size, [])
        if len(block_hashes) < num_blocks:
            hash_blocks(token_ids, self.block_size, block_hashes)
        return block_hashes

    def match_prefix(self, token_ids: list[int], block_hashes: list[bytes] | None = None) -> list[int]:
        """Block ids of the longest run of full blocks of ``token_ids`` already cached.
        At least one token is always left uncached, so the model still produces logits.
        ``block_hashes``: the request's own list of block hashes (see ``hash_blocks``)."""
        if not self.enable_prefix_caching:
            return []
        max_blocks = (len(token_ids) - 1) // self.block_size
        if max_blocks <= 0:
            return []
        hits: list[int] = []
        if block_hashes is None:  # hash lazily: stop at the first miss
            parent = None
            for i in range(max_blocks):
                parent = block_hash(token_ids[i * self.block_size:(i + 1) * self.block_size], parent)
                block_id = self.hash_to_block.get(parent)
                if block_id is None:
                    break
                hits.append(block_id)
            return hits
        hashes = self._hashes(token_ids, block_hashes, max_blocks)
        for i in range(max_blocks):
            block_id = self.hash_to_block.get(hashes[i])
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def _fits(self, token_ids: list[int], hits: list[int]) -> bool:
        """Whether the blocks ``token_ids`` needs beyond its cached ``hits`` are free, counting
        the hits that are free themselves (cached, nobody holds them) as taken."""
        need = -(-len(token_ids) // self.block_size) - len(hits)
        for b in hits:
            need += self.ref_count[b] == 0
        return need <= self.num_blocks - self.num_used

    def can_allocate(self, token_ids: list[int], block_hashes: list[bytes] | None = None) -> bool:
        return self._fits(token_ids, self.match_prefix(token_ids, block_hashes))

    def allocate(self, token_ids: list[int], block_hashes: list[bytes] | None = None) -> tuple[list[int], int]:
        """Blocks for a whole context. Returns (block_table, number of tokens found cached)."""
        hits = self.match_prefix(token_ids, block_hashes)
        if not self._fits(token_ids, hits):
            raise RuntimeError("not enough free KV blocks (call can_allocate first)")
        for block_id in hits:
            self._share(block_id)
        table = list(hits)
        for _ in range(-(-len(token_ids) // self.block_size) - len(hits)):
            table.append(self._take_free())
        return table, len(hits) * self.block_size

    def append_slot(self, block_table: list[int], num_tokens: int) -> bool:
        """Make room for token number ``num_tokens`` (0-based); False if the pool is empty."""
        if num_tokens < len(block_table) * self.block_size:
            return True
        if self.num_used == self.num_blocks:
            return False
        block_table.append(self._take_free())
        return True

    def commit_full_blocks(self, block_table: list[int], token_ids: list[int], num_computed: int,
                           block_hashes: list[bytes] | None = None) -> None:
        """Register every block that is now full and computed in the prefix index. A block
        whose hash is already registered to another block stays private (see the class
        docstring), so ``cached_blocks`` counts each prefix once."""
        if not self.enable_prefix_caching:
            return
        num_full = min(num_computed // self.block_size, len(block_table))
        hashes = None if block_hashes is None else self._hashes(token_ids, block_hashes, num_full)
        parent = None
        for i in range(num_full):
            block_id = block_table[i]
            known = self.block_hashes[block_id]
            if known is not None:
                parent = known
                continue
            if hashes is not None:
                parent = hashes[i]
            else:
                parent = block_hash(token_ids[i * self.block_size:(i + 1) * self.block_size], parent)
            self.block_hashes[block_id] = parent
            self.hash_to_block.setdefault(parent, block_id)

    def free(self, block_table: list[int]) -> None:
        """Drop one reference to each block; blocks that reach zero go back to the free list.
        Blocks are returned in reverse so a request's last (least shareable) blocks are
        reused first and its prefix stays cached longest."""
        for block_id in reversed(block_table):
            self.ref_count[block_id] -= 1
            if self.ref_count[block_id] < 0:
                raise RuntimeError(f"block {block_id} freed more often than allocated")
            if self.ref_count[block_id] == 0:
                self.num_used -= 1
                h = self.block_hashes[block_id]
                if h is not None and self.hash_to_block.get(h) == block_id:  # the registered one
                    self.free_ids[block_id] = None  # keep cached prefixes for last (LRU end)
                    self._num_cached_free += 1
                else:
                    self.block_hashes[block_id] = None  # a private duplicate: nothing to keep
                    self.free_ids[block_id] = None
                    self.free_ids.move_to_end(block_id, last=False)
        block_table.clear()

    def num_cached_free(self) -> int:
        """Free blocks that still hold a reusable prefix (kept as a count, O(1))."""
        return self._num_cached_free

    def check_invariants(self) -> None:
        """Check every piece of bookkeeping against the others (O(pool size): for tests).
        Raises AssertionError saying what disagrees."""
        n = self.num_blocks
        assert len(self.ref_count) == n and len(self.block_hashes) == n, "per-block arrays have the wrong length"
        negative = [b for b in range(n) if self.ref_count[b] < 0]
        assert not negative, f"negative refcounts on blocks {negative}"
        free = [b for b in range(n) if self.ref_count[b] == 0]
        assert set(self.free_ids) == set(free), (
            f"free list {sorted(self.free_ids)} != blocks with refcount 0 {free}")
        assert self.num_used == n - len(free), f"num_used {self.num_used} but {n - len(free)} blocks are held"
        assert len(self.free_ids) == self.num_free, f"free list has {len(self.free_ids)}, num_free {self.num_free}"
        for h, b in self.hash_to_block.items():
            assert 0 <= b < n and self.block_hashes[b] == h, f"index maps a hash to block {b}, which holds another"
        if not self.enable_prefix_caching:
            assert not self.hash_to_block, "prefix caching is off but the index is not empty"
        unregistered_free = [b for b in free if self.block_hashes[b] is not None and not self._is_registered(b)]
        assert not unregistered_free, f"free blocks {unregistered_free} keep a hash nobody can hit"
        cached = sum(1 for b in free if self._is_registered(b))
        assert self._num_cached_free == cached, f"cached_blocks is {self._num_cached_free}, really {cached}"
        order = [self._is_registered(b) for b in self.free_ids]
        assert order == sorted(order), "a free block without a cached prefix sits behind a cached one"


class KVCache:
    """The pool tensors (one K and one V per layer) plus the allocator that manages them."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device,
                 enable_prefix_caching: bool = True, scratch_block: bool = False, allocator=None,
                 zeros=torch.zeros):
        self.num_layers = num_layers
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        # scratch_block: one more block in the pool that the allocator never hands out, where the
        # padding rows of a fixed-shape decode graph write their K/V (``minillm.fast.decode_graphs``)
        self.scratch_slot = num_blocks * block_size if scratch_block else None
        shape = (num_blocks + int(scratch_block), block_size, num_kv_heads, head_dim)
        # zeros, not empty: attention reads padded slots under a mask, and a masked weight of 0
        # times a NaN left in uninitialised memory would still be NaN. (``zeros``: the fast
        # layer passes one that asks for huge pages, ``minillm.fast.huge_pages``.)
        self.k = [zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self._total_bytes = sum(t.numel() * t.element_size() for t in self.k + self.v)
        # allocator: another object with BlockAllocator's methods (``minillm.seams.PooledAllocator``)
        self.allocator = allocator or BlockAllocator(num_blocks, block_size, enable_prefix_caching)
        self.bytes_per_token = kv_bytes_per_token(
            num_layers, num_kv_heads, head_dim, torch.empty((), dtype=dtype).element_size()
        )

    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    @property
    def total_bytes(self) -> int:
        return self._total_bytes

    def stats(self) -> CacheStats:
        a = self.allocator
        block_bytes = self.block_size * self.bytes_per_token
        return CacheStats(
            total_blocks=a.num_blocks,
            used_blocks=a.num_used,
            free_blocks=a.num_free,
            block_size=self.block_size,
            bytes_per_token=self.bytes_per_token,
            used_bytes=a.num_used * block_bytes,
            total_bytes=self.total_bytes,
            cached_blocks=a.num_cached_free(),
        )
