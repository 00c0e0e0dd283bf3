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

import dataclasses
import math

from ..params import SamplingParams
from ..request import LIVE_STATES, RequestState
from ..trace import Event
from ._common import DEFAULT_PROMPT, default_llm, esc, fmt_bytes, fmt_ms, token_pieces, token_text
from .i18n import FONT_STACK, MONO_STACK, phrase, resolve_lang
from .diagram import diagram_html, edges_of_events, state_holds

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


def button_labels(lang=None) -> dict[str, str]:
    """action -> button label in ``lang`` (None: the course-wide language)."""
    return {a: phrase(f"btn.{a}", lang) for a in ACTIONS + ("new",)}


def _quote(text: str, lang) -> str:
    return f"「{text}」" if resolve_lang(lang) == "zh" else repr(text)


def describe_event(e: Event, tokenizer=None, lang=None, *, token_label=None) -> str:
    """One engine event in plain words (used by the stepper's log and the notebooks).

    ``lang``: "en" or "zh" (None: the course-wide language). ``token_label(event)``, when
    given, names a sampled token (the stepper passes the text its detokenized request shows);
    otherwise the token's own text from ``tokenizer``."""
    lang = resolve_lang(lang)
    d = e.data
    who = phrase("ev.who", lang, rid=e.request_id)
    if e.kind == "transition":
        frm, to = d.get("from"), d.get("to")
        if frm is None:
            return phrase("ev.created", lang, who=who)
        if to == "WAITING":
            return phrase("ev.waiting", lang, who=who, n=d.get("prompt_tokens"))
        if to == "PREFILL":
            cached = d.get("cached_tokens", 0)
            extra = phrase("ev.prefill_cached", lang, n=cached) if cached else ""
            return phrase("ev.prefill", lang, who=who, frm=frm, blocks=d.get("blocks"), extra=extra)
        if to == "DECODE":
            return phrase("ev.decode", lang, who=who)
        if to == "PREEMPTED":
            return phrase("ev.preempted", lang, who=who, frm=frm, blocks=d.get("blocks"))
        if to == "FINISHED":
            return phrase("ev.finished", lang, who=who, frm=frm, reason=d.get("stop_reason"))
        if to == "RELEASED":
            return phrase("ev.released", lang, who=who, blocks=d.get("blocks"))
        return f"{who}: {frm} -> {to}"
    if e.kind == "token":
        label = token_label(e) if token_label is not None else (
            token_text(tokenizer, d["token_id"]) if tokenizer is not None else None)
        text = f" {_quote(label, lang)}" if label is not None else ""
        prob = f" (p={math.exp(d['logprob']):.3f})" if "logprob" in d else ""
        return phrase("ev.token", lang, who=who, index=d["index"], id=d["token_id"], text=text, prob=prob)
    if e.kind == "step":
        n = d["num_tokens"]
        key = "ev.step_one" if n == 1 else "ev.step"
        return phrase(key, lang, step=e.step, prefill=d["num_prefill"], decode=d["num_decode"], n=n,
                      used=d["used_blocks"], total=d["total_blocks"])
    return repr(e)


