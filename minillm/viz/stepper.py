"""RequestStepper: walk one request through the engine, one button press per state change.

Two layers:

* ``RequestStepperCore`` is plain Python. Its methods ``tokenize()``, ``prefill()``,
  ``decode_one()``, ``run_to_end()``, ``cancel()`` and ``release()`` call the real engine
  (``LLM.new_request`` / ``enqueue`` / ``step`` / ``cancel`` / ``release``) and return the
  events the engine wrote to its trace. Everything the widget shows (state, tokens,
  candidates, blocks, bytes, timings) is read back from the engine: the request object,
  ``llm.trace``, ``llm.metrics()`` and ``llm.cache_stats()``. Tests drive this class directly.
* ``RequestStepper`` is an ``ipywidgets.VBox`` around a core: a prompt box, sampling
  controls, one button per action (disabled when the action does not apply to the current
  state) and the views.

The request is created with ``auto_release=False``, so the engine stops at FINISHED and
waits for **Release**: you can see the memory still held after the logic is done, then
watch it go back to the pool.

Stable hooks for browser tests: the outer box has the DOM class ``minillm-stepper``; the
status line contains ``<span class="minillm-state">STATE</span>`` and
``<span class="minillm-blocks">N</span>`` (KV blocks held by this request); each button has
the DOM class ``minillm-btn-<action>`` and the exact label from ``BUTTON_LABELS``.
A fresh stepper is in NEW: press **Tokenize** first, then **Prefill**.
"""

from __future__ import annotations

import dataclasses
import math

from ..params import SamplingParams
from ..request import LIVE_STATES, RequestState
from ..trace import Event
from ._common import DEFAULT_PROMPT, default_llm, esc, fmt_bytes, fmt_ms, token_text
from .i18n import resolve_lang
from .diagram import STATE_HOLDS, diagram_html, edges_of_events

S = RequestState
ACTIONS = ("tokenize", "prefill", "decode_one", "run_to_end", "cancel", "release")
BUTTON_LABELS = {
    "tokenize": "Tokenize",
    "prefill": "Prefill",
    "decode_one": "Decode one step",
    "run_to_end": "Run to end",
    "cancel": "Cancel",
    "release": "Release",
}
DEFAULT_LOGPROBS = 8


def describe_event(e: Event, tokenizer=None, lang=None) -> str:
    """One engine event in plain words (used by the stepper's log and the notebooks)."""
    d = e.data
    who = f"request {e.request_id}"
    if e.kind == "transition":
        frm, to = d.get("from"), d.get("to")
        if frm is None:
            return f"{who} created: NEW (prompt and SamplingParams validated, not tokenized yet)"
        if to == "WAITING":
            return f"{who}: NEW -> WAITING, tokenized into {d.get('prompt_tokens')} tokens and queued"
        if to == "PREFILL":
            cached = d.get("cached_tokens", 0)
            extra = f", {cached} prompt tokens found in the prefix cache" if cached else ""
            return f"{who}: {frm} -> PREFILL, scheduled with {d.get('blocks')} KV blocks{extra}"
        if to == "DECODE":
            return f"{who}: PREFILL -> DECODE, the first token is out; from now on one token per step"
        if to == "PREEMPTED":
            return f"{who}: {frm} -> PREEMPTED, {d.get('blocks')} blocks taken back (will be recomputed)"
        if to == "FINISHED":
            return f"{who}: {frm} -> FINISHED, stop reason {d.get('stop_reason')}"
        if to == "RELEASED":
            return f"{who}: FINISHED -> RELEASED, {d.get('blocks')} KV blocks back in the pool"
        return f"{who}: {frm} -> {to}"
    if e.kind == "token":
        text = f" {token_text(tokenizer, d['token_id'])!r}" if tokenizer is not None else ""
        prob = f" (p={math.exp(d['logprob']):.3f})" if "logprob" in d else ""
        return f"{who}: sampled output token #{d['index']} = id {d['token_id']}{text}{prob}"
    if e.kind == "step":
        n = d["num_tokens"]
        return (f"engine step {e.step}: {d['num_prefill']} prefill + {d['num_decode']} decode, "
                f"{n} token{'' if n == 1 else 's'} through the model; KV pool {d['used_blocks']}/"
                f"{d['total_blocks']} blocks used")
    return repr(e)


