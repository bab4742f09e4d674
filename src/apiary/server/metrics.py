"""Prometheus metrics of one coordinator (a registry per instance, served at /metrics).

Every metric of Apiary's own is named `apiary_...`; beside them are the standard `process_*`
metrics of the process (CPU, memory, file descriptors, start time). The back-pressure
metrics of RFC 13 are read from the router at scrape time; the RFC calls its names
illustrative, so they carry the prefix too (docs/metrics.md maps them).

Label values come from bounded sets only (served method paths and route patterns, agent ids,
protocol codes): a call to no served method or route is counted under UNKNOWN_METHOD, so
that what a client types as a path never becomes a label (labels live for the process).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, ProcessCollector, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, SummaryMetricFamily
from prometheus_client.registry import Collector

from apiary.engine.activity import Activity
from apiary.engine.cluster.node import ClusterNode
from apiary.engine.eventlog import EventRecorder
from apiary.engine.router.router import Router
from apiary.engine.router.stats import Timing
from apiary.engine.scheduler.scheduler import Scheduler
from apiary.server.metrics_cluster import ClusterCollector
from apiary.server.thread_cpu import process_cpu_seconds, thread_cpu_seconds
from apiary.store.sqlite.database import SqliteStats

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
UNKNOWN_METHOD: Final = "unknown"
"""The `method` label of calls to no served method or route."""


class _RouterCollector(Collector):
    def __init__(self, router: Router) -> None:
        self._router = router

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | SummaryMetricFamily]:
        router, stats = self._router, self._router.stats
        depth = GaugeMetricFamily(
            "apiary_router_inbound_queue_depth",
            "Messages in the agent's inbound buffer.",
            labels=["agent_id"],
        )
        capacity = GaugeMetricFamily(
            "apiary_router_inbound_queue_capacity",
            "Configured inbound buffer capacity.",
            labels=["agent_id"],
        )
        oldest = GaugeMetricFamily(
            "apiary_router_oldest_enqueued_age_seconds",
            "Age of the oldest undelivered message.",
            labels=["agent_id"],
        )
        now = router.clock_now()
        for agent_id, inbox in sorted(router.inboxes().items()):
            depth.add_metric([agent_id], inbox.depth)
            capacity.add_metric([agent_id], inbox.capacity)
            at = inbox.oldest_pending_at()
            oldest.add_metric([agent_id], max(now - at, 0.0) if at is not None else 0.0)
        yield from (depth, capacity, oldest)
        yield _counter(
            "apiary_router_enqueue_rejects",
            "Rejected enqueues by reason.",
            ["agent_id", "reason"],
            stats.enqueue_rejects,
        )
        yield _counter(
            "apiary_router_admission_refused",
            "Envelopes refused at admission by error code (answered to the caller and logged "
            "as message.rejected; never admitted, so not dead-lettered).",
            ["error_code"],
            {(k,): v for k, v in stats.admission_refused.items()},
        )
        yield _counter(
            "apiary_router_nacks",
            "NACKs emitted by error code.",
            ["agent_id", "error_code"],
            stats.nacks,
        )
        yield _counter(
            "apiary_router_messages_accepted",
            "Messages durably admitted.",
            ["agent_id"],
            {(k,): v for k, v in stats.accepted.items()},
        )
        yield _counter(
            "apiary_router_urgent_dispatches",
            "Deliveries from the PRIVILEGED lane.",
            ["agent_id"],
            {(k,): v for k, v in stats.urgent_dispatches.items()},
        )
        yield _counter(
            "apiary_router_urgent_overflows",
            "PRIVILEGED messages over the lane's rate limit, served in STANDARD's share.",
            ["agent_id"],
            {(k,): v for k, v in stats.urgent_overflows.items()},
        )
        tokens = GaugeMetricFamily(
            "apiary_router_urgent_burst_tokens",
            "PRIVILEGED burst tokens left per agent (refilled at the lane's rate).",
            labels=["agent_id"],
        )
        for agent_id, inbox in sorted(router.inboxes().items()):
            tokens.add_metric([agent_id], inbox.lanes.tokens)
        yield tokens
        yield _counter(
            "apiary_router_dead_lettered",
            "Messages moved to the DLQ.",
            ["error_code"],
            {(k,): v for k, v in stats.dead_lettered.items()},
        )
        yield _summary(
            "apiary_router_enqueue_latency_seconds",
            "Receive to durable enqueue.",
            stats.enqueue_latency,
        )
        yield _summary(
            "apiary_agent_dequeue_latency_seconds", "Enqueue to agent fetch.", stats.dequeue_latency
        )
        yield _summary(
            "apiary_agent_process_time_seconds",
            "Agent fetch to terminal acknowledgement.",
            stats.process_time,
        )


def _counter(
    name: str, doc: str, labels: list[str], values: Mapping[Any, float]
) -> CounterMetricFamily:
    family = CounterMetricFamily(name, doc, labels=labels)
    for key, value in sorted(values.items()):
        family.add_metric(list(key), value)
    return family


def _summary(name: str, doc: str, timings: dict[str, Timing]) -> SummaryMetricFamily:
    family = SummaryMetricFamily(name, doc, labels=["agent_id"])
    for agent_id, timing in sorted(timings.items()):
        family.add_metric([agent_id], count_value=timing.count, sum_value=timing.total_s)
    return family


class _ActivityCollector(Collector):
    """RFC 10.1: utilization, and a warning gauge above 80% of capacity."""

    def __init__(self, activity: Activity) -> None:
        self._activity = activity

    def collect(self) -> Iterator[GaugeMetricFamily]:
        buffer = self._activity.buffer
        yield GaugeMetricFamily(
            "apiary_activity_buffer_entries", "Active activity-buffer entries.", value=len(buffer)
        )
        yield GaugeMetricFamily(
            "apiary_activity_buffer_utilization", "Active entries / capacity.",
            value=buffer.utilization,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "apiary_activity_buffer_over_warning",
            "1 when utilization exceeds the warning ratio (80%).",
            value=1.0 if buffer.over_warning else 0.0,
        )  # fmt: skip


class _SchedulerCollector(Collector):
    """RFC 9.3 monitoring: concurrency patterns (conflict decisions by outcome), Inference
    Engine confidence scores and HITL escalation rates; task counts by state."""

    def __init__(self, scheduler: Scheduler) -> None:
        self._scheduler = scheduler

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | SummaryMetricFamily]:
        gate = self._scheduler.gate
        outcomes = {k: v for k, v in gate.stats.items() if not k.startswith("hitl_")}
        yield _counter(
            "apiary_scheduler_conflict_decisions",
            "Scope-conflict decisions between concurrent tasks, by outcome (PARALLEL, "
            "SERIALIZE, ESCALATE; escalated and engine_unavailable counted apart).",
            ["outcome"],
            {(k,): v for k, v in outcomes.items()},
        )
        yield _counter(
            "apiary_scheduler_conflict_hitl_decisions",
            "Human decisions on CONFLICT escalations, by outcome.",
            ["outcome"],
            {(k.removeprefix("hitl_"),): v for k, v in gate.stats.items() if k.startswith("hitl_")},
        )
        scores = gate.confidences
        confidence = SummaryMetricFamily(
            "apiary_scheduler_inference_confidence",
            "Confidence scores the Inference Engine returned (the last 1,000).",
            count_value=len(scores), sum_value=sum(scores),
        )  # fmt: skip
        yield confidence
        states = GaugeMetricFamily(
            "apiary_scheduler_tasks", "Tasks the Scheduler holds, by state.", labels=["state"]
        )
        for state, count in sorted(self._scheduler.counts().items()):
            states.add_metric([state], count)
        yield states


class _EventCollector(Collector):
    """Every kind of event this coordinator recorded (tool calls, handoffs, workflow nodes,
    negotiation rounds, HITL decisions, ...): one counter family, labelled by type."""

    def __init__(self, events: EventRecorder) -> None:
        self._events = events

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield _counter(
            "apiary_events", "Events recorded since start, by event type.", ["event_type"],
            {(k,): v for k, v in self._events.counts.items()},
        )  # fmt: skip


class _SqliteCollector(Collector):
    """The embedded store's single writer and WAL: group commits, jobs per commit (their
    ratio is how well concurrent writes share commits), checkpoints and WAL restarts."""

    def __init__(self, stats: Callable[[], SqliteStats]) -> None:
        self._stats = stats

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        stats = self._stats()
        writer = stats.writer
        for name, doc, value in (
            ("apiary_store_commits", "SQLite transactions committed by the writer.",
             writer.commits),
            ("apiary_store_jobs", "Write jobs committed (several share one commit).", writer.jobs),
            ("apiary_store_checkpoints", "Background WAL checkpoints.", stats.checkpoints),
            ("apiary_store_wal_restarts", "Times the WAL was made to start over.",
             stats.wal_restarts),
        ):  # fmt: skip
            yield CounterMetricFamily(name, doc, value=value)
        yield GaugeMetricFamily(
            "apiary_store_largest_batch", "Most write jobs in one commit so far.",
            value=writer.largest_batch,
        )  # fmt: skip
        if stats.writer_pid is not None:
            cpu = process_cpu_seconds(stats.writer_pid)
            if cpu is not None:
                yield CounterMetricFamily(
                    "apiary_store_writer_process_cpu_seconds",
                    "CPU seconds used by the SQLite writer process (writer=process).", value=cpu,
                )  # fmt: skip


class _ThreadCollector(Collector):
    """CPU time of the coordinator's threads by name (Linux only: empty elsewhere)."""

    def collect(self) -> Iterator[CounterMetricFamily]:
        yield _counter(
            "apiary_thread_cpu_seconds",
            "CPU seconds used by the coordinator's threads (the event loop is MainThread).",
            ["thread"], {(name,): value for name, value in thread_cpu_seconds().items()},
        )  # fmt: skip


