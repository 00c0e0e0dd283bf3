"""RequestStepper: walk one request through the engine, one button press per state change.

Two layers:

* ``RequestStepperCore`` (``stepper_core.py``) is plain Python, importable without ipywidgets.
  Its methods ``tokenize()``, ``prefill()``, ``decode_one()``, ``run_to_end()``, ``cancel()``
  and ``release()`` call the real engine (``LLM.new_request`` / ``enqueue`` / ``step`` /
  ``cancel`` / ``release``) and return the events the engine wrote to its trace. Everything
  the widget shows (state, tokens, candidates, blocks, bytes, timings) is read back from the
  engine: the request object, ``llm.trace``, ``llm.metrics()`` and ``llm.cache_stats()``.
  Tests drive this class directly.
* ``RequestStepper`` (here) is an ``ipywidgets.VBox`` around a core: a prompt box, sampling
  controls, one button per action (disabled when the action does not apply to the current
  state) and the HTML panels below, which read the core; the log's sentences come from
  ``narration.py``.

The request is created with ``auto_release=False``, so the engine stops at FINISHED and
waits for **Release**: you can see the memory still held after the logic is done, then
watch it go back to the pool.

Stable hooks for browser tests: the outer box has the DOM class ``minillm-stepper``; the
status line contains ``<span class="minillm-state">STATE</span>`` and
``<span class="minillm-blocks">N</span>`` (KV blocks held by this request); each button has
the DOM class ``minillm-btn-<action>`` and the exact label from ``button_labels(lang)``
(``BUTTON_LABELS`` is the English set). A fresh stepper is in NEW: press **Tokenize** first,
then **Prefill**.

Language: ``RequestStepper(llm, lang="zh")`` (or ``minillm.viz.set_language("zh")`` once)
gives Chinese buttons and panels; the states keep the engine's names. Tokens are shown as the
text they add to the request (``token_pieces``): a Chinese character that a byte-level
tokenizer split into several byte tokens shows its bytes (‹E5 B0›) on each piece and the
character on the piece that completes it, never '�'.
"""

from __future__ import annotations

from ..params import SamplingParams
from ._common import DEFAULT_PROMPT, ButtonMap, esc, fmt_bytes, fmt_ms, language_notice
from .diagram import diagram_html, state_holds
from .i18n import FONT_STACK, MONO_STACK, phrase
from .narration import describe_event, summarize_action
from .stepper_core import ACTIONS, BUTTON_LABELS, DEFAULT_LOGPROBS, RequestStepperCore, S, button_labels

# names this module has always offered (notebooks import them from here)
__all__ = ["RequestStepper", "RequestStepperCore", "ACTIONS", "BUTTON_LABELS", "DEFAULT_LOGPROBS", "button_labels",
           "describe_event", "summarize_action", "ButtonMap", "language_notice", "tokens_html", "candidates_html",
           "blocks_html", "metrics_html", "log_html"]


# ----------------------------------------------------------------------------------------
# HTML views
# ----------------------------------------------------------------------------------------