class RequestStepperCore:
    """One request, driven step by step through the real engine. No widgets needed.

    Args:
        llm: an ``LLM``; None builds one on the shipped model with a small pool of small
            blocks (``block_size=4``, 64 blocks) so the block table is easy to watch.
        prompt: the prompt used by ``tokenize()`` (can be changed until then).
        params: the ``SamplingParams`` used by ``tokenize()``; ``logprobs`` is set to
            8 when not given, so the next-token candidates can be shown.
    """

    def __init__(self, llm=None, prompt: str = DEFAULT_PROMPT, params: SamplingParams | None = None,
                 *, max_run_steps: int = 10_000, lang=None):
        self.lang = resolve_lang(lang)
        self.llm = llm if llm is not None else default_llm()
        self.prompt = prompt
        self.params = params if params is not None else SamplingParams(max_tokens=20, temperature=0.8, seed=0)
        self.max_run_steps = max_run_steps
        self.req = None
        self.last_action: str | None = None
        self.last_events: list[Event] = []
        self.log: list[tuple[str, list[Event]]] = []  # (action, events) for this request

    # --- state ---------------------------------------------------------------------------
    @property
    def state(self) -> RequestState:
        """The request's state; NEW until ``tokenize()`` hands the request to the engine."""
        return S.NEW if self.req is None else self.req.state

    @property
    def request_id(self) -> str | None:
        return None if self.req is None else self.req.request_id

    def can(self, action: str) -> bool:
        """Whether ``action`` (one of ACTIONS) applies to the current state."""
        st = self.state
        if action == "tokenize":
            return self.req is None
        if self.req is None:
            return False
        if action == "prefill":
            return st in (S.WAITING, S.PREEMPTED)
        if action == "decode_one":
            return st == S.DECODE
        if action == "run_to_end":
            return st in (S.WAITING, S.PREEMPTED, S.PREFILL, S.DECODE)
        if action == "cancel":
            return st in LIVE_STATES
        if action == "release":
            return st == S.FINISHED
        raise ValueError(f"unknown action {action!r}; expected one of {', '.join(ACTIONS)}")

    def _require(self, action: str) -> None:
        if not self.can(action):
            raise ValueError(f"{BUTTON_LABELS[action]} does not apply: the request is {self.state.value}"
                             + ("" if self.req is not None else " (press Tokenize first)"))

    def _record(self, action: str, start: int) -> list[Event]:
        events = list(self.llm.trace[start:])
        self.last_action, self.last_events = action, events
        self.log.append((action, events))
        return events

    # --- actions: each one calls the engine and returns the events it produced --------------
    def tokenize(self, prompt: str | None = None, params: SamplingParams | None = None) -> list[Event]:
        """Create the request (NEW) and tokenize + enqueue it (NEW -> WAITING)."""
        self._require("tokenize")
        if prompt is not None:
            self.prompt = prompt
        if params is not None:
            self.params = params
        params = self.params
        if params.logprobs is None:
            params = dataclasses.replace(params, logprobs=DEFAULT_LOGPROBS)
        start = len(self.llm.trace)
        self.req = self.llm.new_request(self.prompt, params, auto_release=False)
        self.llm.enqueue(self.req)
        return self._record("tokenize", start)

    def prefill(self) -> list[Event]:
        """One engine step for a WAITING (or PREEMPTED) request: the scheduler admits it,
        allocates its blocks, runs its whole context through the model and samples the first
        token, so after the step the request is already in DECODE (or FINISHED)."""
        self._require("prefill")
        start = len(self.llm.trace)
        self.llm.step()
        return self._record("prefill", start)

    def decode_one(self) -> list[Event]:
        """One engine step for a DECODE request: one token in, one token sampled."""
        self._require("decode_one")
        start = len(self.llm.trace)
        self.llm.step()
        return self._record("decode_one", start)

    def run_to_end(self) -> list[Event]:
        """Step the engine until this request stops (it then waits in FINISHED for release)."""
        self._require("run_to_end")
        start = len(self.llm.trace)
        for _ in range(self.max_run_steps):
            if not self.req.is_live:
                break
            self.llm.step()
        return self._record("run_to_end", start)

    def cancel(self) -> list[Event]:
        """``llm.cancel``: the request is FINISHED (CANCELLED) and RELEASED in the same call."""
        self._require("cancel")
        start = len(self.llm.trace)
        self.llm.cancel(self.req.request_id)
        return self._record("cancel", start)

    def release(self) -> list[Event]:
        """``llm.release``: FINISHED -> RELEASED, the request's blocks go back to the pool."""
        self._require("release")
        start = len(self.llm.trace)
        self.llm.release(self.req.request_id)
        return self._record("release", start)

    def reset(self, prompt: str | None = None, params: SamplingParams | None = None) -> list[Event]:
        """Start over with a new request (back to NEW). The old request is cancelled if it is
        still live, or released if it is FINISHED, so it never keeps blocks behind."""
        start = len(self.llm.trace)
        if self.req is not None:
            if self.req.is_live:
                self.llm.cancel(self.req.request_id)
            elif self.req.state == S.FINISHED:
                self.llm.release(self.req.request_id)
        events = list(self.llm.trace[start:])
        self.req = None
        self.log = []
        self.last_action, self.last_events = "reset", events
        if prompt is not None:
            self.prompt = prompt
        if params is not None:
            self.params = params
        return events

    # --- views of the engine's state -----------------------------------------------------
    def request_events(self) -> list[Event]:
        """This request's events in the engine trace."""
        if self.req is None:
            return []
        return [e for e in self.llm.trace if e.request_id == self.req.request_id]

    def last_edges(self) -> list[tuple[str, str]]:
        """Lifecycle edges the last action moved this request along."""
        mine = [e for e in self.last_events if e.request_id == self.request_id]
        return edges_of_events(mine)

    @property
    def blocks_held(self) -> int:
        return 0 if self.req is None else len(self.req.block_table)

    def prompt_tokens(self) -> list[tuple[int, str]]:
        if self.req is None:
            return []
        tok = self.llm.tokenizer
        return [(t, token_text(tok, t)) for t in self.req.prompt_token_ids]

    def output_tokens(self) -> list[tuple[int, str]]:
        if self.req is None:
            return []
        tok = self.llm.tokenizer
        return [(t, token_text(tok, t)) for t in self.req.output_token_ids]

    def candidates(self) -> dict | None:
        """The top candidates the engine reported for the latest sampled token (raw model
        probabilities, before temperature and filters) and the token actually chosen."""
        if self.req is None or not self.req.logprobs:
            return None
        entry = self.req.logprobs[-1]
        tok = self.llm.tokenizer
        top = [(int(t), token_text(tok, t), math.exp(lp)) for t, lp in entry["top"]]
        chosen = int(entry["token_id"])
        return {"index": len(self.req.logprobs) - 1, "chosen": chosen,
                "chosen_text": token_text(tok, chosen), "chosen_prob": math.exp(entry["logprob"]),
                "chosen_rank": next((i for i, (t, _, _) in enumerate(top) if t == chosen), None),
                "top": top}

    def pool(self) -> list[dict]:
        """Every block of the KV pool: whose it is. ``kind`` is "mine" (``pos`` = its index in
        this request's block table), "other" (held by another request), "cached" (free, but
        still holding a full block of tokens the prefix cache can reuse) or "free"."""
        alloc = self.llm.kv_cache.allocator
        mine = {b: i for i, b in enumerate(self.req.block_table)} if self.req is not None else {}
        others = set()
        for r in self.llm.requests.values():
            if self.req is None or r.request_id != self.req.request_id:
                others.update(r.block_table)
        cells = []
        for b in range(alloc.num_blocks):
            if b in mine:
                kind = "mine"
            elif b in others or alloc.ref_count[b] > 0:
                kind = "other"
            elif alloc.block_hashes[b] is not None:
                kind = "cached"
            else:
                kind = "free"
            cells.append({"block": b, "kind": kind, "pos": mine.get(b), "shared": alloc.ref_count[b] > 1})
        return cells

    def kv(self) -> dict:
        """Bytes and blocks, from ``llm.cache_stats()`` and the request's block table."""
        s = self.llm.cache_stats()
        blocks = self.blocks_held
        return {"blocks": blocks, "block_size": s.block_size, "slots": blocks * s.block_size,
                "tokens_in_cache": 0 if self.req is None else min(self.req.num_computed_tokens, blocks * s.block_size),
                "bytes_per_token": s.bytes_per_token, "bytes_held": blocks * s.block_bytes,
                "used_blocks": s.used_blocks, "total_blocks": s.total_blocks,
                "used_bytes": s.used_bytes, "total_bytes": s.total_bytes, "cached_blocks": s.cached_blocks}

    def metrics(self) -> dict:
        return {} if self.req is None else self.llm.metrics(self.req.request_id)

    def status_html(self) -> str:
        """The status line, with the stable ``minillm-state`` / ``minillm-blocks`` hooks."""
        rid = "–" if self.req is None else esc(self.req.request_id)
        reason = self.req.stop_reason.value if self.req is not None and self.req.stop_reason else "–"
        return (f"<div class='minillm-status'>request <b>{rid}</b> · state "
                f"<span class=\"minillm-state\">{self.state.value}</span> · KV blocks held "
                f"<span class=\"minillm-blocks\">{self.blocks_held}</span> · engine step "
                f"<b>{self.llm.step_count}</b> · stop reason <b>{reason}</b></div>")


