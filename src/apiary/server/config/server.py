"""The coordinator's configuration (`ServerConfig`), its [server] keys as they come from the
file, the environment and the flags, and the checks of the whole: TLS files, the store URL,
and when serving beyond loopback needs the secure mode (`exposure_problem`)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from apiary.controlplane.settings import RuntimeSettings
from apiary.core.handoff_request import HandoffPolicy
from apiary.core.limits import Limits
from apiary.core.tasks.capacity import PREFETCH_ACK_TIMEOUT_S, PREFETCHED_RECEIVED_AFTER_S
from apiary.engine.cluster.settings import ClusterSettings
from apiary.engine.hitl import HitlSettings
from apiary.engine.negotiation.policies import NegotiationSettings
from apiary.engine.negotiation.rooms import RoomSettings
from apiary.engine.presence import PresenceSettings
from apiary.engine.settings import RouterSettings, SchedulerSettings
from apiary.engine.tools.settings import ToolSettings
from apiary.engine.worktrees.settings import WorktreeSettings
from apiary.errors import ValidationError
from apiary.server.auth.settings import AuthSettings
from apiary.server.config.address import Address, is_loopback_host
from apiary.server.config.data_dir import DATA_DIR_ENV, DEFAULT_DATA_DIR
from apiary.server.tracing.settings import TracingSettings
from apiary.store.open import check_store_url
from apiary.swarm.settings import PeerSettings

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
DEFAULT_GRPC = Address("127.0.0.1", 50051)
DEFAULT_HTTP = Address("127.0.0.1", 8080)


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """The coordinator's configuration, every layer merged (loader.load_config)."""

    data_dir: Path = DEFAULT_DATA_DIR
    grpc: Address = DEFAULT_GRPC
    http: Address = DEFAULT_HTTP
    store: str = ""
    """Store URL; empty means SQLite at data_dir/apiary.db."""
    log_level: str = "INFO"
    router: RouterSettings = field(default_factory=RouterSettings)
    """Messaging-plane settings: TOML table [router] (see RouterSettings)."""
    hitl: HitlSettings = field(default_factory=HitlSettings)
    """Human-in-the-loop settings: TOML table [hitl] and [[hitl.operators]]."""
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    """Scheduler settings: TOML table [scheduler] (see docs/scheduler.md)."""
    handoff: HandoffPolicy = field(default_factory=HandoffPolicy)
    """Handoff policy: TOML table [handoff] (see docs/handoff.md)."""
    worktrees: WorktreeSettings = field(default_factory=WorktreeSettings)
    """Worktree binding settings: TOML table [worktrees] and its [[worktrees.repos]]."""
    rooms: RoomSettings = field(default_factory=RoomSettings)
    """Negotiation-room settings and policy: TOML table [rooms]."""
    tools: ToolSettings = field(default_factory=ToolSettings)
    """Tool settings: TOML table [tools] (see docs/tools.md)."""
    negotiation: NegotiationSettings = field(default_factory=NegotiationSettings)
    """Negotiation settings: TOML table [negotiation] (see docs/negotiation.md)."""
    auth: AuthSettings = field(default_factory=AuthSettings)
    """Authentication and authorization: TOML table [auth] (docs/security.md)."""
    limits: Limits = field(default_factory=Limits)
    """The limits on what clients send: TOML table [limits] (docs/decisions.md, "Limits")."""
    tracing: TracingSettings = field(default_factory=TracingSettings)
    """Spans exported over OTLP: TOML table [tracing] (docs/tracing.md); off by default."""
    cluster: ClusterSettings = field(default_factory=ClusterSettings)
    """Cluster mode: TOML table [cluster] (docs/cluster.md); `apiary serve --cluster`."""
    runtime: RuntimeSettings = field(default_factory=RuntimeSettings)
    """The runtime control plane's limits and windows: TOML table [runtime]
    (docs/control-plane.md, "Configuration")."""
    presence: PresenceSettings | None = None
    """Heartbeat checks of connected agents: TOML table [presence] (docs/scheduler.md,
    "Agent lifecycle"); None: the engine's defaults (or a test's Runtime)."""
    swarm: PeerSettings | None = None
    """A swarm peer served by the coordinator: TOML table [swarm] (docs/swarm.md)."""
    tls_cert: Path | None = None
    """PEM certificate (chain) served on the gRPC and HTTP ports; with `tls_key`, TLS is on."""
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    """With TLS on: require client certificates signed by this CA (mTLS)."""


ENV = {
    "data_dir": DATA_DIR_ENV,
    "grpc": "APIARY_GRPC",
    "http": "APIARY_HTTP",
    "store": "APIARY_STORE",
    "log_level": "APIARY_LOG_LEVEL",
}
"""The [server] keys the environment sets, and the variables that set them."""


def _coerce(name: str, value: Any, source: str) -> Any:
    if not isinstance(value, str):
        raise ValidationError(f"{source}: {name} must be a string", {"field": name})
    if name in ("data_dir", "tls_cert", "tls_key", "tls_client_ca"):
        return Path(value)
    if name in ("grpc", "http"):
        return Address.parse(value, f"{source}: {name}")
    if name == "log_level":
        level = value.upper()
        if level not in LOG_LEVELS:
            raise ValidationError(
                f"{source}: log_level must be one of {', '.join(LOG_LEVELS)}", {"field": name}
            )
        return level
    return value


