"""Prometheus metrics of one coordinator (a registry per instance, served at /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, generate_latest

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._rpcs = Counter(
            "apiary_rpc_total",
            "RPCs answered, by transport, method and protocol result code.",
            ("transport", "method", "code"),
            registry=self.registry,
        )

    def rpc_done(self, transport: str, method: str, code: str) -> None:
        self._rpcs.labels(transport, method, code).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