# ----------------------------------------------------------------------------------------
# HTML views
# ----------------------------------------------------------------------------------------

_CSS = """
<style>
.minillm-stepper .widget-html-content{line-height:1.45}
.minillm-stepper .mm-chip{display:inline-block;margin:2px;padding:2px 5px;border-radius:6px;
  font-family:monospace;font-size:12px;text-align:center;line-height:1.2;vertical-align:top}
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
.minillm-stepper .mm-log{font-family:monospace;font-size:12px;max-height:220px;overflow-y:auto}
.minillm-stepper .mm-diagram svg{width:100%;max-width:100%;height:auto}
.minillm-stepper .mm-grid{display:grid;grid-template-columns:repeat(16,30px);gap:0}
.minillm-stepper .jupyter-button:disabled,.minillm-stepper .jupyter-button[disabled]{background:#e5e7eb !important;
  color:#9ca3af !important;opacity:1;box-shadow:none;cursor:not-allowed}
</style>
"""


def tokens_html(core: RequestStepperCore) -> str:
    if core.req is None:
        return ("<div class='mm-h'>Tokens</div><div><em>Not tokenized yet: the prompt is still text. "
                "Press <b>Tokenize</b>.</em></div>")
    special = set(core.llm.tokenizer.all_special_ids)
    chips = []
    for t, text in core.prompt_tokens():
        cls = "mm-special" if t in special else "mm-prompt"
        chips.append(f"<span class='mm-chip {cls}' title='prompt token id {t}'>{esc(text)}<small>{t}</small></span>")
    outs = core.output_tokens()
    for i, (t, text) in enumerate(outs):
        cls = "mm-new" if i == len(outs) - 1 else "mm-out"
        chips.append(f"<span class='mm-chip {cls}' title='output token #{i}, id {t}'>{esc(text)}<small>{t}</small></span>")
    n_in, n_out = len(core.req.prompt_token_ids), len(outs)
    return (f"<div class='mm-h'>Tokens: {n_in} prompt (blue) + {n_out} output (green, newest in amber)</div>"
            f"<div>{''.join(chips)}</div>"
            f"<div style='font-size:12px;margin-top:3px'>text so far: <code>{esc(core.req.text)}</code></div>")


