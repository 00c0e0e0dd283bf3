"""A decode-only CPU step's integers in buffers kept from step to step (``FastRunner``'s eager
decode steps on the "kernel" attention backend).

A step's layout is built for a device: every integer in one upload, then the block tables as
rows of the persistent device table (``BlockTableRows``), with views, an ``index_select`` and a
new ``AttentionBatch`` and ``DecodeMeta`` each step. On the CPU nothing needs uploading, and for
the shipped 4-layer model that work was ~100 of a ~700 us decode step (AMD EPYC Zen 4, one
thread), run cold after the weights went through the caches. ``DecodeLayout`` keeps one flat
int64 buffer (ids, positions, slots, context lengths, then the block tables row by row, padded
with ``NULL_BLOCK``), filled in place through numpy, and the ``AttentionBatch`` and
``DecodeMeta`` viewing it, all reused while the rows and the tables' width stay; the one-call
layers' step struct cached on the meta is reused with them (``layer_step._step``).

Rows are in the scheduler's order (the logits come back in it; the paged kernel bounds each row
by its own context, so no row is padded to another) and the width goes up in powers of two, so
a growing context seldom makes a new layout. Only for backends that keep nothing of a step on
its meta (``PagedKernel``): a reused meta carries no stale mask.
"""

from __future__ import annotations

import torch

from ..models.llama import AttentionBatch
from .attention import NULL_BLOCK, DecodeMeta


class DecodeLayout:
    """The buffers, batch and meta of decode-only steps of ``rows`` rows whose block tables fit
    ``width`` blocks."""

    def __init__(self, rows: int, width: int, attention):
        self.rows, self.width = rows, width
        self.flat = torch.zeros(4 * rows + rows * width, dtype=torch.long)
        try:
            self.host = self.flat.numpy()  # filled in place (~1.5 us for batch 1, ~8 for a tensor made and copied)
        except (RuntimeError, TypeError):  # torch built without numpy
            self.host = None
        ids, positions, slots, lens = self.flat[:4 * rows].view(4, rows).unbind(0)
        self.input_ids = ids
        self.meta = DecodeMeta(self.flat[4 * rows:].view(rows, width), lens, slots, width)
        self.argmax = torch.zeros(rows, dtype=torch.long)  # ``DecodeMeta.argmax`` for greedy steps
        self.batch = AttentionBatch(positions=positions, slot_mapping=slots, num_decode=rows, attention=attention,
                                    decode_meta=self.meta)

    def fill(self, values: list[int]) -> None:
        """Write a step's integers (``decode_values``' layout, ``len(flat)`` of them)."""
        if self.host is not None:
            self.host[:] = values
        else:
            self.flat.copy_(torch.tensor(values, dtype=torch.long))


def layout_width(blocks: int) -> int:
    """The tables' width for contexts of at most ``blocks`` blocks: a power of two."""
    return 1 << max(blocks - 1, 0).bit_length()


def decode_row(r, block_size: int) -> tuple[int, int, int]:
    """A decoding request's row: (its newest token, that token's position, the cache slot its K/V
    goes to); the context it attends is position + 1 tokens."""
    out, table = r.output_token_ids, r.block_table
    pos = len(r.prompt_token_ids) + len(out) - 1
    token = out[-1] if out else r.prompt_token_ids[-1]
    return token, pos, table[pos // block_size] * block_size + pos % block_size


def decode_values(decodes: list, block_size: int, width: int | None = None) -> tuple[list[int], int]:
    """The flat buffer's contents for decoding ``decodes`` (each request's newest token at its
    position, the slot its K/V goes to, its context length and block table), and the width
    (``layout_width`` of the longest context's blocks, or ``width`` when that is enough)."""
    ids, positions, slots = [], [], []
    for r in decodes:
        token, pos, slot = decode_row(r, block_size)
        ids.append(token)
        positions.append(pos)
        slots.append(slot)
    blocks = max(positions) // block_size + 1
    if width is None or width < blocks:
        width = layout_width(blocks)
    tables = []
    for r, pos in zip(decodes, positions):
        own = pos // block_size + 1
        tables += r.block_table[:own]
        tables += [NULL_BLOCK] * (width - own)
    return ids + positions + slots + [pos + 1 for pos in positions] + tables, width
