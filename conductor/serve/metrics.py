"""Prometheus metrics of one server (prometheus_client, its own registry): requests, latency, the server's own
time (overhead), worker calls, dollars, tokens, errors by type, lake rows. Served as text on ``GET /metrics``.

WHY the per-request series are tallied in plain Python and turned into Prometheus families only when scraped
(prometheus_client's custom-collector API): a request touches a dozen series, and prometheus_client takes a lock
and walks the buckets on every update, which cost about 3% of a request's CPU (docs/serving.md, "Seventh look").
Every update runs on the server's event loop, as does the scrape, so the tallies need no lock. The text is the same
families, names and labels as prometheus_client's own ``Counter`` and ``Histogram`` (without their ``_created``
series).
"""

from __future__ import annotations

import math
from bisect import bisect_left
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.metrics_core import Metric

    from conductor.serve.engine import Outcome

# the server's own time per request (conductor/serve/timing.py): tenths of a millisecond to 100 ms
_OVERHEAD_BUCKETS = (0.0001, 0.00025, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025,
                     0.05, 0.1)
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class Counter:
    """A labelled counter: a value per label tuple.

    >>> c = Counter("x", "doc", ("a",)); c.inc(("1",)); c.inc(("1",), 2.5)
    >>> [(s.name, s.labels, s.value) for s in c.family().samples]
    [('x_total', {'a': '1'}, 3.5)]
    """

    def __init__(self, name: str, doc: str, labelnames: tuple[str, ...] = ()):
        self.name, self.doc, self.labelnames = name, doc, labelnames
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, labels: tuple[str, ...], amount: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def family(self) -> Metric:
        from prometheus_client.core import CounterMetricFamily

        f = CounterMetricFamily(self.name, self.doc, labels=self.labelnames)
        for labels, value in self.values.items():
            f.add_metric(labels, value)
        return f


class Histogram:
    """A labelled histogram: per label tuple, a count per bucket (``le`` semantics: the first bound at or above the
    value; the last bucket is +Inf) and the sum. A histogram without labels shows its empty series from the start.

    >>> h = Histogram("t", "doc", (), (0.1, 1.0)); h.observe((), 0.1); h.observe((), 0.5); h.observe((), 7.0)
    >>> [(s.name, s.labels.get("le"), s.value) for s in h.family().samples]   # doctest: +NORMALIZE_WHITESPACE
    [('t_bucket', '0.1', 1.0), ('t_bucket', '1.0', 2.0), ('t_bucket', '+Inf', 3.0), ('t_count', None, 3.0),
     ('t_sum', None, 7.6)]
    """

    def __init__(self, name: str, doc: str, labelnames: tuple[str, ...], bounds: tuple[float, ...]):
        from prometheus_client.utils import floatToGoString

        self.name, self.doc, self.labelnames, self.bounds = name, doc, labelnames, bounds
        self.les = [floatToGoString(b) for b in (*bounds, math.inf)]
        self.series: dict[tuple[str, ...], list[float]] = {}    # labels -> [count per bucket..., sum]
        if not labelnames:
            self.series[()] = [0] * len(self.les) + [0.0]

    def observe(self, labels: tuple[str, ...], value: float) -> None:
        s = self.series.get(labels)
        if s is None:
            s = self.series[labels] = [0] * len(self.les) + [0.0]
        s[bisect_left(self.bounds, value)] += 1
        s[-1] += value

    def family(self) -> Metric:
        from prometheus_client.core import HistogramMetricFamily

        f = HistogramMetricFamily(self.name, self.doc, labels=self.labelnames)
        for labels, s in self.series.items():
            total, buckets = 0.0, []
            for le, n in zip(self.les, s):
                total += n
                buckets.append((le, total))
            f.add_metric(labels, buckets, sum_value=s[-1])
        return f