def apply_layer(config: ServerConfig, values: Mapping[str, Any], source: str) -> ServerConfig:
    """`config` with the [server] keys of one layer (the file's [server] table, the
    environment, the flags); `source` names the layer in errors."""
    known = {f.name for f in fields(ServerConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValidationError(
            f"{source}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}",
            {"field": unknown[0]},
        )
    return replace(config, **{k: _coerce(k, v, source) for k, v in values.items()})


def secured(config: ServerConfig) -> ServerConfig:
    """`config` in secure mode (`apiary serve --secure`, DESIGN.md section 9): TLS, which must
    be configured, then authentication with default-deny authorization and message signing,
    turned on together."""
    if config.tls_cert is None or config.tls_key is None:
        raise ValidationError(
            "--secure needs TLS: set tls_cert and tls_key (or --tls-cert and --tls-key); "
            "`apiary certs dev` makes a local CA and certificates to try it",
            {"field": "tls_cert"},
        )
    return replace(
        config,
        auth=replace(config.auth, secure=True),
        router=replace(config.router, signing_required=True),
    )


def exposure_problem(config: ServerConfig, *, insecure: bool = False) -> str | None:
    """Why `config` may not serve as it is, or None. Across a network boundary the secure
    mode is required (RFC 6.2; DESIGN.md section 9): a gRPC or HTTP address that is not
    loopback needs TLS (`tls_cert` and `tls_key`), message signing (`[router]
    signing_required = true`) and default-deny authorization (`[auth] secure = true`), which
    `--secure` turns on together, unless the operator says the network is trusted
    (`insecure`)."""
    if insecure:
        return None
    missing = [
        what
        for what, on in (
            ("TLS (tls_cert and tls_key, or --tls-cert and --tls-key)", config.tls_cert),
            ("message signing ([router] signing_required = true)", config.router.signing_required),
            ("authentication ([auth] secure = true)", config.auth.secure),
        )
        if not on
    ]
    if not missing:
        return None
    for name, address in (("grpc", config.grpc), ("http", config.http)):
        if not is_loopback_host(address.host):
            return (
                f"{name} address {address.host}:{address.port} is not loopback and needs "
                f"{' and '.join(missing)}: serve with --secure; or pass --insecure to serve "
                "without them on a network you trust"
            )
    return None


def checked_tenants(config: ServerConfig) -> ServerConfig:
    """`config`, once tenants besides the default come with message signing (RFC 6.2: signing
    MUST be on when the framework supports multiple tenants)."""
    if config.auth.tenants and not config.router.signing_required:
        raise ValidationError(
            f"[auth] tenants ({', '.join(config.auth.tenants)}) need message signing: serve "
            "with --secure or set [router] signing_required = true",
            {"field": "tenants"},
        )
    return config


def checked_prefetch(config: ServerConfig) -> ServerConfig:
    """`config`, once its ACK deadline leaves a prefetched task time for its lazy RECEIVED
    (core/tasks/capacity.py PREFETCH_ACK_TIMEOUT_S)."""
    timeout = config.router.ack_timeout_s
    if config.scheduler.prefetch and timeout < PREFETCH_ACK_TIMEOUT_S:
        raise ValidationError(
            f"[router] ack_timeout_s = {timeout:g} is below {PREFETCH_ACK_TIMEOUT_S:g} s, which "
            f"[scheduler] prefetch = {config.scheduler.prefetch} needs (a prefetched task is "
            f"acknowledged RECEIVED after waiting {PREFETCHED_RECEIVED_AFTER_S:g} s): raise "
            "it, or set [scheduler] prefetch = 0",
            {"field": "router.ack_timeout_s"},
        )
    return config


def checked_tls(config: ServerConfig) -> ServerConfig:
    """`config`, once its TLS settings (and the client certificate a replica presents to the
    cluster's leader) are known to go together and their files readable."""
    if (config.tls_cert is None) != (config.tls_key is None):
        missing = "tls_key" if config.tls_key is None else "tls_cert"
        raise ValidationError(
            f"{missing} is needed too: TLS takes a certificate and its key", {"field": missing}
        )
    if config.tls_client_ca is not None and config.tls_cert is None:
        raise ValidationError(
            "tls_client_ca (mTLS) needs TLS on: set tls_cert and tls_key",
            {"field": "tls_client_ca"},
        )
    cluster = config.cluster
    if (cluster.client_cert is None) != (cluster.client_key is None):
        missing = "client_key" if cluster.client_key is None else "client_cert"
        raise ValidationError(
            f"cluster.{missing} is needed too: a replica's client certificate takes its key",
            {"field": f"cluster.{missing}"},
        )
    if cluster.client_cert is not None and config.tls_cert is None:
        raise ValidationError(
            "cluster.client_cert is presented to the leader over TLS: set tls_cert and tls_key",
            {"field": "cluster.client_cert"},
        )
    files = [(name, getattr(config, name)) for name in ("tls_cert", "tls_key", "tls_client_ca")]
    files += [(f"cluster.{name}", getattr(cluster, name)) for name in ("client_cert", "client_key")]
    for name, path in files:
        if path is not None and not os.access(path, os.R_OK):
            raise ValidationError(f"{name}: cannot read {path}", {"field": name})
    return config


def checked_store(config: ServerConfig) -> ServerConfig:
    """A store URL of a form the store refuses is a configuration error, before anything
    starts (its message names the accepted forms)."""
    try:
        check_store_url(config.store or None)
    except ValueError as exc:
        raise ValidationError(f"store: {exc}", {"field": "store"}) from None
    return config
