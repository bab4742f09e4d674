"""Coordinator configuration: defaults < TOML file < environment < command-line flags.

TOML (`--config FILE` or APIARY_CONFIG):

    [server]
    data_dir = ".apiary"
    grpc = "127.0.0.1:50051"
    http = "127.0.0.1:8080"
    store = "postgresql://..."      # optional; default SQLite under data_dir
    log_level = "INFO"

Further tables: [router], [hitl] (+ [[hitl.operators]]), [scheduler] (docs/scheduler.md,
"Configuration"), [handoff] (docs/handoff.md), [worktrees] (+ [[worktrees.repos]],
docs/worktrees.md), [rooms] (docs/negotiation-rooms.md, "Configuration"), [tools]
(docs/tools.md, "Configuration"; parsed in tool_config.py), [negotiation]
(docs/negotiation.md) and [swarm] (docs/swarm.md: a swarm peer inside the coordinator).

Environment: APIARY_DATA_DIR, APIARY_GRPC, APIARY_HTTP, APIARY_STORE, APIARY_LOG_LEVEL.
"""

from __future__ import annotations

import ipaddress
import math
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, TypeVar

from apiary.core.acl import acl_policy
from apiary.core.agent_lifecycle import LifecycleTimeouts
from apiary.core.conflicts import ConflictPolicy
from apiary.core.handoff_request import HandoffPolicy
from apiary.core.hitl import HitlPolicy
from apiary.core.lanes import DEFAULT_WEIGHTS, LanePolicy
from apiary.core.preemption import PreemptionPolicy
from apiary.core.worktree_binding import BindingPolicy, valid_id
from apiary.engine.hitl import HitlSettings
from apiary.engine.inference import InferenceSettings
from apiary.engine.lifecycle import LifecycleSettings
from apiary.engine.negotiation.policies import NegotiationSettings
from apiary.engine.negotiation.rooms import RoomSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.engine.settings import RouterSettings, SchedulerSettings, adaptive_policy
from apiary.engine.tools.settings import ToolSettings
from apiary.engine.worktrees.settings import RepoEntry, WorktreeSettings
from apiary.errors import ValidationError
from apiary.server.negotiation_config import negotiation_settings
from apiary.server.tool_config import tool_settings
from apiary.store.open import check_store_url
from apiary.swarm.settings import PeerSettings

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class Address:
    host: str
    port: int

    @classmethod
    def parse(cls, text: str, field: str) -> Address:
        """'HOST:PORT' (IPv6 hosts in brackets); port 0 asks for a free port."""
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit() or int(port) > 65535:
            raise ValidationError(
                f"{field} must be HOST:PORT with a port 0-65535, not {text!r}", {"field": field}
            )
        return cls(host.strip("[]"), int(port))

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True, slots=True)
class ServerConfig:
    data_dir: Path = Path(".apiary")
    grpc: Address = Address("127.0.0.1", 50051)
    http: Address = Address("127.0.0.1", 8080)
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
    swarm: PeerSettings | None = None
    """A swarm peer served by the coordinator: TOML table [swarm] (docs/swarm.md)."""
    tls_cert: Path | None = None
    """PEM certificate (chain) served on the gRPC and HTTP ports; with `tls_key`, TLS is on."""
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    """With TLS on: require client certificates signed by this CA (mTLS)."""


_ENV = {
    "data_dir": "APIARY_DATA_DIR",
    "grpc": "APIARY_GRPC",
    "http": "APIARY_HTTP",
    "store": "APIARY_STORE",
    "log_level": "APIARY_LOG_LEVEL",
}


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


