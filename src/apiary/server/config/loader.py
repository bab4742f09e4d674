"""Loading the configuration: defaults < TOML file < environment < command-line flags."""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, TypeVar

from apiary.engine.worktrees.settings import WorktreeSettings
from apiary.errors import ValidationError
from apiary.server.config.auth import auth_settings
from apiary.server.config.cluster import cluster_problem, cluster_settings
from apiary.server.config.handoff import handoff_policy
from apiary.server.config.hitl import hitl_settings
from apiary.server.config.limits import limits_settings
from apiary.server.config.negotiation import negotiation_settings
from apiary.server.config.presence import presence_settings
from apiary.server.config.rooms import room_settings
from apiary.server.config.router import router_settings
from apiary.server.config.runtime import runtime_settings
from apiary.server.config.scheduler import scheduler_settings
from apiary.server.config.server import (
    ENV,
    ServerConfig,
    apply_layer,
    checked_prefetch,
    checked_store,
    checked_tenants,
    checked_tls,
)
from apiary.server.config.swarm import swarm_settings
from apiary.server.config.tools import tool_settings
from apiary.server.config.tracing import tracing_settings
from apiary.server.config.values import as_table
from apiary.server.config.worktrees import worktree_settings
from apiary.swarm.settings import PeerSettings

_T = TypeVar("_T")
_Parse = Callable[[Any, Path], Any]


def _table_of(
    parse: Callable[[Mapping[str, Any], str], _T], name: str
) -> Callable[[Any, Path], _T]:
    """`parse` of the [name] table, which must be a table; errors name the file and [name]."""

    def parsed(value: Any, path: Path) -> _T:
        if not isinstance(value, dict):
            raise ValidationError(f"{path}: [{name}] must be a table", {"field": name})
        return parse(value, f"{path} [{name}]")

    return parsed


def _worktrees(value: Any, path: Path) -> WorktreeSettings:
    def parse(values: Mapping[str, Any], source: str) -> WorktreeSettings:
        # Relative repository paths are taken from the configuration file's directory.
        return worktree_settings(values, source, path.parent)

    return _table_of(parse, "worktrees")(value, path)


def _swarm(value: Any, path: Path) -> PeerSettings:
    return swarm_settings(as_table(value, "swarm", str(path)), f"{path} [swarm]")


_PARSERS: dict[str, _Parse] = {
    "router": _table_of(router_settings, "router"),
    "hitl": _table_of(hitl_settings, "hitl"),
    "scheduler": _table_of(scheduler_settings, "scheduler"),
    "handoff": lambda value, path: handoff_policy(value, str(path)),
    "worktrees": _worktrees,
    "rooms": lambda value, path: room_settings(value, f"{path} [rooms]"),
    "tools": _table_of(tool_settings, "tools"),
    "negotiation": _table_of(negotiation_settings, "negotiation"),
    "swarm": _swarm,
    "auth": _table_of(auth_settings, "auth"),
    "limits": _table_of(limits_settings, "limits"),
    "tracing": _table_of(tracing_settings, "tracing"),
    "cluster": _table_of(cluster_settings, "cluster"),
    "presence": _table_of(presence_settings, "presence"),
    "runtime": _table_of(runtime_settings, "runtime"),
}
"""The parser of each table, keyed by its ServerConfig field, in the order the tables are
checked (the first error is the one reported); [server] comes before them (apply_layer)."""
_TABLES = ("server", *_PARSERS)
_OPTIONAL = frozenset({"swarm"})
"""Tables that leave their field None when absent; the others are parsed from {}."""


def load_config(
    config_file: Path | None, env: Mapping[str, str], flags: Mapping[str, str | None]
) -> ServerConfig:
    """Merge the layers; every error names the setting and where it came from."""
    config = ServerConfig()
    path = config_file or (Path(env["APIARY_CONFIG"]) if env.get("APIARY_CONFIG") else None)
    if path is not None:
        config = _file_layer(config, path)
    from_env = {k: env[v] for k, v in ENV.items() if env.get(v)}
    config = apply_layer(config, from_env, "environment")
    config = apply_layer(config, {k: v for k, v in flags.items() if v is not None}, "flag")
    return checked_store(checked_tls(checked_prefetch(config)))


def checked_serving(config: ServerConfig) -> ServerConfig:
    """The checks of a configuration about to serve, once every flag is applied."""
    problem = cluster_problem(config.cluster, config.store)
    if problem is not None:
        raise problem
    return checked_tenants(config)


def _file_layer(config: ServerConfig, path: Path) -> ServerConfig:
    """`config` with the tables of the file at `path`."""
    doc = _read(path)
    server = doc.get("server", {})
    if not isinstance(server, dict):
        raise ValidationError(f"{path}: [server] must be a table", {"field": "server"})
    config = apply_layer(config, server, str(path))
    changes = {
        name: parse(doc.get(name, {}), path)
        for name, parse in _PARSERS.items()
        if name in doc or name not in _OPTIONAL
    }
    # The router checks envelopes with the same [limits] as every handler its requests.
    changes["router"] = replace(changes["router"], fields=changes["limits"])
    return replace(config, **changes)


def _read(path: Path) -> dict[str, Any]:
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ValidationError(f"config file {path} does not exist", {"field": "config"}) from None
    except tomllib.TOMLDecodeError as exc:
        raise ValidationError(f"config file {path}: {exc}", {"field": "config"}) from None
    unknown = sorted(set(doc) - set(_TABLES))
    if unknown:
        raise ValidationError(
            f"{path}: unknown table(s) {', '.join(unknown)}; known: {', '.join(_TABLES)}",
            {"field": unknown[0]},
        )
    return doc
