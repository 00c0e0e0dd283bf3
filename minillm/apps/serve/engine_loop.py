"""One thread owns the engine; HTTP handlers talk to it through thread-safe queues.

The engine is a single-threaded state machine: ``step()`` moves every request one token on.
A server has many clients at once, each in its own asyncio task. Rather than let those
tasks call the engine (and interleave with a step), exactly one background thread calls
``add_request`` / ``step`` / ``cancel``. Handlers put commands into a ``queue.Queue``; the
thread applies them between steps and hands each stream its new text through
``loop.call_soon_threadsafe`` into that stream's own ``asyncio.Queue``.

This is also where the chapter's scenario 2 is decided: a client that goes away must reach
the engine (``cancel``), not just the HTTP layer, or its KV blocks stay held until
``max_tokens``.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from dataclasses import dataclass, field

from minillm import LLM, RequestState, SamplingParams, StopReason

log = logging.getLogger("minillm.apps.serve")

_WAITING_STATES = (RequestState.NEW, RequestState.WAITING, RequestState.PREEMPTED)
_RUNNING_STATES = (RequestState.PREFILL, RequestState.DECODE)
TRACE_EVENTS_KEPT = 20_000  # the engine's trace is cleared beyond this: a server runs for days


class Overloaded(RuntimeError):
    """The waiting queue is full (HTTP 503 with Retry-After)."""


class ShuttingDown(RuntimeError):
    """The server is stopping and takes no new request (HTTP 503)."""


@dataclass
class Update:
    """What one stream learns from one engine step."""

    text: str                       # text produced since the previous update
    token_ids: list[int]            # tokens produced since the previous update
    logprobs: list[dict]            # their logprob entries, when the request asked for them
    num_output_tokens: int          # all output tokens so far
    stop_reason: StopReason | None = None  # set on the last update only


@dataclass
class Stream:
    """A client's end of one engine request: awaits updates in the event loop's thread."""

    request_id: str
    loop: asyncio.AbstractEventLoop
    accepted: asyncio.Future = None  # -> number of prompt tokens, or the engine's ValueError
    prompt_tokens: int = 0
    stop_reason: StopReason | None = None
    client_gone: bool = False
    _updates: asyncio.Queue = field(default_factory=asyncio.Queue, repr=False)

    @property
    def finished(self) -> bool:
        return self.stop_reason is not None

    async def updates(self):
        """Yield ``Update``s until the one that carries the stop reason."""
        while self.stop_reason is None:
            item = await self._updates.get()
            if item.stop_reason is not None:
                self.stop_reason = item.stop_reason
            yield item

    # called from the engine thread --------------------------------------------------------
    def _call(self, fn, *args) -> None:
        try:
            self.loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass

    def _push(self, update: Update) -> None:
        self._call(self._updates.put_nowait, update)

    def _accept(self, prompt_tokens: int) -> None:
        def done():
            self.prompt_tokens = prompt_tokens
            if not self.accepted.done():
                self.accepted.set_result(prompt_tokens)
        self._call(done)

    def _reject(self, exc: Exception) -> None:
        def done():
            if not self.accepted.done():
                self.accepted.set_exception(exc)
        self._call(done)


@dataclass
class _Live:
    """The engine thread's bookkeeping for one request it serves."""

    req: object
    stream: Stream
    sent_text: int = 0
    sent_tokens: int = 0
    blocks: int = 0  # what its release gave back (from the RELEASED event, or counted at cancel)
    cancel_reason: str | None = None
    steps_late: int | None = None  # engine steps between the cancel being asked for and applied


