"""Logits -> token. Sampling is part of a request's execution: the token it picks becomes
the history every later step is computed from.

Processors run in this fixed order, on one row of logits (one request):

0. ``apply_logit_bias``: each request's ``logit_bias`` is added to the model's logits (vLLM's
   and OpenAI's meaning: -100 all but bans a token, +100 all but forces it);
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
   a seeded request gives the same tokens whatever else shares its batch. The draw is an
   *exponential race*: each token gets Exp(1) noise ``q`` and the row takes
   ``argmax(logit - log q)``, which picks token ``i`` with probability ``softmax(logits)[i]``
   (the Gumbel-max trick).

After penalties and after temperature, ``finite_or_best`` guards the row: any legal
``SamplingParams`` value, however extreme, yields a token chosen from finite logits (or, when
a penalty removed everything, the model's own argmax), never one picked from NaN.

Each processor is a plain function on a logits tensor, so notebooks and exercises can apply
them one by one and look at the distribution in between. ``Sampler`` is the reference: one
row at a time. The fast layer's sampler (``minillm.fast.sampler``) does the same for a whole
batch in a fixed number of device operations and picks the same tokens.
"""

from __future__ import annotations

import torch

from .params import SamplingParams

NEG_INF = float("-inf")


def apply_logit_bias(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """``params.logit_bias`` added to one row (1-D logits). Returns a new tensor."""
    bias = params.logit_bias
    if not bias:
        return logits.clone()
    ids = torch.tensor([t for t, _ in bias], device=logits.device, dtype=torch.long)
    values = torch.tensor([b for _, b in bias], device=logits.device, dtype=logits.dtype)
    return logits.index_add(-1, ids, values)


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
    # no `if rows.any()` shortcuts: each would make the host wait for the device
    inf = float("inf")
    logits = torch.nan_to_num(logits, nan=NEG_INF, posinf=inf, neginf=NEG_INF)
    top = logits.amax(dim=-1, keepdim=True)
    has_pos, dead = top == inf, top == NEG_INF
    logits = torch.where(has_pos, torch.where(logits == inf, 0.0, NEG_INF), logits)
    source = logits if raw is None else torch.nan_to_num(raw.float(), nan=NEG_INF)
    best = source.argmax(dim=-1, keepdim=True)
    # a dead row (all -inf) gets 0 at the best token; any other row keeps its value there
    return logits.scatter(-1, best, torch.where(dead, 0.0, logits.gather(-1, best)))


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
                     output_ids: list[int] = (), top_k=None, top_p=None) -> torch.Tensor:
    """The whole pipeline (steps 0-5) for one row, as the sampler applies it. For a greedy
    request the result keeps only the argmax. ``top_k`` / ``top_p``: filter functions to use
    instead of ``top_k_filter`` / ``top_p_filter``."""
    raw = logits.float()
    logits = finite_or_best(apply_penalties(apply_logit_bias(raw, params), params, list(prompt_ids),
                                            list(output_ids)), raw)
    if params.greedy:
        keep = logits.argmax(dim=-1, keepdim=True)
        return torch.full_like(logits, NEG_INF).scatter(-1, keep, logits.gather(-1, keep))
    logits = finite_or_best(apply_temperature(logits, params.temperature), raw)
    if params.top_k > 0:
        logits = torch.as_tensor((top_k or top_k_filter)(logits.clone(), params.top_k), dtype=raw.dtype)
    if params.top_p < 1.0:
        logits = torch.as_tensor((top_p or top_p_filter)(logits.clone(), params.top_p), dtype=raw.dtype)
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
    """Samples one token per row of a batch of logits, one row (one request) at a time: the
    processors above (``processed_logits``), then the request's own draw. Returns the chosen
    ids and the (float32) logits they were drawn from. ``top_k_filter(logits, k)`` /
    ``top_p_filter(logits, p)``: one-row filters to use instead of the engine's
    (``minillm.seams``: a learner's own)."""

    def __init__(self, top_k_filter=None, top_p_filter=None):
        self.filters = (top_k_filter, top_p_filter)  # None: the engine's (``processed_logits``)

    def __call__(self, logits: torch.Tensor, requests: list) -> tuple[list[int], torch.Tensor]:
        logits = logits.float()
        chosen = []
        for row, req in zip(logits, requests):
            p = req.params
            untouched = (not p.logit_bias and p.repetition_penalty == 1.0 and not p.presence_penalty
                         and not p.frequency_penalty)
            if p.greedy and untouched:  # nothing changes the model's logits: their argmax
                chosen.append(int(row.argmax()))
                continue
            x = processed_logits(row, p, req.prompt_token_ids, req.output_token_ids, *self.filters)
            if not p.greedy:  # the race: a draw of exactly 0 would give -log 0 = inf, hence the clamp
                noise = torch.empty_like(x).exponential_(generator=req._generator)
                x = x - noise.clamp_(min=torch.finfo(noise.dtype).tiny).log()
            chosen.append(int(x.argmax()))
        return chosen, logits


def logprob_entry(token: int, row, n: int) -> dict:
    """What a request records for a token (``Request.logprobs``): its log-probability and the
    ``n`` best ``(token_id, logprob)`` pairs. ``row`` is a ``(logprob, top)`` pair (``minillm.fast.sampler.TokenLogprobs``) or a dense 1-D
    tensor of log-probabilities (from a sampler that returns none, or a row sampled alone)."""
    if isinstance(row, tuple):  # the fast sampler's ``TokenLogprobs``
        return {"token_id": token, "logprob": float(row.logprob), "top": list(row.top[:n]) if n else []}
    top = torch.topk(row, min(max(n, 1), row.shape[-1])) if n else None
    return {"token_id": token, "logprob": float(row[token]),
            "top": [] if top is None else [(int(t), float(lp)) for lp, t in zip(*top)]}
