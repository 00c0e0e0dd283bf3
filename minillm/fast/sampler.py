"""The fast layer's sampler: ``minillm.sampler``'s pipeline on a whole batch at once.

The reference ``Sampler`` processes one row at a time; this one runs steps 0-6 on the whole
batch without waiting for the device: the per-row parameters go up in one copy; what the
penalties count (``PenaltyCounts``) is kept on the device per request, built once from its
tokens and bumped by each chosen token there, so a step's upload does not grow with the
history; top-k / top-p / min-p share one sort (``sorted_filters``), and greedy and sampled rows
end in one argmax over the exponential race. A request with a ``seed`` draws its noise from its
own generator, so its tokens do not depend on what shares its batch. On CUDA
(``BatchedSampler(shared_noise=...)``) the rows without a seed draw theirs in one launch from
the sampler's generator (seeded by ``LLM(seed=...)``) instead of one launch per row:
reproducible run for run, but no longer alone-or-batched invariant. The chosen ids (and, for
``logprobs``, only each row's chosen and top-k values, picked on the device) come back in one
copy. On the CPU it picks the tokens the reference picks (the parity and fuzz tests check it).
"""

from __future__ import annotations

from array import array

import torch

from ..sampler import NEG_INF, apply_temperature, finite_or_best, make_generator, min_p_filter, top_k_filter, \
    top_p_filter

def sorted_filters(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                   min_p: torch.Tensor | None) -> torch.Tensor:
    """``top_k_filter``, then ``top_p_filter``, then ``min_p_filter`` on a batch, with one
    shared sort. Per-row tensors; a row with k <= 0, p >= 1 or min_p = 0 is left alone by
    that filter (so a request is filtered the same way whatever else shares its batch)."""
    vocab = logits.shape[-1]
    values, order = logits.sort(dim=-1, descending=True)
    remove = torch.zeros_like(values, dtype=torch.bool)
    if top_k is not None:
        k = torch.where(top_k <= 0, vocab, top_k.clamp(max=vocab)).long()
        kth = values.gather(-1, (k - 1).unsqueeze(-1))
        remove |= values < kth
    if top_p is not None:
        probs = values.masked_fill(remove, NEG_INF).float().softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        cut = (mass_before >= top_p.unsqueeze(-1)) & (top_p < 1.0).unsqueeze(-1)
        cut[..., 0] = False
        remove |= cut
    if min_p is not None:
        probs = values.masked_fill(remove, NEG_INF).float().softmax(dim=-1)
        remove |= probs < probs[..., :1] * min_p.unsqueeze(-1)
    return logits.masked_fill(torch.zeros_like(remove).scatter(-1, order, remove), NEG_INF)


# columns of the per-row parameter block the sampler sends to the device (_ROW: the row of
# ``PenaltyCounts`` that holds the request's counts, 0 = none)
_TEMP, _GREEDY, _TOP_K, _TOP_P, _MIN_P, _REP, _PRES, _FREQ, _ROW = range(9)
_COLUMNS = 9