def summarize_action(action: str, events: list[Event], request_id, tokenizer=None, lang=None, *,
                     token_label=None) -> str:
    """One sentence for what a stepper action did to its request, from the events it caused,
    e.g. "Prefill: one forward pass over 5 prompt tokens, 1 KV block allocated, first token
    'fox' sampled"."""
    lang = resolve_lang(lang)
    mine = [e for e in events if e.request_id == request_id]
    steps = [e for e in events if e.kind == "step"]
    tokens = [e for e in mine if e.kind == "token"]
    moved = {e.data.get("to"): e for e in mine if e.kind == "transition"}

    def name(e):
        label = token_label(e) if token_label is not None else (
            token_text(tokenizer, e.data["token_id"]) if tokenizer is not None else str(e.data["token_id"]))
        return _quote(label, lang)

    parts = []
    if action == "tokenize" and "WAITING" in moved:
        parts.append(phrase("sum.tokenize", lang, n=moved["WAITING"].data.get("prompt_tokens")))
    elif action in ("prefill", "decode_one") and "PREFILL" in moved:
        pre = moved["PREFILL"].data
        chunks = [e.data.get("chunk_tokens") for e in mine if e.kind == "transition" and e.data.get("to") == "PREFILL"]
        # this request's own prompt tokens (a step may also have carried other requests' tokens)
        n = sum(c for c in chunks if c) if any(chunks) else sum(s.data["num_tokens"] for s in steps)
        key = "sum.prefill" if len(steps) <= 1 else "sum.prefill_steps"
        parts.append(phrase(key, lang, n=n, blocks=pre.get("blocks"), steps=len(steps)))
        if pre.get("cached_tokens"):
            parts.append(phrase("sum.cached", lang, n=pre["cached_tokens"]))
        if tokens:
            parts.append(phrase("sum.first", lang, tok=name(tokens[0])))
    elif action == "decode_one" and tokens:
        parts.append(phrase("sum.decode", lang, tok=name(tokens[-1]), index=tokens[-1].data["index"]))
    elif action == "run_to_end":
        parts.append(phrase("sum.run", lang, steps=len(steps), n=len(tokens)))
    elif action == "cancel":
        parts.append(phrase("sum.cancel", lang, blocks=moved.get("RELEASED").data.get("blocks")
                            if "RELEASED" in moved else 0))
    elif action == "release" and "RELEASED" in moved:
        parts.append(phrase("sum.release", lang, blocks=moved["RELEASED"].data.get("blocks")))
    if "FINISHED" in moved and action not in ("cancel",):
        parts.append(phrase("sum.finished", lang, reason=moved["FINISHED"].data.get("stop_reason")))
    if not parts:
        return ""
    sep = "，" if lang == "zh" else ", "
    return phrase(f"btn.{action}", lang) + ("：" if lang == "zh" else ": ") + sep.join(parts)


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
            raise ValueError(phrase("err.not_now", self.lang, label=phrase(f"btn.{action}", self.lang),
                                    state=self.state.value)
                             + ("" if self.req is not None else phrase("err.tokenize_first", self.lang)))

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

    def prompt_pieces(self):
        """The prompt's tokens as ``TokenPiece``s: the text each adds (a Chinese character split
        over byte tokens shows on the token that completes it; the others are marked partial)."""
        if self.req is None:
            return []
        return token_pieces(self.llm.tokenizer, self.req.prompt_token_ids)

    def output_pieces(self):
        """The output tokens as ``TokenPiece``s, decoded after the prompt as the request's
        detokenizer does: their ``text`` joins to ``req.text`` (unless a stop string cut it)."""
        if self.req is None:
            return []
        return token_pieces(self.llm.tokenizer, self.req.output_token_ids, context=self.req.prompt_token_ids)

    def prompt_tokens(self) -> list[tuple[int, str]]:
        """(id, label) per prompt token; the label is the visible text or ‹bytes› of a partial token."""
        return [(p.token_id, p.label) for p in self.prompt_pieces()]

    def output_tokens(self) -> list[tuple[int, str]]:
        return [(p.token_id, p.label) for p in self.output_pieces()]

    def token_label(self, event) -> str:
        """The caption of a sampled token event: the piece of the output it is."""
        if self.req is not None and event.request_id == self.req.request_id:
            pieces = self.output_pieces()
            i = event.data.get("index", -1)
            if 0 <= i < len(pieces) and pieces[i].token_id == event.data["token_id"]:
                return pieces[i].label
        return token_text(self.llm.tokenizer, event.data["token_id"])

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
        return ("<div class='minillm-status'>" + phrase(
            "st.line", self.lang, rid=f"<b>{rid}</b>",
            state=f"<span class=\"minillm-state\">{self.state.value}</span>",
            blocks=f"<span class=\"minillm-blocks\">{self.blocks_held}</span>",
            step=f"<b>{self.llm.step_count}</b>", reason=f"<b>{reason}</b>") + "</div>")


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


class ButtonMap(dict):
    """label -> Button, where a button also answers to its English label and its action name.

    Iterating (``keys``, ``values``, ``items``) shows each button once, under the label it
    shows; ``buttons["Prefill"]``, ``buttons["预填充"]`` and ``buttons["prefill"]`` are the
    same button, so a notebook's code works in both languages."""

    def __init__(self):
        super().__init__()
        self._alias: dict[str, str] = {}

    def add(self, button, label: str, *aliases: str) -> None:
        self[label] = button
        for a in aliases:
            if a != label:
                self._alias[a] = label

    def __getitem__(self, key):
        return super().__getitem__(self._alias.get(key, key))

    def __contains__(self, key):
        return super().__contains__(self._alias.get(key, key))

    def get(self, key, default=None):
        return self[key] if key in self else default


def language_notice(pieces, lang=None) -> str:
    """One line of HTML when some characters of the prompt are not in the tokenizer's
    vocabulary (they fell back to byte tokens), else "".

    A byte-level tokenizer accepts any text, but a character it never learned becomes two to
    four byte tokens the model has hardly seen in training, so what it generates next is
    noise. Say so instead of letting it look broken. ``pieces``: ``token_pieces`` of the prompt."""
    chars = "".join(p.completes for p in pieces if p.partial and p.text)  # once per character group
    if not chars:
        return ""
    n_tokens = sum(1 for p in pieces if p.partial)
    sample = "".join(dict.fromkeys(chars))[:12]
    return ("<div style='color:#92400e;font-size:13px'>ℹ "
            + esc(phrase("notice.bytes", lang, chars=len(chars), n=n_tokens, sample=sample)) + "</div>")


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
