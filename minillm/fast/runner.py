"""The fast runner: the reference runner's job (``minillm.runner``), laid out for a device.

Same contract as ``ModelRunner``: a scheduled batch in, one forward pass, logits out, token for
token what the reference gives (the parity, fuzz and SIGINT tests run both). What it adds:
decode requests come first in the flat batch (one row each, longest context first), then the
new tokens of each request being prefilled, and all decode rows are attended at once.

How decode attention reads the cache is the attention backend's choice (``minillm.fast.attention``),
made when the runner is built. "gather" gathers each request's context from
the cache, padded to the longest one attended in the same call. With contexts of very
different lengths most of that would be padding, so the decode rows are split into a few
groups of similar length (``split_by_length``); each group is one gather and one attention
call per layer. A backend that ``uses_block_tables`` ("paged") gets fixed-shape metadata
instead (``DecodeMeta``: block tables padded with the null block, context lengths, slots).

On a GPU each host->device tensor is a copy to queue and each device->host read a wait, so
every integer a step needs is computed here on the host (slots from the block tables) and
sent in one copy (``StepUpload``); the slots of the gathers are expanded from the block
tables on the device. Sampling then reads the results back once (``Sampler``).

The block tables themselves stay on the device from step to step (``BlockTableRows``, a row
per scheduled request): a step sends only the blocks allocated since the last, so a decode
step's host work and upload are O(batch), whatever the contexts' lengths.

With ``LLM(decode_graphs=...)`` a decode-only step skips the per-step layout altogether: its
integers, padded to a bucket, go into a graph's persistent buffers and one fixed-shape forward
runs (``minillm.fast.decode_graphs``, ``ModelRunner.graphs``); steps with a prefill stay as above.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.modules.module as _module

from ..kv_cache import KVCache
from ..models.llama import AttentionBatch, DecodeGroup, LlamaForCausalLM, PrefillSeq
from ..request import Request
from ..runner import ModelRunner
from .attention import NULL_BLOCK, AttentionBackend, DecodeMeta, PagedKernel, make_backend
from .decode_layout import DecodeLayout, decode_row, decode_values
from .gemv import only_thread_hooks, thread_hooks_idle
from .sampler import BatchedSampler, plainly_greedy

MAX_DECODE_GROUPS = 4
# An extra decode group costs about as much per layer (two gathers, one attention call) as
# gathering and attending over this many padded cache slots: split only when it saves more.
GROUP_COST_SLOTS = 1024


def split_by_length(lengths: list[int], max_groups: int | None = None,
                    group_cost: int | None = None) -> list[tuple[int, int]]:
    """Split ``lengths`` (sorted longest first) into at most ``max_groups`` runs [start, end)
    so that the padded total (each run padded to its first length) plus ``group_cost`` per run
    is small. Greedy: split the run where a split saves the most, while it saves more than
    ``group_cost``."""
    max_groups = MAX_DECODE_GROUPS if max_groups is None else max_groups
    group_cost = GROUP_COST_SLOTS if group_cost is None else group_cost
    groups = [(0, len(lengths))]
    while len(groups) < max_groups:
        best_saving, best = group_cost, None
        for gi, (a, b) in enumerate(groups):
            top = lengths[a]
            for k in range(a + 1, b):
                if lengths[k] == lengths[k - 1]:
                    continue
                saving = (b - k) * (top - lengths[k])  # the rows after k stop padding to `top`
                if saving > best_saving:
                    best_saving, best = saving, (gi, k)
        if best is None:
            break
        gi, k = best
        a, b = groups[gi]
        groups[gi:gi + 1] = [(a, k), (k, b)]
    return groups


class StepUpload:
    """Every integer a step sends to the device, gathered on the host and sent in one copy
    (pinned and non-blocking on CUDA): one transfer per step instead of one per tensor.
    ``add`` reserves a section, ``then`` registers work to do on the device copy, ``send``
    copies and runs that work; ``view`` is a section of the device copy."""

    def __init__(self):
        self.data: list[int] = []
        self._after: list = []

    def add(self, values) -> tuple[int, int]:
        start = len(self.data)
        self.data.extend(values)
        return start, len(self.data)

    def then(self, fn) -> None:
        self._after.append(fn)

    @staticmethod
    def view(dev: torch.Tensor, part: tuple[int, int]) -> torch.Tensor:
        return dev[part[0]:part[1]]

    def send(self, device: torch.device) -> torch.Tensor:
        if device.type == "cuda":
            dev = torch.tensor(self.data, dtype=torch.long).pin_memory().to(device, non_blocking=True)
        else:
            dev = torch.tensor(self.data, dtype=torch.long, device=device)
        for fn in self._after:
            fn(dev)
        return dev


@dataclass(eq=False)
class _TableRow:
    """What the device holds of one request's block table."""

    index: int            # its row in ``BlockTableRows.table``
    blocks: list[int]     # the request's own ``block_table`` list, mirrored
    synced: int = 0       # how many of its blocks are on the device
    last: int = -1        # the last of them (a cheap check that the list was not rewritten)
    contiguous: int = 0   # how many leading blocks are consecutive ids in the pool