class PenaltyCounts:
    """What the penalties need of each penalised request, kept on the logits' device from step
    to step: ``counts[row]``, how often each token was output, and ``seen[row]``, which tokens
    the prompt or the output hold. A row is built once from the request's tokens (the flat ids
    ride in the sampler's one upload), then bumped on the device by the token chosen each step,
    so a step uploads O(rows) values whatever the contexts' lengths.

    Row 0 stays all zero: unpenalised rows of a batch read it. ``num_counted[req]`` is how many
    output tokens a row accounts for; a request whose output length disagrees (a step rolled
    back after sampling, a test that set the tokens by hand) is rebuilt, so the counts never
    drift from ``output_token_ids``. ``forget`` frees a row when its request ends."""

    def __init__(self):
        self.counts: torch.Tensor | None = None  # [capacity, vocab] float32
        self.seen: torch.Tensor | None = None    # [capacity, vocab] bool
        self.rows: dict = {}                     # request -> row
        self.num_counted: dict = {}              # request -> output tokens the row holds
        self._free: list[int] = []

    def __len__(self) -> int:
        return len(self.rows)

    def forget(self, req) -> None:
        """The request is done: its row goes back to the free list."""
        row = self.rows.pop(req, None)
        self.num_counted.pop(req, None)
        if row is not None:
            self._free.append(row)

    def _fit(self, vocab: int, device: torch.device, needed: int) -> None:
        """Tensors for this vocabulary and device with at least ``needed`` free rows."""
        if self.counts is not None and (self.counts.shape[1] != vocab or self.counts.device != device):
            self.counts = self.seen = None  # another model's logits: start over
            self.rows.clear(), self.num_counted.clear(), self._free.clear()
        capacity = 0 if self.counts is None else self.counts.shape[0]
        if len(self._free) >= needed:
            return
        short = needed - len(self._free) + (capacity == 0)  # row 0 is never handed out
        new_cap = max(2 * capacity, capacity + short, 9)
        counts = torch.zeros((new_cap, vocab), dtype=torch.float32, device=device)
        seen = torch.zeros((new_cap, vocab), dtype=torch.bool, device=device)
        if capacity:
            counts[:capacity] = self.counts
            seen[:capacity] = self.seen
        self.counts, self.seen = counts, seen
        self._free.extend(range(max(capacity, 1), new_cap))

    def plan(self, requests: list, penalised: list[bool], vocab: int, device: torch.device):
        """Host side of a step: each row's counts row (0 when unpenalised), and for the rows to
        (re)build: their row ids, the flat ids ``row * vocab + token`` of their seen tokens
        and of their output tokens (one per occurrence)."""
        stale = [r for r, pen in zip(requests, penalised)
                 if pen and self.num_counted.get(r) != len(r.output_token_ids)]
        for r, pen in zip(requests, penalised):
            if pen:  # until ``commit``: a step cut short anywhere leaves these rows to be rebuilt
                self.num_counted.pop(r, None)
        self._fit(vocab, device, sum(1 for r in stale if r not in self.rows))
        rebuild, seen_ids, out_ids = [], [], []
        for r in stale:
            row = self.rows.get(r)
            if row is None:
                row = self.rows[r] = self._free.pop()
            rebuild.append(row)
            base = row * vocab
            seen_ids += sorted(base + t for t in set(r.prompt_token_ids) | set(r.output_token_ids)
                               if 0 <= t < vocab)
            out_ids += [base + t for t in r.output_token_ids if 0 <= t < vocab]
        rows = [self.rows[r] if pen else 0 for r, pen in zip(requests, penalised)]
        return rows, rebuild, seen_ids, out_ids

    def build(self, rebuild: torch.Tensor, seen_ids: torch.Tensor, out_ids: torch.Tensor) -> None:
        """Device side of ``plan``: zero the rows, then mark and count their tokens."""
        self.counts.index_fill_(0, rebuild, 0.0)
        self.seen.index_fill_(0, rebuild, False)
        self.seen.view(-1)[seen_ids] = True
        self.counts.view(-1).index_add_(0, out_ids, torch.ones_like(out_ids, dtype=self.counts.dtype))

    def bump(self, requests: list, penalised: list[bool], rows: torch.Tensor, chosen: torch.Tensor) -> None:
        """Count each penalised row's chosen token, on the device (no upload, no wait), then
        record that the rows hold their outputs so far plus that token."""
        real = rows > 0  # row 0 (the unpenalised rows) must stay zero
        self.counts.index_put_((rows, chosen), real.to(self.counts.dtype), accumulate=True)
        self.seen.index_put_((rows, chosen), real)
        for r, pen in zip(requests, penalised):
            if pen and r in self.rows:
                self.num_counted[r] = len(r.output_token_ids) + 1


class TokenLogprobs(tuple):
    """One row's log-probabilities as the sampler sends them to the host: ``(logprob, top)``,
    the chosen token's and the row's top ``k`` as ``[(token_id, logprob), ...]`` best first
    (``k`` the largest ``params.logprobs`` of the batch; ``logprob_entry`` keeps a request's own)."""

    def __new__(cls, logprob: float, top: list):
        return super().__new__(cls, (logprob, top))

    @property
    def logprob(self) -> float:
        return self[0]

    @property
    def top(self) -> list:
        return self[1]


def _as_float32(values: list[float]) -> list[float]:
    """Values rounded as a float32 tensor holds them (the log-probabilities' precision), on
    the host without torch (no tensor made: a step's only device->host copy stays the one)."""
    return array("f", values).tolist()


class SampleResult(tuple):
    """``(token_ids, raw_logits)``, plus ``logprobs``: None, or one ``TokenLogprobs`` per row
    (host values: the chosen token's log-probability and the top ``max(params.logprobs)``)."""

    logprobs: list | None = None

    def __new__(cls, token_ids, raw, logprobs=None):
        self = super().__new__(cls, (token_ids, raw))
        self.logprobs = logprobs
        return self


def plainly_greedy(p) -> bool:
    """Whether a row of these params gets the argmax of its logits as they are (greedy, no
    penalty or bias, no log-probabilities): ``BatchedSampler.choose``'s shortcut."""
    return (p.greedy and p.logprobs is None and not p.logit_bias and p.repetition_penalty == 1.0
            and not p.presence_penalty and not p.frequency_penalty)


