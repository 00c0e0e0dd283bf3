"""``minillm serve`` through real clients over 127.0.0.1: the official ``openai`` package,
``httpx`` (streaming, dropped streams, many at once), Prometheus text, signals.

Each server is a real ``minillm serve`` process on a free port of the loopback interface;
nothing here talks to any other address.
"""

from __future__ import annotations

import asyncio
import json
import time
from urllib.parse import urlparse

import httpx
import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("fastapi")

from minillm import LLM, SamplingParams  # noqa: E402
from minillm.apps.serve.launch import ServerProcess  # noqa: E402

MODEL = "stories-3m"
PROMPT = "Once upon a time"


def _client(url: str) -> httpx.Client:
    assert urlparse(url).hostname == "127.0.0.1", url  # loopback only
    return httpx.Client(base_url=url, trust_env=False, timeout=30)


@pytest.fixture(scope="module")
def server():
    with ServerProcess(["--max-num-seqs", "16"]) as srv:
        yield srv


@pytest.fixture(scope="module")
def http(server):
    with _client(server.url) as c:
        yield c


@pytest.fixture(scope="module")
def oai(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         http_client=httpx.Client(trust_env=False, timeout=30))


def _engine(http) -> dict:
    return http.get("/v1/engine/requests").json()


def _used_blocks(http) -> float:
    for line in http.get("/metrics").text.splitlines():
        if line.startswith("minillm_kv_cache_used_blocks "):
            return float(line.split()[1])
    raise AssertionError("/metrics has no minillm_kv_cache_used_blocks")


def _wait_idle(http, timeout=5.0) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        snap = _engine(http)
        if not snap["requests"] and snap["kv_cache"]["used_blocks"] == 0 or time.monotonic() > deadline:
            return snap
        time.sleep(0.02)


def test_health_models_and_binding(server, http):
    assert urlparse(server.url).hostname == "127.0.0.1"  # the default bind address
    assert http.get("/health").json() == {"status": "ok"}
    models = http.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == [MODEL]


def test_openai_client_completion_streaming_and_not(oai):
    full = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0)
    choice = full.choices[0]
    assert choice.finish_reason == "length" and choice.model_extra["minillm_stop_reason"] == "MAX_TOKENS"
    assert full.usage.completion_tokens == 24 and full.usage.prompt_tokens > 0
    assert full.usage.total_tokens == full.usage.prompt_tokens + 24
    pieces, reasons = [], []
    for chunk in oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=24, temperature=0, stream=True):
        pieces.append(chunk.choices[0].text)
        reasons.append(chunk.choices[0].finish_reason)
    assert "".join(pieces) == choice.text and len(pieces) > 3
    assert reasons[-1] == "length" and set(reasons[:-1]) == {None}


def test_openai_client_chat_streaming_and_not(oai):
    messages = [{"role": "user", "content": "Tell me about a cat."}]
    full = oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    msg = full.choices[0].message
    assert msg.role == "assistant" and msg.content
    text, roles, usage = "", [], None
    for chunk in oai.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0,
                                             stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text += c.delta.content or ""
            roles.append(c.delta.role)
    assert text == msg.content
    assert roles[0] == "assistant"
    assert usage.completion_tokens == full.usage.completion_tokens
    assert usage.prompt_tokens == full.usage.prompt_tokens


def test_greedy_text_equals_offline_generate(oai):
    prompts = [PROMPT, "One day, Mia went to the beach", "The little robot"]
    offline = LLM().generate(prompts, SamplingParams(max_tokens=40, temperature=0))
    for prompt, want in zip(prompts, offline):
        got = oai.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0)
        assert got.choices[0].text == want.text
        assert got.choices[0].model_extra["minillm_stop_reason"] == want.stop_reason.value


def test_seeded_sampling_and_vllm_extras(oai):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0.9, seed=11,
              extra_body={"top_k": 20, "min_p": 0.02, "repetition_penalty": 1.1})
    a = oai.completions.create(**kw).choices[0].text
    b = oai.completions.create(**kw).choices[0].text
    assert a == b  # the seed travels with the request through the service interface
    stopped = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=60, temperature=0, stop=[" was"])
    assert stopped.choices[0].finish_reason == "stop"
    assert stopped.choices[0].model_extra["minillm_stop_reason"] == "STOP_STRING"
    assert " was" not in stopped.choices[0].text


def test_logprobs_completion_and_chat(oai):
    out = oai.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=3)
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == 5 and len(lp.token_logprobs) == 5
    assert all(len(t) == 3 for t in lp.top_logprobs)
    assert "".join(lp.tokens) == out.choices[0].text
    chat = oai.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                       temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == 4 and all(len(c.top_logprobs) == 2 for c in content)
    assert all(c.logprob <= 0 for c in content)


@pytest.mark.parametrize("field,value", [("top_p", 0), ("temperature", -1), ("max_tokens", 0),
                                         ("top_k", -5), ("min_p", 2), ("repetition_penalty", 0),
                                         ("stop_token_ids", [-1])])
