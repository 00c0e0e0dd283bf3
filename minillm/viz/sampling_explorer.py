"""SamplingExplorer: temperature, top-k, top-p, min-p and a seed on the model's real logits.

``SamplingExplorerCore`` (plain Python, ``sampling_explorer_core.py``) takes the next-token logits the model gives after a
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

from ._common import esc, token_pieces
from .i18n import FONT_STACK, MONO_STACK, phrase
from .sampling_explorer_core import DEFAULT_EXPLORER_PROMPT, SamplingExplorerCore, Stage

# names this module has always offered
__all__ = ["SamplingExplorer", "SamplingExplorerCore", "Stage", "DEFAULT_EXPLORER_PROMPT"]


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