def _apply(config: ServerConfig, values: Mapping[str, Any], source: str) -> ServerConfig:
    known = {f.name for f in fields(ServerConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValidationError(
            f"{source}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}",
            {"field": unknown[0]},
        )
    return replace(config, **{k: _coerce(k, v, source) for k, v in values.items()})


_ROUTER_TYPES: dict[str, type] = {
    "ack_timeout_s": float,
    "buffer_capacity": int,
    "dedup_window_s": float,
    "hlc_required": bool,
    "strict_correlation_ids": bool,
    "credit_window": int,
    "per_producer_cap": int,
    "credit_adaptive": bool,
    "credit_min_window": int,
    "credit_target_latency_s": float,
    "max_batch": int,
    "max_deliveries": int,
    "max_frame_items": int,
    "max_frame_bytes": int,
    "hand_over_wait_s": float,
    "signing_required": bool,
    "notice_ttl_s": float,
    "retention_s": float,
}


def router_settings(values: Mapping[str, Any], source: str) -> RouterSettings:
    """RouterSettings from a TOML table; `limits` is a table of per-type payload limits."""
    settings = RouterSettings()
    changes: dict[str, Any] = {}
    for key, value in values.items():
        if key == "limits":
            if not isinstance(value, dict):
                raise ValidationError(f"{source}: limits must be a table", {"field": "limits"})
            changes["limits"] = settings.limits.with_overrides(value)
            continue
        if key == "lanes":
            changes["lanes"] = lane_policy(_table(value, "lanes", source), source)
            continue
        if key == "acl":
            changes["acl"] = _built(acl_policy, source, _table(value, "acl", source))
            continue
        kind = _ROUTER_TYPES.get(key)
        if kind is None:
            known = ", ".join(sorted([*_ROUTER_TYPES, "acl", "lanes", "limits"]))
            raise ValidationError(
                f"{source}: unknown setting {key}; known: {known}", {"field": key}
            )
        numeric = (
            kind is not bool and isinstance(value, int | float) and not isinstance(value, bool)
        )
        if not (isinstance(value, kind) or (kind is float and numeric)):
            raise ValidationError(f"{source}: {key} must be {kind.__name__}", {"field": key})
        if kind is not bool and value < _ROUTER_MINIMUMS.get(key, 0):
            raise ValidationError(f"{source}: {key} must not be below its minimum", {"field": key})
        changes[key] = kind(value)
    settings = replace(settings, **changes)
    if settings.credit_adaptive:
        try:
            adaptive_policy(settings)
        except ValidationError as exc:
            raise ValidationError(f"{source}: {exc.message}", exc.details) from None
    return settings


_ROUTER_MINIMUMS = {"buffer_capacity": 1, "max_batch": 1, "credit_min_window": 1}


# --- typed TOML values, shared by [router.lanes] and [scheduler] ------------------------------

_KIND_NAMES: dict[type, str] = {
    int: "an integer",
    float: "a number",
    bool: "true or false",
    str: "a string",
}


def _typed(value: Any, kind: type, name: str, source: str) -> Any:
    """`value` as `kind` (int for float is fine, bool never counts as a number)."""
    if kind is float:
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(value, kind):
        return value
    raise ValidationError(f"{source}: {name} must be {_KIND_NAMES[kind]}", {"field": name})


def _table(value: Any, name: str, source: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValidationError(f"{source}: {name} must be a table", {"field": name})
    return value


def _check_known(values: Mapping[str, Any], known: Any, prefix: str, source: str) -> None:
    for key in values:
        if key not in known:
            raise ValidationError(
                f"{source}: unknown setting {prefix}{key}; known: "
                + ", ".join(f"{prefix}{k}" for k in sorted(known)),
                {"field": f"{prefix}{key}"},
            )


def _typed_fields(
    values: Mapping[str, Any], types: Mapping[str, type], prefix: str, source: str
) -> dict[str, Any]:
    """Each of `values` checked against `types`; unknown keys are errors."""
    _check_known(values, types, prefix, source)
    return {k: _typed(v, types[k], f"{prefix}{k}", source) for k, v in values.items()}


def _built(build: Callable[..., _T], source: str, /, *args: Any, **kwargs: Any) -> _T:
    """`build(*args, **kwargs)`, its ValidationError prefixed with `source`."""
    try:
        return build(*args, **kwargs)
    except ValidationError as exc:
        raise ValidationError(f"{source}: {exc.message}", exc.details) from None


def lane_policy(values: Mapping[str, Any], source: str, prefix: str = "lanes.") -> LanePolicy:
    """LanePolicy from a lanes table: `weights` (a table of lane = integer, merged over the
    defaults 4/2/1), `privileged_rate` (per second), `privileged_burst`."""
    changes = _typed_fields(
        {k: v for k, v in values.items() if k != "weights"},
        {"privileged_rate": float, "privileged_burst": int, "weights": dict},
        prefix,
        source,
    )
    if "weights" in values:
        weights = _table(values["weights"], f"{prefix}weights", source)
        changes["weights"] = {
            **DEFAULT_WEIGHTS,
            **{k: _typed(v, int, f"{prefix}weights.{k}", source) for k, v in weights.items()},
        }
    return _built(LanePolicy, source, **changes)


_HITL_POLICY = {
    "timeout_s": ("default_timeout_s", float),
    "timeout_action": ("timeout_action", str),
    "unavailable_policy": ("unavailable_policy", str),
    "auto_decide_threshold": ("auto_decide_threshold", float),
    "max_extensions": ("max_extensions", int),
    "enabled": ("enabled", bool),
}


def _operator_entries(values: Any, source: str) -> tuple[OperatorEntry, ...]:
    if not isinstance(values, list):
        raise ValidationError(
            f"{source}: operators must be [[hitl.operators]] tables", {"field": "operators"}
        )
    entries = []
    for i, entry in enumerate(values):
        where = f"{source} operators[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ValidationError(f"{where}: needs a name", {"field": "operators.name"})
        token, digest = entry.get("token"), entry.get("token_sha256")
        if not isinstance(token, str) and not isinstance(digest, str):
            raise ValidationError(
                f"{where}: needs token or token_sha256", {"field": "operators.token"}
            )
        roles = entry.get("roles", [])
        if not isinstance(roles, list) or not all(isinstance(r, str) for r in roles):
            raise ValidationError(
                f"{where}: roles must be a list of strings", {"field": "operators.roles"}
            )
        entries.append(
            OperatorEntry(
                entry["name"],
                digest if isinstance(digest, str) else token_digest(str(token)),
                tuple(roles),
            )
        )
    return tuple(entries)


def hitl_settings(values: Mapping[str, Any], source: str) -> HitlSettings:
    """HitlSettings from the [hitl] table (policy keys, presence keys, operators)."""
    policy: dict[str, Any] = {}
    settings: dict[str, Any] = {}
    for key, value in values.items():
        if key == "operators":
            settings["operators"] = _operator_entries(value, source)
        elif key in ("presence_required", "presence_window_s"):
            settings[key] = value
        elif key in _HITL_POLICY:
            name, kind = _HITL_POLICY[key]
            number = kind is float and isinstance(value, int) and not isinstance(value, bool)
            if not (number or isinstance(value, kind)):
                raise ValidationError(f"{source}: {key} must be {kind.__name__}", {"field": key})
            policy[name] = float(value) if number else value
        else:
            known = ", ".join(
                sorted([*_HITL_POLICY, "operators", "presence_required", "presence_window_s"])
            )
            raise ValidationError(
                f"{source}: unknown setting {key}; known: {known}", {"field": key}
            )
    try:
        built = HitlPolicy.from_settings(policy)
    except ValueError as exc:
        raise ValidationError(f"{source}: {exc}", {"field": "hitl"}) from None
    return HitlSettings(policy=built, **settings)


_SCHEDULER_TYPES: dict[str, type] = {
    "default_max_parallel": int,
    "max_queued": int,
    "duplicate_jobs": str,
    "dispatch_attempts": int,
    "retry_after_s": float,
    "inference_timeout_s": float,
    "hitl_timeout_s": float,
}
_SCHEDULER_TABLES = (
    "max_parallel_instances", "conflicts", "preemption", "lanes", "lifecycle", "inference",
)  # fmt: skip
_POSITIVE = ("retry_after_s", "inference_timeout_s")
_TIMEOUT_KEYS = tuple(f.name for f in fields(LifecycleTimeouts))
_INFERENCE_TYPES: dict[str, type] = {
    "kind": str,
    "url": str,
    "model": str,
    "api_key_env": str,
    "timeout_s": float,
}


def _instance_limits(values: Any, source: str) -> dict[str, int]:
    table = _table(values, "max_parallel_instances", source)
    return {k: _typed(v, int, f"max_parallel_instances.{k}", source) for k, v in table.items()}


def _conflict_policy(values: Any, source: str) -> ConflictPolicy:
    table = _table(values, "conflicts", source)
    known = {"threshold": float, "serialize_below": float, "overrides": dict}
    scalars = {k: v for k, v in table.items() if k != "overrides"}
    changes: dict[str, Any] = _typed_fields(scalars, known, "conflicts.", source)
    if "overrides" in table:
        overrides = _table(table["overrides"], "conflicts.overrides", source)
        changes["overrides"] = {
            k: _typed(v, str, f"conflicts.overrides.{k}", source) for k, v in overrides.items()
        }
    return _built(ConflictPolicy, source, **changes)


def _timeouts(
    values: Mapping[str, Any], base: LifecycleTimeouts, prefix: str, source: str
) -> LifecycleTimeouts:
    """`base` with the timeouts of `values` (seconds; `waiting = 0` means no timeout)."""
    changes = _typed_fields(values, dict.fromkeys(_TIMEOUT_KEYS, float), prefix, source)
    if changes.get("waiting") == 0.0:
        changes["waiting"] = None

    def build(**kwargs: Any) -> LifecycleTimeouts:
        return replace(base, **kwargs)

    return _built(build, source, **changes)


def _lifecycle(values: Any, source: str) -> LifecycleSettings:
    table = _table(values, "lifecycle", source)
    known = {"auto_recover": bool, "max_auto_recoveries": int, "timeouts": dict, "per_type": dict}
    scalars = {k: v for k, v in table.items() if k not in ("timeouts", "per_type")}
    changes: dict[str, Any] = _typed_fields(scalars, known, "lifecycle.", source)
    base = LifecycleSettings().timeouts
    if "timeouts" in table:
        timeouts = _table(table["timeouts"], "lifecycle.timeouts", source)
        base = _timeouts(timeouts, base, "lifecycle.timeouts.", source)
        changes["timeouts"] = base
    if "per_type" in table:
        per_type = _table(table["per_type"], "lifecycle.per_type", source)
        changes["per_type"] = {
            name: _timeouts(
                _table(entry, f"lifecycle.per_type.{name}", source),
                base,
                f"lifecycle.per_type.{name}.",
                source,
            )
            for name, entry in per_type.items()
        }
    return _built(LifecycleSettings, source, **changes)


def _inference(values: Any, source: str) -> InferenceSettings:
    table = _table(values, "inference", source)
    if "api_key" in table:
        raise ValidationError(
            f"{source}: inference.api_key is not read from the file; put the key in an "
            "environment variable and name it in inference.api_key_env",
            {"field": "inference.api_key"},
        )
    changes = _typed_fields(table, _INFERENCE_TYPES, "inference.", source)
    return _built(InferenceSettings, source, **changes)


_SCHEDULER_PARSERS: dict[str, Callable[[Any, str], Any]] = {
    "max_parallel_instances": _instance_limits,
    "conflicts": _conflict_policy,
    "preemption": lambda v, s: _built(
        PreemptionPolicy,
        s,
        **_typed_fields(
            _table(v, "preemption", s),
            {"safe_point_timeout_s": float, "grace_s": float, "max_section_s": float},
            "preemption.",
            s,
        ),
    ),
    "lanes": lambda v, s: lane_policy(_table(v, "lanes", s), s),
    "lifecycle": _lifecycle,
    "inference": _inference,
}


def scheduler_settings(values: Mapping[str, Any], source: str) -> SchedulerSettings:
    """SchedulerSettings from the [scheduler] table and its sub-tables (docs/scheduler.md).

    Errors name the setting, dotted below [scheduler] (`conflicts.threshold`), and `source`.
    """
    scalars = {k: v for k, v in values.items() if k not in _SCHEDULER_TABLES}
    _check_known(scalars, {*_SCHEDULER_TYPES, *_SCHEDULER_TABLES}, "", source)
    changes: dict[str, Any] = {
        k: _typed(v, _SCHEDULER_TYPES[k], k, source) for k, v in scalars.items()
    }
    for name in _POSITIVE:
        if name in changes and changes[name] <= 0:
            raise ValidationError(f"{source}: {name} must be > 0", {"field": name})
    if changes.get("hitl_timeout_s", 0.0) < 0:
        raise ValidationError(
            f"{source}: hitl_timeout_s must be >= 0 (0: the [hitl] default)",
            {"field": "hitl_timeout_s"},
        )
    for name in _SCHEDULER_TABLES:
        if name in values:
            changes[name] = _SCHEDULER_PARSERS[name](values[name], source)
    return _built(SchedulerSettings, source, **changes)


def handoff_policy(values: Any, path: str) -> HandoffPolicy:
    """The [handoff] table (HandoffPolicy fields; see docs/handoff.md)."""
    table = _table(values, "handoff", path)
    try:
        return HandoffPolicy.from_settings(table)
    except ValidationError as exc:
        raise ValidationError(f"{path} [handoff]: {exc.message}", exc.details) from None
    except TypeError as exc:  # a value of the wrong type reaching the dataclass
        raise ValidationError(f"{path} [handoff]: {exc}", {"field": "handoff"}) from None


_WORKTREE_POLICY: dict[str, type] = {
    "retry_base_s": float,
    "max_retries": int,
    "recovery_timeout_s": float,
    "default_ttl_s": float,
    "max_ttl_s": float,
}


def _repo_entries(values: Any, source: str, base: Path) -> tuple[RepoEntry, ...]:
    if not isinstance(values, list):
        raise ValidationError(
            f"{source}: repos must be [[worktrees.repos]] tables", {"field": "repos"}
        )
    entries: dict[str, RepoEntry] = {}
    for i, entry in enumerate(values):
        where = f"{source} repos[{i}]"
        if not isinstance(entry, dict):
            raise ValidationError(f"{where}: must be a table", {"field": "repos"})
        _check_known(entry, {"id", "path"}, "repos.", where)
        repo_id, path = entry.get("id"), entry.get("path")
        if not isinstance(repo_id, str) or not valid_id(repo_id):
            raise ValidationError(
                f"{where}: id must be 1-128 of A-Z a-z 0-9 . _ - (not {repo_id!r})",
                {"field": "repos.id"},
            )
        if not isinstance(path, str) or not path:
            raise ValidationError(f"{where}: path must be a string", {"field": "repos.path"})
        if repo_id in entries:
            raise ValidationError(f"{where}: repository {repo_id!r} is configured twice",
                                  {"field": "repos.id"})  # fmt: skip
        entries[repo_id] = RepoEntry(repo_id, (base / Path(path).expanduser()).resolve())
    return tuple(entries.values())


def worktree_settings(values: Mapping[str, Any], source: str, base: Path) -> WorktreeSettings:
    """WorktreeSettings from the [worktrees] table: policy keys, `hitl_timeout_s` and the
    [[worktrees.repos]] tables (`id`, `path`; a relative path is taken from `base`, the
    configuration file's directory)."""
    scalars = {k: v for k, v in values.items() if k not in ("repos", "hitl_timeout_s")}
    policy = _typed_fields(scalars, _WORKTREE_POLICY, "", source)
    changes: dict[str, Any] = {"policy": _built(BindingPolicy, source, **policy)}
    if "hitl_timeout_s" in values:
        timeout = _typed(values["hitl_timeout_s"], float, "hitl_timeout_s", source)
        if timeout < 0:
            raise ValidationError(
                f"{source}: hitl_timeout_s must be >= 0 (0: the [hitl] default)",
                {"field": "hitl_timeout_s"},
            )
        changes["hitl_timeout_s"] = timeout
    if "repos" in values:
        changes["repos"] = _repo_entries(values["repos"], source, base)
    return WorktreeSettings(**changes)


def room_settings(values: Any, source: str) -> RoomSettings:
    """RoomSettings from the [rooms] table; errors name the setting and `source`."""
    if not isinstance(values, dict):
        raise ValidationError(f"{source}: [rooms] must be a table", {"field": "rooms"})
    return _built(RoomSettings.from_settings, source, values)


def swarm_settings(values: Mapping[str, Any], source: str) -> PeerSettings:
    """PeerSettings from the [swarm] table: home (required), listen, cert, key, bridge_agent,
    wake; relative paths are taken from the current directory."""
    known = {f.name: str for f in fields(PeerSettings)}
    changes = _typed_fields(values, known, "swarm.", source)
    if not changes.get("home"):
        raise ValidationError(f"{source}: swarm.home is required", {"field": "swarm.home"})
    if changes.get("listen") and not (changes.get("cert") and changes.get("key")):
        raise ValidationError(
            f"{source}: swarm.listen needs swarm.cert and swarm.key (TLS)", {"field": "swarm.cert"}
        )
    return PeerSettings(**{**changes, "home": Path(changes["home"])})


_TABLES = (
    "server", "router", "hitl", "scheduler", "handoff", "worktrees", "rooms", "tools",
    "negotiation", "swarm",
)  # fmt: skip


def exposure_problem(config: ServerConfig, *, insecure: bool = False) -> str | None:
    """Why `config` may not serve as it is, or None. Across a network boundary the secure
    mode is required (RFC 6.2; DESIGN.md section 9): a gRPC or HTTP address that is not
    loopback needs TLS (`tls_cert` and `tls_key`) and message signing (`[router]
    signing_required = true`), unless the operator says the network is trusted (`insecure`)."""
    if insecure:
        return None
    missing = [
        what
        for what, on in (
            ("TLS (tls_cert and tls_key, or --tls-cert and --tls-key)", config.tls_cert),
            ("message signing ([router] signing_required = true)", config.router.signing_required),
        )
        if not on
    ]
    if not missing:
        return None
    for name, address in (("grpc", config.grpc), ("http", config.http)):
        if not is_loopback_host(address.host):
            return (
                f"{name} address {address.host}:{address.port} is not loopback and needs "
                f"{' and '.join(missing)}; or pass --insecure to serve without them on a "
                "network you trust"
            )
    return None


def _checked_tls(config: ServerConfig) -> ServerConfig:
    """`config`, once its TLS settings are known to go together and their files readable."""
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
    for name in ("tls_cert", "tls_key", "tls_client_ca"):
        path = getattr(config, name)
        if path is not None and not os.access(path, os.R_OK):
            raise ValidationError(f"{name}: cannot read {path}", {"field": name})
    return config


def is_loopback_host(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def load_config(
    config_file: Path | None, env: Mapping[str, str], flags: Mapping[str, str | None]
) -> ServerConfig:
    """Merge the layers; every error names the setting and where it came from."""
    config = ServerConfig()
    path = config_file or (Path(env["APIARY_CONFIG"]) if env.get("APIARY_CONFIG") else None)
    if path is not None:
        try:
            doc = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise ValidationError(
                f"config file {path} does not exist", {"field": "config"}
            ) from None
        except tomllib.TOMLDecodeError as exc:
            raise ValidationError(f"config file {path}: {exc}", {"field": "config"}) from None
        unknown = sorted(set(doc) - set(_TABLES))
        if unknown:
            raise ValidationError(
                f"{path}: unknown table(s) {', '.join(unknown)}; known: {', '.join(_TABLES)}",
                {"field": unknown[0]},
            )
        server = doc.get("server", {})
        if not isinstance(server, dict):
            raise ValidationError(f"{path}: [server] must be a table", {"field": "server"})
        config = _apply(config, server, str(path))
        router = doc.get("router", {})
        if not isinstance(router, dict):
            raise ValidationError(f"{path}: [router] must be a table", {"field": "router"})
        config = replace(config, router=router_settings(router, f"{path} [router]"))
        hitl = doc.get("hitl", {})
        if not isinstance(hitl, dict):
            raise ValidationError(f"{path}: [hitl] must be a table", {"field": "hitl"})
        config = replace(config, hitl=hitl_settings(hitl, f"{path} [hitl]"))
        scheduler = doc.get("scheduler", {})
        if not isinstance(scheduler, dict):
            raise ValidationError(f"{path}: [scheduler] must be a table", {"field": "scheduler"})
        config = replace(config, scheduler=scheduler_settings(scheduler, f"{path} [scheduler]"))
        config = replace(config, handoff=handoff_policy(doc.get("handoff", {}), str(path)))
        worktrees = doc.get("worktrees", {})
        if not isinstance(worktrees, dict):
            raise ValidationError(f"{path}: [worktrees] must be a table", {"field": "worktrees"})
        config = replace(
            config,
            worktrees=worktree_settings(worktrees, f"{path} [worktrees]", path.parent),
        )
        config = replace(config, rooms=room_settings(doc.get("rooms", {}), f"{path} [rooms]"))
        tools = doc.get("tools", {})
        if not isinstance(tools, dict):
            raise ValidationError(f"{path}: [tools] must be a table", {"field": "tools"})
        config = replace(config, tools=tool_settings(tools, f"{path} [tools]"))
        negotiation = doc.get("negotiation", {})
        if not isinstance(negotiation, dict):
            raise ValidationError(
                f"{path}: [negotiation] must be a table", {"field": "negotiation"}
            )
        config = replace(
            config, negotiation=negotiation_settings(negotiation, f"{path} [negotiation]")
        )
        if "swarm" in doc:
            swarm = _table(doc["swarm"], "swarm", str(path))
            config = replace(config, swarm=swarm_settings(swarm, f"{path} [swarm]"))
    from_env = {k: env[v] for k, v in _ENV.items() if env.get(v)}
    config = _apply(config, from_env, "environment")
    config = _apply(config, {k: v for k, v in flags.items() if v is not None}, "flag")
    return _checked_store(_checked_tls(config))


def _checked_store(config: ServerConfig) -> ServerConfig:
    """A store URL of a form the store refuses is a configuration error, before anything
    starts (its message names the accepted forms)."""
    try:
        check_store_url(config.store or None)
    except ValueError as exc:
        raise ValidationError(f"store: {exc}", {"field": "store"}) from None
    return config
