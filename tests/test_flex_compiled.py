"""The "flex" backend's fused path, as CUDA runs it (``FlexPaged(compiled=True)``: the block
mask's list of KV blocks trusted, the mask function trimming only the last block), compiled
here for the CPU by ``torch.compile`` (tens of seconds per shape: a slow file). The eager
path is checked in ``test_attention_backends.py`` and, through the engine, ``test_parity.py``."""

from __future__ import annotations

import pytest
import torch

from minillm.fast.attention import NULL_BLOCK, DecodeMeta, FlexPaged
from minillm.models.llama import AttentionBatch
from test_attention_backends import _naive


@pytest.mark.parametrize("block_size", [4, 16])
def test_compiled_flex_reads_only_each_rows_blocks(block_size):
    g = torch.Generator().manual_seed(1)
    heads, kv_heads, dim, scale = 4, 2, 16, 16 ** -0.5
    lengths = [2 * block_size + 3, block_size, 1, block_size - 1 or 1]
    num_blocks = 24
    k_pool = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g)
    v_pool = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g)
    free = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    tables = [[free.pop() for _ in range(-(-n // block_size))] for n in lengths]
    q = torch.randn(len(lengths), heads, dim, generator=g)
    want = torch.stack([_naive(q[i], k_pool, v_pool, t, n, scale) for i, (t, n) in enumerate(zip(tables, lengths))])
    # every block no row owns is poisoned: a read outside a row's own blocks shows up
    owned = {b for t in tables for b in t}
    for b in range(num_blocks):
        if b not in owned:
            k_pool[b], v_pool[b] = 1e4, 1e4
    width = max(len(t) for t in tables) + 2  # wider than needed, as a bucket is
    padded = torch.tensor([t + [NULL_BLOCK] * (width - len(t)) for t in tables])
    meta = DecodeMeta(padded, torch.tensor(lengths), None, width)
    batch = AttentionBatch(positions=None, slot_mapping=None, num_decode=len(lengths), decode_meta=meta)
    got = FlexPaged(compiled=True).decode(q, k_pool, v_pool, batch, scale)
    assert (got - want).abs().max().item() < 1e-4