def candidates_html(core: RequestStepperCore) -> str:
    c = core.candidates()
    head = "<div class='mm-h'>Next-token candidates</div>"
    if c is None:
        return head + "<div><em>No token sampled yet. The first one comes out of Prefill.</em></div>"
    rows = []
    top = c["top"]
    if c["chosen_rank"] is None:
        top = top + [(c["chosen"], c["chosen_text"], c["chosen_prob"])]
    pmax = max(p for _, _, p in top) or 1.0
    for rank, (t, text, p) in enumerate(top):
        chosen = t == c["chosen"]
        mark = "★ sampled" if chosen else ""
        rank_txt = str(rank + 1) if rank < len(c["top"]) else "…"
        rows.append(f"<tr class='{'mm-chosen' if chosen else ''}'><td>{rank_txt}</td><td><code>{esc(text)}</code></td>"
                    f"<td>{t}</td><td><span class='mm-bar' style='width:{int(120 * p / pmax)}px'></span></td>"
                    f"<td>{p:.3f}</td><td>{mark}</td></tr>")
    p = core.req.params
    knobs = f"temperature={p.temperature}, top_k={p.top_k}, top_p={p.top_p}, seed={p.seed}"
    return (head + f"<div style='font-size:12px'>for output token #{c['index']}: the model's probabilities "
            f"(before temperature and filters) and the token the sampler drew with {esc(knobs)}. "
            f"That token is now part of the history.</div>"
            f"<table class='mm-cand'><tr><td>#</td><td>token</td><td>id</td><td></td><td>p</td><td></td></tr>"
            f"{''.join(rows)}</table>")


