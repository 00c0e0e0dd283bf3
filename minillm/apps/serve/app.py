"""The HTTP face of one ``EngineLoop``: OpenAI-compatible routes plus looking inside.

Routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions`` (both
streaming as server-sent events, as the OpenAI API defines them), ``GET /v1/engine/requests``
(every live request: state, tokens so far, blocks held), ``GET /metrics`` (Prometheus) and
``GET /health``. With an API key, every ``/v1`` route needs ``Authorization: Bearer <key>``,
and so does the schema (``/openapi.json``; the ``/docs`` and ``/redoc`` pages are then off).

A body goes through ``guards`` (Host, content type, size, arrival time, JSON shape), then is
parsed and its prompt tokenised (or its chat laid out by the template) in a worker thread,
never in the engine's thread: the engine only ever receives token ids that fit, so a
client's megabyte prompt costs other clients' streams no step.

What happens when a client goes away is one method, ``OpenAIServer.client_gone``: it cancels
the request in the engine. The course's notebook overrides it with the bug the chapter warns
about (stop sending, keep generating) to show the memory that is then never given back.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import json
import logging
import os
import threading
import uuid
from contextlib import asynccontextmanager

import anyio
from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from minillm.request import check_params

from . import guards
from . import protocol as P
from .engine_loop import EngineLoop, Overloaded, ShuttingDown, Stream
from .metrics import CONTENT_TYPE_LATEST, ServerMetrics

log = logging.getLogger("minillm.apps.serve")

#: Largest body (bytes) a request may send, unless the server is told otherwise.
DEFAULT_MAX_BODY_BYTES = 1 << 20
#: Bodies beyond this many bytes are parsed and tokenised in a lane of their own (one thread),
#: so that huge prompts wait for each other, never in front of ordinary ones.
LARGE_BODY_BYTES = 16 * 1024
#: How much lower the CPU priority of the threads that parse and tokenise is than the engine's.
PREPARE_NICENESS = 10


class CancellingStream(StreamingResponse):
    """An SSE response that notices the client leaving even while no token is ready.

    It listens for ``http.disconnect`` alongside sending, whatever ASGI spec version the
    server speaks (Starlette only does so for servers older than ASGI 2.4), and calls
    ``on_disconnect`` at once: the engine hears about it within one step.
    """

    def __init__(self, content, on_disconnect):
        super().__init__(content, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self.on_disconnect = on_disconnect

    async def __call__(self, scope, receive, send) -> None:
        async with anyio.create_task_group() as tg:
            async def send_all():
                try:
                    await self.stream_response(send)
                except OSError:  # the socket broke while writing
                    self.on_disconnect()
                tg.cancel_scope.cancel()

            tg.start_soon(send_all)
            await self.listen_for_disconnect(receive)
            self.on_disconnect()  # reached only when the client left before the end
            tg.cancel_scope.cancel()


async def _wait_disconnect(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


_niced = threading.local()


def yield_to_engine() -> None:
    """Lower this worker thread's CPU priority (Linux: nice +10, once per thread): on a busy
    machine a long tokenisation then takes the cores the engine's thread leaves, instead of
    slowing its steps. Elsewhere, or where it is not allowed, nothing changes."""
    if getattr(_niced, "done", False):
        return
    _niced.done = True
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), PREPARE_NICENESS)
    except (AttributeError, OSError):
        pass


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class OpenAIServer:
    """Routes over an ``EngineLoop``. Args: ``engine``; ``model_name`` as clients send it;
    ``api_key`` (None = open); ``metrics`` (a ``ServerMetrics``, the loop's observer);
    ``max_body_bytes`` (larger bodies: 413); ``request_timeout`` (seconds for a body to
    arrive, else 408; None = no limit); ``allowed_hosts`` (Host header names answered, ``*``
    any; default: any)."""

    def __init__(self, engine: EngineLoop, model_name: str, *, api_key: str | None = None,
                 metrics: ServerMetrics | None = None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 request_timeout: float | None = None, allowed_hosts=("*",)):
        self.engine = engine
        self.llm = engine.llm  # read-only uses here: max_model_len, prepare_prompt (lock-free)
        self.model_name = model_name
        self.api_key = api_key or None
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.request_timeout = request_timeout
        self.allowed_hosts = list(allowed_hosts)
        self.created = P.now()
        self._large_lane = None  # made in the event loop (an anyio CapacityLimiter of 1)

    # --- the one policy the chapter is about ---------------------------------------------------
    def client_gone(self, stream: Stream) -> None:
        """A client disconnected before its request finished: cancel it in the engine, so its
        KV blocks go back to the pool at the next step boundary."""
        log.info("%s client disconnected before the end; cancelling in the engine", stream.request_id)
        self.engine.cancel(stream.request_id, "client disconnected")

    def _client_gone_once(self, stream: Stream) -> None:
        if not stream.client_gone and not stream.finished:
            stream.client_gone = True
            self.client_gone(stream)

    # --- helpers ------------------------------------------------------------------------------
    def _check_auth(self, request: Request) -> None:
        if self.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(), self.api_key.encode()):
            raise guards.HTTPError(401, "a valid API key is needed: send 'Authorization: Bearer <key>'",
                                   kind="authentication_error")

    async def _parse(self, kind: str, request: Request) -> P.ParsedRequest:
        """Read the body under the guards, then parse it and prepare its prompt in a worker
        thread (huge bodies in their own one-thread lane)."""
        guards.require_json(request)
        raw = await guards.read_body(request, self.max_body_bytes, self.request_timeout)
        if len(raw) > LARGE_BODY_BYTES:
            if self._large_lane is None:
                self._large_lane = anyio.CapacityLimiter(1)
            lane = self._large_lane
        else:
            lane = None
        return await anyio.to_thread.run_sync(self.parse_body, kind, raw, limiter=lane)

    def _check_vocabulary(self, parsed: P.ParsedRequest) -> P.ParsedRequest:
        """The engine's own check that the params' token ids (``logit_bias``) are in the vocabulary."""
        try:
            check_params(parsed.params, self.llm.model_config.vocab_size)
        except ValueError as exc:
            raise P.BadRequest(str(exc), P.param_of(str(exc))) from None
        return parsed

    def parse_body(self, kind: str, raw: bytes) -> P.ParsedRequest:
        """In a worker thread: JSON -> a request whose prompt is token ids that fit."""
        yield_to_engine()
        body = guards.parse_json_object(raw)
        model = body.get("model")
        if isinstance(model, str) and model != self.model_name:
            raise guards.HTTPError(404, f"the model {model[:100]!r} does not exist; this server serves "
                                        f"{self.model_name!r}", param="model", kind="not_found_error")
        if kind == "chat":
            parsed = P.parse_chat(body, self.llm.max_model_len, lambda msgs: self.llm.prepare_prompt(messages=msgs))
            return self._check_vocabulary(parsed)
        parsed = self._check_vocabulary(P.parse_completion(body))
        try:
            ids = self.llm.prepare_prompt(parsed.prompt, prompt_token_ids=parsed.prompt_token_ids)
        except ValueError as exc:
            raise P.BadRequest(str(exc), "prompt") from None
        return dataclasses.replace(parsed, prompt=None, prompt_token_ids=ids)

    async def _admit(self, kind: str, request_id: str, parsed: P.ParsedRequest) -> Stream:
        stream = self.engine.submit(request_id, parsed.params, prompt=parsed.prompt,
                                    prompt_token_ids=parsed.prompt_token_ids)
        try:
            await stream.accepted
        except ValueError as exc:  # the engine's verdict: a prompt that can never fit, ...
            raise P.BadRequest(str(exc), P.param_of(str(exc)) or ("messages" if kind == "chat" else "prompt")) \
                from None
        return stream

    def _token_text(self, token_id: int) -> str:
        return self.llm.tokenizer.decode([token_id])

    # --- one response shape per endpoint ------------------------------------------------------
    def _chunk(self, kind: str, rid: str, text: str, entries: list[dict], stop_reason, first: bool,
               text_offset: int) -> dict:
        lp = None
        if kind == "chat":
            if entries:
                lp = P.chat_logprobs(entries, self._token_text)
            delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": lp}
            obj = "chat.completion.chunk"
        else:
            if entries:
                lp = P.completion_logprobs(entries, self._token_text, text_offset)
            choice = {"index": 0, "text": text, "logprobs": lp}
            obj = "text_completion"
        choice.update(P.finish_fields(stop_reason))
        return {"id": rid, "object": obj, "created": P.now(), "model": self.model_name, "choices": [choice]}

    async def _stream_events(self, kind: str, stream: Stream, parsed: P.ParsedRequest):
        rid, first, offset, n_out = stream.request_id, True, 0, 0
        want_lp = parsed.top_logprobs is not None
        try:
            async for u in stream.updates():
                if first or u.text or (want_lp and u.logprobs):
                    yield _sse(self._chunk(kind, rid, u.text, u.logprobs if want_lp else [], None, first, offset))
                    first, offset = False, offset + len(u.text)
                n_out = u.num_output_tokens
                if u.stop_reason is not None:
                    yield _sse(self._chunk(kind, rid, "", [], u.stop_reason, False, offset))
            if parsed.include_usage:
                yield _sse({"id": rid, "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
                            "created": P.now(), "model": self.model_name, "choices": [],
                            "usage": P.usage(stream.prompt_tokens, n_out)})
            yield "data: [DONE]\n\n"
        finally:  # closed before the end (a broken write, a cancelled task): the engine must know
            if not stream.finished:
                self._client_gone_once(stream)

    async def _collect(self, request: Request, stream: Stream) -> tuple[str, list[dict], int]:
        parts, entries, n = [], [], 0

        async def read():
            nonlocal n
            async for u in stream.updates():
                parts.append(u.text)
                entries.extend(u.logprobs)
                n = u.num_output_tokens

        reader = asyncio.ensure_future(read())
        watcher = asyncio.ensure_future(_wait_disconnect(request))
        try:
            await asyncio.wait({reader, watcher}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watcher.cancel()
            if not reader.done():  # the client left while we waited: nothing will read this
                self._client_gone_once(stream)
                reader.cancel()
        return "".join(parts), entries, n

    async def _serve(self, kind: str, request: Request, parsed: P.ParsedRequest, rid: str):
        stream = await self._admit(kind, rid, parsed)
        if parsed.stream:
            return CancellingStream(self._stream_events(kind, stream, parsed),
                                    lambda: self._client_gone_once(stream))
        text, entries, n = await self._collect(request, stream)
        want_lp = parsed.top_logprobs is not None
        if kind == "chat":
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": P.chat_logprobs(entries, self._token_text) if want_lp else None}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text,
                      "logprobs": P.completion_logprobs(entries, self._token_text) if want_lp else None}
            obj = "text_completion"
        choice.update(P.finish_fields(stream.stop_reason))
        return {"id": rid, "object": obj, "created": P.now(), "model": self.model_name,
                "choices": [choice], "usage": P.usage(stream.prompt_tokens, n)}

    # --- the application ----------------------------------------------------------------------
    def build_app(self) -> FastAPI:
        @asynccontextmanager
        async def lifespan(app):
            self.engine.start()
            yield
            await asyncio.to_thread(self.engine.stop)

        keyed = self.api_key is not None  # then the schema needs the key and the docs pages are off
        app = FastAPI(title="minillm serve", version="0.1.0", lifespan=lifespan,
                      openapi_url=None if keyed else "/openapi.json", docs_url=None if keyed else "/docs",
                      redoc_url=None if keyed else "/redoc")
        app.add_middleware(guards.HostAllowList, allowed_hosts=self.allowed_hosts)
        auth = Depends(self._check_auth)

        @app.exception_handler(P.BadRequest)
        async def bad_request(request, exc: P.BadRequest):
            return JSONResponse(P.error_body(str(exc), exc.param, code=400), status_code=400)

        @app.exception_handler(guards.HTTPError)
        async def http_error(request, exc: guards.HTTPError):
            return JSONResponse(P.error_body(str(exc), exc.param, exc.kind, exc.status), status_code=exc.status,
                                headers=exc.headers)

        if keyed:
            @app.get("/openapi.json", dependencies=[auth], include_in_schema=False)
            async def openapi_schema():
                return JSONResponse(app.openapi())

        @app.exception_handler(Overloaded)
        async def overloaded(request, exc: Overloaded):
            return JSONResponse(P.error_body(str(exc), None, "overloaded_error", 503), status_code=503,
                                headers={"Retry-After": "1"})

        @app.exception_handler(ShuttingDown)
        async def shutting_down(request, exc: ShuttingDown):
            return JSONResponse(P.error_body(str(exc), None, "unavailable_error", 503), status_code=503,
                                headers={"Retry-After": "5", "Connection": "close"})

        @app.get("/health")
        async def health():
            ok = self.engine.alive
            return JSONResponse({"status": "ok" if ok else "engine stopped"}, status_code=200 if ok else 503)

        @app.get("/metrics")
        async def metrics():
            if self.metrics is None:
                raise guards.HTTPError(404, "metrics are not enabled on this server")
            body = self.metrics.render(self.engine.snapshot()["waiting"])
            return Response(body, media_type=CONTENT_TYPE_LATEST)

        @app.get("/v1/models", dependencies=[auth])
        async def models():
            return {"object": "list", "data": [{"id": self.model_name, "object": "model", "created": self.created,
                                                "owned_by": "minillm", "max_model_len": self.llm.max_model_len}]}

        @app.get("/v1/engine/requests", dependencies=[auth])
        async def engine_requests():
            return self.engine.snapshot()

        @app.post("/v1/completions", dependencies=[auth])
        async def completions(request: Request):
            parsed = await self._parse("completion", request)
            return await self._serve("completion", request, parsed, f"cmpl-{uuid.uuid4().hex[:24]}")

        @app.post("/v1/chat/completions", dependencies=[auth])
        async def chat_completions(request: Request):
            parsed = await self._parse("chat", request)
            return await self._serve("chat", request, parsed, f"chatcmpl-{uuid.uuid4().hex[:24]}")

        return app
