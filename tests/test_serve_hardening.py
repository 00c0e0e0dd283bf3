"""``minillm serve`` against hostile input: oversized, slow, malformed or cross-site requests
get a 4xx naming the limit (never a 500, a reset or a hang), and a huge prompt is tokenised
off the engine's thread, so other clients' steps go on while it is.

Most checks run the app in this process (httpx's ASGI transport, the engine loop started by
hand); the slow-client checks need real sockets and run a real ``minillm serve`` on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from urllib.parse import urlparse

import httpx
import pytest

pytest.importorskip("fastapi")

from minillm import LLM, SamplingParams  # noqa: E402
from minillm.apps.serve import EngineLoop, OpenAIServer, guards  # noqa: E402
from minillm.apps.serve.launch import ServerProcess  # noqa: E402

JSON = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def llm(tiny_llama):
    return LLM(str(tiny_llama[0]), block_size=4, num_kv_blocks=64, max_num_seqs=4)


def _server(llm, **kw) -> OpenAIServer:
    kw.setdefault("allowed_hosts", guards.default_allowed_hosts("127.0.0.1"))
    return OpenAIServer(EngineLoop(llm), "tiny", **kw)


def _call(run_async, server: OpenAIServer, fn):
    """Run ``fn(client)`` against ``server``'s app in this process, its engine loop started;
    returns what ``fn`` returns, after checking that no KV block is left held."""
    app = server.build_app()

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=120) as c:
            return await fn(c)

    server.engine.start()
    try:
        return run_async(go())
    finally:
        snap = server.engine.stop()
        assert snap["kv_cache"]["used_blocks"] == 0 and snap["requests"] == []


def _err(r, status: int, param=None) -> str:
    assert r.status_code == status, (r.status_code, r.text[:500])
    err = r.json()["error"]
    if param is not None:
        assert err["param"] == param, err
    return err["message"]


# --- body size and content type ------------------------------------------------------------
def test_a_body_over_the_limit_is_413_by_content_length_and_while_streaming(llm, run_async):
    async def fn(c):
        big = json.dumps({"prompt": "x" * 5000}).encode()
        by_length = await c.post("/v1/completions", content=big, headers=JSON)

        async def chunks():  # no Content-Length: counted as the bytes arrive
            for _ in range(10):
                yield b" " * 1000
            yield big

        streamed = await c.post("/v1/completions", content=chunks(), headers=JSON)
        fits = await c.post("/v1/completions", json={"prompt": "x" * 100, "max_tokens": 2})
        return by_length, streamed, fits

    by_length, streamed, fits = _call(run_async, _server(llm, max_body_bytes=4096), fn)
    assert "--max-body-bytes is 4096" in _err(by_length, 413) and "Content-Length" in by_length.json()["error"]["message"]
    assert by_length.headers["connection"] == "close"
    assert "--max-body-bytes is 4096" in _err(streamed, 413)
    assert fits.status_code == 200, fits.text


@pytest.mark.parametrize("ctype", [None, "text/plain", "application/x-www-form-urlencoded", "multipart/form-data",
                                   "application/jsonp", "text/json"])
def test_anything_but_application_json_is_415(llm, run_async, ctype):
    async def fn(c):
        headers = {} if ctype is None else {"content-type": ctype}
        return await c.post("/v1/completions", content=b'{"prompt": "hi", "max_tokens": 1}', headers=headers)

    r = _call(run_async, _server(llm), fn)
    assert "application/json" in _err(r, 415, "content-type")


def test_application_json_with_a_charset_is_taken(llm, run_async):
    async def fn(c):
        return await c.post("/v1/completions", content=b'{"prompt": "hi", "max_tokens": 1}',
                            headers={"content-type": "Application/JSON; charset=utf-8"})

    assert _call(run_async, _server(llm), fn).status_code == 200


# --- malformed bodies ------------------------------------------------------------------------
MALFORMED = [
    (b'{"a":' * 50_000 + b"1" + b"}" * 50_000, None, "deeper than 32"),
    (b"[" * 100_000 + b"]" * 100_000, None, "deeper than 32"),
    (b'{"prompt": "hi", "stop": ' + b"[" * 40 + b'"x"' + b"]" * 40 + b"}", "stop", "deeper than 32"),
    (b"[1, 2]", None, "JSON object"),
    (b'"hi"', None, "JSON object"),
    (b"{not json", None, "not valid JSON"),
    (b'{"prompt": "\xff\xfe"}', None, "not valid JSON"),
    (b'{"prompt": "a\\ud800b"}', "prompt", "lone surrogate"),
    (b'{"prompt": "hi", "stop": ["\\udfff"]}', "stop", "lone surrogate"),
    (b'{"prompt": "hi", "\\ud800": 1}', "\\ud800", "lone surrogate"),
    (b'{"prompt": "hi", "n": 1.0}', "n", "integer 1"),
    (b'{"prompt": "hi", "n": true}', "n", "integer 1"),
    (b'{"prompt": "hi", "n": "1"}', "n", "integer 1"),
    (b'{"prompt": "hi", "n": 2}', "n", "integer 1"),
    (b'{"prompt": "hi", "best_of": true}', "best_of", "integer 1"),
    (b'{"prompt": "hi", "model": ["tiny"]}', "model", "string"),
    (b'{"prompt": "hi", "temprature": 0.5}', "temprature", "did you mean 'temperature'"),
    (b'{"prompt": "hi", "logit_bias": {"5": 101}}', "logit_bias", "[-100, 100]"),
    (b'{"prompt": "hi", "logit_bias": {"5": true}}', "logit_bias", "[-100, 100]"),
    (b'{"prompt": "hi", "logit_bias": {"abc": 1}}', "logit_bias", "token ids"),
    (b'{"prompt": "hi", "logit_bias": {"' + b"9" * 5000 + b'": 1}}', "logit_bias", "token ids"),
    (b'{"prompt": "hi", "logit_bias": {"100000": 1}}', "logit_bias", "vocabulary [0, 320)"),
    (b'{"prompt": "hi", "logit_bias": [1, 2]}', "logit_bias", "object"),
    (b'{"prompt": "hi", "suffix": "end"}', "suffix", "not supported"),
    (b'{"prompt": "hi", "response_format": {"type": "json_object"}}', "response_format", "not supported"),
    (b'{"prompt": "hi", "max_tokens": true}', "max_tokens", "max_tokens"),
    (b'{"prompt": "hi", "seed": false}', "seed", "seed"),
    # every step looks for each stop string and stop id: a megabyte of them slowed others 25x
    (json.dumps({"prompt": "hi", "stop": [f"s{i}" for i in range(65)]}).encode(), "stop", "at most 64"),
    (json.dumps({"prompt": "hi", "stop": ["x" * 1025]}).encode(), "stop", "at most 1024 characters"),
    (json.dumps({"prompt": "hi", "stop_token_ids": list(range(1025))}).encode(), "stop_token_ids", "at most 1024"),
]


@pytest.mark.parametrize("body,param,needle", MALFORMED, ids=range(len(MALFORMED)))
def test_malformed_completion_bodies_are_400_naming_the_problem(llm, run_async, body, param, needle):
    async def fn(c):
        return await c.post("/v1/completions", content=body, headers=JSON)

    server = _server(llm)
    r = _call(run_async, server, fn)
    msg = _err(r, 400)
    assert needle in msg and r.json()["error"]["param"] == param, r.json()
    assert server.engine.steps == 0  # refused before the engine heard of it


CHAT_MALFORMED = [
    ({"messages": [{"role": "user", "content": "a\ud800"}]}, "messages", "lone surrogate"),
    ({"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, "tools", "not supported"),
    ({"messages": [{"role": "user", "content": "hi"}], "n": 1.0}, "n", "integer 1"),
    ({"messages": [{"role": "user", "content": "hi"}], "prompt": "x"}, "prompt", "unknown field"),
    ({"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": "5"}, "max_completion_tokens",
     "max_completion_tokens must be"),
]


@pytest.mark.parametrize("body,param,needle", CHAT_MALFORMED, ids=range(len(CHAT_MALFORMED)))
def test_malformed_chat_bodies_are_400(llm, run_async, body, param, needle):
    async def fn(c):
        return await c.post("/v1/chat/completions", content=json.dumps(body).encode(), headers=JSON)

    r = _call(run_async, _server(llm), fn)
    assert needle in _err(r, 400, param)


def test_null_unsupported_fields_and_user_are_taken(llm, run_async):
    async def fn(c):
        return await c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2, "n": 1, "best_of": None,
                                                     "response_format": None, "suffix": None, "user": "u-1"})

    r = _call(run_async, _server(llm), fn)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_a_template_refusal_is_400_with_the_template_s_message(llm, run_async):
    async def fn(c):
        return await c.post("/v1/chat/completions", json={"messages": [{"role": "system", "content": "x"}]})

    old = llm.tokenizer.chat_template
    llm.tokenizer.chat_template = "{{ raise_exception('system messages are not supported') }}"
    try:
        r = _call(run_async, _server(llm), fn)
    finally:
        llm.tokenizer.chat_template = old
    assert "system messages are not supported" in _err(r, 400, "messages")


def test_a_prompt_longer_than_the_context_is_400_naming_max_model_len(llm, run_async):
    async def fn(c):
        text = await c.post("/v1/completions", json={"prompt": "fox " * 2000})
        ids = await c.post("/v1/completions", json={"prompt": [5] * 5000})
        chat = await c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "fox " * 2000}]})
        return text, ids, chat

    server = _server(llm)
    text, ids, chat = _call(run_async, server, fn)
    for r, param in ((text, "prompt"), (ids, "prompt"), (chat, "messages")):
        assert f"max_model_len is {llm.max_model_len}" in _err(r, 400, param)
    assert server.engine.steps == 0


def test_an_error_message_never_echoes_a_megabyte(llm, run_async):
    async def fn(c):
        return await c.post("/v1/completions", json={"prompt": "hi", "stop": ["x" * 100_000, 5]})

    r = _call(run_async, _server(llm), fn)
    assert len(_err(r, 400, "stop")) < 1200


# --- Host header, docs, key ------------------------------------------------------------------
@pytest.mark.parametrize("header,name", [("localhost:8000", "localhost"), ("127.0.0.1", "127.0.0.1"),
                                         ("[::1]:80", "::1"), ("Example.COM.", "example.com"),
                                         ("", None), ("a b", None), ("[nothex]:1", None), ("x:y:z", None)])
def test_host_name(header, name):
    assert guards.host_name(header) == name


def test_default_allowed_hosts():
    assert set(guards.default_allowed_hosts("127.0.0.1")) == {"localhost", "127.0.0.1", "::1"}
    assert "127.0.0.2" in guards.default_allowed_hosts("127.0.0.2")
    assert guards.default_allowed_hosts("0.0.0.0") == ["*"]
    assert guards.is_loopback("::1") and not guards.is_loopback("10.0.0.1")


def test_a_foreign_host_header_is_400_dns_rebinding(llm, run_async):
    async def fn(c):
        out = {}
        for host in ("evil.example", "evil.example:8000", "127.0.0.1.nip.io", "localhost.evil.example",
                     "localhost", "127.0.0.1:8000", "[::1]:8000"):
            out[host] = (await c.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1},
                                      headers={"host": host})).status_code
        return out

    codes = _call(run_async, _server(llm), fn)
    assert codes == {"evil.example": 400, "evil.example:8000": 400, "127.0.0.1.nip.io": 400,
                     "localhost.evil.example": 400, "localhost": 200, "127.0.0.1:8000": 200, "[::1]:8000": 200}


def test_allowed_hosts_patterns(llm, run_async):
    async def fn(c):
        return [(await c.get("/health", headers={"host": h})).status_code
                for h in ("api.example.com", "example.com", "other.org", "127.0.0.1")]

    codes = _call(run_async, _server(llm, allowed_hosts=["*.example.com", "example.com"]), fn)
    assert codes == [200, 200, 400, 400]


def test_docs_and_schema_need_the_key_when_one_is_set(llm, run_async):
    async def fn(c):
        auth = {"Authorization": "Bearer k3y"}
        return ((await c.get("/openapi.json")).status_code, (await c.get("/openapi.json", headers=auth)).status_code,
                (await c.get("/docs", headers=auth)).status_code, (await c.get("/redoc")).status_code,
                (await c.post("/v1/completions", content=b"x" * 10_000_000, headers=JSON)).status_code)

    assert _call(run_async, _server(llm, api_key="k3y"), fn) == (401, 200, 404, 404, 401)

    async def open_fn(c):
        return (await c.get("/openapi.json")).status_code, (await c.get("/docs")).status_code

    assert _call(run_async, _server(llm), open_fn) == (200, 200)


# --- a huge prompt does not stall the engine -----------------------------------------------------
def test_a_huge_prompt_is_tokenised_off_the_engine_thread_while_others_step(llm, run_async, monkeypatch):
    """Request B decodes; request A sends a ~1 MB prompt. A's tokenisation is held until the
    engine has taken 3 more steps (for B): were it on the engine's thread, those steps could
    never come. Then A is refused (longer than max_model_len) and B finishes all its tokens."""
    server = _server(llm)
    engine = server.engine
    real_encode = llm.tokenizer.encode
    threads = []

    def encode(text, *args, **kwargs):
        threads.append(threading.current_thread().name)
        if len(text) > 100_000:
            start = engine.steps
            deadline = time.monotonic() + 300  # a failure bound, not a measurement
            while engine.steps < start + 3:
                assert time.monotonic() < deadline, "the engine took no step while a prompt was tokenised"
                time.sleep(0.005)
        return real_encode(text, *args, **kwargs)

    monkeypatch.setattr(llm.tokenizer, "encode", encode)

    async def fn(c):
        b = asyncio.ensure_future(c.post("/v1/completions", json={"prompt": "the fox", "max_tokens": 120,
                                                                  "temperature": 0, "ignore_eos": True}))
        while engine.snapshot()["running"] == 0:
            await asyncio.sleep(0.005)
        steps_before = engine.steps
        a = await c.post("/v1/completions", json={"prompt": "fox " * 250_000})
        return a, await b, steps_before

    a, b, steps_before = _call(run_async, server, fn)
    assert "max_model_len" in _err(a, 400, "prompt")
    assert b.status_code == 200 and b.json()["usage"]["completion_tokens"] == 120
    assert engine.steps >= steps_before + 3
    assert threads and "minillm-engine" not in threads, threads  # nothing was tokenised on the engine thread


def test_an_ordinary_request_is_not_queued_behind_a_huge_one(llm, run_async, monkeypatch):
    """A's ~200 KB prompt is held in its tokeniser until B (a small request, sent after A)
    has been answered: B must not wait in A's lane."""
    server = _server(llm)
    real_encode = llm.tokenizer.encode
    a_tokenising, b_answered = threading.Event(), threading.Event()

    def encode(text, *args, **kwargs):
        if len(text) > 100_000:
            a_tokenising.set()
            assert b_answered.wait(300), "the small request waited behind the huge one"  # a failure bound
        return real_encode(text, *args, **kwargs)

    monkeypatch.setattr(llm.tokenizer, "encode", encode)

    async def fn(c):
        a = asyncio.ensure_future(c.post("/v1/completions", json={"prompt": "fox " * 50_000}))
        while not a_tokenising.is_set() and not a.done():
            await asyncio.sleep(0.005)
        b = await c.post("/v1/completions", json={"prompt": "the fox", "max_tokens": 3})
        b_answered.set()
        return await a, b

    a, b = _call(run_async, server, fn)
    assert b.status_code == 200 and "max_model_len" in _err(a, 400, "prompt")


