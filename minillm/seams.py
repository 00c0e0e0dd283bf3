"""Seams: the places where a part written outside the engine replaces the engine's own.

The build-it notebook (``course/ch04/06b_build_it``) has the learner write four parts of the
engine. Each plugs in through one argument, ``LLM(parts=EngineParts(...))``, and everything
else (the scheduler, the model, every widget that is handed the engine) then runs on it:

- ``transitions``: a table ``{state: set of next states}`` that guards every move of every
  request, in place of ``request.TRANSITIONS``;
- ``block_pool``: a class ``BlockPool(num_blocks)`` that keeps reference counts and a free
  list (the protocol below); the engine wraps it in :class:`PooledAllocator`, which adds
  block tables and prefix sharing;
- ``step``: a function ``step(llm) -> ScheduledBatch``: one iteration (schedule, run,
  sample, stop, release) over ``llm.scheduler``, ``llm.runner`` and ``llm.sampler``;
- ``top_k_filter`` / ``top_p_filter``: one-row filters ``(logits[vocab], k or p) -> logits``
  the sampler applies to each sampled request instead of its batched, shared-sort filters.

A part left as None is the engine's own. The seams cost nothing when unused: the default
engine takes exactly the path it takes without them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, runtime_checkable

from .kv_cache import hash_blocks


@runtime_checkable
class BlockPool(Protocol):
    """What ``EngineParts.block_pool`` builds: ``BlockPool(num_blocks)`` over block ids
    ``0 .. num_blocks - 1``, every block free at first.

    ``ref_count(b)`` is how many block tables hold block ``b``: 0 means free. The engine asks
    ``num_free()`` before it allocates, so ``allocate`` may raise when asked for more."""

    def allocate(self, n: int) -> list[int]:
        """``n`` free blocks, each now held once (reference count 1)."""

    def share(self, block_id: int) -> None:
        """One more holder of a block that is already held (another request's prefix)."""

    def free(self, block_ids: list[int]) -> None:
        """One holder fewer for each block; a block nobody holds any more is free again."""

    def num_free(self) -> int:
        """How many blocks are free."""

    def ref_count(self, block_id: int) -> int:
        """How many holders block ``block_id`` has."""


class RefCountPool:
    """The engine's own ``BlockPool``: a list of free ids and a list of counts. The grader
    runs it beside a learner's pool, so both engines schedule alike."""

    def __init__(self, num_blocks: int):
        self._free = list(range(num_blocks - 1, -1, -1))  # pop() hands out block 0 first
        self._count = [0] * num_blocks

    def allocate(self, n: int) -> list[int]:
        if n > len(self._free):
            raise RuntimeError(f"asked for {n} blocks, {len(self._free)} free")
        taken = [self._free.pop() for _ in range(n)]
        for b in taken:
            self._count[b] = 1
        return taken

    def share(self, block_id: int) -> None:
        if self._count[block_id] < 1:
            raise RuntimeError(f"block {block_id} is free: it cannot be shared")
        self._count[block_id] += 1

    def free(self, block_ids: list[int]) -> None:
        for b in block_ids:
            if self._count[b] < 1:
                raise RuntimeError(f"block {b} freed more often than held")
            self._count[b] -= 1
            if self._count[b] == 0:
                self._free.append(b)

    def num_free(self) -> int:
        return len(self._free)

    def ref_count(self, block_id: int) -> int:
        return self._count[block_id]


class _Counts:
    """``allocator.ref_count[b]`` read from the pool (what the widgets and checks index)."""

    def __init__(self, pool: BlockPool, n: int):
        self._pool, self._n = pool, n

    def __getitem__(self, block_id: int) -> int:
        return self._pool.ref_count(block_id)

    def __len__(self) -> int:
        return self._n

    def __iter__(self):
        return (self._pool.ref_count(b) for b in range(self._n))


class PooledAllocator:
    """The allocator the scheduler talks to (``kv_cache.BlockAllocator``'s methods), over any
    :class:`BlockPool`. It keeps what a pool does not: block tables grow a block at a time,
    and full prompt blocks are shared between requests that hold them at the same time (a
    prefix index of held blocks; unlike ``BlockAllocator`` a freed block is not kept for
    later hits, so the pool alone decides which free block comes next)."""

    def __init__(self, pool: BlockPool, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        missing = [m for m in ("allocate", "share", "free", "num_free", "ref_count") if not callable(
            getattr(pool, m, None))]
        if missing:
            raise ValueError(f"block_pool must have the methods allocate, share, free, num_free, ref_count; "
                             f"{type(pool).__name__} lacks {', '.join(missing)}")
        self.pool = pool
        self.num_blocks, self.block_size = num_blocks, block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_count = _Counts(pool, num_blocks)
        self.block_hashes: list[bytes | None] = [None] * num_blocks  # hash of a held, registered full block
        self.hash_to_block: dict[bytes, int] = {}

    @property
    def num_free(self) -> int:
        return self.pool.num_free()

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.pool.num_free()

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def match_prefix(self, token_ids: list[int], block_hashes: list[bytes] | None = None) -> list[int]:
        """Held blocks that already hold this context's first full blocks (one token is always
        left to compute, so the model still gives logits)."""
        max_blocks = (len(token_ids) - 1) // self.block_size
        if not self.enable_prefix_caching or max_blocks <= 0:
            return []
        hashes = hash_blocks(token_ids, self.block_size, [] if block_hashes is None else block_hashes)
        hits: list[int] = []
        for h in hashes[:max_blocks]:
            b = self.hash_to_block.get(h)
            if b is None:
                break
            hits.append(b)
        return hits

    def can_allocate(self, token_ids: list[int], block_hashes: list[bytes] | None = None) -> bool:
        hits = self.match_prefix(token_ids, block_hashes)
        return self.blocks_needed(len(token_ids)) - len(hits) <= self.num_free

    def allocate(self, token_ids: list[int], block_hashes: list[bytes] | None = None) -> tuple[list[int], int]:
        """Blocks for a whole context: shared hits, then fresh blocks from the pool."""
        hits = self.match_prefix(token_ids, block_hashes)
        need = self.blocks_needed(len(token_ids)) - len(hits)
        if need > self.num_free:
            raise RuntimeError("not enough free KV blocks (call can_allocate first)")
        for b in hits:
            self.pool.share(b)
        return hits + list(self.pool.allocate(need)), len(hits) * self.block_size

    def append_slot(self, block_table: list[int], num_tokens: int) -> bool:
        """Room for token number ``num_tokens`` (0-based); False if the pool is empty."""
        if num_tokens < len(block_table) * self.block_size:
            return True
        if self.num_free == 0:
            return False
        block_table.extend(self.pool.allocate(1))
        return True

    def commit_full_blocks(self, block_table: list[int], token_ids: list[int], num_computed: int,
                           block_hashes: list[bytes] | None = None) -> None:
        """Index every full, computed block so a request arriving while it is held can share it."""
        if not self.enable_prefix_caching:
            return
        num_full = min(num_computed // self.block_size, len(block_table))
        hashes = hash_blocks(token_ids[:num_full * self.block_size], self.block_size,
                             [] if block_hashes is None else block_hashes)
        for b, h in zip(block_table[:num_full], hashes):
            if self.block_hashes[b] is None and h not in self.hash_to_block:
                self.block_hashes[b] = h
                self.hash_to_block[h] = b

    def free(self, block_table: list[int]) -> None:
        """One reference fewer on each block (last block first); a block that becomes free
        leaves the prefix index."""
        blocks = list(reversed(block_table))
        self.pool.free(blocks)
        for b in blocks:
            h = self.block_hashes[b]
            if h is not None and self.pool.ref_count(b) == 0:
                self.block_hashes[b] = None
                del self.hash_to_block[h]
        block_table.clear()

    def num_cached_free(self) -> int:
        return 0  # freed blocks are not kept for later hits


@dataclass
class EngineParts:
    """The parts a learner wrote, for ``LLM(parts=...)``; None = the engine's own."""

    transitions: Mapping | None = None
    block_pool: Callable[[int], BlockPool] | None = None
    step: Callable | None = None
    top_k_filter: Callable | None = None
    top_p_filter: Callable | None = None

    def __post_init__(self):
        if self.transitions is not None and not isinstance(self.transitions, Mapping):
            raise ValueError(f"transitions must be a dict {{state: set of next states}}, "
                             f"got {type(self.transitions).__name__}")
        for name in ("block_pool", "step", "top_k_filter", "top_p_filter"):
            value = getattr(self, name)
            if value is not None and not callable(value):
                raise ValueError(f"{name} must be callable (a class or a function), got {type(value).__name__}")
