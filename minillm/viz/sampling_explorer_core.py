"""SamplingExplorerCore: the sampler opened up on one real next-token distribution.

Plain Python, importable without ipywidgets. It takes the next-token logits the model gives
after a context (``llm.next_token_logits``) and runs them through the sampler's own functions,
in the engine's own order: ``apply_temperature`` -> ``top_k_filter`` -> ``top_p_filter`` ->
``min_p_filter`` (``minillm.sampler``), keeping every intermediate distribution (a ``Stage``) so
you can see what each knob removes. ``sample()`` draws the token exactly as the engine would for
a request with this seed, ``draws(n)`` repeats the draw for a histogram, and ``append()`` puts
the chosen token into the context. :class:`~minillm.viz.sampling_explorer.SamplingExplorer` is
the widget around it.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import torch

from ..params import SamplingParams
from ..sampler import apply_temperature, make_generator, min_p_filter, processed_logits, top_k_filter, top_p_filter
from ._common import default_llm, token_text
from .fonts import with_cjk_fonts
from .i18n import phrase, resolve_lang

DEFAULT_EXPLORER_PROMPT = "Once upon a time, there was a little"


@dataclass
class Stage:
    """One step of the pipeline: the logits after it and the distribution they give."""

    name: str          # "raw", "temperature", "top-k", "top-p", "min-p" or "greedy"
    label: str         # a short human title, e.g. "top-k (k=20)"
    logits: torch.Tensor
    probs: torch.Tensor
    active: bool       # False when the knob is off and the step changes nothing

    @property
    def kept(self) -> int:
        """How many tokens can still be drawn."""
        return int(torch.isfinite(self.logits).sum())

    @property
    def entropy_bits(self) -> float:
        """Uncertainty of the distribution in bits (0 = one certain token)."""
        p = self.probs[self.probs > 0]
        return float(-(p * p.log2()).sum())


class SamplingExplorerCore:
    """The sampler, opened up on one real distribution. No widgets needed.

    Args:
        llm: an ``LLM``; None loads the shipped model.
        prompt: the starting context (tokenized by the model's tokenizer).
        temperature, top_k, top_p, min_p, seed: as in ``SamplingParams``.
        num_draws: how many draws ``draws()`` makes for the histogram.
    """

    def __init__(self, llm=None, prompt: str = DEFAULT_EXPLORER_PROMPT, *, temperature: float = 1.0,
                 top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, seed: int = 0, num_draws: int = 200,
                 lang=None):
        self.lang = resolve_lang(lang)
        self.llm = llm if llm is not None else default_llm()
        self.prompt = prompt
        self.prompt_ids: list[int] = list(self.llm.tokenizer.encode(prompt))
        if not self.prompt_ids:
            raise ValueError("prompt must give at least one token")
        self.appended: list[int] = []
        self.num_draws = num_draws
        self._check(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)
        self.temperature, self.top_k, self.top_p, self.min_p, self.seed = temperature, top_k, top_p, min_p, seed
        self._gen_states: list[torch.Tensor] = [make_generator(seed).get_state()]
        self._logits_cache: dict[tuple[int, ...], torch.Tensor] = {}

    # --- settings ------------------------------------------------------------------------
    @staticmethod
    def _check(**kw) -> SamplingParams:
        return SamplingParams(max_tokens=1, **kw)  # raises ValueError naming a bad field

    @property
    def params(self) -> SamplingParams:
        """The settings as the ``SamplingParams`` a request would carry."""
        return SamplingParams(max_tokens=1, temperature=self.temperature, top_k=self.top_k, top_p=self.top_p,
                              min_p=self.min_p, seed=self.seed)

    def set(self, **kwargs) -> None:
        """Change temperature / top_k / top_p / min_p / seed / num_draws. A new seed is a new
        generator, as for a new request: it applies from the current position on."""
        known = {"temperature", "top_k", "top_p", "min_p", "seed", "num_draws"}
        bad = set(kwargs) - known
        if bad:
            raise ValueError(f"unknown setting(s) {sorted(bad)}; use {sorted(known)}")
        if "num_draws" in kwargs:
            n = kwargs.pop("num_draws")
            if not isinstance(n, int) or n < 1:
                raise ValueError(f"num_draws must be an int >= 1, got {n!r}")
            self.num_draws = n
        merged = dict(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p, min_p=self.min_p,
                      seed=self.seed)
        merged.update(kwargs)
        self._check(**merged)
        if merged["seed"] != self.seed:
            self._gen_states[-1] = make_generator(merged["seed"]).get_state()
        for k, v in merged.items():
            setattr(self, k, v)

    # --- the context -----------------------------------------------------------------------
    @property
    def context_ids(self) -> list[int]:
        return self.prompt_ids + self.appended

    @property
    def context_text(self) -> str:
        return self.llm.tokenizer.decode(self.context_ids, skip_special_tokens=True)

    @property
    def logits(self) -> torch.Tensor:
        """The model's raw next-token logits after the current context (float32, 1-D)."""
        key = tuple(self.context_ids)
        if key not in self._logits_cache:
            self._logits_cache[key] = self.llm.next_token_logits(list(key)).detach().float().cpu()
        return self._logits_cache[key]

    # --- the pipeline ----------------------------------------------------------------------
    def stages(self) -> list[Stage]:
        """The distribution after each step, in the sampler's order. With temperature 0 the
        engine is greedy: it takes the argmax and skips every filter."""
        x = self.logits
        lang = self.lang
        out = [Stage("raw", phrase("se.raw", lang), x, x.softmax(-1), True)]
        if self.temperature == 0.0:
            g = processed_logits(x, self.params)
            out.append(Stage("greedy", phrase("se.greedy", lang), g, g.softmax(-1), True))
            return out
        x = apply_temperature(x, self.temperature)
        out.append(Stage("temperature", f"temperature={self.temperature:g}", x, x.softmax(-1),
                         self.temperature != 1.0))
        if self.top_k > 0:
            x = top_k_filter(x, self.top_k)
        out.append(Stage("top-k", phrase("se.top_k", lang, k=self.top_k) if self.top_k > 0 else phrase("se.top_k_off", lang), x,
                         x.softmax(-1), self.top_k > 0))
        if self.top_p < 1.0:
            x = top_p_filter(x, self.top_p)
        out.append(Stage("top-p", phrase("se.top_p", lang, p=f"{self.top_p:g}") if self.top_p < 1.0 else phrase("se.top_p_off", lang), x,
                         x.softmax(-1), self.top_p < 1.0))
        if self.min_p > 0.0:
            x = min_p_filter(x, self.min_p)
        out.append(Stage("min-p", phrase("se.min_p", lang, p=f"{self.min_p:g}") if self.min_p > 0 else phrase("se.min_p_off", lang), x,
                         x.softmax(-1), self.min_p > 0.0))
        return out

    def final_logits(self) -> torch.Tensor:
        return self.stages()[-1].logits

    def probs(self) -> torch.Tensor:
        """The distribution the token is drawn from."""
        return self.stages()[-1].probs

    def sample(self) -> int:
        """The token the engine would pick here, for a request with these settings and seed
        that had sampled the appended tokens so far: greedy takes the argmax; otherwise one
        ``torch.multinomial`` draw with the request's seeded generator."""
        token, _ = self._draw_one()
        return token

    def _draw_one(self) -> tuple[int, torch.Tensor]:
        state = self._gen_states[-1]
        if self.temperature == 0.0:
            return int(self.logits.argmax()), state
        gen = torch.Generator()
        gen.set_state(state)
        token = int(torch.multinomial(self.probs(), 1, generator=gen)[0])
        return token, gen.get_state()

    def draws(self, n: int | None = None) -> list[int]:
        """``n`` draws (default ``num_draws``) from this distribution with one generator
        seeded by ``seed``: the same seed always gives the same list."""
        n = self.num_draws if n is None else n
        if self.temperature == 0.0:
            return [int(self.logits.argmax())] * n
        gen = make_generator(self.seed)
        return torch.multinomial(self.probs(), n, replacement=True, generator=gen).tolist()

    def append(self, token_id: int | None = None) -> int:
        """Append ``token_id`` (default: the sampled token) to the context; the next
        distribution is computed from the longer history. Returns the appended id."""
        token, state = self._draw_one()
        if token_id is not None:
            vocab = self.logits.shape[-1]
            if not isinstance(token_id, int) or not 0 <= token_id < vocab:
                raise ValueError(f"token_id must be an int in [0, {vocab}), got {token_id!r}")
            token = token_id
        self.appended.append(token)
        self._gen_states.append(state)
        return token

    def undo(self) -> int | None:
        """Take the last appended token back (and the generator state with it)."""
        if not self.appended:
            return None
        self._gen_states.pop()
        return self.appended.pop()

    def reset(self) -> None:
        """Back to the prompt, with a fresh generator for the current seed."""
        self.appended.clear()
        self._gen_states = [make_generator(self.seed).get_state()]

    # --- tables ------------------------------------------------------------------------------
    def rank(self, token_id: int) -> int:
        """1 for the model's most likely next token (before any sampling step), 2 for the next, ..."""
        raw = self.stages()[0].probs
        return int((raw > raw[int(token_id)]).sum()) + 1

    def text(self, token_id: int) -> str:
        return token_text(self.llm.tokenizer, token_id)

    def top_tokens(self, n: int = 10, stage: str | None = None, digits: int | None = None) -> list[tuple[int, str, float]]:
        """The ``n`` most likely tokens after ``stage`` (default: the last one), as
        (id, text, probability); tokens a filter removed are left out."""
        stages = {s.name: s for s in self.stages()}
        st = stages[stage] if stage is not None else self.stages()[-1]
        probs = st.probs
        k = min(n, int((probs > 0).sum()))
        vals, ids = probs.topk(k)
        rows = [(int(i), self.text(int(i)), float(v)) for v, i in zip(vals, ids)]
        if digits is not None:
            rows = [(i, t, round(p, digits)) for i, t, p in rows]
        return rows

    def summary(self) -> str:
        """One line per stage: tokens left and the top token's probability."""
        lines = []
        for s in self.stages():
            top = int(s.probs.argmax())
            lines.append(f"{s.label:<32} " + phrase("se.summary", self.lang, kept=f"{s.kept:>5}", top=repr(self.text(top)),
                                                    p=f"{float(s.probs[top]):.3f}"))
        return "\n".join(lines)

    def print_table(self, n: int = 8, digits: int = 3) -> None:
        """Print the top ``n`` tokens after every stage side by side (for notebooks)."""
        stages = self.stages()
        raw = stages[0].probs
        order = raw.topk(min(n, raw.shape[-1])).indices.tolist()
        width = 14
        removed, left = phrase("se.removed", self.lang), phrase("se.tokens_left_row", self.lang)
        print(f"{'token':<14}" + "".join(f"{s.name:>{width}}" for s in stages))
        for t in order:
            cells = []
            for s in stages:
                p = float(s.probs[t])
                cells.append(f"{p:>{width}.{digits}f}" if p > 0 else f"{removed:>{width}}")
            print(f"{self.text(t)!r:<14}" + "".join(cells))
        print(f"{left:<14}" + "".join(f"{s.kept:>{width}}" for s in stages))

    # --- plot --------------------------------------------------------------------------------
    @with_cjk_fonts
    def figure(self, n: int = 15):
        """A matplotlib Figure: the top-``n`` tokens at every stage (same tokens, same order,
        so you can see what each step removes), then a histogram of ``num_draws`` draws."""
        from matplotlib.figure import Figure

        stages = self.stages()
        raw = stages[0].probs
        order = raw.topk(min(n, raw.shape[-1])).indices.tolist()[::-1]
        sampled = self.sample()
        if sampled not in order:  # a high temperature can pick a token outside the top n: show it too
            order = [sampled] + order
        lang = self.lang
        labels = [f"{self.text(t)}" + (phrase("se.rank", lang, r=self.rank(t)) if t == sampled and t == order[0]
                                      and len(order) > n else "") for t in order]
        fig = Figure(figsize=(2.1 * (len(stages) + 1), 0.26 * len(order) + 1.4), dpi=90)
        axes = fig.subplots(1, len(stages) + 1, sharey=False)
        xmax = max(float(s.probs[t]) for s in stages for t in order) * 1.15 or 1.0
        for ax, s in zip(axes, stages):
            vals = [float(s.probs[t]) for t in order]
            colors = []
            for t, v in zip(order, vals):
                if v == 0:
                    colors.append("#e5e7eb")
                elif t == sampled and s is stages[-1]:
                    colors.append("#f59e0b")
                else:
                    colors.append("#6366f1" if s.active else "#a5b4fc")
            ax.barh(range(len(order)), vals, color=colors)
            for y, v in enumerate(vals):
                if v == 0:
                    ax.text(0.0, y, " " + phrase("se.removed", lang), va="center", fontsize=9, color="#9ca3af")
            ax.set_title(f"{s.label}\n" + phrase("se.tokens_left", lang, n=s.kept), fontsize=10)
            ax.set_yticks(range(len(order)))
            ax.set_yticklabels(labels if ax is axes[0] else [], fontsize=10)
            ax.set_xlim(0, xmax)  # one scale for every stage: sharper means longer bars
            ax.tick_params(axis="x", labelsize=9)
        self._draw_panel(axes[-1], order, sampled, xmax, lang)
        axes[-1].tick_params(axis="x", labelsize=9)
        # fixed margins (tight_layout would cost a second full draw on every slider move)
        fig.subplots_adjust(left=0.09, right=0.98, top=1 - 0.5 / fig.get_figheight(),
                            bottom=0.35 / fig.get_figheight(), wspace=0.6)
        return fig

    def _draw_panel(self, ax, order: list[int], sampled: int, xmax: float, lang) -> None:
        """The histogram of ``num_draws`` draws over the same tokens, in the same order and on the
        same scale as the stage panels (at temperature 0 every draw is the argmax: one bar of 1.0
        among the empty rows of the tokens greedy never picks)."""
        draws = self.draws()
        counts: dict[int, int] = {}
        for t in draws:
            counts[t] = counts.get(t, 0) + 1
        shares = [counts.get(t, 0) / len(draws) for t in order]
        probs = self.probs()
        ax.barh(range(len(order)), shares, color=["#f59e0b" if t == sampled else "#10b981" for t in order])
        ax.scatter([float(probs[t]) for t in order], range(len(order)), marker="|", color="black", s=60,
                   label=phrase("se.probability", lang), zorder=3)
        ax.set_yticks(range(len(order)))
        ax.set_yticklabels([], fontsize=10)
        ax.set_xlim(0, max(xmax, max(shares) * 1.05))  # the stage panels' scale, unless a share is larger
        outside = len(draws) - sum(counts.get(t, 0) for t in order)
        title = phrase("se.draws_title", lang, n=len(draws), seed=self.seed)
        ax.set_title(title + (phrase("se.draws_outside", lang, k=outside) if outside else ""), fontsize=10)

    def png(self, n: int = 15) -> bytes:
        buf = io.BytesIO()
        self.figure(n).savefig(buf, format="png")
        return buf.getvalue()