def test_prepare_prompt_does_not_take_the_engine_lock(llm):
    """``LLM.prepare_prompt`` runs while another thread holds the engine's lock (as a step does)."""
    got = []
    with llm._lock:
        t = threading.Thread(target=lambda: got.append(llm.prepare_prompt("the fox")))
        t.start()
        t.join(120)
    assert got and got[0] == llm.tokenizer.encode("the fox")
    assert llm.prepare_prompt(prompt_token_ids=[5, 6]) == [5, 6]
    assert llm.prepare_prompt(messages=[{"role": "user", "content": "hi"}])


@pytest.mark.parametrize("kwargs,needle", [({}, "exactly one"), ({"prompt": "a", "prompt_token_ids": [1]}, "exactly one"),
                                           ({"prompt": "a\ud800"}, "lone surrogate"),
                                           ({"messages": [{"role": "user", "content": "\udc00"}]}, "lone surrogate"),
                                           ({"prompt_token_ids": [10**9]}, "prompt_token_ids"),
                                           ({"prompt": "fox " * 2000}, "max_model_len")])
def test_prepare_prompt_refuses_with_value_errors(llm, kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        llm.prepare_prompt(**kwargs)


# --- the Python API: the same inputs are ValueErrors ---------------------------------------------
@pytest.mark.parametrize("template,needle", [("{{ raise_exception('no system role here') }}", "no system role here"),
                                             ("{{ ''.__class__.__mro__ }}", "SecurityError"),
                                             ("{% for x in %}", "TemplateSyntaxError")])
def test_a_template_error_is_a_value_error_naming_the_template(llm, template, needle):
    old = llm.tokenizer.chat_template
    llm.tokenizer.chat_template = template
    try:
        with pytest.raises(ValueError, match=needle) as info:
            llm.chat([{"role": "user", "content": "hi"}], SamplingParams(max_tokens=1))
    finally:
        llm.tokenizer.chat_template = old
    assert "chat template" in str(info.value)
    assert llm.cache_stats().used_blocks == 0


def test_a_lone_surrogate_is_a_value_error_in_the_python_api(llm):
    n = len(llm.requests)
    for call in (lambda: llm.generate(["fine", "bad \ud800"], SamplingParams(max_tokens=1)),
                 lambda: llm.add_request("bad \udfff", SamplingParams(max_tokens=1)),
                 lambda: llm.chat([{"role": "user", "content": "\ud83d"}], SamplingParams(max_tokens=1))):
        with pytest.raises(ValueError, match="lone surrogate"):
            call()
    assert len(llm.requests) == n and llm.cache_stats().used_blocks == 0  # nothing half-added


# --- slow clients, through real sockets ------------------------------------------------------------
@pytest.fixture(scope="module")
def slow_server():
    with ServerProcess(["--request-timeout", "2", "--max-body-bytes", "65536", "--max-num-seqs", "2"]) as srv:
        yield srv


def _connect(url: str) -> socket.socket:
    u = urlparse(url)
    assert u.hostname == "127.0.0.1"  # loopback only
    s = socket.create_connection((u.hostname, u.port), timeout=60)  # 60 s: a failure bound only
    return s


def _read_all(s: socket.socket) -> bytes:
    """Everything until the server closes the connection."""
    out = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return out
        out += chunk


def test_half_sent_headers_are_408_and_closed(slow_server):
    socks = [_connect(slow_server.url) for _ in range(20)]
    try:
        for i, s in enumerate(socks):
            if i % 2:  # half the headers; the other half of the clients send nothing at all
                s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: appl")
        answers = [_read_all(s) for s in socks]  # returns only once the server has closed each
    finally:
        for s in socks:
            s.close()
    assert all(a.startswith(b"HTTP/1.1 408 ") and b"--request-timeout" in a for a in answers), answers[:2]


def test_a_half_sent_body_is_408_and_closed(slow_server):
    with _connect(slow_server.url) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{\"prompt\": ")
        answer = _read_all(s)
    assert answer.startswith(b"HTTP/1.1 408 ") and b"did not arrive within 2 s" in answer, answer


def test_a_kept_alive_connection_is_timed_for_its_next_request_too(slow_server):
    body = b'{"prompt": "hi", "max_tokens": 1}'
    with _connect(slow_server.url) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        first = s.recv(65536)
        s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.")  # and nothing more
        rest = _read_all(s)
    assert first.startswith(b"HTTP/1.1 200 "), first
    assert b"HTTP/1.1 408 " in rest, rest


def test_a_lying_content_length_is_413_at_once_and_a_foreign_host_400(slow_server):
    with _connect(slow_server.url) as s:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 10000000000\r\n\r\n{")
        answer = _read_all(s)
    assert answer.startswith(b"HTTP/1.1 413 ") and b"--max-body-bytes is 65536" in answer, answer
    with httpx.Client(base_url=slow_server.url, trust_env=False, timeout=60) as c:
        assert c.get("/health", headers={"host": "attacker.example"}).status_code == 400
        assert c.get("/health").status_code == 200
        ok = c.post("/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 3})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("args,needle", [(["--max-body-bytes", "10"], "--max-body-bytes"),
                                         (["--request-timeout", "0"], "--request-timeout"),
                                         (["--limit-concurrency", "1"], "--limit-concurrency"),
                                         (["--allowed-hosts", " , "], "--allowed-hosts")])
def test_bad_hardening_options_are_clear_errors(args, needle, capsys):
    from minillm.apps.serve import serve

    assert serve(args) == 2  # refused before any model is loaded
    err = capsys.readouterr().err
    assert "minillm serve: error:" in err and needle in err, err


def test_hardening_options_reach_uvicorn():
    from minillm.apps.serve.server import allowed_hosts, build_parser, uvicorn_limits

    args = build_parser().parse_args(["--request-timeout", "7", "--limit-concurrency", "9"])
    limits = uvicorn_limits(args)
    assert limits["http"].request_timeout == 7.0 and limits["limit_concurrency"] == 9
    assert limits["timeout_keep_alive"] == 5 and limits["h11_max_incomplete_event_size"] == 16 * 1024
    assert set(allowed_hosts(args)) == {"localhost", "127.0.0.1", "::1"}
    wide = build_parser().parse_args(["--host", "0.0.0.0", "--allowed-hosts", "api.example.com, *.lan"])
    assert allowed_hosts(wide) == ["api.example.com", "*.lan"]
    assert allowed_hosts(build_parser().parse_args(["--host", "0.0.0.0"])) == ["*"]
    assert build_parser().parse_args([]).max_body_bytes == 1 << 20


@pytest.mark.parametrize("call,needle", [
    (lambda llm: llm.generate(123), "prompts must be a string or a list"),
    (lambda llm: llm.generate(None), "prompts must be a string or a list"),
    (lambda llm: llm.generate("x", params=5), "params must be a SamplingParams or a list"),
    (lambda llm: llm.generate("x", params={"max_tokens": 2}), "params must be a SamplingParams or a list"),
    (lambda llm: llm.next_token_logits(5), "prompt_token_ids"),
    (lambda llm: llm.next_token_logits("a\ud800"), "lone surrogate"),
    (lambda llm: llm.next_token_logits([10**9]), "prompt_token_ids"),
    (lambda llm: llm.next_token_logits("fox " * 2000), "max_model_len"),
], ids=range(8))
def test_the_python_api_refuses_with_value_errors_not_type_or_index_errors(llm, call, needle):
    with pytest.raises(ValueError, match=needle):
        call(llm)
    assert llm.cache_stats().used_blocks == 0


# --- logit_bias (vLLM's and OpenAI's meaning: added to the model's logits first) ---------------
def test_logit_bias_bans_and_forces_tokens_and_leaves_the_batch_alone(llm):
    greedy = SamplingParams(max_tokens=6, temperature=0, ignore_eos=True)
    base = llm.generate(["the fox", "a bird"], greedy)
    first = base[0].token_ids[0]
    banned, other = llm.generate(["the fox", "a bird"], [greedy.replace(logit_bias={first: -100}), greedy])
    assert first not in banned.token_ids and other.token_ids == base[1].token_ids
    forced = llm.generate(["the fox"], SamplingParams(max_tokens=6, temperature=1.0, seed=1, ignore_eos=True,
                                                      repetition_penalty=1.5, logit_bias={7: 100}))[0]
    assert forced.token_ids == [7] * 6  # +100 beats any logit, and the penalty on the repeats
    assert llm.cache_stats().used_blocks == 0


def test_the_batched_sampler_applies_logit_bias_like_the_reference(llm):
    from minillm.sampler import processed_logits

    logits = llm.next_token_logits("the fox")
    for bias in ({int(logits.argmax()): -100.0}, {3: 50.0, 9: -20.0}):
        params = SamplingParams(temperature=0, logit_bias=bias)
        out = llm.generate(["the fox"], params.replace(max_tokens=1))[0]
        assert out.token_ids[0] == int(processed_logits(logits, params).argmax())


@pytest.mark.parametrize("bias,needle", [({5: 100.5}, r"\[-100, 100\]"), ({5: float("inf")}, "logit_bias"),
                                         ({-1: 1}, "token ids"), ({"5": 1}, "token ids"), ({True: 1}, "token ids"),
                                         (5, "dict"), ([1, 2], "dict")])
def test_logit_bias_values_are_checked(bias, needle):
    with pytest.raises(ValueError, match=needle):
        SamplingParams(logit_bias=bias)


def test_logit_bias_ids_are_checked_against_the_vocabulary(llm):
    n = len(llm.requests)
    with pytest.raises(ValueError, match=r"logit_bias.*\[0, 320\)"):
        llm.add_request("the fox", SamplingParams(logit_bias={320: 1}))
    assert len(llm.requests) == n
    assert dict(SamplingParams(logit_bias={5: 1, 2: -3}).logit_bias) == {2: -3.0, 5: 1.0}


def test_logit_bias_over_http_matches_the_python_api(llm, run_async):
    body = {"prompt": "the fox", "max_tokens": 5, "temperature": 0, "ignore_eos": True,
            "logit_bias": {"7": 100, "9": -100}}

    async def fn(c):
        return await c.post("/v1/completions", json=body)

    r = _call(run_async, _server(llm), fn)
    assert r.status_code == 200, r.text
    want = llm.generate(["the fox"], SamplingParams(max_tokens=5, temperature=0, ignore_eos=True,
                                                    logit_bias={7: 100, 9: -100}))[0]
    assert r.json()["choices"][0]["text"] == want.text and want.token_ids == [7] * 5
