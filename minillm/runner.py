"""The model runner: a scheduled batch in, one forward pass, logits out; then the sampler.

Paging is bookkeeping done here, in plain Python: token ``j`` of a request lives in cache slot
``block_table[j // block_size] * block_size + j % block_size``. For each scheduled request the
runner lists its new tokens, their positions, the slots their keys and values go to, and the
slots of its whole context (what its queries attend to); the lists go to the device in one
tensor, and the model does the rest (``minillm.models.llama``). A decode is simply a chunk
of one token.

This is the reference the chapter reads. The fast runner (``minillm.fast.runner``) makes the
same logits with device-side block tables, batched decode attention and decode graphs.
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

    @torch.inference_mode()
    def run(self, decodes: list[Request], prefills: list[Request],
            prefill_chunks: list[int] | None = None) -> torch.Tensor:
        """One forward pass over every scheduled request: one new token of each decode, then
        ``prefill_chunks[i]`` tokens of ``prefills[i]`` from its ``num_computed_tokens`` on
        (default: all the rest). Logits come back, in that order, for every request whose
        context is complete after this step; a partial prefill only writes its keys and values."""
        if prefill_chunks is None:
            prefill_chunks = [r.num_tokens - r.num_computed_tokens for r in prefills]
        bs = self.block_size
        ids, positions, slot_mapping, context_slots, logits_rows, seqs = [], [], [], [], [], []
        for req, chunk in zip(decodes + prefills, [1] * len(decodes) + list(prefill_chunks)):
            tokens, start = req.all_token_ids, req.num_computed_tokens
            end = start + chunk
            if chunk <= 0 or end > len(tokens):
                raise ValueError(f"request {req.request_id!r}: a chunk of {chunk} tokens from "
                                 f"{start} does not fit its {len(tokens)} tokens")
            slots = []  # of the whole context
            for j in range(end):
                slots.append(req.block_table[j // bs] * bs + j % bs)
            seqs.append(PrefillSeq(q_start=len(ids), q_len=chunk, ctx_len=end))
            ids += tokens[start:end]
            positions += range(start, end)
            slot_mapping += slots[start:]
            context_slots += slots
            if end == len(tokens):  # the context is complete: this request gets a token
                logits_rows.append(len(ids) - 1)
        # every integer of the step in one tensor, one copy to the device, then views of it
        dev = torch.tensor(ids + positions + slot_mapping + logits_rows + context_slots, device=self.device)
        n, r = len(ids), len(logits_rows)
        at = 3 * n + r
        for seq in seqs:
            seq.slots, at = dev[at:at + seq.ctx_len], at + seq.ctx_len
        batch = AttentionBatch(positions=dev[n:2 * n], slot_mapping=dev[2 * n:3 * n], prefills=seqs)
        return self.model(dev[:n], batch, self.kv, logits_rows=dev[3 * n:3 * n + r])

    def sample(self, sampler, logits: torch.Tensor, reqs: list[Request], rng_states=()):
        """Tokens for ``reqs`` (one row of ``logits`` each), their log-probabilities when any
        request asked for them, and {row: error} for rows whose parameters made sampling raise.
        Those rows are found by sampling again one row at a time from the generators' saved
        ``rng_states`` (request, state), so one bad request cannot sink the others."""
        if not reqs:
            return [], None, {}
        errors: dict[int, str] = {}
        want = False
        for r in reqs:
            want = want or r.params.logprobs is not None
        try:
            result = sampler(logits, reqs)
            token_ids, raw = result[0], result[1]
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
            logprobs = rows if want else None
        return token_ids, logprobs, errors


def _host_logprobs(result, raw: torch.Tensor):
    """The log-probabilities a sampler's result carries (the fast sampler's ``SampleResult.logprobs``:
    one ``TokenLogprobs`` per row); otherwise computed here (a dense [rows, vocab] host tensor;
    ``sampler.logprob_entry`` reads both)."""
    table = getattr(result, "logprobs", None)
    return table if table is not None else raw.float().log_softmax(-1).cpu()