class _LeaderOnly(Collector):
    """The figures of a component that runs on the cluster's leader only (the Scheduler's,
    the Activity Buffer's: docs/cluster.md, "The leader"): left out of /metrics while this
    replica does not lead, where the component is idle and its zeros would be misread as
    the cluster's. `apiary_cluster_leader` says which replica's to read; outside cluster
    mode (`leads` None) always there."""

    def __init__(self, inner: Collector, leads: Callable[[], bool] | None) -> None:
        self._inner = inner
        self._leads = leads

    def collect(self) -> Iterator[Any]:
        if self._leads is None or self._leads():
            yield from self._inner.collect()


class Metrics:
    def __init__(
        self,
        router: Router | None = None,
        activity: Activity | None = None,
        scheduler: Scheduler | None = None,
        events: EventRecorder | None = None,
        store_stats: Callable[[], SqliteStats] | None = None,
        cluster: ClusterNode | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        self._rpcs = Counter(
            "apiary_rpc_total",
            "RPCs answered, by transport, method and protocol result code.",
            ("transport", "method", "code"),
            registry=self.registry,
        )
        self._denied = Counter(
            "apiary_access_denied_total",
            "Calls refused by the authorizer, by action and refusal (unauthenticated or "
            "permission_denied).",
            ("action", "refusal"),
            registry=self.registry,
        )
        if router is not None:
            self.registry.register(_RouterCollector(router))
        leads = cluster.leader.leads if cluster is not None and cluster.leader else None
        if activity is not None:
            self.registry.register(_LeaderOnly(_ActivityCollector(activity), leads))
        if scheduler is not None:
            self.registry.register(_LeaderOnly(_SchedulerCollector(scheduler), leads))
        if events is not None:
            self.registry.register(_EventCollector(events))
        if store_stats is not None:
            self.registry.register(_SqliteCollector(store_stats))
        if cluster is not None:
            self.registry.register(ClusterCollector(cluster))
        self.registry.register(_ThreadCollector())
        # process_cpu_seconds_total, process_resident_memory_bytes, process_open_fds,
        # process_max_fds, process_virtual_memory_bytes, process_start_time_seconds.
        ProcessCollector(registry=self.registry)

    def rpc_done(self, transport: str, method: str, code: str) -> None:
        """One answered call; `method` is a served method path or route pattern, or
        UNKNOWN_METHOD (never a path as a client typed it)."""
        self._rpcs.labels(transport, method, code).inc()

    def access_denied(self, action: str, refusal: str) -> None:
        """One refused call; `action` is a method path or route from the rule table only."""
        self._denied.labels(action, refusal).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
