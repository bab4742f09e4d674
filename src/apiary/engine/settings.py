"""Operational settings of the messaging plane, with the RFC's defaults (RFC 20)."""

from __future__ import annotations

from dataclasses import dataclass, field

from apiary.core.envelope_rules import PayloadLimits
from apiary.core.lanes import LanePolicy


@dataclass(frozen=True, slots=True)
class RouterSettings:
    ack_timeout_s: float = 10.0
    """Time from admission to the recipient's first acknowledgement (RFC 11)."""
    buffer_capacity: int = 10
    """Default inbound buffer per agent (RFC 13); per-agent values override it."""
    dedup_window_s: float = 3600.0
    """Idempotency deduplication window (RFC 11.2)."""
    limits: PayloadLimits = field(default_factory=PayloadLimits)
    hlc_required: bool = False
    """When HLC is enabled every envelope must carry hlc_timestamp (RFC 11.1)."""
    credit_window: int = 0
    """Credit-based flow control (RFC 13.1): in-flight deliveries per receiver; 0 = off."""
    per_producer_cap: int = 0
    """With credits on: at most this many in flight per producer and receiver; 0 = none."""
    lanes: LanePolicy = field(default_factory=LanePolicy)
    max_deliveries: int = 5
    """Retry budget: a message handed out this many times without any acknowledgement fails
    into the DLQ (agent_unavailable) on the next attempt; 0 = unlimited."""
    max_frame_items: int = 5000
    """Envelopes per SendStream frame (RFC 5.4: batches bounded by count)."""
    max_frame_bytes: int = 16 * 1024 * 1024
    """Payload bytes per SendStream frame (RFC 5.4: batches bounded by size)."""
    max_batch: int = 256
    """Deliveries per stream batch, and the bound on backlog replayed per read (RFC 5.5)."""
    notice_ttl_s: float = 3600.0
    """Coordinator notices (NACKs, forwarded ACKs, join/leave) expire after this long."""
    retention_s: float = 7 * 24 * 3600.0
    """Finished messages, idempotency records and DLQ entries are purged after this long."""
