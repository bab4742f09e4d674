"""The `[tools]` table of the configuration file (docs/tools.md, "Configuration").

    [tools]
    max_retries = 5               # the most retries any call gets
    cancel_grace_s = 5.0
    allowlist = ["api.example.com:443"]

    [tools.acl]                   # who may call what; absent: everyone may call everything
    coder = ["fs", "time/get_current_time"]
    "*" = ["text"]

    [tools.preapproved]           # run without asking HITL: provider ids or provider/tool
    ELEVATED = ["fs"]
    PRIVILEGED = ["ops/reboot"]
    FULL_ACCESS = []

    [[tools.commands]]
    provider = "text"
    name = "word_count"
    argv = ["wc", "-w"]           # {name} placeholders take the call's arguments
    input_schema = '{"type": "object"}'     # JSON text or an inline table
    idempotent = true
    [tools.commands.policy]
    budget_wall_ms = 5000

    [[tools.mcp]]
    provider = "time"
    command = "mcp-server-time"
    args = ["--local-timezone", "UTC"]
    expose = ["~/.cache/my-server"]   # read-only directories the sandbox cannot infer

Every error names the setting (`tools.commands[0].argv`) and where it came from.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from apiary.core.tools.argv import template_fields
from apiary.core.tools.descriptor import ToolDescriptor, check_provider_id, validate_tool
from apiary.core.tools.policy import ExecutionPolicy, parse_host_port
from apiary.core.tools.requests import RequestedPolicy, effective_policy
from apiary.engine.tools.command_tools import STDIN_MODES, CommandToolSpec
from apiary.engine.tools.mcp_bridge import McpServerSpec
from apiary.engine.tools.settings import PREAPPROVAL_LEVELS, ToolSettings
from apiary.errors import ValidationError
from apiary.sandbox.program import expose_problem

_T = TypeVar("_T")
_SCALARS: dict[str, type] = {
    "max_retries": int,
    "retry_base_s": float,
    "retry_cap_s": float,
    "cancel_grace_s": float,
    "hitl_timeout_s": float,
    "mcp_health_interval_s": float,
    "log_dir": str,
}
_POLICY: dict[str, type] = {
    "timeout_ms": int,
    "max_retries": int,
    "backoff": str,
    "worktree_required": bool,
    "network_policy": str,
    "privilege_level": str,
    "budget_cpu_ms": int,
    "budget_wall_ms": int,
    "allowlist": list,
}
_COMMAND: dict[str, type] = {
    "provider": str, "name": str, "argv": list, "description": str, "input_schema": object,
    "output_schema": object, "idempotent": bool, "needs_worktree": bool, "timeout_s": int,
    "max_concurrency": int, "side_effects": str, "stdin": str, "content_type": str,
    "env": dict, "policy": dict,
}  # fmt: skip
_MCP: dict[str, type] = {
    "provider": str, "command": str, "args": list, "env": dict, "cwd": str,
    "startup_timeout_s": float, "policy": dict, "expose": list,
}  # fmt: skip


class _Where:
    """A setting's dotted name and the file it came from, for error messages."""

    def __init__(self, source: str, prefix: str = "tools.") -> None:
        self.source = source
        self.prefix = prefix

    def error(self, name: str, problem: str) -> ValidationError:
        field = f"{self.prefix}{name}"
        return ValidationError(f"{self.source}: {field}: {problem}", {"field": field})

    def under(self, name: str) -> _Where:
        return _Where(self.source, f"{self.prefix}{name}.")


def _typed(value: Any, kind: type, name: str, where: _Where) -> Any:
    if kind is object:
        return value
    if kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        if math.isfinite(value) and value >= 0:
            return float(value)
        raise where.error(name, "must be a finite number >= 0")
    if kind is int and isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise where.error(name, "must not be negative")
        return value
    if kind not in (int, float) and isinstance(value, kind):
        return value
    raise where.error(name, f"must be {kind.__name__}")


def _fields(values: Any, types: Mapping[str, type], where: _Where, label: str) -> dict[str, Any]:
    if not isinstance(values, dict):
        raise where.error(label, "must be a table")
    unknown = sorted(set(values) - set(types))
    if unknown:
        raise where.error(unknown[0], f"unknown setting; known: {', '.join(sorted(types))}")
    return {k: _typed(v, types[k], k, where) for k, v in values.items()}


def _checked(build: Callable[[], _T], where: _Where) -> _T:
    try:
        return build()
    except ValidationError as exc:
        field = exc.details.get("field", "")
        raise where.error(field, exc.message.removeprefix(f"{field}: ")) from None


def _strings(value: Any, name: str, where: _Where) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise where.error(name, "must be a list of strings")
    return tuple(value)


def _env(value: Any, where: _Where) -> dict[str, str]:
    if not all(isinstance(v, str) for v in value.values()):
        raise where.error("env", "values must be strings")
    return dict(value)


def _policy(values: Any, where: _Where) -> ExecutionPolicy:
    fields = _fields(values, _POLICY, where, "policy")
    allowlist = tuple(
        _checked(partial(parse_host_port, entry), where)
        for entry in _strings(fields.pop("allowlist", []), "allowlist", where)
    )
    requested = RequestedPolicy(**fields)
    policy = _checked(lambda: effective_policy(requested, ExecutionPolicy(), max_retries_cap=100),
                      where)  # fmt: skip
    return replace(policy, allowlist=allowlist)


def _schema(value: Any, name: str, where: _Where) -> str:
    if value is None or value == "":
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return json.dumps(value)
    raise where.error(name, "must be JSON Schema text or a table")


