"""The paged KV cache: a fixed pool of blocks, and the allocator that hands them out.

Memory for keys and values is allocated once, up front, as one pool per layer of shape
``[num_blocks, block_size, num_kv_heads, head_dim]`` (one for K, one for V). A request owns
a *block table*: the list of block ids that hold its tokens, in order. Token ``i`` of a
request lives in block ``block_table[i // block_size]`` at offset ``i % block_size``.

The allocator keeps a free list and a reference count per block. Prefix caching: a block
that is full gets a hash chained over its tokens and its parent's hash, so two requests
whose prompts start with the same full blocks share those blocks (refcount > 1). A freed
block keeps its hash until it is handed out again, so a later request can still hit it.
"""

from __future__ import annotations

import hashlib
from collections import deque
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
    """Free list + reference counts + prefix-cache index over ``num_blocks`` block ids."""

    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1:
            raise ValueError(f"num_kv_blocks must be >= 1, got {num_blocks}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_count = [0] * num_blocks
        self.block_hashes: list[bytes | None] = [None] * num_blocks
        self.hash_to_block: dict[bytes, int] = {}
        self.free_ids: deque[int] = deque(range(num_blocks))
        self._num_used = 0
        self._num_cached_free = 0  # free blocks that still carry a prefix hash

    # --- counts --------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return self.num_blocks - self._num_used

    @property
    def num_used(self) -> int:
        return self._num_used

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # --- allocation ----------------------------------------------------------------------
    def _take_free(self) -> int:
        block_id = self.free_ids.popleft()
        old = self.block_hashes[block_id]
        if old is not None:  # evict the cached prefix this free block still carried
            if self.hash_to_block.get(old) == block_id:
                del self.hash_to_block[old]
            self.block_hashes[block_id] = None
            self._num_cached_free -= 1
        self.ref_count[block_id] = 1
        self._num_used += 1
        return block_id

    def _share(self, block_id: int) -> None:
        if self.ref_count[block_id] == 0:
            self.free_ids.remove(block_id)  # revive a cached free block
            self._num_used += 1
            self._num_cached_free -= 1
        self.ref_count[block_id] += 1

    def match_prefix(self, token_ids: list[int]) -> list[int]:
        """Block ids of the longest run of full blocks of ``token_ids`` already cached.
        At least one token is always left uncached, so the model still produces logits."""
        if not self.enable_prefix_caching:
            return []
        hits: list[int] = []
        parent = None
        max_blocks = (len(token_ids) - 1) // self.block_size
        for i in range(max_blocks):
            chunk = token_ids[i * self.block_size:(i + 1) * self.block_size]
            parent = block_hash(chunk, parent)
            block_id = self.hash_to_block.get(parent)
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def can_allocate(self, token_ids: list[int]) -> bool:
        hits = self.match_prefix(token_ids)
        revived = sum(1 for b in hits if self.ref_count[b] == 0)
        need = self.blocks_needed(len(token_ids)) - len(hits)
        return need + revived <= self.num_free

    def allocate(self, token_ids: list[int]) -> tuple[list[int], int]:
        """Blocks for a whole context. Returns (block_table, number of tokens found cached)."""
        hits = self.match_prefix(token_ids)
        if not self.can_allocate(token_ids):
            raise RuntimeError("not enough free KV blocks (call can_allocate first)")
        for block_id in hits:
            self._share(block_id)
        table = list(hits)
        for _ in range(self.blocks_needed(len(token_ids)) - len(hits)):
            table.append(self._take_free())
        return table, len(hits) * self.block_size

    def append_slot(self, block_table: list[int], num_tokens: int) -> bool:
        """Make room for token number ``num_tokens`` (0-based); False if the pool is empty."""
        if num_tokens < len(block_table) * self.block_size:
            return True
        if self.num_free == 0:
            return False
        block_table.append(self._take_free())
        return True

    def commit_full_blocks(self, block_table: list[int], token_ids: list[int], num_computed: int) -> None:
        """Register every block that is now full and computed in the prefix index."""
        if not self.enable_prefix_caching:
            return
        parent = None
        for i in range(num_computed // self.block_size):
            block_id = block_table[i]
            known = self.block_hashes[block_id]
            if known is not None:
                parent = known
                continue
            chunk = token_ids[i * self.block_size:(i + 1) * self.block_size]
            parent = block_hash(chunk, parent)
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
                self._num_used -= 1
                if self.block_hashes[block_id] is not None:
                    self.free_ids.append(block_id)  # keep cached prefixes for last
                    self._num_cached_free += 1
                else:
                    self.free_ids.appendleft(block_id)
        block_table.clear()

    def num_cached_free(self) -> int:
        """Free blocks that still hold a reusable prefix (kept as a count, O(1))."""
        return self._num_cached_free


class KVCache:
    """The pool tensors (one K and one V per layer) plus the allocator that manages them."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                 head_dim: int, dtype: torch.dtype, device: torch.device,
                 enable_prefix_caching: bool = True):
        self.num_layers = num_layers
        self.block_size = block_size
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dtype = dtype
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        # zeros, not empty: attention reads padded slots under a mask, and a masked weight of 0
        # times a NaN left in uninitialised memory would still be NaN
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.allocator = BlockAllocator(num_blocks, block_size, enable_prefix_caching)
        self.bytes_per_token = kv_bytes_per_token(
            num_layers, num_kv_heads, head_dim, torch.empty((), dtype=dtype).element_size()
        )

    @property
    def num_blocks(self) -> int:
        return self.allocator.num_blocks

    @property
    def total_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.k + self.v)

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
