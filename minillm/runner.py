"""The model runner: turns a scheduled batch into tensors, runs one forward pass, returns logits.

All the bookkeeping of paging lives here, as tensor arithmetic done once per step:
token ``j`` of a request lives in cache slot ``block_table[j // block_size] * block_size +
j % block_size``. Decode requests come first in the flat batch (one row each, longest context
first), then the new tokens of each request being prefilled.

How decode attention reads the cache is the attention backend's choice (``minillm.attention``),
made when the runner is built. The reference ("gather") gathers each request's context from
the cache, padded to the longest one attended in the same call. With contexts of very
different lengths most of that would be padding, so the decode rows are split into a few
groups of similar length (``split_by_length``); each group is one gather and one attention
call per layer. A backend that ``uses_block_tables`` ("paged") gets fixed-shape metadata
instead (``DecodeMeta``: block tables padded with the null block, context lengths, slots).

On a GPU each host->device tensor is a copy to queue and each device->host read a wait, so
every integer a step needs is computed here on the host (slots from the block tables) and
sent in one copy (``StepUpload``); the slots of the gathers are expanded from the block
tables on the device. Sampling then reads the results back once (``Sampler``).
"""

from __future__ import annotations

import torch

from .attention import NULL_BLOCK, AttentionBackend, DecodeMeta, make_backend
from .kv_cache import KVCache
from .models.llama import AttentionBatch, DecodeGroup, LlamaForCausalLM, PrefillSeq
from .request import Request

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


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, kv_cache: KVCache, device: torch.device,
                 attention: AttentionBackend | str | None = None):
        self.model = model
        # how decode attention reads the pool: decode groups (gather) or fixed-shape block tables
        self.attention = attention if isinstance(attention, AttentionBackend) else make_backend(attention)
        self.kv = kv_cache
        self.device = device
        self.block_size = kv_cache.block_size
        self._offsets = torch.arange(self.block_size, device=device)
        self._workspace: tuple[torch.Tensor, torch.Tensor] | None = None

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

    def _decode_group(self, start: int, end: int, tables: list[list[int]], ctx: list[int],
                      upload: "StepUpload | None" = None) -> DecodeGroup:
        """Slots (and padding mask) of decode rows [start, end), whose contexts are ctx[start:end].
        The block table rows (and context lengths) go into ``upload``; the slots and the mask
        are computed on the device once it has been sent (alone, it is sent here)."""
        bs = self.block_size
        m, longest = end - start, ctx[start]
        width = -(-longest // bs)
        if m == 1:  # one request whose blocks are consecutive in the pool: no gather needed
            table = tables[start]
            first = table[0]
            if all(b == first + i for i, b in enumerate(table[:width])):
                return DecodeGroup(start, end, None, first_slot=first * bs, length=longest)
        own = upload is None
        upload = StepUpload() if own else upload
        group = DecodeGroup(start, end, None, length=longest)
        blocks = upload.add([b for t in tables[start:end]
                             for b in (t[:width] if len(t) >= width else t + [0] * (width - len(t)))])
        lens = upload.add(ctx[start:end]) if ctx[end - 1] != longest else None  # contexts differ

        def finish(dev: torch.Tensor) -> None:
            slots = (upload.view(dev, blocks).view(m, width, 1) * bs + self._offsets).view(m, width * bs)
            group.slots = slots if width * bs == longest else slots[:, :longest].contiguous()
            if lens is not None:  # hide each context's padding
                pad = torch.arange(longest, device=self.device) >= upload.view(dev, lens)[:, None]
                group.mask = torch.zeros((m, 1, 1, longest), dtype=self.kv.dtype, device=self.device
                                         ).masked_fill_(pad.view(m, 1, 1, longest), float("-inf"))

        upload.then(finish)
        if own:
            upload.send(self.device)
        return group

    def _decode_meta(self, tables: list[list[int]], ctx: list[int], upload: StepUpload) -> DecodeMeta:
        """Fixed-shape metadata of the decode rows: block tables [B, W] padded with the null
        block and context lengths [B] go into ``upload``; the padding mask (-inf past each
        context) is made on the device once it has been sent."""
        bs = self.block_size
        m, width = len(ctx), -(-ctx[0] // bs)
        blocks = upload.add([b for t in tables
                             for b in (t[:width] if len(t) >= width else t + [NULL_BLOCK] * (width - len(t)))])
        lens = upload.add(ctx)
        meta = DecodeMeta(None, None, None, width)
        padded = any(c != width * bs for c in ctx)

        def finish(dev: torch.Tensor) -> None:
            meta.block_tables = upload.view(dev, blocks).view(m, width)
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
        if prefill_chunks is None:
            prefill_chunks = [r.num_tokens - r.num_computed_tokens for r in prefills]
        ids: list[int] = []
        positions: list[int] = []
        slot_mapping: list[int] = []
        bs = self.block_size
        n = len(decodes)
        upload = StepUpload()
        batch = AttentionBatch(positions=None, slot_mapping=None, num_decode=n, attention=self.attention)
        logits_rows = list(range(n))
        if decodes:
            # longest context first, so that groups of similar length are runs of rows; the
            # logits come back in the scheduler's order (logits_rows undoes the sort)
            order = sorted(range(n), key=lambda i: -decodes[i].num_tokens)
            ctx, tables = [], []
            for row, i in enumerate(order):
                r = decodes[i]
                length = r.num_tokens
                pos = length - 1
                table = r.block_table
                ids.append(r.output_token_ids[-1] if r.output_token_ids else r.prompt_token_ids[-1])
                positions.append(pos)
                slot_mapping.append(table[pos // bs] * bs + pos % bs)
                ctx.append(length)
                tables.append(table)
                logits_rows[i] = row
            if self.attention.uses_block_tables:
                batch.decode_meta = self._decode_meta(tables, ctx, upload)
            else:
                batch.decode_groups = [self._decode_group(a, b, tables, ctx, upload)
                                       for a, b in split_by_length(ctx)]
            gathered = [(g.end - g.start) * g.length for g in batch.decode_groups if g.first_slot is None]
            if gathered:
                batch.k_workspace, batch.v_workspace = self._gather_workspace(max(gathered))
        for r, chunk in zip(prefills, prefill_chunks):
            tokens = r.all_token_ids
            start = r.num_computed_tokens
            ctx = start + chunk
            if not 0 < chunk or ctx > len(tokens):
                raise ValueError(f"request {r.request_id!r}: a prefill chunk of {chunk} tokens from "
                                 f"{start} does not fit its {len(tokens)} tokens")
            table = r.block_table
            seq = PrefillSeq(q_start=len(ids), q_len=chunk, ctx_len=ctx)
            if start > 0:  # a cached prefix precedes: attention reads the whole context's slots
                width = -(-ctx // bs)
                part = upload.add(table[:width])

                def finish(dev, seq=seq, part=part, width=width, ctx=ctx):
                    seq.slots = (upload.view(dev, part).view(width, 1) * bs + self._offsets).view(-1)[:ctx]

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

    def sample(self, sampler, logits: torch.Tensor, reqs: list[Request], rng_states=()):
        """Tokens for ``reqs`` (one row of ``logits`` each), their log-probabilities when any
        request asked for them (a host tensor, see ``SampleResult``), and {row: error} for rows
        whose parameters made sampling raise. Those rows are found by sampling again one row at
        a time from the generators' saved ``rng_states`` (request, state), so one bad request
        cannot sink the others."""
        if not reqs:
            return [], None, {}
        errors: dict[int, str] = {}
        want = any(r.params.logprobs is not None for r in reqs)
        try:
            result = sampler(logits, reqs)
            token_ids, raw = result
            logprobs = _host_logprobs(result, raw) if want else None
        except Exception:  # noqa: BLE001 - find the request(s) it came from
            for r, state in rng_states:
                r._generator.set_state(state)
            token_ids, rows = [], []
            for i, r in enumerate(reqs):
                try:
                    result = sampler(logits[i:i + 1], [r])
                    token_ids.append(result[0][0])
                    rows.append(_host_logprobs(result, result[1])[0] if want else None)
                except Exception as exc:  # noqa: BLE001
                    errors[i] = f"sampling failed: {type(exc).__name__}: {exc}"
                    token_ids.append(None)
                    rows.append(logits[i].float().log_softmax(-1).cpu() if want else None)
            logprobs = torch.stack(rows) if want else None
        return token_ids, logprobs, errors


def _host_logprobs(result, raw: torch.Tensor) -> torch.Tensor:
    """The log-probabilities a sampler's result carries (``SampleResult.logprobs``); a
    sampler that returns a plain (ids, logits) pair gets them computed here instead."""
    table = getattr(result, "logprobs", None)
    return table if table is not None else raw.float().log_softmax(-1).cpu()
