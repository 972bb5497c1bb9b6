"""The controller's Prometheus metrics and its small HTTP endpoints.

Every metric is created against the `CollectorRegistry` passed in (one per test,
one per process). `serve` exposes `/metrics` and, given checks, `/healthz` and
`/readyz` on one port; the controller may run two (metrics and health). This
module records numbers; it decides nothing.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
# A tiny model's swap in a second or two, a 70B model's cold start in minutes.
SWAP_BUCKETS = (1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0, 600.0, 1200.0, 1800.0)


class ControllerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        # A registry of its own unless given one (tests pass theirs, to read it back).
        self.registry = registry = registry if registry is not None else CollectorRegistry()
        self.lease_active = Gauge(
            "flexinfer_gpu_lease_active",
            "1 while a GPU lease parks the group",
            ["group", "namespace", "owner"],
            registry=registry,
        )
        self.lease_acquired = Counter(
            "flexinfer_gpu_lease_acquired_total",
            "GPU leases seen taking a group",
            ["group", "namespace", "owner"],
            registry=registry,
        )
        self.lease_read_errors = Counter(
            "flexinfer_gpu_lease_read_errors_total",
            "Reconciles that could not read GPU leases and failed open toward serving",
            ["namespace", "source"],
            registry=registry,
        )
        self.member_active = Gauge(
            "flexinfer_shared_group_member_active",
            "1 for the member that holds the shared group's GPU, 0 for the others",
            ["namespace", "group", "model"],
            registry=registry,
        )
        self.preemptions = Counter(
            "flexinfer_preemptions_total",
            "Members evicted while Ready (shared groups) or swapped out (GPUGroups)",
            ["namespace", "group", "reason"],
            registry=registry,
        )
        self.swaps = Counter(
            "flexinfer_swaps_total",
            "Changes of the member holding a group's GPU",
            ["namespace", "group", "kind"],
            registry=registry,
        )
        self.reconcile_seconds = Histogram(
            "flexinfer_reconcile_duration_seconds",
            "Time to observe, decide and apply one key",
            ["kind"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.decision_applied_seconds = Histogram(
            "flexinfer_decision_applied_seconds",
            "From the change that queued a key to its decision being written",
            ["kind"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        # Observed by `flexinfer_k8s.ready_times` (the first two) and
        # `flexinfer_k8s.drain_times` from the cluster's timestamps.
        self.swap_seconds = Histogram(
            "flexinfer_swap_seconds",
            "From the moment a model was handed the card to its pod being Ready",
            ["namespace", "model"],
            buckets=SWAP_BUCKETS,
            registry=registry,
        )
        self.cold_start_seconds = Histogram(
            "flexinfer_cold_start_seconds",
            "From a model pod's creation to its being Ready",
            ["namespace", "model"],
            buckets=SWAP_BUCKETS,
            registry=registry,
        )
        self.drain_seconds = Histogram(
            "flexinfer_drain_seconds",
            "From a replaced holder's drain start to its being scaled to 0",
            ["namespace", "model", "outcome"],
            buckets=SWAP_BUCKETS,
            registry=registry,
        )
        self.reconcile_errors = Counter(
            "flexinfer_reconcile_errors_total",
            "Reconciles that failed, by error class",
            ["kind", "error"],
            registry=registry,
        )
        self.api_requests = Counter(
            "flexinfer_api_requests_total",
            "Requests the controller sent to the API server, by verb",
            ["verb"],
            registry=registry,
        )
        self.leading = Gauge(
            "flexinfer_controller_leading",
            "1 while this replica leads (or runs without leader election)",
            registry=registry,
        )

    def count_request(self, method: str, path: str) -> None:
        self.api_requests.labels(verb=method.upper()).inc()

    def writes(self) -> float:
        """Total non-GET requests so far (tests and the benchmark read this)."""
        total = 0.0
        for metric in self.api_requests.collect():
            for sample in metric.samples:
                if sample.name.endswith("_total") and sample.labels.get("verb") != "GET":
                    total += sample.value
        return total


Check = Callable[[], tuple[bool, str]]


class HttpEndpoints:
    """One small HTTP server: /metrics, and /healthz and /readyz when checks are given."""

    def __init__(
        self,
        port: int,
        *,
        registry: CollectorRegistry | None = None,
        healthz: Check | None = None,
        readyz: Check | None = None,
        host: str = "0.0.0.0",
    ) -> None:
        routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {}
        if registry is not None:
            reg = registry
            routes["/metrics"] = lambda: (200, CONTENT_TYPE_LATEST, generate_latest(reg))
        for path, check in (("/healthz", healthz), ("/readyz", readyz)):
            if check is not None:
                routes[path] = _check_route(check)

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                route = routes.get(self.path.split("?", 1)[0])
                if route is None:
                    status, ctype, body = 404, "text/plain", b"not found\n"
                else:
                    status, ctype, body = route()
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # scrapes and probes are not worth a log line each

        self._server = ThreadingHTTPServer((host, port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name=f"http-{port}", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def start(self) -> HttpEndpoints:
        self._thread.start()
        return self

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._server.shutdown()
        self._server.server_close()


def _check_route(check: Check) -> Callable[[], tuple[int, str, bytes]]:
    def route() -> tuple[int, str, bytes]:
        ok, detail = check()
        return (200 if ok else 503, "text/plain", (detail or ("ok" if ok else "not ok")).encode())

    return route