def blocks_html(core: RequestStepperCore) -> str:
    kv = core.kv()
    cells = []
    for c in core.pool():
        label = "" if c["pos"] is None else str(c["pos"])
        share = " (shared)" if c["shared"] else ""
        title = {"mine": f"block {c['block']}: entry {c['pos']} of this request's block table{share}",
                 "other": f"block {c['block']}: held by another request{share}",
                 "cached": f"block {c['block']}: free, still holds a cached prefix",
                 "free": f"block {c['block']}: free"}[c["kind"]]
        cells.append(f"<span class='mm-cell mm-{c['kind']}' title='{esc(title)}'>{label}</span>")
    legend = ("<span class='mm-cell mm-mine'>0</span> this request (number = position in its block table) "
              "<span class='mm-cell mm-other'></span> other requests "
              "<span class='mm-cell mm-cached'></span> free, prefix still cached "
              "<span class='mm-cell mm-free'></span> free")
    held = (f"this request holds <b>{kv['blocks']}</b> blocks = {kv['slots']} token slots "
            f"({kv['tokens_in_cache']} filled with K/V) = <b>{fmt_bytes(kv['bytes_held'])}</b> "
            f"({kv['bytes_per_token']} bytes per token)")
    pool = (f"pool: {kv['used_blocks']} / {kv['total_blocks']} blocks in use, "
            f"{fmt_bytes(kv['used_bytes'])} of {fmt_bytes(kv['total_bytes'])}")
    return (f"<div class='mm-h'>KV cache pool ({kv['total_blocks']} blocks × {kv['block_size']} tokens)</div>"
            f"<div class='mm-grid'>{''.join(cells)}</div><div style='font-size:12px'>{legend}</div>"
            f"<div style='font-size:12px;margin-top:4px'>{held}<br>{pool}</div>")