def _command(values: Any, where: _Where) -> CommandToolSpec:
    fields = _fields(values, _COMMAND, where, "commands")
    for required in ("provider", "name", "argv"):
        if required not in fields:
            raise where.error(required, "is required")
    provider = _checked(lambda: check_provider_id(fields["provider"]), where)
    argv = _strings(fields["argv"], "argv", where)
    if not argv:
        raise where.error("argv", "must name a program")
    try:
        template_fields(argv)
    except ValueError as exc:
        raise where.error("argv", str(exc)) from None
    stdin = fields.get("stdin", "args")
    if stdin not in STDIN_MODES:
        raise where.error("stdin", "must be 'args', 'none' or 'stream'")
    descriptor = ToolDescriptor(
        tool_name=fields["name"],
        input_schema=_schema(fields.get("input_schema"), "input_schema", where),
        output_schema=_schema(fields.get("output_schema"), "output_schema", where),
        idempotent=fields.get("idempotent", False),
        needs_worktree=fields.get("needs_worktree", False),
        default_timeout_s=fields.get("timeout_s", 0),
        max_concurrency=fields.get("max_concurrency", 0),
        side_effects=fields.get("side_effects", ""),
        description=fields.get("description", ""),
    )
    return CommandToolSpec(
        provider_id=provider,
        descriptor=_checked(lambda: validate_tool(descriptor), where),
        argv=argv,
        policy=_policy(fields.get("policy", {}), where.under("policy")),
        env=_env(fields["env"], where) if "env" in fields else None,
        stdin=stdin,
        content_type=fields.get("content_type", "text/plain"),
    )


def _mcp(values: Any, where: _Where) -> McpServerSpec:
    fields = _fields(values, _MCP, where, "mcp")
    for required in ("provider", "command"):
        if required not in fields:
            raise where.error(required, "is required")
    return McpServerSpec(
        provider_id=_checked(lambda: check_provider_id(fields["provider"]), where),
        command=fields["command"],
        args=_strings(fields.get("args", []), "args", where),
        env=_env(fields.get("env", {}), where),
        cwd=fields.get("cwd", ""),
        policy=_policy(fields.get("policy", {}), where.under("policy")),
        startup_timeout_s=fields.get("startup_timeout_s", 30.0) or 30.0,
        expose=_expose(fields.get("expose", []), where),
        source="config",
    )


def _expose(value: Any, where: _Where) -> tuple[str, ...]:
    """Directories shown read-only to the sandboxed server; `~` is the coordinator's home."""
    paths = tuple(os.path.expanduser(p) for p in _strings(value, "expose", where))
    for i, path in enumerate(paths):
        if (problem := expose_problem(path)) is not None:
            raise where.error(f"expose[{i}]", f"{path}: {problem}")
    return tuple(dict.fromkeys(os.path.normpath(p) for p in paths))


def _preapproved(values: Any, where: _Where) -> dict[str, frozenset[str]]:
    fields = _fields(values, dict.fromkeys(PREAPPROVAL_LEVELS, list), where, "preapproved")
    return {level: frozenset(_strings(v, level, where)) for level, v in fields.items()}


def _entries(values: Any, name: str, where: _Where, parse: Callable[[Any, _Where], _T]) -> list[_T]:
    if not isinstance(values, list):
        raise where.error(name, f"must be [[tools.{name}]] tables")
    return [parse(v, _Where(where.source, f"tools.{name}[{i}].")) for i, v in enumerate(values)]


def tool_settings(values: Mapping[str, Any], source: str) -> ToolSettings:
    """ToolSettings from the [tools] table; every error names the setting and `source`."""
    where = _Where(source)
    tables = {"preapproved", "commands", "mcp", "allowlist", "acl", "hitl_approver_roles"}
    scalars = _fields({k: v for k, v in values.items() if k not in tables},
                      _SCALARS, where, "tools")  # fmt: skip
    changes: dict[str, Any] = dict(scalars)
    if "log_dir" in changes:
        changes["log_dir"] = Path(changes["log_dir"])
    if "preapproved" in values:
        changes["preapproved"] = _preapproved(values["preapproved"], where.under("preapproved"))
    if "acl" in values:
        acl = values["acl"]
        if not isinstance(acl, dict):
            raise where.error("acl", "must be a table of agent id = [provider or provider/tool]")
        changes["acl"] = {str(k): frozenset(_strings(v, f"acl.{k}", where)) for k, v in acl.items()}
    if "hitl_approver_roles" in values:
        roles = _strings(values["hitl_approver_roles"], "hitl_approver_roles", where)
        changes["hitl_approver_roles"] = tuple(dict.fromkeys(roles))
    if "allowlist" in values:
        entries = _strings(values["allowlist"], "allowlist", where)
        changes["allowlist"] = tuple(_checked(partial(parse_host_port, e), where) for e in entries)
    commands = _entries(values.get("commands", []), "commands", where, _command)
    seen: set[tuple[str, str]] = set()
    for i, spec in enumerate(commands):
        key = (spec.provider_id, spec.descriptor.tool_name)
        if key in seen:
            raise where.error(f"commands[{i}].name", f"{key[0]}/{key[1]} is declared twice")
        seen.add(key)
    mcp = _entries(values.get("mcp", []), "mcp", where, _mcp)
    command_providers = {s.provider_id for s in commands}
    mcp_ids = [s.provider_id for s in mcp]
    for i, provider in enumerate(mcp_ids):
        if provider in command_providers or mcp_ids.index(provider) != i:
            raise where.error(f"mcp[{i}].provider", f"provider id {provider!r} is used twice")
    return ToolSettings(commands=tuple(commands), mcp=tuple(mcp), **changes)
