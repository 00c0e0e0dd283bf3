"""SamplingExplorer: temperature, top-k, top-p, min-p and a seed on the model's real logits.

``SamplingExplorerCore`` (plain Python) takes the next-token logits the model gives after a
context (``llm.next_token_logits``) and runs them through the sampler's own functions, in
the engine's own order: ``apply_temperature`` -> ``top_k_filter`` -> ``top_p_filter`` ->
``min_p_filter`` (``minillm.sampler``). It keeps every intermediate distribution, so you
can see what each knob removes. ``sample()`` draws the token exactly as the engine would
for a request with this seed (same generator, same draw), ``draws(n)`` repeats the draw n
times for a histogram, and ``append()`` puts the chosen token into the context: it becomes
history and the next distribution is computed from it.

``SamplingExplorer`` is the ``ipywidgets`` view: sliders, bar charts of the top tokens
before and after each step, a histogram of repeated draws and an
**Append sampled token** button. ``lang="zh"`` (or ``set_language("zh")``) labels it in Chinese.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

import torch

from ..params import SamplingParams
from ..sampler import apply_temperature, make_generator, min_p_filter, processed_logits, top_k_filter, top_p_filter
from ._common import default_llm, esc, token_pieces, token_text
from .fonts import with_cjk_fonts
from .i18n import FONT_STACK, MONO_STACK, phrase, resolve_lang

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


# ----------------------------------------------------------------------------------------
# The widget
# ----------------------------------------------------------------------------------------

def _import_widgets():
    import ipywidgets as w

    return w


_CSS = """
<style>
.minillm-sampling .widget-html-content{line-height:1.45;font-family:%(font)s}
.minillm-sampling .widget-button,.minillm-sampling .widget-label,.minillm-sampling input{font-family:%(font)s}
.minillm-sampling .mm-chip{display:inline-block;margin:1px;padding:1px 4px;border-radius:5px;font-family:%(mono)s;
  font-size:12px}
