"""Logits -> token. Sampling is part of a request's execution: the token it picks becomes
the history every later step is computed from.

Processors run in this fixed order, on a batch of rows (one row per request):

1. ``apply_penalties``: repetition_penalty (prompt + output tokens; positive logits are
   divided by it, negative ones multiplied, as in vLLM and transformers), then
   presence_penalty and frequency_penalty (output tokens only: ``logit -= presence * seen
   + frequency * count``);
2. ``apply_temperature``: logits / temperature; greedy rows (temperature 0 or below
   ``GREEDY_EPS`` = 1e-5) skip 2-6 and take the argmax of the penalised logits;
3. ``top_k_filter``: keep the k highest logits;
4. ``top_p_filter``: keep the smallest set of most likely tokens whose probability adds up
   to at least top_p;
5. ``min_p_filter``: drop tokens whose probability is below min_p x the top probability;
6. one draw from softmax of what is left, with the request's own ``torch.Generator``, so
   a seeded request gives the same tokens whatever else shares its batch.

After penalties and after temperature, ``finite_or_best`` guards each row: any legal
``SamplingParams`` value, however extreme, yields a token chosen from finite logits (or, when
a penalty removed everything, the model's own argmax), never one picked from NaN.

Each filter is a plain function on a logits tensor, so notebooks and exercises can apply
them one by one and look at the distribution in between.
"""

from __future__ import annotations

import torch

from .params import SamplingParams

NEG_INF = float("-inf")


def apply_penalties(logits: torch.Tensor, params: SamplingParams, prompt_ids: list[int],
                    output_ids: list[int]) -> torch.Tensor:
    """Penalties for one row (1-D logits). Returns a new tensor. Huge (legal) penalties may
    push logits to +-inf; ``finite_or_best`` then decides what survives."""
    logits = logits.clone()
    device = logits.device
    vocab = logits.shape[-1]
    if params.repetition_penalty != 1.0 and (prompt_ids or output_ids):
        seen = torch.tensor(sorted(t for t in set(prompt_ids) | set(output_ids) if 0 <= t < vocab),
                            device=device, dtype=torch.long)
        vals = logits[seen]
        logits[seen] = torch.where(vals > 0, vals / params.repetition_penalty,
                                   vals * params.repetition_penalty)
    if (params.presence_penalty or params.frequency_penalty) and output_ids:
        ids = torch.tensor(output_ids, device=device)
        counts = torch.bincount(ids, minlength=vocab)[:vocab].to(logits.dtype)
        seen = counts > 0
        # only seen tokens change: a huge penalty times a count of 0 must not give inf * 0 = NaN
        penalty = params.frequency_penalty * counts + params.presence_penalty
        logits = torch.where(seen, logits - penalty, logits)
    return logits


def finite_or_best(logits: torch.Tensor, raw: torch.Tensor | None = None) -> torch.Tensor:
    """Make every row safe to argmax and softmax, whatever penalties or temperature did:
    NaN becomes -inf; in a row with +inf entries those (and only those) stay, tied at 0;
    a row left with no finite logit falls back to the argmax of ``raw`` (the model's own
    logits), so a token is still chosen for a reason and never from NaN order."""
    logits = torch.nan_to_num(logits, nan=NEG_INF, posinf=float("inf"), neginf=NEG_INF)
    pos = logits == float("inf")
    has_pos = pos.any(dim=-1, keepdim=True)
    if bool(has_pos.any()):
        logits = torch.where(has_pos, torch.where(pos, 0.0, NEG_INF), logits)
    dead = (logits == NEG_INF).all(dim=-1, keepdim=True)
    if bool(dead.any()):
        source = logits if raw is None else torch.nan_to_num(raw.float(), nan=NEG_INF)
        best = source.argmax(dim=-1, keepdim=True)
        one_hot = torch.full_like(logits, NEG_INF).scatter(-1, best, 0.0)
        logits = torch.where(dead, one_hot, logits)
    return logits


def apply_temperature(logits: torch.Tensor, temperature) -> torch.Tensor:
    """Divide by temperature (a float or a per-row tensor); temperature must be > 0 here."""
    if isinstance(temperature, torch.Tensor):
        temperature = temperature.to(logits.dtype).unsqueeze(-1)
    return logits / temperature


def top_k_filter(logits: torch.Tensor, top_k) -> torch.Tensor:
    """Keep the ``top_k`` highest logits of each row (0 = keep all; a k beyond the vocabulary
    keeps all too); others become -inf."""
    vocab = logits.shape[-1]
    if isinstance(top_k, int):  # any Python int, even 2**63, before it becomes an int64 tensor
        top_k = min(top_k, vocab)
    elif not isinstance(top_k, torch.Tensor):
        top_k = [min(int(k), vocab) for k in top_k]
    k = torch.as_tensor(top_k, device=logits.device).long()
    k = torch.where(k <= 0, torch.full_like(k, vocab), k.clamp(max=vocab))
    sorted_logits = logits.sort(dim=-1, descending=True).values
    kth = sorted_logits.gather(-1, (k - 1).reshape(*k.shape, 1).expand(*logits.shape[:-1], 1))
    return logits.masked_fill(logits < kth, NEG_INF)


