"""Events: what happened in the engine, in order, and the timings derived from them.

Every state transition, every scheduled step and every sampled token appends an ``Event``
(``EngineCore._emit``). The widgets, the plots and the Chrome trace export read this list.
``LLM.metrics`` reads the same moments from the request's own timestamps (``metrics_of``: the
same clock readings as its events, O(1), still there when the trace is bounded), and the
scheduler keeps its own account of which request holds blocks (``Scheduler.holding``), which
each step event copies into ``kv_blocks``.

Event kinds and their ``data``:
- ``"transition"``: ``{"from": state, "to": state, ...}`` (``stop_reason`` on FINISHED, and
  ``error`` when the engine ended the request because something raised for it alone;
  ``blocks`` freed on RELEASED and PREEMPTED; ``cached_tokens``, ``blocks`` and
  ``chunk_tokens`` on the first PREFILL; a PREFILL -> PREFILL event for every further chunk
  of a chunked prefill, with ``chunk_tokens`` and ``computed_tokens`` (already in the cache);
  ``rolled_back: True`` with ``blocks`` freed on PREFILL -> WAITING / PREEMPTED when a failed
  or interrupted step was undone);
- ``"token"``: ``{"token_id", "index", "logprob"?, "top"?}`` (no text: the text is the
  request's own, ``req.text``, and the detokenizer decides when a character is complete);
- ``"step"``: ``{"num_prefill", "num_decode", "num_tokens", "num_preempted", "duration",
  "used_blocks", "total_blocks", "bytes_per_token", "block_size", "kv_blocks": {request_id:
  blocks}, "prefill_tokens": {request_id: tokens prefilled this step}}`` (request_id ``None``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean


@dataclass
class Event:
    step: int
    time: float            # time.monotonic() seconds
    request_id: str | None
    kind: str
    data: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        rid = f" {self.request_id}" if self.request_id is not None else ""
        if self.kind == "transition":
            return f"Event(step={self.step}{rid} {self.data['from']} -> {self.data['to']})"
        return f"Event(step={self.step}{rid} {self.kind} {self.data})"


def request_metrics(events: list[Event], request_id: str) -> dict:
    """Timing of one request, from its events alone.

    queue_time: enqueued (WAITING) -> first scheduled (PREFILL);
    ttft: enqueued -> first token; tpot: mean gap between later tokens;
    e2e: enqueued -> FINISHED.
    """
    enq = first_sched = finish = released = None
    token_times: list[float] = []
    for e in events:
        if e.request_id != request_id:
            continue
        if e.kind == "transition":
            to = e.data["to"]
            if to == "WAITING" and enq is None:
                enq = e.time
            elif to == "PREFILL" and first_sched is None:
                first_sched = e.time
            elif to == "FINISHED":
                finish = e.time
            elif to == "RELEASED":
                released = e.time
        elif e.kind == "token":
            token_times.append(e.time)
    out = {"num_output_tokens": len(token_times), "queue_time": None, "ttft": None, "tpot": None,
           "e2e": None, "release_delay": None}
    if enq is not None and first_sched is not None:
        out["queue_time"] = first_sched - enq
    if enq is not None and token_times:
        out["ttft"] = token_times[0] - enq
    if len(token_times) > 1:
        out["tpot"] = (token_times[-1] - token_times[0]) / (len(token_times) - 1)
    if enq is not None and finish is not None:
        out["e2e"] = finish - enq
    if finish is not None and released is not None:
        out["release_delay"] = released - finish
    return out


def metrics_of(req) -> dict:
    """The same numbers as ``request_metrics``, from the request's own timestamps: O(1),
    whatever the length of the trace (and still there when the trace is bounded)."""
    n = len(req.output_token_ids)
    enq, first, last = req.arrival_time, req.first_token_time, req.last_token_time

    def gap(a, b):
        return b - a if a is not None and b is not None else None

    return {"num_output_tokens": n, "queue_time": gap(enq, req.first_scheduled_time),
            "ttft": gap(enq, first), "tpot": (last - first) / (n - 1) if n > 1 and first is not None else None,
            "e2e": gap(enq, req.finished_time), "release_delay": gap(req.finished_time, req.released_time)}


def summary(events: list[Event]) -> dict:
    """Whole-trace numbers: output tokens per second and mean TTFT / TPOT."""
    ids = sorted({e.request_id for e in events if e.request_id is not None})
    per = [request_metrics(events, r) for r in ids]
    tokens = sum(1 for e in events if e.kind == "token")
    steps = [e for e in events if e.kind == "step"]
    span = (steps[-1].time - steps[0].time + steps[0].data.get("duration", 0.0)) if steps else 0.0
    ttfts = [m["ttft"] for m in per if m["ttft"] is not None]
    tpots = [m["tpot"] for m in per if m["tpot"] is not None]
    return {
        "num_requests": len(ids),
        "num_steps": len(steps),
        "output_tokens": tokens,
        "tokens_per_s": tokens / span if span > 0 else None,
        "mean_ttft": mean(ttfts) if ttfts else None,
        "mean_tpot": mean(tpots) if tpots else None,
    }


def kv_usage(events: list[Event]) -> list[dict]:
    """KV use after each step: ``{"step", "time", "used_blocks", "used_bytes", "per_request"}``
    where per_request maps request id -> blocks held (bytes = blocks x block_size x bytes_per_token)."""
    rows = []
    for e in events:
        if e.kind != "step":
            continue
        d = e.data
        block_bytes = d["block_size"] * d["bytes_per_token"]
        rows.append({
            "step": e.step, "time": e.time, "used_blocks": d["used_blocks"],
            "used_bytes": d["used_blocks"] * block_bytes,
            "per_request": dict(d["kv_blocks"]),
            "per_request_bytes": {r: n * block_bytes for r, n in d["kv_blocks"].items()},
        })
    return rows


def state_intervals(events: list[Event]) -> dict[str, list[tuple[str, int, int | None]]]:
    """For each request, the states it was in as (state, first step, last step or None if still there)."""
    spans: dict[str, list[list]] = {}
    for e in events:
        if e.kind != "transition" or e.request_id is None:
            continue
        lst = spans.setdefault(e.request_id, [])
        if lst:
            lst[-1][2] = e.step
        lst.append([e.data["to"], e.step, None])
    return {r: [tuple(x) for x in lst] for r, lst in spans.items()}


def to_chrome_trace(events: list[Event], path: str | Path | None = None) -> dict:
    """Chrome trace JSON (open in https://ui.perfetto.dev or chrome://tracing): one track per
    request with its states as spans, one track for scheduler steps, tokens as instants."""
    if not events:
        doc = {"traceEvents": [], "displayTimeUnit": "ms"}
    else:
        t0 = events[0].time
        us = lambda t: (t - t0) * 1e6  # noqa: E731
        tids: dict[str | None, int] = {None: 0}
        out = [{"ph": "M", "name": "thread_name", "pid": 1, "tid": 0, "args": {"name": "scheduler"}}]
        open_span: dict[str, tuple[str, float]] = {}
        for e in events:
            if e.request_id not in tids:
                tids[e.request_id] = len(tids)
                out.append({"ph": "M", "name": "thread_name", "pid": 1, "tid": tids[e.request_id],
                            "args": {"name": f"request {e.request_id}"}})
            tid = tids[e.request_id]
            if e.kind == "step":
                dur = e.data.get("duration", 0.0) * 1e6
                out.append({"ph": "X", "name": f"step {e.step}", "pid": 1, "tid": 0,
                            "ts": us(e.time) - dur, "dur": dur,
                            "args": {k: v for k, v in e.data.items() if k != "kv_blocks"}})
                out.append({"ph": "C", "name": "kv_used_blocks", "pid": 1, "ts": us(e.time),
                            "args": {"used": e.data["used_blocks"]}})
            elif e.kind == "transition":
                prev = open_span.pop(e.request_id, None)
                if prev is not None:
                    out.append({"ph": "X", "name": prev[0], "pid": 1, "tid": tid, "ts": prev[1],
                                "dur": max(us(e.time) - prev[1], 0.0)})
                if e.data["to"] != "RELEASED":
                    open_span[e.request_id] = (e.data["to"], us(e.time))
            elif e.kind == "token":
                out.append({"ph": "i", "s": "t", "name": "token", "pid": 1, "tid": tid, "ts": us(e.time),
                            "args": {"token_id": e.data.get("token_id")}})
        end = us(events[-1].time)
        for rid, (state, ts) in open_span.items():
            out.append({"ph": "X", "name": state, "pid": 1, "tid": tids[rid], "ts": ts, "dur": end - ts})
        doc = {"traceEvents": out, "displayTimeUnit": "ms"}
    if path is not None:
        Path(path).write_text(json.dumps(doc))
    return doc
