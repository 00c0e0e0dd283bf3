"""``minillm serve``: build the engine, its loop and the routes, and run them under uvicorn.

Shutdown on SIGTERM or Ctrl-C is graceful and ends with exit code 0: stop accepting, cancel
every live request in the engine (open streams end with ``finish_reason: "abort"``), wait for
the engine thread, check that no KV block is still held.
"""

from __future__ import annotations

import argparse
import inspect
import logging
import os
import signal
import sys
import threading
import time
from contextlib import contextmanager

import uvicorn

log = logging.getLogger("minillm.apps.serve")

DEFAULT_MAX_BODY_BYTES = 1 << 20  # the same as app.DEFAULT_MAX_BODY_BYTES (not imported: fastapi loads late)
DEFAULT_REQUEST_TIMEOUT = 30.0
DEFAULT_LIMIT_CONCURRENCY = 256

# A long-running server must not grow without bound: small limits for the engine's history,
# passed only where this engine version has them.
SERVER_ENGINE_LIMITS = {"max_history": 256, "trace_limit": 20_000}


def process_start_monotonic() -> float:
    """When this process started, on the ``time.monotonic`` clock (Linux: from /proc, so the
    ready line counts the interpreter and torch imports too; elsewhere: now)."""
    try:
        ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        since_boot = float(open("/proc/uptime").read().split()[0])
        age = since_boot - ticks / os.sysconf("SC_CLK_TCK")
        return time.monotonic() - max(age, 0.0)
    except (OSError, ValueError, IndexError):
        return time.monotonic()


def engine_limits(llm_class) -> dict:
    params = inspect.signature(llm_class).parameters
    return {k: v for k, v in SERVER_ENGINE_LIMITS.items() if k in params}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minillm serve",
                                description="Serve a model over an OpenAI-compatible HTTP API.")
    p.add_argument("model", nargs="?", default=None, help="local Hugging Face folder (default: the shipped model)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port; 0 picks a free one (default 8000)")
    p.add_argument("--api-key", default=None,
                   help="require 'Authorization: Bearer KEY' on /v1 routes (default: $MINILLM_API_KEY)")
    p.add_argument("--served-model-name", default=None, help="the model id clients send (default: folder name)")
    p.add_argument("--max-waiting", type=int, default=64,
                   help="most requests queued for a batch slot; beyond it HTTP 503 (default 64)")
    p.add_argument("--max-num-seqs", type=int, default=16, help="most requests running at once (default 16)")
    p.add_argument("--max-model-len", type=int, default=None, help="longest context (default: the model's)")
    p.add_argument("--kv-cache-tokens", type=int, default=None, help="KV budget in tokens (default: the engine's)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16)")
    p.add_argument("--decode-graphs", action="store_true",
                   help="run decode-only steps as fixed-shape graphs (LLM(decode_graphs=True): CUDA graphs on "
                        "CUDA, inductor on the CPU for batches up to 4), made before serving")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--seed", type=int, default=0, help="seeds requests that bring no seed of their own")
    p.add_argument("--allowed-hosts", default=None,
                   help="comma-separated Host header names answered ('*' = any, '*.example.com' = its "
                        "subdomains); default: the loopback names when bound to loopback, else any")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help=f"largest request body; beyond it HTTP 413 (default {DEFAULT_MAX_BODY_BYTES}: 1 MiB)")
    p.add_argument("--request-timeout", type=float, default=DEFAULT_REQUEST_TIMEOUT,
                   help="seconds a client has to send a request's headers, and again its body; "
                        f"beyond it HTTP 408 and the connection is closed (default {DEFAULT_REQUEST_TIMEOUT:g})")
    p.add_argument("--limit-concurrency", type=int, default=DEFAULT_LIMIT_CONCURRENCY,
                   help="most open connections; requests beyond it get HTTP 503 "
                        f"(default {DEFAULT_LIMIT_CONCURRENCY})")
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def _check_args(args) -> None:
    if not 0 <= args.port <= 65535:
        raise ValueError(f"--port must be an int in [0, 65535], got {args.port}")
    if args.max_waiting < 1:
        raise ValueError(f"--max-waiting must be an int >= 1, got {args.max_waiting}")
    if args.max_body_bytes < 1024:
        raise ValueError(f"--max-body-bytes must be an int >= 1024, got {args.max_body_bytes}")
    if not 0 < args.request_timeout <= 3600:
        raise ValueError(f"--request-timeout must be seconds in (0, 3600], got {args.request_timeout:g}")
    if args.limit_concurrency < 2:
        raise ValueError(f"--limit-concurrency must be an int >= 2, got {args.limit_concurrency}")