def top_p_filter(logits: torch.Tensor, top_p) -> torch.Tensor:
    """Nucleus filter: keep the smallest set of most likely tokens whose probabilities add up
    to at least ``top_p`` (always at least one token); others become -inf."""
    p = torch.as_tensor(top_p, device=logits.device, dtype=torch.float32)
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    probs = sorted_logits.float().softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of the tokens ranked above
    remove_sorted = mass_before >= p.reshape(*p.shape, 1) if p.dim() else mass_before >= p
    remove_sorted[..., 0] = False
    remove = torch.zeros_like(remove_sorted).scatter(-1, order, remove_sorted)
    return logits.masked_fill(remove, NEG_INF)


def min_p_filter(logits: torch.Tensor, min_p) -> torch.Tensor:
    """Drop tokens whose probability is below ``min_p`` times the most likely token's."""
    p = torch.as_tensor(min_p, device=logits.device, dtype=torch.float32)
    probs = logits.float().softmax(dim=-1)
    threshold = probs.max(dim=-1, keepdim=True).values * (p.unsqueeze(-1) if p.dim() else p)
    return logits.masked_fill(probs < threshold, NEG_INF)


def processed_logits(logits: torch.Tensor, params: SamplingParams, prompt_ids: list[int] = (),
                     output_ids: list[int] = ()) -> torch.Tensor:
    """The whole pipeline (steps 1-5) for one row, as the sampler applies it. For a greedy
    request the result keeps only the argmax."""
    raw = logits.float()
    logits = finite_or_best(apply_penalties(raw, params, list(prompt_ids), list(output_ids)), raw)
    if params.greedy:
        keep = logits.argmax(dim=-1, keepdim=True)
        return torch.full_like(logits, NEG_INF).scatter(-1, keep, logits.gather(-1, keep))
    logits = finite_or_best(apply_temperature(logits, params.temperature), raw)
    if params.top_k > 0:
        logits = top_k_filter(logits, params.top_k)
    if params.top_p < 1.0:
        logits = top_p_filter(logits, params.top_p)
    if params.min_p > 0.0:
        logits = min_p_filter(logits, params.min_p)
    return logits


def make_generator(seed: int, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator for one request. Any integer seed works: it is reduced modulo 2**64 (the
    generator's range), so -1 and 2**64 - 1 give the same stream, deterministically."""
    gen = torch.Generator(device=device)
    gen.manual_seed(int(seed) % (2**64))
    return gen


class Sampler:
    """Samples one token per row of a batch of logits, each row with its own request's
    params and generator. Batched where the rows agree (all greedy is one argmax)."""

    def __call__(self, logits: torch.Tensor, requests: list) -> tuple[list[int], torch.Tensor]:
        """Returns the chosen token ids and the raw (float32) logits they were drawn from."""
        logits = logits.float()
        all_plain = all(
            r.params.repetition_penalty == 1.0 and not r.params.presence_penalty
            and not r.params.frequency_penalty for r in requests
        )
        if all_plain:
            processed = logits
        else:
            processed = finite_or_best(torch.stack([
                apply_penalties(logits[i], r.params, r.prompt_token_ids, r.output_token_ids)
                for i, r in enumerate(requests)
            ]), logits)
        greedy_ids = processed.argmax(dim=-1)
        sampled_rows = [i for i, r in enumerate(requests) if not r.params.greedy]
        chosen = greedy_ids.clone()
        if sampled_rows:
            rows = torch.tensor(sampled_rows, device=logits.device)
            sub = processed.index_select(0, rows)
            ps = [requests[i].params for i in sampled_rows]
            temps = torch.tensor([p.temperature for p in ps], device=logits.device)
            sub = apply_temperature(sub, temps)
            if not all_plain:  # huge penalties / small temperature may have made inf
                sub = finite_or_best(sub, logits.index_select(0, rows))
            vocab = logits.shape[-1]
            if any(p.top_k > 0 for p in ps):
                sub = top_k_filter(sub, torch.tensor([min(p.top_k, vocab) for p in ps], device=logits.device))
            if any(p.top_p < 1.0 for p in ps):
                sub = top_p_filter(sub, torch.tensor([p.top_p for p in ps], device=logits.device))
            if any(p.min_p > 0.0 for p in ps):
                sub = min_p_filter(sub, torch.tensor([p.min_p for p in ps], device=logits.device))
            probs = sub.softmax(dim=-1)
            for j, i in enumerate(sampled_rows):
                token = torch.multinomial(probs[j], 1, generator=requests[i]._generator)
                chosen[i] = token[0]
        return chosen.tolist(), logits