_CSS = """
<style>
.minillm-stepper .widget-html-content{line-height:1.45;font-family:%(font)s}
.minillm-stepper .widget-button,.minillm-stepper .widget-label,.minillm-stepper textarea{font-family:%(font)s}
.minillm-stepper .mm-chip{display:inline-block;margin:2px;padding:2px 5px;border-radius:6px;
  font-family:%(mono)s;font-size:12px;text-align:center;line-height:1.2;vertical-align:top}
.minillm-stepper .mm-partial{border-style:dotted;color:#7c2d12}
.minillm-stepper .mm-summary{font-size:13px;font-weight:bold;color:#92400e;margin:2px 0 4px 0}
.minillm-stepper .mm-chip small{display:block;font-size:12px;opacity:.75}
.minillm-stepper .mm-prompt{background:#dbeafe;border:1px solid #93c5fd}
.minillm-stepper .mm-special{background:#e5e7eb;border:1px dashed #9ca3af;font-style:italic}
.minillm-stepper .mm-out{background:#dcfce7;border:1px solid #86efac}
.minillm-stepper .mm-new{background:#fde68a;border:2px solid #f59e0b}
.minillm-stepper .mm-cell{display:inline-block;width:28px;height:24px;margin:1px;border-radius:3px;
  font-size:12px;line-height:22px;text-align:center;font-family:monospace;box-sizing:border-box;vertical-align:middle}
.minillm-stepper .mm-mine{background:#f59e0b;color:#fff;font-weight:bold}
.minillm-stepper .mm-other{background:#64748b;color:#fff}
.minillm-stepper .mm-cached{background:#ecfccb;border:1px dashed #65a30d}
.minillm-stepper .mm-free{background:#fff;border:1px solid #cbd5e1}
.minillm-stepper table.mm-cand{border-collapse:collapse;font-size:12px}
.minillm-stepper table.mm-cand td{padding:1px 6px}
.minillm-stepper tr.mm-chosen{background:#fef3c7;font-weight:bold}
.minillm-stepper .mm-bar{background:#818cf8;height:10px;display:inline-block}
.minillm-stepper .mm-h{font-weight:bold;margin:6px 0 2px 0}
.minillm-stepper .minillm-status{font-size:14px;padding:4px 8px;background:#f8fafc;border-left:4px solid #f59e0b}
.minillm-stepper .minillm-state{font-weight:bold;color:#92400e}
.minillm-stepper .mm-log{font-family:%(mono)s;font-size:12px;max-height:220px;overflow-y:auto}
.minillm-stepper .mm-diagram svg{width:100%;max-width:100%;height:auto}
.minillm-stepper .mm-grid{display:grid;grid-template-columns:repeat(16,30px);gap:0}
.minillm-stepper .jupyter-button:disabled,.minillm-stepper .jupyter-button[disabled]{background:#e5e7eb !important;
  color:#9ca3af !important;opacity:1;box-shadow:none;cursor:not-allowed}
</style>
""".replace("%(font)s", FONT_STACK).replace("%(mono)s", MONO_STACK)


def tokens_html(core: RequestStepperCore) -> str:
    lang = core.lang
    if core.req is None:
        return f"<div class='mm-h'>{phrase('tok.head', lang)}</div><div><em>{phrase('tok.none', lang)}</em></div>"
    special = set(core.llm.tokenizer.all_special_ids)
    partial_tip = phrase("tok.partial_tip", lang)
    invalid_tip = phrase("tok.invalid_tip", lang)
    chips = []

    def chip(piece, cls, title):
        if piece.partial:
            cls += " mm-partial"
            title += " · " + (invalid_tip if piece.invalid else partial_tip) + (f" → {piece.completes}" if piece.completes else "")
        return (f"<span class='mm-chip {cls}' title='{esc(title)}'>{esc(piece.label)}"
                f"<small>{piece.token_id}</small></span>")

    for piece in core.prompt_pieces():
        cls = "mm-special" if piece.token_id in special else "mm-prompt"
        chips.append(chip(piece, cls, phrase("tok.prompt_tip", lang, id=piece.token_id)))
    outs = core.output_pieces()
    for i, piece in enumerate(outs):
        cls = "mm-new" if i == len(outs) - 1 else "mm-out"
        chips.append(chip(piece, cls, phrase("tok.out_tip", lang, i=i, id=piece.token_id)))
    n_in, n_out = len(core.req.prompt_token_ids), len(outs)
    return (f"<div class='mm-h'>{phrase('tok.counts', lang, n_in=n_in, n_out=n_out)}</div>"
            f"<div>{''.join(chips)}</div>"
            f"<div style='font-size:12px;margin-top:3px'>{phrase('tok.so_far', lang)} "
            f"<code>{esc(core.req.text)}</code></div>")


