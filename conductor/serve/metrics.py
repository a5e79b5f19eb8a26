"""Prometheus metrics of one server (prometheus_client, its own registry): requests, latency, worker calls,
dollars, tokens, errors by type, lake rows. Served as text on ``GET /metrics``."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from conductor.serve.engine import Outcome

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

    def outcome(self, out: Outcome) -> None:
        self.workflow.labels(out.model.model_id).observe(out.seconds)
        for t in out.trajectories:
            self.steps.observe(sum(1 for c in t.calls if c.depth == 0))
            for c in t.calls:
                self.worker_calls.labels(c.worker, "true" if c.cache_hit else "false").inc()
                if c.error_kind:
                    self.worker_errors.labels(c.worker, c.error_kind).inc()
                if c.cost_usd:
                    self.dollars.labels(c.worker).inc(c.cost_usd)
            self.tokens.labels("input").inc(t.input_tokens)
            self.tokens.labels("output").inc(t.output_tokens)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