class BlockTableRows:
    """A persistent device tensor of the scheduled requests' block tables, one row each, kept
    from step to step so that a step sends only the blocks allocated since the last one
    (a new block every ``block_size`` tokens) instead of every request's whole table.

    A request's table only grows while it is admitted; a new list (admitted again after a
    preemption, a rollback) or a shorter one means its blocks changed, and the row is
    rewritten. Rows of requests a step does not schedule are recycled in that step (or at
    once by ``forget``, when a request finishes); a recycled row is reset to ``NULL_BLOCK`` so
    whatever a new tenant's table does not cover reads the null block, as the padding of a
    fresh table would. Host bookkeeping only moves forward once the device copy is made, so a
    step cut short anywhere (Ctrl-C) makes the next one send the blocks again."""

    def __init__(self, device: torch.device):
        self.device = device
        self.table: torch.Tensor | None = None  # [capacity, width] long
        self.rows: dict[Request, _TableRow] = {}
        self._free: list[int] = []

    def __len__(self) -> int:
        return len(self.rows)

    def forget(self, req: Request) -> None:
        row = self.rows.pop(req, None)
        if row is not None:
            self._free.append(row.index)

    def _grow(self, new_rows: int, width: int) -> None:
        """Room for ``new_rows`` more rows and tables of ``width`` blocks (doubling)."""
        cap, w = (0, 0) if self.table is None else self.table.shape
        short = new_rows - len(self._free)
        if short <= 0 and width <= w:
            return
        new_cap = max(cap + short, 2 * cap) if short > 0 else cap
        new_w = max(width, 2 * w) if width > w else w
        table = torch.full((new_cap, new_w), NULL_BLOCK, dtype=torch.long, device=self.device)
        if cap:
            table[:cap, :w] = self.table
        self.table = table
        self._free.extend(range(cap, new_cap))

    def plan(self, reqs: list[Request], num_decode: int,
             upload: StepUpload) -> tuple[list[_TableRow], tuple[int, int]]:
        """Host side of a step over ``reqs`` (the decodes in the batch's row order, then the
        prefills): each one's row, with its new blocks (and any reset) put into ``upload``.
        Returns the rows and the upload part holding the first ``num_decode`` rows' indices
        (the decode rows read their tables through it). O(len(reqs)) plus the new blocks:
        a request's table goes up while it is prefilled, then a block at a time."""
        live = set(reqs)
        for req in [r for r in self.rows if r not in live]:
            self.forget(req)
        fresh = [r for r in reqs if r not in self.rows]
        width = max(len(r.block_table) for r in reqs)
        self._grow(len(fresh), width)
        resets, where, blocks = [], [], []
        out = []
        w = self.table.shape[1]
        for r in reqs:
            row = self.rows.get(r)
            table = r.block_table
            if row is None:
                row = self.rows[r] = _TableRow(self._free.pop(), table)
            elif (row.blocks is not table or len(table) < row.synced
                  or (row.synced and table[row.synced - 1] != row.last)):  # its blocks changed
                row.blocks, row.synced, row.contiguous = table, 0, 0
            if row.synced == 0:  # a new tenant, or rewritten: null blocks past its own
                resets.append(row.index)
            base = row.index * w
            for col in range(row.synced, len(table)):
                where.append(base + col)
                blocks.append(table[col])
            first = table[0]
            while row.contiguous < len(table) and table[row.contiguous] == first + row.contiguous:
                row.contiguous += 1
            out.append(row)
        reset_part, where_part, blocks_part = upload.add(resets), upload.add(where), upload.add(blocks)
        rows_part = upload.add([row.index for row in out[:num_decode]])

        def finish(dev: torch.Tensor) -> None:
            if resets:
                self.table.index_fill_(0, upload.view(dev, reset_part), NULL_BLOCK)
            if where:
                self.table.view(-1).index_copy_(0, upload.view(dev, where_part), upload.view(dev, blocks_part))
            # only now that the device holds them
            for row in out:
                row.synced, row.last = len(row.blocks), row.blocks[-1]

        upload.then(finish)
        return out, rows_part


