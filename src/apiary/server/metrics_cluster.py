"""The cluster's figures at /metrics (docs/cluster.md, "Operating"): what this replica holds
and has done, from its lease keeper and its owner timers. Only a replica in cluster mode
has them."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from apiary.engine.cluster.node import ClusterNode


class ClusterCollector(Collector):
    def __init__(self, node: ClusterNode) -> None:
        self._node = node

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        keeper = self._node.keeper
        view = keeper.view
        yield GaugeMetricFamily(
            "apiary_cluster_partitions_owned",
            "Partitions whose lease this replica holds now.",
            value=len(keeper.owned()),
        )
        yield GaugeMetricFamily(
            "apiary_cluster_partitions",
            "Partitions of the cluster ([cluster] partitions).",
            value=keeper.settings.partitions,
        )
        leader = self._node.leader
        yield GaugeMetricFamily(
            "apiary_cluster_leader",
            "1 while this replica leads the cluster (its apiary_scheduler_* and "
            "apiary_activity_buffer_* figures are the cluster's; other replicas have none).",
            value=1 if leader is not None and leader.leads() else 0,
        )
        yield GaugeMetricFamily(
            "apiary_cluster_replicas_live",
            "Replicas whose heartbeat had not expired at this replica's last lease tick.",
            value=len(view.live_replicas()) if view is not None else 0,
        )
        yield CounterMetricFamily(
            "apiary_cluster_takeovers",
            "Partitions this replica took over from a replica whose lease had lapsed.",
            value=keeper.takeovers,
        )
        yield CounterMetricFamily(
            "apiary_cluster_lease_ticks",
            "Lease rounds (heartbeat, renewals, acquisitions) this replica has run.",
            value=keeper.ticks,
        )
        yield CounterMetricFamily(
            "apiary_cluster_deadlines_fired",
            "Message deadlines (ACK, TTL) this replica fired as its partitions' owner.",
            value=self._node.timers.fired
            + sum(part.timers.fired for part in self._node.tenants.values()),
        )