def candidates_html(core: RequestStepperCore) -> str:
    lang = core.lang
    c = core.candidates()
    head = f"<div class='mm-h'>{phrase('cand.head', lang)}</div>"
    if c is None:
        return head + f"<div><em>{phrase('cand.none', lang)}</em></div>"
    rows = []
    top = c["top"]
    if c["chosen_rank"] is None:
        top = top + [(c["chosen"], c["chosen_text"], c["chosen_prob"])]
    pmax = max(p for _, _, p in top) or 1.0
    for rank, (t, text, p) in enumerate(top):
        chosen = t == c["chosen"]
        mark = phrase("cand.sampled", lang) if chosen else ""
        rank_txt = str(rank + 1) if rank < len(c["top"]) else "…"
        rows.append(f"<tr class='{'mm-chosen' if chosen else ''}'><td>{rank_txt}</td><td><code>{esc(text)}</code></td>"
                    f"<td>{t}</td><td><span class='mm-bar' style='width:{int(120 * p / pmax)}px'></span></td>"
                    f"<td>{p:.3f}</td><td>{mark}</td></tr>")
    p = core.req.params
    knobs = f"temperature={p.temperature}, top_k={p.top_k}, top_p={p.top_p}, seed={p.seed}"
    return (head + f"<div style='font-size:12px'>{phrase('cand.explain', lang, index=c['index'], knobs=esc(knobs))}"
            f"</div><table class='mm-cand'><tr><td>#</td><td>{phrase('cand.token', lang)}</td><td>id</td><td></td>"
            f"<td>p</td><td></td></tr>{''.join(rows)}</table>")


def blocks_html(core: RequestStepperCore) -> str:
    lang = core.lang
    kv = core.kv()
    cells = []
    for c in core.pool():
        label = "" if c["pos"] is None else str(c["pos"])
        share = phrase("pool.shared", lang) if c["shared"] else ""
        title = phrase(f"pool.tip_{c['kind']}", lang, block=c["block"], pos=c["pos"], share=share)
        cells.append(f"<span class='mm-cell mm-{c['kind']}' title='{esc(title)}'>{label}</span>")
    legend = (f"<span class='mm-cell mm-mine'>0</span> {phrase('pool.leg_mine', lang)} "
              f"<span class='mm-cell mm-other'></span> {phrase('pool.leg_other', lang)} "
              f"<span class='mm-cell mm-cached'></span> {phrase('pool.leg_cached', lang)} "
              f"<span class='mm-cell mm-free'></span> {phrase('pool.leg_free', lang)}")
    held = phrase("pool.held", lang, blocks=kv["blocks"], slots=kv["slots"], filled=kv["tokens_in_cache"],
                  bytes=fmt_bytes(kv["bytes_held"]), bpt=kv["bytes_per_token"])
    pool = phrase("pool.total", lang, used=kv["used_blocks"], total=kv["total_blocks"],
                  used_bytes=fmt_bytes(kv["used_bytes"]), total_bytes=fmt_bytes(kv["total_bytes"]))
    return (f"<div class='mm-h'>{phrase('pool.head', lang, total=kv['total_blocks'], size=kv['block_size'])}</div>"
            f"<div class='mm-grid'>{''.join(cells)}</div><div style='font-size:12px'>{legend}</div>"
            f"<div style='font-size:12px;margin-top:4px'>{held}<br>{pool}</div>")


def metrics_html(core: RequestStepperCore) -> str:
    m = core.metrics()
    if not m:
        return ""
    lang = core.lang
    return (f"<div class='mm-h'>{phrase('met.head', lang)}</div><div style='font-size:12px'>"
            + phrase("met.line", lang, ttft=fmt_ms(m["ttft"]), tpot=fmt_ms(m["tpot"]),
                     queue=fmt_ms(m["queue_time"]), e2e=fmt_ms(m["e2e"]), release=fmt_ms(m["release_delay"]),
                     n=m["num_output_tokens"]) + "</div>")