def metrics_html(core: RequestStepperCore) -> str:
    m = core.metrics()
    if not m:
        return ""
    return ("<div class='mm-h'>Timings (from the engine's trace; stepping by hand, your pauses between "
            "clicks count too)</div><div style='font-size:12px'>"
            f"TTFT {fmt_ms(m['ttft'])} · TPOT {fmt_ms(m['tpot'])} · queue {fmt_ms(m['queue_time'])} · "
            f"end-to-end {fmt_ms(m['e2e'])} · FINISHED→RELEASED {fmt_ms(m['release_delay'])} · "
            f"output tokens {m['num_output_tokens']}</div>")


def log_html(core: RequestStepperCore) -> str:
    tok = core.llm.tokenizer
    if core.last_action is None:
        st = core.state.value
        return (f"<div class='mm-h'>What happened</div><div style='font-size:12px'>Nothing yet. In {st} a request "
                f"holds: {esc(STATE_HOLDS[st])}.</div>")
    lines = [esc(describe_event(e, tok)) for e in core.last_events]
    label = BUTTON_LABELS.get(core.last_action, core.last_action)
    if core.last_action in ("prefill", "decode_one") and core.req is not None and core.state == S.WAITING:
        lines.append("(the scheduler could not admit the request this step: no free slot, budget or blocks)")
    st = core.state.value
    history = "<br>".join(f"<b>{esc(BUTTON_LABELS.get(a, a))}</b>: " + "; ".join(
        esc(describe_event(e, tok)) for e in evs if e.request_id is not None) for a, evs in core.log)
    return (f"<div class='mm-h'>What “{esc(label)}” did in the engine</div>"
            f"<div class='mm-log'>{'<br>'.join(lines) or 'no events'}</div>"
            f"<div style='font-size:12px;margin-top:3px'>Now {st}: holds {esc(STATE_HOLDS[st])}.</div>"
            f"<details><summary style='font-size:12px'>all events of this request</summary>"
            f"<div class='mm-log'>{history}</div></details>")


# ----------------------------------------------------------------------------------------
# The widget
# ----------------------------------------------------------------------------------------

def _import_widgets():
    import ipywidgets as w

    return w


def language_notice(prompt: str, num_tokens: int) -> str:
    """One line of HTML when the prompt is not plain English text, else "".

    The shipped model learned English children's stories only; its byte-level tokenizer still
    accepts any text, but a Chinese character becomes several byte tokens the model never saw
    in training, so what it generates next is noise. Say so instead of letting it look broken."""
    foreign = sum(1 for ch in prompt if ord(ch) > 127)
    if not foreign:
        return ""
    return (f"<div style='color:#92400e;font-size:13px'>ℹ The shipped model was trained on English stories "
            f"only: these {len(prompt)} characters became {num_tokens} tokens, the non-English ones as raw "
            f"bytes it has hardly seen, so expect nonsense after them. The engine's mechanics are the same; "
            f"LLM(\"path/to/a/multilingual/model\") loads a model that reads them.</div>")