class EngineLoop:
    """Runs ``llm`` in one background thread and serves many concurrent streams.

    Args:
        llm: the engine; after ``start()`` only this loop's thread may call it.
        max_waiting: most requests queued for a batch slot; one more is ``Overloaded``.
        observer: optional object with ``on_step(snapshot)``, ``on_finish(req, stop_reason,
            timings)`` and ``on_reject()`` (the Prometheus metrics, see ``metrics.py``).
    """

    def __init__(self, llm: LLM, *, max_waiting: int = 64, observer=None):
        if not isinstance(max_waiting, int) or isinstance(max_waiting, bool) or max_waiting < 1:
            raise ValueError(f"max_waiting must be an int >= 1, got {max_waiting!r}")
        self.llm = llm
        self.max_waiting = max_waiting
        self.observer = observer
        self._commands: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._pending = 0           # submitted, not yet seen by the engine thread
        self._waiting = 0           # engine requests not yet running (last publish)
        self._stopping = False
        self._live: dict[str, _Live] = {}
        self._thread: threading.Thread | None = None
        self.steps = 0
        self._snapshot = self._build_snapshot()

    # --- called from HTTP handlers (the event loop thread) -----------------------------------
    def start(self) -> "EngineLoop":
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="minillm-engine", daemon=True)
            self._thread.start()
        return self

    def submit(self, request_id: str, params: SamplingParams, *, prompt: str | None = None,
               prompt_token_ids: list[int] | None = None) -> Stream:
        """Queue a request for the engine. Raises ``Overloaded`` / ``ShuttingDown`` at once;
        the engine's own verdict (a prompt too long, ...) arrives in ``stream.accepted``.
        A ``prompt`` text is tokenised on the engine's thread, delaying every stream by that
        long: the server passes ``prompt_token_ids`` made by ``LLM.prepare_prompt`` in a worker."""
        loop = asyncio.get_running_loop()
        stream = Stream(request_id, loop, accepted=loop.create_future())
        with self._lock:
            if self._stopping:
                raise ShuttingDown("the server is shutting down")
            if self._waiting + self._pending >= self.max_waiting:
                if self.observer is not None:
                    self.observer.on_reject()
                raise Overloaded(f"{self._waiting + self._pending} requests are already waiting "
                                 f"(--max-waiting {self.max_waiting}); retry shortly")
            self._pending += 1
        self._commands.put(("add", stream, params, prompt, prompt_token_ids))
        return stream

    def cancel(self, request_id: str, why: str = "client disconnected") -> None:
        """Cancel in the engine (between two steps): its blocks go back to the pool."""
        self._commands.put(("cancel", request_id, why, self.steps))  # steps: to log how late it landed

    def begin_shutdown(self) -> None:
        """Stop accepting; cancel every live request at the next step boundary."""
        with self._lock:
            self._stopping = True
        self._commands.put(("shutdown",))

    def stop(self, timeout: float = 10.0) -> dict:
        """Shut down and wait for the engine thread; returns the last snapshot."""
        self.begin_shutdown()
        if self._thread is not None:
            self._thread.join(timeout)
        return self.snapshot()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def snapshot(self) -> dict:
        """The engine as of the last step: KV blocks, running / waiting counts, live requests."""
        with self._lock:
            snap = dict(self._snapshot)
            snap["waiting"] += self._pending
            return snap

    # --- the engine thread ------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            idle = not self._live
            if idle and self._stopping and self._commands.empty():
                break
            added = self._apply_commands(block=idle)
            if self._stopping:
                for rid in list(self._live):
                    self._cancel(rid, "server shutting down")
            if self._live:
                self._step()
            self._publish(added)
        self._publish(0)
        stats = self.llm.cache_stats()
        log.info("engine loop stopped after %d steps: KV used %d/%d blocks", self.steps,
                 stats.used_blocks, stats.total_blocks)

    def _apply_commands(self, block: bool) -> int:
        added = 0
        try:
            cmd = self._commands.get(timeout=0.5) if block else self._commands.get_nowait()
        except queue.Empty:
            return 0
        while True:
            kind = cmd[0]
            if kind == "add":
                added += 1
                self._add(*cmd[1:])
            elif kind == "cancel":
                self._cancel(cmd[1], cmd[2], cmd[3])
            try:
                cmd = self._commands.get_nowait()
            except queue.Empty:
                return added

    def _add(self, stream: Stream, params, prompt, prompt_token_ids) -> None:
        if self._stopping:
            stream._reject(ShuttingDown("the server is shutting down"))
            return
        try:
            req = self.llm.add_request(prompt, params, prompt_token_ids=prompt_token_ids,
                                       request_id=stream.request_id)
        except Exception as exc:  # ValueError: the client's fault (HTTP 400); anything else: 500
            if not isinstance(exc, ValueError):
                log.exception("add_request failed for %s", stream.request_id)
            stream._reject(exc)
            return
        self._live[stream.request_id] = _Live(req, stream)
        stream._accept(len(req.prompt_token_ids))

    def _cancel(self, request_id: str, why: str, asked_at_step: int | None = None) -> None:
        live = self._live.get(request_id)
        if live is None:  # finished already, or never admitted: nothing is held
            return
        live.cancel_reason = why
        live.steps_late = None if asked_at_step is None else self.steps - asked_at_step
        live.blocks = len(live.req.block_table)
        self.llm.cancel(request_id)
        self._deliver(live)

    def _step(self) -> None:
        try:
            events = self.llm.step()
        except Exception as exc:  # an engine bug must not leave clients hanging or blocks held
            log.exception("engine step failed; cancelling %d live requests", len(self._live))
            for rid in list(self._live):
                self._cancel(rid, f"engine error: {exc}")
            return
        self.steps += 1
        if len(self.llm.trace) > TRACE_EVENTS_KEPT:
            self.llm.clear_trace()  # this loop reads request fields, never the trace
        for e in events:  # what each release gave back, as the engine reports it
            if e.kind == "transition" and e.data.get("to") == "RELEASED" and e.request_id in self._live:
                self._live[e.request_id].blocks = e.data.get("blocks", 0)
        for live in list(self._live.values()):
            self._deliver(live)

    def _deliver(self, live: _Live) -> None:
        """Send a stream what is new since its last update; retire it when it is finished."""
        req = live.req
        done = not req.is_live
        hold = 0 if done else max((len(s) for s in req.params.stop_strings), default=1) - 1
        safe = max(len(req.text) - hold, live.sent_text)
        n = len(req.output_token_ids)
        if safe == live.sent_text and n == live.sent_tokens and not done:
            return
        update = Update(text=req.text[live.sent_text:safe], token_ids=req.output_token_ids[live.sent_tokens:n],
                        logprobs=req.logprobs[live.sent_tokens:n] if req.params.logprobs is not None else [],
                        num_output_tokens=n, stop_reason=req.stop_reason if done else None)
        live.sent_text, live.sent_tokens = safe, n
        live.stream._push(update)
        if done:
            del self._live[req.request_id]
            self._retire(live)

    def _retire(self, live: _Live) -> None:
        req = live.req
        stats = self.llm.cache_stats()
        if live.cancel_reason:
            late = "" if live.steps_late is None else f", {live.steps_late} step(s) after it was asked for"
            log.info("%s %s: cancelled in the engine after %d tokens%s; released %d blocks "
                     "(KV used %d/%d)", req.request_id, live.cancel_reason, len(req.output_token_ids), late,
                     live.blocks, stats.used_blocks, stats.total_blocks)
        else:
            log.info("%s finished: %s after %d tokens; released %d blocks (KV used %d/%d)",
                     req.request_id, req.stop_reason.value, len(req.output_token_ids), live.blocks,
                     stats.used_blocks, stats.total_blocks)
        if self.observer is not None:
            self.observer.on_finish(req, req.stop_reason, request_timings(req))

    def _publish(self, added: int) -> None:
        snap = self._build_snapshot()
        # the gauges before the snapshot: a client that reads this snapshot (say, no request left)
        # and then /metrics finds gauges at least as new, never the step before's
        if self.observer is not None:
            self.observer.on_step(snap)
        with self._lock:
            self._pending -= added
            self._waiting = snap["waiting"]
            self._snapshot = snap

    def _build_snapshot(self) -> dict:
        stats = self.llm.cache_stats()
        rows, running, waiting = [], 0, 0
        for live in self._live.values():
            req = live.req
            running += req.state in _RUNNING_STATES
            waiting += req.state in _WAITING_STATES
            rows.append({"id": req.request_id, "state": req.state.value,
                         "prompt_tokens": len(req.prompt_token_ids),
                         "output_tokens": len(req.output_token_ids),
                         "max_tokens": req.params.max_tokens, "blocks": len(req.block_table),
                         "client_connected": not live.stream.client_gone})
        return {"time": time.time(), "steps": self.steps, "running": running, "waiting": waiting,
                "kv_cache": {"total_blocks": stats.total_blocks, "used_blocks": stats.used_blocks,
                             "free_blocks": stats.free_blocks, "block_size": stats.block_size,
                             "usage": stats.usage},
                "requests": rows}


def request_timings(req) -> dict:
    """Queue time, TTFT and TPOT of a finished request, from its own timestamps (O(1),
    independent of the trace, which a long-running server clears)."""
    arrival, sched, first, end = req.arrival_time, req.first_scheduled_time, req.first_token_time, req.finished_time
    n = len(req.output_token_ids)
    return {"queue_time": None if arrival is None or sched is None else sched - arrival,
            "ttft": None if arrival is None or first is None else first - arrival,
            "tpot": None if n < 2 or first is None or end is None else (end - first) / (n - 1),
            "e2e": None if arrival is None or end is None else end - arrival,
            "prompt_tokens": len(req.prompt_token_ids), "output_tokens": n}