def log_html(core: RequestStepperCore) -> str:
    lang = core.lang
    tok = core.llm.tokenizer
    holds = state_holds(lang)
    st = core.state.value
    head = f"<div class='mm-h'>{phrase('log.head_idle', lang)}</div>"
    if core.last_action is None:
        return head + f"<div style='font-size:12px'>{esc(phrase('log.nothing', lang, state=st, holds=holds[st]))}</div>"

    def say(e):
        return esc(describe_event(e, tok, lang, token_label=core.token_label))

    lines = [say(e) for e in core.last_events]
    action = "new" if core.last_action == "reset" else core.last_action
    label = phrase(f"btn.{action}", lang) if action in ACTIONS + ("new",) else action
    if core.last_action in ("prefill", "decode_one") and core.req is not None and core.state == S.WAITING:
        lines.append(esc(phrase("log.not_admitted", lang)))
    summary = summarize_action(core.last_action, core.last_events, core.request_id, tok, lang,
                               token_label=core.token_label)
    history = "<br>".join(f"<b>{esc(phrase(f'btn.{a}', lang))}</b>: " + "; ".join(
        say(e) for e in evs if e.request_id is not None) for a, evs in core.log)
    return (f"<div class='mm-h'>{esc(phrase('log.head', lang, label=label))}</div>"
            + (f"<div class='mm-summary'>{esc(summary)}</div>" if summary else "")
            + f"<div class='mm-log'>{'<br>'.join(lines) or esc(phrase('log.no_events', lang))}</div>"
            f"<div style='font-size:12px;margin-top:3px'>{esc(phrase('log.now', lang, state=st, holds=holds[st]))}</div>"
            f"<details><summary style='font-size:12px'>{phrase('log.all', lang)}</summary>"
            f"<div class='mm-log'>{history}</div></details>")


# ----------------------------------------------------------------------------------------
# The widget
# ----------------------------------------------------------------------------------------

def _import_widgets():
    import ipywidgets as w

    return w


