"""The model runner: turns a scheduled batch into tensors, runs one forward pass, returns logits.

All the bookkeeping of paging lives here, as tensor arithmetic done once per step:
token ``j`` of a request lives in cache slot ``block_table[j // block_size] * block_size +
j % block_size``. Decode requests come first in the flat batch (one row each), then the new
tokens of each request being prefilled.
"""

from __future__ import annotations

import torch

from .kv_cache import KVCache
from .models.llama import AttentionBatch, LlamaForCausalLM, PrefillSeq
from .request import Request


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, kv_cache: KVCache, device: torch.device):
        self.model = model
        self.kv = kv_cache
        self.device = device
        self.block_size = kv_cache.block_size
        self._offsets = torch.arange(self.block_size, device=device)

    def _slots(self, tables: list[list[int]], length: int) -> torch.Tensor:
        """[len(tables), length] flat slot ids for positions 0..length-1 of each block table
        (tables shorter than needed are padded with block 0; the mask hides those slots)."""
        width = max(-(-length // self.block_size), 1)
        padded = [t[:width] + [0] * (width - len(t[:width])) for t in tables]
        blocks = torch.tensor(padded, dtype=torch.long, device=self.device)
        return (blocks.unsqueeze(-1) * self.block_size + self._offsets).view(len(tables), -1)[:, :length]

    @torch.inference_mode()
    def run(self, decodes: list[Request], prefills: list[Request]) -> torch.Tensor:
        """One forward pass over every scheduled request; logits [len(decodes)+len(prefills), vocab]."""
        ids: list[int] = []
        positions: list[int] = []
        slot_mapping: list[int] = []
        bs = self.block_size
        for r in decodes:
            pos = r.num_tokens - 1
            ids.append(r.last_token_id)
            positions.append(pos)
            slot_mapping.append(r.block_table[pos // bs] * bs + pos % bs)
        batch = AttentionBatch(positions=None, slot_mapping=None, num_decode=len(decodes))
        if decodes:
            ctx = [r.num_tokens for r in decodes]
            longest = max(ctx)
            batch.decode_slots = self._slots([r.block_table for r in decodes], longest)
            lens = torch.tensor(ctx, device=self.device)
            batch.decode_mask = (torch.arange(longest, device=self.device) < lens[:, None]).view(
                len(decodes), 1, 1, longest)
        logits_rows = list(range(len(decodes)))
        for r in prefills:
            tokens = r.all_token_ids
            start, ctx = r.num_computed_tokens, len(tokens)
            slots = self._slots([r.block_table], ctx)[0]
            seq = PrefillSeq(q_start=len(ids), q_len=ctx - start, ctx_len=ctx,
                             slots=slots if start > 0 else None)
            batch.prefills.append(seq)
            ids.extend(tokens[start:])
            positions.extend(range(start, ctx))
            slot_mapping.extend(slots[start:].tolist())
            logits_rows.append(len(ids) - 1)
        batch.positions = torch.tensor(positions, dtype=torch.long, device=self.device)
        batch.slot_mapping = torch.tensor(slot_mapping, dtype=torch.long, device=self.device)
        input_ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        rows = torch.tensor(logits_rows, dtype=torch.long, device=self.device)
        return self.model(input_ids, batch, self.kv, logits_rows=rows)
