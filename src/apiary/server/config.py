"""Coordinator configuration: defaults < TOML file < environment < command-line flags.

TOML (`--config FILE` or APIARY_CONFIG):

    [server]
    data_dir = ".apiary"
    grpc = "127.0.0.1:50051"
    http = "127.0.0.1:8080"
    store = "postgresql://..."      # optional; default SQLite under data_dir
    log_level = "INFO"

Environment: APIARY_DATA_DIR, APIARY_GRPC, APIARY_HTTP, APIARY_STORE, APIARY_LOG_LEVEL.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from apiary.core.hitl import HitlPolicy
from apiary.engine.hitl import HitlSettings
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.engine.settings import RouterSettings, SchedulerSettings
from apiary.errors import ValidationError

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


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
    if name == "data_dir":
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
    "credit_window": int,
    "per_producer_cap": int,
    "max_batch": int,
    "max_deliveries": int,
    "max_frame_items": int,
    "max_frame_bytes": int,
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
        kind = _ROUTER_TYPES.get(key)
        if kind is None:
            known = ", ".join(sorted([*_ROUTER_TYPES, "limits"]))
            raise ValidationError(
                f"{source}: unknown setting {key}; known: {known}", {"field": key}
            )
        numeric = (
            kind is not bool and isinstance(value, int | float) and not isinstance(value, bool)
        )
        if not (isinstance(value, kind) or (kind is float and numeric)):
            raise ValidationError(f"{source}: {key} must be {kind.__name__}", {"field": key})
        if kind is not bool and value < (1 if key in ("buffer_capacity", "max_batch") else 0):
            raise ValidationError(f"{source}: {key} must not be below its minimum", {"field": key})
        changes[key] = kind(value)
    return replace(settings, **changes)


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
        unknown = sorted(set(doc) - {"server", "router", "hitl"})
        if unknown:
            raise ValidationError(
                f"{path}: unknown table(s) {', '.join(unknown)}; known: server, router, hitl",
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
    from_env = {k: env[v] for k, v in _ENV.items() if env.get(v)}
    config = _apply(config, from_env, "environment")
    return _apply(config, {k: v for k, v in flags.items() if v is not None}, "flag")