.minillm-sampling .mm-partial{border:1px dotted #9a3412;color:#7c2d12}
.minillm-sampling .mm-prompt{background:#dbeafe}
.minillm-sampling .mm-added{background:#fde68a;border:1px solid #f59e0b}
</style>
""".replace("%(font)s", FONT_STACK).replace("%(mono)s", MONO_STACK)


class SamplingExplorer(_import_widgets().VBox):
    """The widget: ``SamplingExplorer(llm=None, prompt=...)``. ``explorer.core`` is the
    ``SamplingExplorerCore``; ``explorer.buttons`` maps labels to buttons; the sliders are
    ``explorer.temperature``, ``.top_k``, ``.top_p``, ``.min_p``, ``.seed``, ``.num_draws``."""

    def __init__(self, llm=None, prompt: str = DEFAULT_EXPLORER_PROMPT, *, lang=None, **kwargs):
        w = _import_widgets()
        core_kw = {k: kwargs.pop(k) for k in ("temperature", "top_k", "top_p", "min_p", "seed", "num_draws")
                   if k in kwargs}
        super().__init__(**kwargs)
        self.core = SamplingExplorerCore(llm, prompt, lang=lang, **core_kw)
        self.lang = self.core.lang
        c = self.core
        L = lambda key: phrase(key, self.lang)  # noqa: E731
        style = {"description_width": "100px"}
        lay = w.Layout(width="340px")
        self.temperature = w.FloatSlider(value=c.temperature, min=0.0, max=2.0, step=0.05, description="temperature",
                                         style=style, layout=lay, continuous_update=False)
        self.top_k = w.IntSlider(value=c.top_k, min=0, max=100, description=L("ctl.top_k"), style=style, layout=lay,
                                 continuous_update=False)
        self.top_p = w.FloatSlider(value=c.top_p, min=0.05, max=1.0, step=0.01, description="top-p", style=style,
                                   layout=lay, continuous_update=False)
        self.min_p = w.FloatSlider(value=c.min_p, min=0.0, max=0.5, step=0.01, description="min-p", style=style,
                                   layout=lay, continuous_update=False)
        self.seed = w.IntText(value=c.seed, description=L("ctl.seed"), style=style, layout=lay)
        self.num_draws = w.IntSlider(value=c.num_draws, min=10, max=2000, step=10, description=L("se.draws"), style=style,
                                     layout=lay, continuous_update=False)
        self.sliders = [self.temperature, self.top_k, self.top_p, self.min_p, self.seed, self.num_draws]
        for s in self.sliders:
            s.observe(self._on_change, names="value")
        from ._common import ButtonMap

        self.buttons = ButtonMap()
        for action, english, fn in (("append", "Append sampled token", self._append), ("undo", "Undo", self._undo),
                                    ("reset", "Reset", self._reset)):
            label = L(f"se.btn_{action}")
            b = w.Button(description=label, layout=w.Layout(width="180px" if action == "append" else "90px"),
                         button_style="success" if action == "append" else "")
            b.on_click(lambda _b, f=fn: f())
            b.add_class("minillm-btn-" + action)
            self.buttons.add(b, label, english, action)
        self.prompt_box = w.Text(value=prompt, description=L("ctl.prompt"), style=style, layout=w.Layout(width="520px"))
        self.prompt_button = w.Button(description=L("se.btn_prompt"), layout=w.Layout(width="150px"))
        self.prompt_button.on_click(lambda _b: self._new_prompt())
        self.buttons.add(self.prompt_button, L("se.btn_prompt"), "Use this prompt", "prompt")
        self.context = w.HTML()
        self.info = w.HTML(layout=w.Layout(width="520px"))
        self.plot = w.Image(format="png", layout=w.Layout(max_width="100%"))
        controls = w.VBox(self.sliders + [w.HBox(list(self.buttons.values()))])
        self.message = w.HTML()
        self.children = [w.HTML(_CSS), w.HBox([self.prompt_box, self.prompt_button]), self.message, self.context,
                         w.HBox([controls, self.info]), self.plot]
        self.add_class("minillm-sampling")
        from ._common import language_notice

        self.message.value = language_notice(token_pieces(c.llm.tokenizer, c.prompt_ids), self.lang)
        self.refresh()

    def _on_change(self, _change=None) -> None:
        try:
            self.core.set(temperature=float(self.temperature.value), top_k=int(self.top_k.value),
                          top_p=float(self.top_p.value), min_p=float(self.min_p.value), seed=int(self.seed.value),
                          num_draws=int(self.num_draws.value))
        except ValueError as exc:
            self.info.value = f"<div style='color:#b91c1c'>⚠ {esc(exc)}</div>"
            return
        self.refresh()

    def _new_prompt(self) -> None:
        """A new context: the same engine and settings, the distribution after the typed prompt."""
        from ._common import language_notice

        c = self.core
        try:
            self.core = SamplingExplorerCore(c.llm, self.prompt_box.value, temperature=c.temperature, top_k=c.top_k,
                                             top_p=c.top_p, min_p=c.min_p, seed=c.seed, num_draws=c.num_draws,
                                             lang=c.lang)
        except ValueError as exc:
            self.message.value = f"<div style='color:#b91c1c'>⚠ {esc(exc)}</div>"
            return
        self.message.value = language_notice(token_pieces(c.llm.tokenizer, self.core.prompt_ids), self.lang)
        self.refresh()

    def _repr_mimebundle_(self, **kwargs):
        from ._common import widget_bundle

        plain = phrase("se.plain", self.lang, line=self.core.summary().splitlines()[0])
        return widget_bundle(self, super()._repr_mimebundle_(**kwargs), plain, lang=self.lang)

    def _append(self) -> None:
        self.core.append()
        self.refresh()

    def _undo(self) -> None:
        self.core.undo()
        self.refresh()

    def _reset(self) -> None:
        self.core.reset()
        self.refresh()

    def refresh(self) -> None:
        c = self.core
        lang = self.lang
        partial_tip = phrase("tok.partial_tip", lang)
        invalid_tip = phrase("tok.invalid_tip", lang)
        chips = []
        for i, piece in enumerate(token_pieces(c.llm.tokenizer, c.context_ids)):
            cls = "mm-prompt" if i < len(c.prompt_ids) else "mm-added"
            title = f"id {piece.token_id}"
            if piece.partial:
                cls += " mm-partial"
                title += " · " + (invalid_tip if piece.invalid else partial_tip) + (f" → {piece.completes}" if piece.completes else "")
            chips.append(f"<span class='mm-chip {cls}' title='{esc(title)}'>{esc(piece.label)}</span>")
        self.context.value = (f"<div>{phrase('se.context', lang, n=len(c.prompt_ids), m=len(c.appended))}</div>"
                              f"<div>{''.join(chips)}</div>")
        stages = c.stages()
        sampled = c.sample()
        probs = c.probs()
        rows = "".join(f"<tr><td>{esc(s.label)}</td><td style='text-align:right'>{s.kept}</td></tr>" for s in stages)
        self.info.value = (
            f"<table style='font-size:12px'><tr><th>{phrase('se.step_col', lang)}</th>"
            f"<th>{phrase('se.left_col', lang)}</th></tr>{rows}</table>"
            f"<div style='font-size:13px;margin-top:6px'>"
            + phrase("se.would_sample", lang, tok=f"<b><code>{esc(c.text(sampled))}</code></b>", id=sampled,
                     p=f"{float(probs[sampled]):.3f}", rank=c.rank(sampled), seed=c.seed,
                     button=f"<b>{esc(phrase('se.btn_append', lang))}</b>") + "</div>")
        self.buttons["Undo"].disabled = not c.appended
        self.buttons["Reset"].disabled = not c.appended
        self.plot.value = c.png()