class FastRunner(ModelRunner):
    def __init__(self, model: LlamaForCausalLM, kv_cache: KVCache, device: torch.device,
                 attention: AttentionBackend | str | None = None):
        super().__init__(model, kv_cache, device)
        # how decode attention reads the pool: decode groups (gather) or fixed-shape block tables
        self.attention = attention if isinstance(attention, AttentionBackend) else make_backend(attention)
        self._offsets = torch.arange(self.block_size, device=device)
        self._workspace: tuple[torch.Tensor, torch.Tensor] | None = None
        self.block_rows = BlockTableRows(device)  # the decode rows' block tables, kept on the device
        # decode-only steps at fixed shapes, one graph per bucket (``minillm.fast.decode_graphs``);
        # None: every step eager
        self.graphs = None
        self._argmax = None  # (logits, their argmax) of the last graph or one-call step, for ``sample``
        # eager decode-only CPU steps on the paged kernel: their buffers, kept (``decode_layout``)
        self._layout: DecodeLayout | None = None
        self._layouts = device.type == "cpu" and type(self.attention) is PagedKernel

    def forget(self, req: Request) -> None:
        """Drop what the runner keeps for ``req`` (its block-table row): call when it ends."""
        self.block_rows.forget(req)

    def _gather_workspace(self, slots: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V buffers of at least ``slots`` cache slots for the decode gathers, kept from
        step to step (grown by half again when too small)."""
        ws = self._workspace
        if ws is None or ws[0].shape[0] < slots:
            size = max(slots, 0 if ws is None else ws[0].shape[0] * 3 // 2)
            shape = (size, self.kv.num_kv_heads, self.kv.head_dim)
            self._workspace = ws = (torch.empty(shape, dtype=self.kv.dtype, device=self.device),
                                    torch.empty(shape, dtype=self.kv.dtype, device=self.device))
        return ws

    def _decode_group(self, start: int, end: int, rows: list[_TableRow], ctx: list[int],
                      upload: StepUpload, rows_part: tuple[int, int]) -> DecodeGroup:
        """Slots (and padding mask) of decode rows [start, end), whose contexts are ctx[start:end]:
        their block tables are rows of the persistent device table (``BlockTableRows``), the
        context lengths go into ``upload``; slots and mask are computed on the device once it
        has been sent."""
        bs = self.block_size
        m, longest = end - start, ctx[start]
        width = -(-longest // bs)
        if m == 1 and rows[start].contiguous >= width:
            # one request whose blocks are consecutive in the pool: no gather needed
            return DecodeGroup(start, end, None, first_slot=rows[start].blocks[0] * bs, length=longest)
        group = DecodeGroup(start, end, None, length=longest)
        lens = upload.add(ctx[start:end]) if ctx[end - 1] != longest else None  # contexts differ
        part = (rows_part[0] + start, rows_part[0] + end)

        def finish(dev: torch.Tensor) -> None:
            blocks = self.block_rows.table.index_select(0, upload.view(dev, part))[:, :width]
            slots = (blocks.view(m, width, 1) * bs + self._offsets).view(m, width * bs)
            group.slots = slots if width * bs == longest else slots[:, :longest].contiguous()
            if lens is not None:  # hide each context's padding
                pad = torch.arange(longest, device=self.device) >= upload.view(dev, lens)[:, None]
                group.mask = torch.zeros((m, 1, 1, longest), dtype=self.kv.dtype, device=self.device
                                         ).masked_fill_(pad.view(m, 1, 1, longest), float("-inf"))

        upload.then(finish)
        return group

    def _decode_meta(self, ctx: list[int], upload: StepUpload, rows_part: tuple[int, int]) -> DecodeMeta:
        """Fixed-shape metadata of the decode rows: block tables [B, W] (rows of the persistent
        device table, NULL_BLOCK past each request's own blocks) and context lengths [B]
        (into ``upload``); the padding mask (-inf past each context) is made on the device
        once it has been sent."""
        bs = self.block_size
        m, width = len(ctx), -(-ctx[0] // bs)
        lens = upload.add(ctx)
        meta = DecodeMeta(None, None, None, width)
        padded = self.attention.uses_mask and any(c != width * bs for c in ctx)

        def finish(dev: torch.Tensor) -> None:
            meta.block_tables = self.block_rows.table.index_select(0, upload.view(dev, rows_part))[:, :width]
            meta.context_lens = upload.view(dev, lens)
            if padded:
                pad = torch.arange(width * bs, device=self.device) >= meta.context_lens[:, None]
                meta.mask = torch.zeros((m, 1, 1, width * bs), dtype=self.kv.dtype, device=self.device
                                        ).masked_fill_(pad.view(m, 1, 1, width * bs), float("-inf"))

        upload.then(finish)
        return meta

    @torch.inference_mode()
    def run(self, decodes: list[Request], prefills: list[Request],
            prefill_chunks: list[int] | None = None) -> torch.Tensor:
        """One forward pass over every scheduled request. ``prefill_chunks[i]`` tokens of
        ``prefills[i]`` are computed, from its ``num_computed_tokens`` on (default: all the
        rest). Logits come back for the decodes, then for the prefills whose chunk reaches the
        end of their context; a partial prefill only writes its keys and values.

        Every index the step needs (token ids, positions, the slot each new K/V is written to,
        block tables, context lengths, the logits rows) is computed on the host from the block
        tables and sent to the device in one copy."""
        self._argmax = None
        if prefill_chunks is None:
            prefill_chunks = [r.num_tokens - r.num_computed_tokens for r in prefills]
        if decodes and not prefills and self.graphs is not None:
            graph = self.graphs.graph_for(len(decodes), max(-(-r.num_tokens // self.block_size) for r in decodes))
            if graph is not None:
                return self._run_graph(graph, decodes)
        if decodes and not prefills and self._layouts and isinstance(self.model, torch.nn.Module):
            return self._run_layout(decodes)  # (not a ``CompiledModel``: it copies its inputs anyway)
        ids: list[int] = []
        positions: list[int] = []
        slot_mapping: list[int] = []
        bs = self.block_size
        n = len(decodes)
        upload = StepUpload()
        batch = AttentionBatch(positions=None, slot_mapping=None, num_decode=n, attention=self.attention)
        logits_rows = list(range(n))
        # longest context first, so that groups of similar length are runs of rows; the
        # logits come back in the scheduler's order (logits_rows undoes the sort)
        order = sorted(range(n), key=lambda i: -decodes[i].num_tokens)
        if decodes or prefills:
            table_rows, table_part = self.block_rows.plan([decodes[i] for i in order] + list(prefills), n, upload)
        if decodes:
            ctx = []
            for row, i in enumerate(order):
                token, pos, slot = self._decode_row(decodes[i])
                ids.append(token)
                positions.append(pos)
                slot_mapping.append(slot)
                ctx.append(pos + 1)
                logits_rows[i] = row
            if self.attention.uses_block_tables:
                batch.decode_meta = self._decode_meta(ctx, upload, table_part)
            else:
                batch.decode_groups = [self._decode_group(a, b, table_rows, ctx, upload, table_part)
                                       for a, b in split_by_length(ctx)]
            gathered = [(g.end - g.start) * g.length for g in batch.decode_groups if g.first_slot is None]
            if gathered:
                batch.k_workspace, batch.v_workspace = self._gather_workspace(max(gathered))
        for j, (r, chunk) in enumerate(zip(prefills, prefill_chunks)):
            tokens = r.all_token_ids
            start = r.num_computed_tokens
            ctx = start + chunk
            if not 0 < chunk or ctx > len(tokens):
                raise ValueError(f"request {r.request_id!r}: a prefill chunk of {chunk} tokens from "
                                 f"{start} does not fit its {len(tokens)} tokens")
            table = r.block_table
            seq = PrefillSeq(q_start=len(ids), q_len=chunk, ctx_len=ctx)
            if start > 0:  # a cached prefix precedes: attention reads the whole context's slots
                width, index = -(-ctx // bs), table_rows[n + j].index

                def finish(dev, seq=seq, index=index, width=width, ctx=ctx):
                    blocks = self.block_rows.table[index, :width]
                    seq.slots = (blocks.view(width, 1) * bs + self._offsets).view(-1)[:ctx]

                upload.then(finish)
            batch.prefills.append(seq)
            ids.extend(tokens[start:ctx])
            positions.extend(range(start, ctx))
            slot_mapping.extend(table[j // bs] * bs + j % bs for j in range(start, ctx))
            if ctx == len(tokens):
                logits_rows.append(len(ids) - 1)
        in_order = not prefills and all(row == i for i, row in enumerate(logits_rows))
        parts = [upload.add(ids), upload.add(positions), upload.add(slot_mapping)]
        rows_part = None if in_order else upload.add(logits_rows)
        dev = upload.send(self.device)
        input_ids, batch.positions, batch.slot_mapping = (upload.view(dev, p) for p in parts)
        if batch.decode_meta is not None:  # the decode rows' slots lead the step's slot mapping
            batch.decode_meta.slot_mapping = batch.slot_mapping[:n]
        rows = None if rows_part is None else upload.view(dev, rows_part)
        return self.model(input_ids, batch, self.kv, logits_rows=rows)

    def _run_layout(self, decodes: list[Request]) -> torch.Tensor:
        """A decode-only CPU step through the kept buffers (``DecodeLayout``): rows in the
        scheduler's order. When every row is plainly greedy and the model runs its head in the
        same C call (``layer_step.model_call``), that call's argmax is kept for ``sample``."""
        layout = self._layout
        values, width = decode_values(decodes, self.block_size, None if layout is None else layout.width)
        if layout is None or layout.rows != len(decodes) or layout.width != width:
            self._layout = layout = DecodeLayout(len(decodes), width, self.attention)
        layout.fill(values)
        meta = layout.meta
        # no hook to run: forward itself, without Module.__call__'s way through the hooks
        idle = thread_hooks_idle(self.model)
        greedy = (all(plainly_greedy(r.params) for r in decodes)  # (another hook may edit the logits)
                  and (idle or not _module._global_forward_hooks and only_thread_hooks(self.model)))
        meta.argmax, meta.argmax_of = (layout.argmax if greedy else None), None
        call = self.model.forward if idle else self.model
        logits = call(layout.input_ids, layout.batch, self.kv)
        if greedy and meta.argmax_of is logits:
            self._argmax = (logits, layout.argmax)
        meta.argmax_of = None
        return logits

    def _decode_row(self, r: Request) -> tuple[int, int, int]:
        """A decoding request's row (``decode_layout.decode_row``)."""
        return decode_row(r, self.block_size)

    def _run_graph(self, graph, decodes: list[Request]) -> torch.Tensor:
        """A decode-only step through its bucket's graph: the same integers as an eager step
        (rows in the scheduler's order: a fixed-shape batch needs no sorting), padded to the
        bucket's rows. On the CPU the block tables are the requests' own lists and every
        integer goes into the graph's buffers in one copy; on a GPU they are rows of the
        persistent device table and the rest comes in one upload. The graph's argmax is kept
        for ``sample``."""
        if self.device.type == "cpu":
            logits, argmax = graph.run_values(len(decodes), self._graph_values(graph, decodes))
        else:
            logits, argmax = self._run_graph_uploaded(graph, decodes)
        self._argmax = (logits, argmax)
        return logits

    def _graph_values(self, graph, decodes: list[Request]) -> list[int]:
        """The graph's buffers' contents for ``decodes`` (``DecodeInputs.values``)."""
        bs, width = self.block_size, graph.width
        ids, positions, slots, tables = [], [], [], []
        for r in decodes:
            token, pos, slot = decode_row(r, bs)
            table = r.block_table
            ids.append(token)
            positions.append(pos)
            slots.append(slot)
            tables += table[:width]
            if len(table) < width:
                tables += [NULL_BLOCK] * (width - len(table))
        return graph.inputs.values(ids, positions, slots, [pos + 1 for pos in positions], tables)

    def _run_graph_uploaded(self, graph, decodes: list[Request]):
        n = len(decodes)
        upload = StepUpload()
        _, rows_part = self.block_rows.plan(decodes, n, upload)
        pad = self.graphs.padding(n, graph.batch)
        ids, positions, slots = (list(col) for col in zip(*map(self._decode_row, decodes)))
        ctx = [pos + 1 for pos in positions]
        parts = [upload.add(ids + pad["ids"]), upload.add(positions + pad["positions"]),
                 upload.add(slots + pad["slots"]), upload.add(ctx + pad["context_lens"])]
        dev = upload.send(self.device)
        return graph(n, self.block_rows.table, upload.view(dev, rows_part), *(upload.view(dev, p) for p in parts))

    def sample(self, sampler, logits: torch.Tensor, reqs: list[Request], rng_states=()):
        """``ModelRunner.sample``; after a graph step whose rows are all plainly greedy (no
        penalty, bias or log-probabilities), the argmax the graph made is the batched
        sampler's answer (its ``choose`` is then ``logits.argmax``), read back in one copy."""
        kept, self._argmax = self._argmax, None
        if (kept is not None and kept[0] is logits and isinstance(sampler, BatchedSampler)
                and all(plainly_greedy(r.params) for r in reqs)):
            return kept[1].tolist(), None, {}
        return super().sample(sampler, logits, reqs, rng_states)
