"""What a swarm node can be tuned on; the defaults are the protocol's recommendations."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from apiary.swarm.courier import RetryPolicy
from apiary.swarm.freshness import Window
from apiary.swarm.keycache import KEY_TTL_S, REFRESH_COOLDOWN_S
from apiary.swarm.ratelimit import JOINS_PER_IP, MESSAGES_PER_SENDER, MESSAGES_PER_SWARM, Limit


@dataclass(frozen=True, slots=True)
class NodeSettings:
    window: Window = field(default_factory=Window)
    """How old or early a message's timestamp may be (swarm/freshness.py)."""
    per_sender: Limit = MESSAGES_PER_SENDER
    per_swarm: Limit = MESSAGES_PER_SWARM
    joins_per_ip: Limit = JOINS_PER_IP
    key_ttl_s: float = KEY_TTL_S
    key_cooldown_s: float = REFRESH_COOLDOWN_S
    retry_delays: tuple[float, ...] = (0.5, 2.0)
    """Waits before the second and later attempts of a delivery."""
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    """Background retries of destinations still unreachable after those (swarm/courier.py)."""
    request_timeout_s: float = 10.0
    hook_grace_s: float = 5.0
    """How long closing the node waits for deliveries and hooks still running."""


@dataclass(frozen=True, slots=True)
class PeerSettings:
    """A swarm peer inside a coordinator: TOML table [swarm] (docs/swarm.md). Its routes are
    served under /swarm of the coordinator's HTTP port; with `listen`, `cert` and `key` also
    on a TLS listener of their own (with `insecure`, a plain-HTTP loopback listener).
    `bridge_agent` and `wake` override the home's node.json."""

    home: Path
    listen: str = ""
    """HOST:PORT of an HTTPS listener for the swarm routes."""
    cert: str = ""
    key: str = ""
    bridge_agent: str = ""
    wake: str = ""
    insecure: bool = False
    """Serve `listen` as plain HTTP, without cert and key: local development, on a loopback
    address only (the home's endpoint is then an http:// loopback URL)."""