def test_bad_parameter_is_400_naming_it(http, field, value):
    r = http.post("/v1/completions", json={"prompt": PROMPT, field: value})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and field in err["message"]


def test_bad_requests_through_the_openai_client(oai, http):
    with pytest.raises(openai.BadRequestError) as info:
        oai.completions.create(model=MODEL, prompt=PROMPT, top_p=1.5)
    assert "top_p" in str(info.value)
    with pytest.raises(openai.NotFoundError):
        oai.completions.create(model="gpt-4", prompt=PROMPT)
    for body, param in [({"prompt": ""}, "prompt"), ({"prompt": PROMPT, "n": 2}, "n"),
                        ({"prompt": "word " * 2000}, "prompt"), ({"prompt": [5] * 5000}, "prompt")]:
        r = http.post("/v1/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "robot", "content": "x"}]})
    assert r.status_code == 400 and "role" in r.json()["error"]["message"]
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "word " * 2000}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages", r.text
    r = http.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert r.status_code == 400
    assert _wait_idle(http)["kv_cache"]["used_blocks"] == 0  # nothing rejected held a block


def test_dropped_stream_is_cancelled_and_frees_its_blocks(server, http):
    body = {"prompt": PROMPT, "max_tokens": 900, "temperature": 0, "ignore_eos": True, "stream": True}
    with http.stream("POST", "/v1/completions", json=body) as r:
        lines = r.iter_lines()
        first = json.loads(next(line for line in lines if line.startswith("data:"))[5:])
        rid = first["id"]
        for _ in range(5):
            next(lines)
        live = {row["id"]: row for row in _engine(http)["requests"]}
        assert live[rid]["state"] == "DECODE" and live[rid]["blocks"] > 0
        assert _used_blocks(http) >= live[rid]["blocks"]
    t0 = time.monotonic()  # the connection is closed here, mid-stream
    while time.monotonic() - t0 < 1.0:
        snap = _engine(http)
        if rid not in {row["id"] for row in snap["requests"]} and snap["kv_cache"]["used_blocks"] == 0:
            break
        time.sleep(0.01)
    else:
        raise AssertionError(f"the dropped stream still holds blocks after 1 s: {snap}")
    assert _used_blocks(http) == 0
    metrics = http.get("/metrics").text
    assert 'minillm_requests_finished_total{stop_reason="CANCELLED"} 1.0' in metrics
    time.sleep(0.2)  # the log line is written by the engine thread
    line = next(ln for ln in server.log().splitlines() if f"{rid} client disconnected: cancelled in the engine" in ln)
    late = int(line.split(" step(s) after it was asked for")[0].rsplit(" ", 1)[1])
    assert late <= 1, line  # the cancel lands at the next step boundary


async def _one_stream(client, i):
    body = {"prompt": f"Story number {i}: once upon a time", "max_tokens": 20 + i, "temperature": 0.8,
            "seed": i, "stream": True}
    text, reason, done = "", None, False
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data:"):
                c = json.loads(line[5:])["choices"][0]
                text += c["text"]
                reason = c["finish_reason"] or reason
    return text, reason, done


def test_sixteen_concurrent_streams_all_finish_and_leave_no_block(server, http, run_async):
    async def run():
        async with httpx.AsyncClient(base_url=server.url, trust_env=False, timeout=60) as client:
            return await asyncio.gather(*(_one_stream(client, i) for i in range(16)))

    results = run_async(run())
    assert all(done and reason in ("stop", "length") and text for text, reason, done in results), results
    snap = _wait_idle(http)
    assert snap["requests"] == [] and snap["kv_cache"]["used_blocks"] == 0 and _used_blocks(http) == 0


def test_metrics_names(http):
    text = http.get("/metrics").text
    for name in ("minillm_kv_cache_used_blocks", "minillm_kv_cache_total_blocks", "minillm_requests_running",
                 "minillm_requests_waiting", "minillm_requests_finished_total",
                 "minillm_time_to_first_token_seconds_bucket", "minillm_time_per_output_token_seconds_bucket",
                 "minillm_request_queue_time_seconds_bucket", "minillm_generation_tokens_total"):
        assert f"\n{name}" in text, name
    assert 'minillm_requests_finished_total{stop_reason="MAX_TOKENS"}' in text


@pytest.fixture(scope="module")
def small_server():
    """One batch slot, one waiting place, an API key from the environment."""
    with ServerProcess(["--max-num-seqs", "1", "--max-waiting", "1"], env={"MINILLM_API_KEY": "sekret"}) as srv:
        yield srv