class RequestStepper(_import_widgets().VBox):
    """The widget: ``RequestStepper(llm=None, prompt="Once upon a time", params=None)``.

    ``stepper.core`` is the ``RequestStepperCore``; ``stepper.buttons`` maps each button
    label to its ``ipywidgets.Button``: the label shown (``"预填充"`` with ``lang="zh"``), the
    English label (``stepper.buttons["Prefill"].click()`` works in every language) or the
    action name (``"prefill"``); ``stepper.status`` is the HTML widget with the state and
    block-count spans. ``lang``: "en" or "zh" (None: the course-wide ``set_language``).
    """

    def __init__(self, llm=None, prompt: str = DEFAULT_PROMPT, params: SamplingParams | None = None, *,
                 lang=None, **kwargs):
        w = _import_widgets()
        super().__init__(**kwargs)
        self.core = RequestStepperCore(llm, prompt, params, lang=lang)
        self.lang = self.core.lang
        p = self.core.params
        style = {"description_width": "110px"}  # room for "top-k (0=off)" in both languages
        lay = w.Layout(width="350px")
        L = lambda key: phrase(key, self.lang)  # noqa: E731
        self.prompt_box = w.Textarea(value=prompt, description=L("ctl.prompt"), layout=w.Layout(width="350px", height="60px"),
                                     style=style)
        self.prompt_box.add_class("minillm-prompt")  # a stable handle for browser tests
        self.temperature = w.FloatSlider(value=p.temperature, min=0.0, max=2.0, step=0.05, description="temperature",
                                         style=style, layout=lay, continuous_update=False)
        self.top_k = w.IntSlider(value=p.top_k, min=0, max=100, description=L("ctl.top_k"), style=style, layout=lay,
                                 continuous_update=False)
        self.top_p = w.FloatSlider(value=p.top_p, min=0.05, max=1.0, step=0.05, description="top-p", style=style,
                                   layout=lay, continuous_update=False)
        self.seed = w.IntText(value=0 if p.seed is None else p.seed, description=L("ctl.seed"), style=style, layout=lay)
        self.max_tokens = w.IntSlider(value=p.max_tokens, min=1, max=64, description=L("ctl.max_tokens"), style=style,
                                      layout=lay, continuous_update=False)
        self._controls = [self.prompt_box, self.temperature, self.top_k, self.top_p, self.seed, self.max_tokens]
        labels = button_labels(self.lang)
        self.buttons = ButtonMap()
        for action in ACTIONS:
            b = w.Button(description=labels[action], layout=w.Layout(width="150px"),
                         button_style="warning" if action == "cancel" else "")
            b.add_class(f"minillm-btn-{action.replace('_', '-')}")
            b.on_click(lambda _b, a=action: self._do(a))
            self.buttons.add(b, labels[action], BUTTON_LABELS[action], action)
        self.new_button = w.Button(description=labels["new"], layout=w.Layout(width="150px"), button_style="info")
        self.new_button.add_class("minillm-btn-new")
        self.new_button.on_click(lambda _b: self._do("reset"))
        self.buttons.add(self.new_button, labels["new"], "New request", "new")
        self.status = w.HTML()
        self.message = w.HTML()
        self._notice = ""
        self.diagram = w.HTML(layout=w.Layout(width="100%"))
        self.diagram.add_class("mm-diagram")
        self.tokens = w.HTML()
        self.cands = w.HTML(layout=w.Layout(width="48%"))
        self.blocks = w.HTML(layout=w.Layout(width="52%"))
        self.timings = w.HTML()
        self.events_view = w.HTML(layout=w.Layout(width="420px"))
        settings = w.VBox([w.HTML(f"<div class='mm-h'>{L('ctl.request')}</div>")] + self._controls)
        buttons = w.VBox([w.HTML(f"<div class='mm-h'>{L('ctl.actions')}</div>")]
                         + [self.buttons[a] for a in ACTIONS] + [self.new_button])
        top = w.HBox([settings, buttons, self.events_view], layout=w.Layout(align_items="flex-start"))
        self.children = [w.HTML(_CSS), self.status, self.message, top, self.diagram, self.tokens,
                         w.HBox([self.cands, self.blocks], layout=w.Layout(align_items="flex-start")),
                         self.timings]
        self.add_class("minillm-stepper")
        self.refresh()

    def _params_from_controls(self) -> SamplingParams:
        return SamplingParams(max_tokens=int(self.max_tokens.value), temperature=float(self.temperature.value),
                              top_k=int(self.top_k.value), top_p=float(self.top_p.value), seed=int(self.seed.value),
                              logprobs=DEFAULT_LOGPROBS)

    def _do(self, action: str) -> None:
        try:
            if action == "tokenize":
                self.core.tokenize(self.prompt_box.value, self._params_from_controls())
                self._notice = language_notice(self.core.prompt_pieces(), self.lang)
            elif action == "reset":
                self.core.reset()
                self._notice = ""
            else:
                getattr(self.core, action)()
            self.message.value = self._notice  # the byte-token notice stays while the request lives
        except Exception as exc:  # a bad prompt or parameter: say so, keep the widget alive
            self.message.value = f"<div style='color:#b91c1c'>⚠ {esc(type(exc).__name__)}: {esc(exc)}</div>"
        self.refresh()

    def _repr_mimebundle_(self, **kwargs):
        from ._common import widget_bundle

        plain = phrase("st.plain", self.lang, rid=self.core.request_id or phrase("st.none_yet", self.lang),
                       state=self.core.state.value)
        return widget_bundle(self, super()._repr_mimebundle_(**kwargs), plain, lang=self.lang)

    def refresh(self) -> None:
        """Redraw every view from the engine's current state."""
        core = self.core
        for action in ACTIONS:
            self.buttons[action].disabled = not core.can(action)
        self.new_button.disabled = core.req is None
        for c in self._controls:
            c.disabled = core.req is not None  # parameters travel with the request once it exists
        self.status.value = core.status_html()
        self.diagram.value = diagram_html(core.state, core.last_edges() or None, lang=self.lang)
        self.tokens.value = tokens_html(core)
        self.cands.value = candidates_html(core)
        self.blocks.value = blocks_html(core)
        self.timings.value = metrics_html(core)
        self.events_view.value = log_html(core)