class RequestStepper(_import_widgets().VBox):
    """The widget: ``RequestStepper(llm=None, prompt="Once upon a time", params=None)``.

    ``stepper.core`` is the ``RequestStepperCore``; ``stepper.buttons`` maps each button
    label to its ``ipywidgets.Button`` (``stepper.buttons["Prefill"].click()`` works in
    tests); ``stepper.status`` is the HTML widget with the state and block-count spans.
    """

    def __init__(self, llm=None, prompt: str = DEFAULT_PROMPT, params: SamplingParams | None = None, *,
                 lang=None, **kwargs):
        w = _import_widgets()
        super().__init__(**kwargs)
        self.core = RequestStepperCore(llm, prompt, params, lang=lang)
        self.lang = self.core.lang
        p = self.core.params
        style = {"description_width": "90px"}
        lay = w.Layout(width="330px")
        self.prompt_box = w.Textarea(value=prompt, description="prompt", layout=w.Layout(width="330px", height="60px"),
                                     style=style)
        self.temperature = w.FloatSlider(value=p.temperature, min=0.0, max=2.0, step=0.05, description="temperature",
                                         style=style, layout=lay, continuous_update=False)
        self.top_k = w.IntSlider(value=p.top_k, min=0, max=100, description="top-k (0=off)", style=style, layout=lay,
                                 continuous_update=False)
        self.top_p = w.FloatSlider(value=p.top_p, min=0.05, max=1.0, step=0.05, description="top-p", style=style,
                                   layout=lay, continuous_update=False)
        self.seed = w.IntText(value=0 if p.seed is None else p.seed, description="seed", style=style, layout=lay)
        self.max_tokens = w.IntSlider(value=p.max_tokens, min=1, max=64, description="max tokens", style=style,
                                      layout=lay, continuous_update=False)
        self._controls = [self.prompt_box, self.temperature, self.top_k, self.top_p, self.seed, self.max_tokens]
        self.buttons: dict[str, object] = {}
        for action in ACTIONS:
            b = w.Button(description=BUTTON_LABELS[action], layout=w.Layout(width="150px"),
                         button_style="warning" if action == "cancel" else "")
            b.add_class(f"minillm-btn-{action.replace('_', '-')}")
            b.on_click(lambda _b, a=action: self._do(a))
            self.buttons[BUTTON_LABELS[action]] = b
        self.new_button = w.Button(description="New request", layout=w.Layout(width="150px"), button_style="info")
        self.new_button.add_class("minillm-btn-new")
        self.new_button.on_click(lambda _b: self._do("reset"))
        self.buttons["New request"] = self.new_button
        self.status = w.HTML()
        self.message = w.HTML()
        self.diagram = w.HTML(layout=w.Layout(width="100%"))
        self.diagram.add_class("mm-diagram")
        self.tokens = w.HTML()
        self.cands = w.HTML(layout=w.Layout(width="48%"))
        self.blocks = w.HTML(layout=w.Layout(width="52%"))
        self.timings = w.HTML()
        self.events_view = w.HTML(layout=w.Layout(width="420px"))
        settings = w.VBox([w.HTML("<div class='mm-h'>The request: prompt + SamplingParams</div>")] + self._controls)
        buttons = w.VBox([w.HTML("<div class='mm-h'>Engine actions</div>")]
                         + [self.buttons[BUTTON_LABELS[a]] for a in ACTIONS] + [self.new_button])
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
            note = ""
            if action == "tokenize":
                self.core.tokenize(self.prompt_box.value, self._params_from_controls())
                note = language_notice(self.prompt_box.value, len(self.core.req.prompt_token_ids))
            elif action == "reset":
                self.core.reset()
            else:
                getattr(self.core, action)()
            self.message.value = note
        except Exception as exc:  # a bad prompt or parameter: say so, keep the widget alive
            self.message.value = f"<div style='color:#b91c1c'>⚠ {esc(type(exc).__name__)}: {esc(exc)}</div>"
        self.refresh()

    def _repr_mimebundle_(self, **kwargs):
        from ._common import widget_bundle

        plain = (f"RequestStepper: request {self.core.request_id or '(none yet)'} in {self.core.state} "
                 f"(run the cell to use the buttons)")
        return widget_bundle(self, super()._repr_mimebundle_(**kwargs), plain)

    def refresh(self) -> None:
        """Redraw every view from the engine's current state."""
        core = self.core
        for action in ACTIONS:
            self.buttons[BUTTON_LABELS[action]].disabled = not core.can(action)
        self.new_button.disabled = core.req is None
        for c in self._controls:
            c.disabled = core.req is not None  # parameters travel with the request once it exists
        self.status.value = core.status_html()
        self.diagram.value = diagram_html(core.state, core.last_edges() or None)
        self.tokens.value = tokens_html(core)
        self.cands.value = candidates_html(core)
        self.blocks.value = blocks_html(core)
        self.timings.value = metrics_html(core)
        self.events_view.value = log_html(core)
