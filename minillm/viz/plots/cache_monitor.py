"""CacheMonitor: a live engine's KV memory, redrawn after every button press.

A widget over :func:`~minillm.viz.plots.kv_memory.plot_kv_timeline`: it adds requests and
steps the engine, then re-reads the trace and ``cache_stats()``. Everything it draws is what
the engine recorded; the buttons only drive it.
"""

from __future__ import annotations

import io

from ..fonts import with_cjk_fonts
from ..i18n import MONO_STACK, phrase, resolve_lang
from .experiments import random_prompt
from .figure import fmt_bytes, new_figure
from .kv_memory import kv_timeline, plot_kv_timeline

__all__ = ["CacheMonitor"]


def _bytes_formula(llm, lang=None) -> tuple[str, int]:
    cfg = llm.model_config
    import torch

    elem = torch.empty((), dtype=llm.dtype).element_size()
    value = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * elem
    text = phrase("mon.formula", lang, layers=cfg.num_hidden_layers, heads=cfg.num_key_value_heads,
                  dim=cfg.head_dim, elem=elem, value=value)
    return text, value


class CacheMonitor:
    """KV memory of a live engine: per request and in total, over steps, beside the formula.

    ``CacheMonitor()`` makes its own small engine (64 blocks of 16 tokens), so it is a toy you
    can play with however the rest of the notebook used its engine; ``CacheMonitor(llm)`` watches
    an engine you pass. It shows a summary line from ``llm.cache_stats()`` and the
    :func:`plot_kv_timeline` chart of ``llm.trace``, with buttons **Add a request** (a random
    prompt of ``prompt_tokens`` tokens, ``max_tokens`` output tokens), **Step**, **Step x10**
    and **Refresh**. Step is greyed out, with a note saying why, when nothing is left to run.
    Without ipywidgets it still works: ``add_request()``, ``step()``, ``data()``, ``stats()``,
    ``figure()`` and ``summary()`` are plain Python.
    """

    def __init__(self, llm=None, *, controls: bool = True, title: str | None = None,
                 prompt_tokens: int = 24, max_tokens: int = 40, lang=None):
        for name, value in (("prompt_tokens", prompt_tokens), ("max_tokens", max_tokens)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if llm is None:
            from ...llm import LLM

            llm = LLM(device="cpu", num_kv_blocks=64)
        self.llm = llm
        self.lang = resolve_lang(lang)
        self.title = title
        self.controls = controls
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self._added = 0
        self._widget = None
        self._image = None
        self._html = None
        self._note = None
        self._buttons = {}

    # --- plain data ------------------------------------------------------------------------
    def data(self) -> list[dict]:
        return kv_timeline(self.llm.trace)

    def stats(self):
        return self.llm.cache_stats()

    def add_request(self):
        """Queue one more request (a fresh id, a random prompt that shares no prefix) and redraw."""
        from ...params import SamplingParams

        self._added += 1
        seed = 7919 * self._added + self.llm.step_count
        req = self.llm.add_request(prompt_token_ids=random_prompt(self.llm, self.prompt_tokens, seed=seed),
                                   params=SamplingParams(max_tokens=self.max_tokens, temperature=0.0,
                                                         ignore_eos=True))
        self.refresh()
        return req

    def can_step(self) -> bool:
        return self.llm.has_unfinished()

    def step(self, n: int = 1) -> int:
        """Up to ``n`` engine steps (fewer when everything finished first); returns how many ran."""
        done = 0
        for _ in range(n):
            if not self.llm.has_unfinished():
                break
            self.llm.step()
            done += 1
        self.refresh()
        return done

    def summary(self) -> str:
        """One line of text: where the pool stands now, and the bytes-per-token formula."""
        s = self.stats()
        formula, bpt = _bytes_formula(self.llm, self.lang)
        held = self.llm.blocks_held()
        tokens = sum(r.num_computed_tokens for r in self.llm.requests.values() if r.block_table)
        return phrase("mon.summary", self.lang, step=self.llm.step_count, used=s.used_blocks, total=s.total_blocks,
                      bs=s.block_size, bpt=s.bytes_per_token, used_bytes=fmt_bytes(s.used_bytes), held=len(held),
                      tokens=tokens, formula_bytes=fmt_bytes(tokens * bpt), formula=formula)

    def note(self) -> str:
        if self.can_step():
            live = sum(r.is_live for r in self.llm.requests.values())
            return phrase("mon.live", self.lang, n=live)
        return phrase("mon.idle", self.lang)

    @with_cjk_fonts
    def figure(self):
        lang = self.lang
        if not self.data():
            fig, axes = new_figure(8.0, 2.2)
            ax = axes[0][0]
            ax.text(0.5, 0.5, phrase('mon.empty', lang), ha="center", va="center",
                    fontsize=12, transform=ax.transAxes)
            ax.set_axis_off()
            return fig
        return plot_kv_timeline(self.data(), title=self.title, lang=lang)

    # --- widget ----------------------------------------------------------------------------
    @property
    def widget(self):
        if self._widget is None:
            import ipywidgets as w

            self._html = w.HTML()
            self._note = w.HTML()
            self._image = w.Image(format="png", layout=w.Layout(max_width="100%"))
            parts = [self._html, self._image]
            L = lambda key: phrase(key, self.lang)  # noqa: E731
            if self.controls:
                b = self._buttons = {
                    "add": w.Button(description=L("mon.add"),
                                    tooltip=phrase("mon.add_tip", self.lang, n=self.prompt_tokens, m=self.max_tokens)),
                    "step": w.Button(description=L("mon.step"), tooltip=L("mon.step_tip")),
                    "step10": w.Button(description=L("mon.step10"), tooltip=L("mon.step10_tip")),
                    "refresh": w.Button(description=L("mon.refresh"), tooltip=L("mon.refresh_tip")),
                }
                b["add"].on_click(lambda _b: self.add_request())
                b["step"].on_click(lambda _b: self.step(1))
                b["step10"].on_click(lambda _b: self.step(10))
                b["refresh"].on_click(lambda _b: self.refresh())
                parts[0:0] = [w.HBox(list(b.values())), self._note]
            self._widget = w.VBox(parts)
            self._widget.add_class("minillm-cache-monitor")
            self.refresh()
        return self._widget

    def _step(self, n: int) -> None:  # kept for callers of the old name
        self.step(n)

    def refresh(self) -> "CacheMonitor":
        """Re-read the trace and ``cache_stats()`` and redraw. Returns self (so a cell can end
        with ``monitor.refresh()`` and show it)."""
        if self._widget is None and self._image is None:
            return self  # not displayed yet: nothing to redraw, data() is always fresh
        import html as _html

        # the buttons and the note first, the summary last: the browser applies the updates in
        # the order they are sent, so once the summary shows the new step, Step / Step x10 are
        # already enabled or disabled for it (a click in between found a button about to go grey)
        if self._buttons:
            idle = not self.can_step()
            self._buttons["step"].disabled = idle
            self._buttons["step10"].disabled = idle
            colour = "#64748b" if idle else "#334155"
            self._note.value = f"<div style='font-size:13px;color:{colour}'>{_html.escape(self.note())}</div>"
        buf = io.BytesIO()
        self.figure().savefig(buf, format="png", dpi=90)
        self._image.value = buf.getvalue()
        self._html.value = (f"<code style='font-size:12px;font-family:{_html.escape(MONO_STACK)}'>"
                            f"{_html.escape(self.summary())}</code>")
        return self

    def _repr_mimebundle_(self, include=None, exclude=None):
        try:
            widget = self.widget
        except ImportError:  # no ipywidgets: a static picture and the summary line
            buf = io.BytesIO()
            self.figure().savefig(buf, format="png", dpi=90)
            return {"text/plain": self.summary(), "image/png": buf.getvalue()}
        from .._common import widget_bundle

        return widget_bundle(widget, widget._repr_mimebundle_(), f"CacheMonitor: {self.summary()}", lang=self.lang)

    def __repr__(self) -> str:
        return f"CacheMonitor({self.summary()})"