class Gauge:
    """A value without labels, moved by ``inc`` and ``dec`` (requests in flight)."""

    def __init__(self, name: str, doc: str):
        self.name, self.doc, self.value = name, doc, 0.0

    def inc(self) -> None:
        self.value += 1

    def dec(self) -> None:
        self.value -= 1

    def family(self) -> Metric:
        from prometheus_client.core import GaugeMetricFamily

        return GaugeMetricFamily(self.name, self.doc, value=self.value)


class Metrics:
    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry
        from prometheus_client import Gauge as SetGauge

        self.requests = Counter("conductor_serve_requests", "HTTP requests answered", ("endpoint", "status"))
        self.latency = Histogram("conductor_serve_request_seconds", "Request latency (received to answered)",
                                 ("endpoint",), _BUCKETS)
        self.workflow = Histogram("conductor_serve_workflow_seconds", "Conductor + workflow execution per request",
                                  ("model",), _BUCKETS)
        self.overhead = Histogram("conductor_serve_overhead_seconds", "The server's own time per request: total "
                                  "minus the time spent waiting on workers and the conductor model", ("endpoint",),
                                  _OVERHEAD_BUCKETS)
        self.in_flight = Gauge("conductor_serve_in_flight", "Requests being answered")
        self.worker_calls = Counter("conductor_serve_worker_calls", "Worker calls made for served requests",
                                    ("worker", "cache_hit"))
        self.worker_errors = Counter("conductor_serve_worker_errors", "Worker calls that failed, by kind",
                                     ("worker", "kind"))
        self.dollars = Counter("conductor_serve_dollars", "Dollars spent on worker calls", ("worker",))
        self.tokens = Counter("conductor_serve_tokens", "Orchestration tokens", ("direction",))
        self.errors = Counter("conductor_serve_errors", "Requests refused or failed, by error type and code",
                              ("type", "code"))
        self.steps = Histogram("conductor_serve_workflow_steps", "Steps per served workflow", (),
                               (0, 1, 2, 3, 4, 5, 6, 8, 10, 15))
        self._tallied = (self.requests, self.latency, self.workflow, self.overhead, self.in_flight, self.worker_calls,
                         self.worker_errors, self.dollars, self.tokens, self.errors, self.steps)

        r = self.registry = CollectorRegistry()
        r.register(self)     # ``collect`` below: the tallies as families, at each scrape
        # set when scraped (conductor/serve/app.py), from the engine's and the lake writer's own counts
        self.champion_reloads = SetGauge("conductor_serve_champion_reloads", "Champion changes picked up", registry=r)
        self.lake_rows = SetGauge("conductor_serve_lake_rows_written", "Served trajectories written to the lake",
                                  registry=r)
        self.lake_errors = SetGauge("conductor_serve_lake_write_errors", "Lake shard writes that failed (retried)",
                                    registry=r)
        self.lake_rows_lost = SetGauge("conductor_serve_lake_rows_lost", "Served trajectories never written "
                                       "(the retry queue was full)", registry=r)

    def collect(self) -> Iterator[Metric]:
        for m in self._tallied:
            yield m.family()

    def observe_overhead(self, endpoint: str, seconds: float) -> None:
        self.overhead.observe((endpoint,), seconds)

    def outcome(self, out: Outcome) -> None:
        self.workflow.observe((out.model.model_id,), out.seconds)
        tokens_in = tokens_out = 0
        for t in out.trajectories:
            self.steps.observe((), sum(1 for c in t.calls if c.depth == 0))
            for c in t.calls:
                self.worker_calls.inc((c.worker, "true" if c.cache_hit else "false"))
                if c.error_kind:
                    self.worker_errors.inc((c.worker, c.error_kind))
                if c.cost_usd:
                    self.dollars.inc((c.worker,), c.cost_usd)
                tokens_in += c.input_tokens
                tokens_out += c.output_tokens
        self.tokens.inc(("input",), tokens_in)
        self.tokens.inc(("output",), tokens_out)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