def test_api_key_is_required_on_v1(small_server):
    with _client(small_server.url) as c:
        assert c.get("/health").status_code == 200
        r = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2})
        assert r.status_code == 401
        assert c.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        ok = c.post("/v1/completions", json={"prompt": PROMPT, "max_tokens": 2},
                    headers={"Authorization": "Bearer sekret"})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_queue_limit_gives_503_with_retry_after(small_server, run_async):
    """One batch slot and one waiting place: of six streams opened at once, the ones beyond
    the running one and the waiting one are refused with 503, never queued."""
    auth = {"Authorization": "Bearer sekret"}
    body = {"prompt": PROMPT, "max_tokens": 900, "temperature": 0, "ignore_eos": True, "stream": True}

    async def burst():
        async with httpx.AsyncClient(base_url=small_server.url, trust_env=False, timeout=60, headers=auth) as c:
            opened = await asyncio.gather(*(c.send(c.build_request("POST", "/v1/completions", json=body),
                                                   stream=True) for _ in range(6)))
            try:
                snap = (await c.get("/v1/engine/requests")).json()
                refused = [r for r in opened if r.status_code == 503]
                for r in refused:
                    await r.aread()
                return ([r.status_code for r in opened], snap, [(r.headers.get("retry-after"), r.json())
                                                                 for r in refused])
            finally:
                for r in opened:
                    await r.aclose()

    codes, snap, refused = run_async(burst())
    assert set(codes) <= {200, 503} and codes.count(503) >= 1, codes
    assert snap["waiting"] <= 1 and snap["running"] <= 1, snap  # the bound held
    for retry_after, err in refused:
        assert retry_after == "1" and "max-waiting" in err["error"]["message"]
    with _client(small_server.url) as c:
        c.headers.update(auth)
        rejected = [ln for ln in c.get("/metrics").text.splitlines() if ln.startswith("minillm_requests_rejected_total ")]
        assert float(rejected[0].split()[1]) == codes.count(503)
        assert _wait_idle(c)["kv_cache"]["used_blocks"] == 0


@pytest.mark.parametrize("sig", ["SIGTERM", "SIGINT"])
def test_a_signal_cancels_live_streams_and_exits_0(sig):
    import signal

    srv = ServerProcess(["--max-num-seqs", "4"]).start()
    try:
        body = {"prompt": PROMPT, "max_tokens": 900, "temperature": 0, "ignore_eos": True, "stream": True}
        with _client(srv.url) as c, c.stream("POST", "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            next(lines)
            srv.proc.send_signal(getattr(signal, sig))  # while the stream is live (SIGINT = Ctrl-C)
            reasons = [json.loads(line[5:])["choices"][0]["finish_reason"] for line in lines
                       if line.startswith("data:") and line != "data: [DONE]"]
        assert reasons[-1] == "abort"
        assert srv.stop() == 0
    finally:
        srv.stop()
    assert "stopped cleanly" in srv.stdout_tail and "KV used 0/" in srv.stdout_tail
    assert "server shutting down: cancelled in the engine" in srv.log()


def test_streamed_text_with_a_stop_string_equals_the_non_streamed_text(oai):
    kw = dict(model=MODEL, prompt=PROMPT, max_tokens=60, temperature=0, stop=[" named"])
    full = oai.completions.create(**kw).choices[0]
    streamed = "".join(c.choices[0].text for c in oai.completions.create(stream=True, **kw))
    assert full.finish_reason == "stop" and streamed == full.text and " named" not in streamed
    kept = oai.completions.create(extra_body={"include_stop_str_in_output": True}, **kw).choices[0].text
    assert kept == full.text + " named"  # vLLM's field, passed through to the engine


def test_a_client_that_leaves_a_non_streaming_request_cancels_it(server, http):
    body = {"prompt": PROMPT, "max_tokens": 900, "temperature": 0, "ignore_eos": True}
    with httpx.Client(base_url=server.url, trust_env=False, timeout=0.3) as impatient:
        with pytest.raises(httpx.ReadTimeout):
            impatient.post("/v1/completions", json=body)  # the client gives up and closes the socket
    snap = _wait_idle(http, timeout=2.0)
    assert snap["requests"] == [] and snap["kv_cache"]["used_blocks"] == 0
    time.sleep(0.2)
    assert "client disconnected: cancelled in the engine" in server.log()


def test_server_engine_limits_are_passed_when_the_engine_has_them():
    from minillm.apps.serve.server import SERVER_ENGINE_LIMITS, engine_limits

    assert engine_limits(LLM) == {k: v for k, v in SERVER_ENGINE_LIMITS.items()
                                  if k in __import__("inspect").signature(LLM).parameters}

    class Old:
        def __init__(self, model=None, *, max_num_seqs=1):
            pass

    assert engine_limits(Old) == {}


def test_decode_graphs_flag():
    from minillm.apps.serve.server import build_parser

    assert build_parser().parse_args(["--decode-graphs"]).decode_graphs is True
    assert build_parser().parse_args([]).decode_graphs is False


@pytest.mark.parametrize("args,needle", [(["--port", "70000"], "--port"), (["--max-waiting", "0"], "--max-waiting"),
                                         (["--max-num-seqs", "0"], "max_num_seqs"),
                                         (["/no/such/model/folder"], "no/such")])
def test_bad_command_line_is_a_clear_error(args, needle):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "minillm.apps.serve", *args], capture_output=True, text=True, timeout=120,
                       env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert "minillm serve: error:" in r.stderr and needle in r.stderr
