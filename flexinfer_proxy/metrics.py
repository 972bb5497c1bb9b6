"""The proxy's Prometheus metrics, created against an injected registry.

One `ProxyMetrics` per proxy (and per test): queued requests per model, requests
by outcome, time spent queued, time to the backend's first byte, and demand writes
and conflicts. A `model` label is
the model's `namespace/name` (two namespaces' models of one name never share a
series); a name a client made up is recorded as "" so a stranger cannot grow the
label set. This module counts; it decides nothing.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

# CollectorRegistry is re-exported: the type of what callers may pass in.
from prometheus_client import CollectorRegistry as CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

# Outcomes of a client request, as `flexinfer_proxy_requests_total{outcome}`.
OUTCOME_SERVED = "served"
OUTCOME_BACKEND_UNAVAILABLE = "backend_unavailable"
OUTCOME_QUEUE_TIMEOUT = "queue_timeout"
OUTCOME_PROXY_CLOSING = "proxy_closing"
OUTCOME_CLIENT_DISCONNECTED = "client_disconnected"
OUTCOME_UNKNOWN_MODEL = "unknown_model"
OUTCOME_BAD_REQUEST = "bad_request"
OUTCOME_BACKEND_TIMEOUT = "backend_timeout"  # no headers within --backend-headers-timeout
OUTCOME_STREAM_CUT = "stream_cut"  # the backend failed or fell silent mid-answer
OUTCOME_QUEUE_FULL = "queue_full"
OUTCOME_BODY_TOO_LARGE = "body_too_large"
OUTCOME_BODY_TIMEOUT = "body_timeout"
OUTCOME_PROXY_BUSY = "proxy_busy"  # --max-buffered-bytes reached
OUTCOME_UNAUTHORIZED = "unauthorized"
OUTCOME_AMBIGUOUS_MODEL = "ambiguous_model"
OUTCOME_CLIENT_CONCURRENCY_LIMIT = "client_concurrency_limit"  # --max-concurrent-per-client
OUTCOME_CLIENT_QUEUE_LIMIT = "client_queue_limit"  # --max-queued-per-client
OUTCOME_INTERNAL_ERROR = "internal_error"

# Seconds to minutes: a warm answer's first byte, a swap of a small model, a cold
# start of a large one.
QUEUE_WAIT_BUCKETS = (0.05, 0.1, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300, 600, 1800)


class ProxyMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # A registry of its own unless given one (tests pass theirs, to read it back).
        self.registry = registry = registry if registry is not None else CollectorRegistry()
        self.queued = Gauge(
            "flexinfer_proxy_queued_requests",
            "Requests waiting in the proxy for their model to become Ready.",
            ["model"],
            registry=registry,
        )
        self.requests = _RequestCounts()
        registry.register(self.requests)
        self.queue_wait = Histogram(
            "flexinfer_proxy_queue_wait_seconds",
            "Time a request spent queued before it was dispatched, timed out or abandoned.",
            ["model"],
            buckets=QUEUE_WAIT_BUCKETS,
            registry=registry,
        )
        self.time_to_first_byte = Histogram(
            "flexinfer_proxy_time_to_first_byte_seconds",
            "From a request's routing (its queueing, when it waited) to its backend's answer head.",
            ["model"],
            buckets=QUEUE_WAIT_BUCKETS,
            registry=registry,
        )
        self._first_byte_children: dict[str, Any] = {}
        self.demand_writes = Counter(
            "flexinfer_proxy_demand_writes",
            "Demand signals sent to the cluster, by model, kind of signal and result.",
            ["model", "signal", "result"],
            registry=registry,
        )
        self.demand_conflicts = Counter(
            "flexinfer_proxy_demand_conflicts",
            "409 Conflict answers met while writing demand (each is re-read and retried).",
            ["model"],
            registry=registry,
        )

        self.connections = Gauge(
            "flexinfer_proxy_client_connections",
            "Client connections open now.",
            registry=registry,
        )
        self.connections_closed = Counter(
            "flexinfer_proxy_client_connections_closed",
            "Client connections the proxy closed itself, by reason (refused at the cap, "
            "evicted idle at the cap, request head too slow).",
            ["reason"],
            registry=registry,
        )
        self.buffered_bytes = Gauge(
            "flexinfer_proxy_buffered_body_bytes",
            "Bytes of request bodies held in memory now (--max-buffered-bytes bounds it).",
            registry=registry,
        )

    def time_to_first_byte_of(self, model: str) -> Any:
        """The model's `time_to_first_byte` series (kept: `labels` costs on every call)."""
        child = self._first_byte_children.get(model)
        if child is None:
            child = self._first_byte_children[model] = self.time_to_first_byte.labels(model=model)
        return child

    def request_done(self, model: str, outcome: str) -> None:
        counts = self.requests.counts
        key = (model, outcome)
        counts[key] = counts.get(key, 0) + 1

    def exposition(self) -> tuple[bytes, bytes]:
        """`/metrics`: (content type, body) in Prometheus's text format."""
        return CONTENT_TYPE_LATEST.encode(), generate_latest(self.registry)


class _RequestCounts(Collector):
    """`flexinfer_proxy_requests_total{model, outcome}`, counted in a plain dict and
    turned into samples when scraped: a request costs one dict update, not a
    `Counter` child's lock and checks (requests and scrapes run on the event loop's
    one thread)."""

    def __init__(self) -> None:
        self.counts: dict[tuple[str, str], int] = {}

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(
            "flexinfer_proxy_requests",
            "Client requests by model and outcome.",
            labels=["model", "outcome"],
        )
        for (model, outcome), count in list(self.counts.items()):
            family.add_metric([model, outcome], count)
        yield family