class BatchedSampler:
    """Samples one token per row of a batch of logits, each row with its own request's
    params (and, when seeded, its own generator), in a fixed number of device operations: at most one host->device
    copy (the rows' parameters, plus the tokens of a penalised request's first step) and one
    device->host copy (the chosen ids, with the log-probabilities when a request asked for
    them). Keeps ``penalty_counts`` between calls: ``forget(req)`` when a request ends."""

    def __call__(self, logits: torch.Tensor, requests: list) -> SampleResult:
        """Returns the chosen token ids and the raw (float32) logits they were drawn from;
        ``.logprobs`` as ``SampleResult`` says."""
        logits = logits.float()
        chosen = self.choose(logits, requests)
        wanted = [r.params.logprobs for r in requests if r.params.logprobs is not None]
        if not wanted:
            return SampleResult(chosen.tolist(), logits)  # the step's one device->host copy
        k = min(max(max(wanted), 1), logits.shape[1])
        lp = logits.log_softmax(-1)
        top = lp.topk(k, dim=-1)
        packet = torch.cat([chosen.unsqueeze(-1).double(), lp.gather(-1, chosen.unsqueeze(-1)).double(),
                            top.values.double(), top.indices.double()], dim=-1)
        host = packet.tolist()  # the step's one device->host copy: 2 + 2k values a row (ids exact in float64)
        token_ids = [int(row[0]) for row in host]
        table = [TokenLogprobs(_as_float32(row[1:2])[0], list(zip(map(int, row[2 + k:]), _as_float32(row[2:2 + k]))))
                 for row in host]
        return SampleResult(token_ids, logits, table)

    def __init__(self, top_k_filter=None, top_p_filter=None):
        """``top_k_filter(logits, k)`` / ``top_p_filter(logits, p)``: one-row filters to use
        instead of the batched shared sort (``minillm.seams``: a learner's own)."""
        self.penalty_counts = PenaltyCounts()
        self.row_filters = (top_k_filter, top_p_filter) if top_k_filter or top_p_filter else None
        #: draw the unseeded rows' noise in one launch from a generator of the sampler's
        #: (None: on CUDA, where a launch per row costs; ``LLM`` seeds it with its ``seed``)
        self.shared_noise: bool | None = None
        self.seed = 0
        self._generator: torch.Generator | None = None  # made on the logits' device at first use

    def rng_state(self):
        """The shared generator's state (None: not made yet), for a step that may be undone."""
        return None if self._generator is None else self._generator.get_state()

    def set_rng_state(self, state) -> None:
        """Rewind the shared generator to a ``rng_state()`` (None: as if never used)."""
        if state is None:
            self._generator = None
        else:
            self._generator.set_state(state)

    def _noise(self, x: torch.Tensor, requests: list, sampled: list[bool]) -> torch.Tensor:
        """Exp(1) noise for the sampled rows: a row with a seed from its own generator (one
        launch each, batch-invariant); with ``shared_noise``, every other row from one launch
        of the shared generator; without, from its request's generator, one launch per row."""
        shared = self.shared_noise if self.shared_noise is not None else x.device.type == "cuda"
        own = [i for i, r in enumerate(requests) if sampled[i] and not (shared and r.params.seed is None)]
        if len(own) < sum(sampled):  # one launch for every row (greedy rows' noise goes unused)
            if self._generator is None or self._generator.device != x.device:
                self._generator = make_generator(self.seed, x.device)
            noise = torch.empty_like(x).exponential_(generator=self._generator)
        else:
            noise = torch.ones_like(x)
        for i in own:
            noise[i].exponential_(generator=requests[i]._generator)
        return noise

    def forget(self, req) -> None:
        """Drop what the sampler keeps for ``req`` (its penalty counts): call when it ends."""
        self.penalty_counts.forget(req)

    def choose(self, logits: torch.Tensor, requests: list) -> torch.Tensor:
        """[rows] chosen token ids, on the logits' device; the host never waits for it."""
        rows, vocab = logits.shape
        params = [r.params for r in requests]
        penalised = [p.repetition_penalty != 1.0 or bool(p.presence_penalty) or bool(p.frequency_penalty)
                     for p in params]
        sampled = [not p.greedy for p in params]
        biased = [bool(p.logit_bias) for p in params]
        if not any(penalised) and not any(sampled) and not any(biased):
            return logits.argmax(dim=-1)
        state = self.penalty_counts
        if any(penalised):
            state_rows, rebuild, seen_ids, out_ids = state.plan(requests, penalised, vocab, logits.device)
        else:
            state_rows, rebuild, seen_ids, out_ids = [0] * rows, [], [], []
        block = []
        for p, row in zip(params, state_rows):
            greedy = p.greedy
            block += [1.0 if greedy else p.temperature, float(greedy),
                      0.0 if greedy or p.top_k <= 0 else float(min(p.top_k, vocab)),
                      1.0 if greedy else p.top_p, 0.0 if greedy else p.min_p,
                      p.repetition_penalty, p.presence_penalty, p.frequency_penalty, float(row)]
        bias_ids, bias_values = [], []
        for i, (p, b) in enumerate(zip(params, biased)):
            if b:
                bias_ids += [i * vocab + t for t, _ in p.logit_bias]
                bias_values += [v for _, v in p.logit_bias]
        # ids are exact in float64 (below 2**53)
        upload = torch.tensor(block + rebuild + seen_ids + out_ids + bias_ids + bias_values, dtype=torch.float64)
        if logits.device.type == "cuda":
            upload = upload.pin_memory()
        upload = upload.to(logits.device, non_blocking=True)  # the sampler's one host->device copy
        n = rows * _COLUMNS
        table = upload[:n].view(rows, _COLUMNS)
        cols = table.float()
        processed = logits
        end = upload.shape[0] - 2 * len(bias_ids)  # where the penalties' part of the upload ends
        if bias_ids:  # one add on the device, per flat (row, token) index
            nb = len(bias_ids)
            processed = logits.flatten().index_add(0, upload[end:end + nb].long(),
                                                   upload[end + nb:].to(logits.dtype)).view(rows, vocab)
        if any(penalised):
            a, b = n + len(rebuild), n + len(rebuild) + len(seen_ids)
            if rebuild:
                state.build(upload[n:a].long(), upload[a:b].long(), upload[b:end].long())
            row_ids = table[:, _ROW].long()
            x = processed  # each penalty below makes a new tensor (torch.where), never writes into it
            if any(p.repetition_penalty != 1.0 for p in params):
                seen = state.seen.index_select(0, row_ids)
                rp = cols[:, _REP:_REP + 1]
                x = torch.where(seen, torch.where(x > 0, x / rp, x * rp), x)
            if any(p.presence_penalty or p.frequency_penalty for p in params):
                counts = state.counts.index_select(0, row_ids)
                # only seen tokens change: a huge penalty times a count of 0 must not give NaN
                penalty = cols[:, _FREQ:_FREQ + 1] * counts + cols[:, _PRES:_PRES + 1]
                x = torch.where(counts > 0, x - penalty, x)
            processed = finite_or_best(x, logits)
        chosen = self._race(logits, processed, cols, params, requests, sampled, penalised)
        if any(penalised):
            state.bump(requests, penalised, row_ids, chosen)
        return chosen

    def _race(self, logits, processed, cols, params, requests, sampled, penalised) -> torch.Tensor:
        """Temperature, the shared-sort filters and the exponential race over the sampled rows;
        greedy rows take the argmax of ``processed``."""
        if not any(sampled):
            return processed.argmax(dim=-1)
        x = apply_temperature(processed, cols[:, _TEMP])
        if any(penalised):  # huge penalties / a small temperature may have made inf
            x = finite_or_best(x, logits)
        on = [p for p, s in zip(params, sampled) if s]
        use_k, use_p, use_min = (any(p.top_k > 0 for p in on), any(p.top_p < 1.0 for p in on),
                                 any(p.min_p > 0.0 for p in on))
        if self.row_filters is not None:
            x = _filter_rows(x, params, sampled, *self.row_filters)
        elif use_k or use_p or use_min:
            x = sorted_filters(x, cols[:, _TOP_K] if use_k else None, cols[:, _TOP_P] if use_p else None,
                               cols[:, _MIN_P] if use_min else None)
        noise = self._noise(x, requests, sampled)
        # a draw of exactly 0 would give -log 0 = inf (and NaN on a removed token)
        race = x - noise.clamp_(min=torch.finfo(noise.dtype).tiny).log()
        return torch.where(cols[:, _GREEDY:_GREEDY + 1] > 0, processed, race).argmax(dim=-1)


def _filter_rows(x: torch.Tensor, params: list, sampled: list[bool], top_k, top_p) -> torch.Tensor:
    """Top-k, top-p (each the given one-row function, or the engine's), then min-p, row by row."""
    rows = []
    for row, p, s in zip(x, params, sampled):
        if s and p.top_k > 0:
            row = (top_k or top_k_filter)(row.clone(), p.top_k)
        if s and p.top_p < 1.0:
            row = (top_p or top_p_filter)(row.clone(), p.top_p)
        if s and p.min_p > 0.0:
            row = min_p_filter(row, p.min_p)
        rows.append(torch.as_tensor(row, dtype=x.dtype, device=x.device).reshape(x.shape[-1]))
    return torch.stack(rows)