def allowed_hosts(args) -> list[str]:
    """The Host names to answer: ``--allowed-hosts``, else the loopback names when bound to
    loopback (a DNS-rebinding page then gets 400), else any."""
    from .guards import default_allowed_hosts

    if args.allowed_hosts is None:
        return default_allowed_hosts(args.host)
    hosts = [h.strip() for h in args.allowed_hosts.split(",") if h.strip()]
    if not hosts:
        raise ValueError("--allowed-hosts must name at least one host (or '*')")
    return hosts


def uvicorn_limits(args) -> dict:
    """uvicorn's own limits, set on purpose rather than left to its defaults: the h11 protocol
    with a header deadline, idle keep-alive connections closed after 5 s, at most
    ``--limit-concurrency`` connections, headers of at most 16 KiB."""
    from .slow_clients import with_deadline

    return {"http": with_deadline(args.request_timeout), "timeout_keep_alive": 5,
            "limit_concurrency": args.limit_concurrency, "h11_max_incomplete_event_size": 16 * 1024}


class GracefulServer(uvicorn.Server):
    """uvicorn's Server with two changes: a signal first tells the engine loop to cancel live
    requests (so open streams end and their connections can close), and a clean shutdown
    exits 0 instead of re-raising the signal."""

    def __init__(self, config, engine, t_start: float | None = None):
        super().__init__(config)
        self.engine = engine
        self.t_start = time.monotonic() if t_start is None else t_start

    def handle_exit(self, sig, frame):
        if not self.should_exit:
            log.info("received %s: no new requests; cancelling live ones", signal.Signals(sig).name)
        self.engine.begin_shutdown()
        super().handle_exit(sig, frame)

    @contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        old = {s: signal.signal(s, self.handle_exit) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            yield
        finally:
            for s, h in old.items():
                signal.signal(s, h)

    async def startup(self, sockets=None):
        await super().startup(sockets)
        if self.should_exit or not self.servers:
            return
        host, port = self.servers[0].sockets[0].getsockname()[:2]
        print(f"minillm serve: ready at http://{host}:{port} in {time.monotonic() - self.t_start:.1f} s "
              f"(Ctrl-C to stop)", flush=True)


def serve(argv: list[str] | None = None, server_class=None) -> int:
    """Run the server until SIGTERM / Ctrl-C. ``server_class`` replaces ``OpenAIServer`` (the
    course uses this to show a server that does not cancel on disconnect)."""
    t_start = process_start_monotonic()
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    try:
        _check_args(args)
        hosts = allowed_hosts(args)
        from minillm import LLM

        from .app import OpenAIServer
        from .engine_loop import EngineLoop
        from .metrics import ServerMetrics

        kwargs = dict(device=args.device, dtype=args.dtype, block_size=args.block_size,
                      max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                      kv_cache_tokens=args.kv_cache_tokens, seed=args.seed)
        if args.decode_graphs:
            kwargs["decode_graphs"] = True
        llm = LLM(args.model, **kwargs, **engine_limits(LLM))
        if args.decode_graphs:  # before the first request, not in it
            print(f"minillm serve: making decode graphs ({llm.runner.graphs.mode}) ...", flush=True)
            llm.warmup()
    except (ValueError, FileNotFoundError) as exc:
        print(f"minillm serve: error: {exc}", file=sys.stderr)
        return 2
    name = args.served_model_name or llm.model_path.name
    metrics = ServerMetrics(name)
    engine = EngineLoop(llm, max_waiting=args.max_waiting, observer=metrics)
    server_class = server_class or OpenAIServer
    api_key = args.api_key or os.environ.get("MINILLM_API_KEY") or None
    app = server_class(engine, name, api_key=api_key, metrics=metrics, max_body_bytes=args.max_body_bytes,
                       request_timeout=args.request_timeout, allowed_hosts=hosts).build_app()
    from .guards import is_loopback

    if not is_loopback(args.host):
        if api_key is None:
            log.warning("listening on %s without an API key: anyone who can reach it can use it", args.host)
        if "*" in hosts:
            log.warning("listening on %s for any Host header: name the hosts clients use with --allowed-hosts",
                        args.host)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                            timeout_graceful_shutdown=5, lifespan="on", access_log=args.log_level == "debug",
                            **uvicorn_limits(args))
    server = GracefulServer(config, engine, t_start)
    server.run()
    snap = engine.snapshot()
    used = snap["kv_cache"]["used_blocks"]
    if engine.alive or used:
        print(f"minillm serve: unclean shutdown: engine thread alive={engine.alive}, "
              f"{used} KV blocks still held", file=sys.stderr)
        return 1
    print(f"minillm serve: stopped cleanly after {snap['steps']} engine steps; KV used 0/"
          f"{snap['kv_cache']['total_blocks']} blocks", flush=True)
    return 0
