"""``GET /metrics``: the engine's state in Prometheus text format.

Names follow vLLM's server where one exists (its name in brackets), with the ``minillm_``
prefix instead of ``vllm:``:

* ``minillm_kv_cache_used_blocks`` / ``minillm_kv_cache_total_blocks`` and
  ``minillm_kv_cache_usage_ratio`` (``vllm:kv_cache_usage_perc``, a 0-1 fraction there too);
* ``minillm_requests_running`` (``vllm:num_requests_running``), ``minillm_requests_waiting``
  (``vllm:num_requests_waiting``: queued, preempted, or not yet seen by the engine);
* ``minillm_requests_finished_total{stop_reason}`` (``vllm:request_success_total{finished_reason}``),
  ``minillm_requests_rejected_total`` (503 because the waiting queue was full);
* ``minillm_prompt_tokens_total`` / ``minillm_generation_tokens_total`` (same names in vLLM);
* histograms ``minillm_time_to_first_token_seconds``, ``minillm_time_per_output_token_seconds``
  (``vllm:inter_token_latency_seconds``, formerly ``vllm:time_per_output_token_seconds``),
  ``minillm_request_queue_time_seconds``, ``minillm_e2e_request_latency_seconds`` (same in vLLM).

Each server has its own registry, so several servers (tests, notebooks) never share counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import CONTENT_TYPE_LATEST  # noqa: F401  (re-exported for app.py)

from minillm import StopReason

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_TOKEN_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class ServerMetrics:
    """The ``EngineLoop`` observer: gauges after every step, counters and histograms per request."""

    def __init__(self, model_name: str):
        self.registry = CollectorRegistry()
        r, label = self.registry, {"model_name": model_name}
        self.kv_used = Gauge("minillm_kv_cache_used_blocks", "KV blocks held by requests", registry=r)
        self.kv_total = Gauge("minillm_kv_cache_total_blocks", "KV blocks in the pool", registry=r)
        self.kv_usage = Gauge("minillm_kv_cache_usage_ratio", "used / total KV blocks (0-1)", registry=r)
        self.running = Gauge("minillm_requests_running", "requests in PREFILL or DECODE", registry=r)
        self.waiting = Gauge("minillm_requests_waiting", "requests waiting for a batch slot", registry=r)
        self.steps = Counter("minillm_engine_steps", "engine steps run", registry=r)
        self.finished = Counter("minillm_requests_finished", "requests finished, by stop reason",
                                ["stop_reason"], registry=r)
        for reason in StopReason:  # every reason is listed from the start, at 0
            self.finished.labels(reason.value)
        self.rejected = Counter("minillm_requests_rejected", "requests refused with 503 (queue full)", registry=r)
        self.prompt_tokens = Counter("minillm_prompt_tokens", "prompt tokens of finished requests", registry=r)
        self.generation_tokens = Counter("minillm_generation_tokens", "output tokens of finished requests",
                                         registry=r)
        self.ttft = Histogram("minillm_time_to_first_token_seconds", "enqueued -> first token",
                              buckets=_LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("minillm_time_per_output_token_seconds", "mean gap between later tokens",
                              buckets=_TOKEN_BUCKETS, registry=r)
        self.queue_time = Histogram("minillm_request_queue_time_seconds", "enqueued -> first scheduled",
                                    buckets=_LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("minillm_e2e_request_latency_seconds", "enqueued -> finished",
                             buckets=_LATENCY_BUCKETS, registry=r)
        info = Gauge("minillm_model_info", "the model being served", list(label), registry=r)
        info.labels(**label).set(1)
        self._last_steps = 0

    # --- EngineLoop observer hooks (called from the engine thread; prometheus_client is thread-safe)
    def on_step(self, snap: dict) -> None:
        kv = snap["kv_cache"]
        self.kv_used.set(kv["used_blocks"])
        self.kv_total.set(kv["total_blocks"])
        self.kv_usage.set(kv["usage"])
        self.running.set(snap["running"])
        self.waiting.set(snap["waiting"])
        if snap["steps"] > self._last_steps:
            self.steps.inc(snap["steps"] - self._last_steps)
            self._last_steps = snap["steps"]

    def on_finish(self, req, stop_reason, timings: dict) -> None:
        self.finished.labels(stop_reason.value).inc()
        self.prompt_tokens.inc(timings["prompt_tokens"])
        self.generation_tokens.inc(timings["output_tokens"])
        for hist, key in ((self.ttft, "ttft"), (self.tpot, "tpot"), (self.queue_time, "queue_time"),
                          (self.e2e, "e2e")):
            if timings[key] is not None:
                hist.observe(timings[key])

    def on_reject(self) -> None:
        self.rejected.inc()

    def render(self, waiting_now: int | None = None) -> bytes:
        """The text exposition; ``waiting_now`` includes requests not yet seen by the engine."""
        if waiting_now is not None:
            self.waiting.set(waiting_now)
        return generate_latest(self.registry)
