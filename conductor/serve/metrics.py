"""Prometheus metrics of one server (prometheus_client, its own registry): requests, latency, the server's own
time (overhead), worker calls, dollars, tokens, errors by type, lake rows. Served as text on ``GET /metrics``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conductor.serve.engine import Outcome

# the server's own time per request (conductor/serve/timing.py): tenths of a millisecond to 100 ms
_OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025,
                     0.05, 0.1)
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Metrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        r = self.registry = CollectorRegistry()
        self.requests = Counter("conductor_serve_requests", "HTTP requests answered",
                                ["endpoint", "status"], registry=r)
        self.latency = Histogram("conductor_serve_request_seconds", "Request latency (received to answered)",
                                 ["endpoint"], buckets=_BUCKETS, registry=r)
        self.workflow = Histogram("conductor_serve_workflow_seconds", "Conductor + workflow execution per request",
                                  ["model"], buckets=_BUCKETS, registry=r)
        self.overhead = Histogram("conductor_serve_overhead_seconds", "The server's own time per request: total "
                                  "minus the time spent waiting on workers and the conductor model", ["endpoint"],
                                  buckets=_OVERHEAD_BUCKETS, registry=r)
        self.in_flight = Gauge("conductor_serve_in_flight", "Requests being answered", registry=r)
        self.worker_calls = Counter("conductor_serve_worker_calls", "Worker calls made for served requests",
                                    ["worker", "cache_hit"], registry=r)
        self.worker_errors = Counter("conductor_serve_worker_errors", "Worker calls that failed, by kind",
                                     ["worker", "kind"], registry=r)
        self.dollars = Counter("conductor_serve_dollars", "Dollars spent on worker calls", ["worker"], registry=r)
        self.tokens = Counter("conductor_serve_tokens", "Orchestration tokens", ["direction"], registry=r)
        self.errors = Counter("conductor_serve_errors", "Requests refused or failed, by error type and code",
                              ["type", "code"], registry=r)
        self.steps = Histogram("conductor_serve_workflow_steps", "Steps per served workflow", registry=r,
                               buckets=(0, 1, 2, 3, 4, 5, 6, 8, 10, 15))
        self.champion_reloads = Gauge("conductor_serve_champion_reloads", "Champion changes picked up", registry=r)
        self.lake_rows = Gauge("conductor_serve_lake_rows_written", "Served trajectories written to the lake",
                               registry=r)
        self.lake_errors = Gauge("conductor_serve_lake_write_errors", "Lake shard writes that failed (retried)",
                                 registry=r)
        self.lake_rows_lost = Gauge("conductor_serve_lake_rows_lost", "Served trajectories never written "
                                    "(the retry queue was full)", registry=r)

        self._children: dict[tuple[object, tuple[str, ...]], Any] = {}

    def child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, looked up once: prometheus_client validates and locks on every
        ``labels`` call, and a request touches a dozen series."""
        key = (metric, labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = metric.labels(*labels)
        return found

    def observe_overhead(self, endpoint: str, seconds: float) -> None:
        self.child(self.overhead, endpoint).observe(seconds)

    def outcome(self, out: Outcome) -> None:
        child = self.child
        child(self.workflow, out.model.model_id).observe(out.seconds)
        for t in out.trajectories:
            self.steps.observe(sum(1 for c in t.calls if c.depth == 0))
            tokens_in = tokens_out = 0
            for c in t.calls:
                child(self.worker_calls, c.worker, "true" if c.cache_hit else "false").inc()
                if c.error_kind:
                    child(self.worker_errors, c.worker, c.error_kind).inc()
                if c.cost_usd:
                    child(self.dollars, c.worker).inc(c.cost_usd)
                tokens_in += c.input_tokens
                tokens_out += c.output_tokens
            child(self.tokens, "input").inc(tokens_in)
            child(self.tokens, "output").inc(tokens_out)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
