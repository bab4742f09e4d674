"""The [tools] table of the configuration file: providers, policies, pre-approval, errors."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from apiary.core.tools.policy import HostPort, NetworkPolicy, PrivilegeLevel
from apiary.engine.tools.mcp_bridge import McpServerSpec
from apiary.errors import ValidationError
from apiary.server.config.loader import load_config
from apiary.server.config.tools import tool_settings

TOML = """
[tools]
max_retries = 3
cancel_grace_s = 1.5
allowlist = ["api.example.com:443"]

[tools.preapproved]
ELEVATED = ["fs", "git/push"]
FULL_ACCESS = ["web"]

[[tools.commands]]
provider = "fs"
name = "read"
argv = ["cat", "--", "{path}"]
input_schema = '{"type": "object", "required": ["path"]}'
idempotent = true
needs_worktree = true
timeout_s = 10
side_effects = "filesystem"
stdin = "none"
env = { LANG = "C.UTF-8" }
[tools.commands.policy]
privilege_level = "default"
network_policy = "egress_restricted"
allowlist = ["pypi.org:443"]
budget_wall_ms = 2000

[[tools.mcp]]
provider = "time"
command = "mcp-server-time"
args = ["--local-timezone", "UTC"]
startup_timeout_s = 5
"""


def test_the_tools_table(tmp_path: Path) -> None:
    file = tmp_path / "apiary.toml"
    file.write_text(TOML)
    tools = load_config(file, {}, {}).tools
    assert (tools.max_retries, tools.cancel_grace_s) == (3, 1.5)
    assert tools.allowlist == (HostPort("api.example.com", 443),)
    assert tools.preapproved == {
        "ELEVATED": frozenset({"fs", "git/push"}), "FULL_ACCESS": frozenset({"web"}),
    }  # fmt: skip
    (read,) = tools.commands
    assert (read.provider_id, read.argv, read.stdin) == ("fs", ("cat", "--", "{path}"), "none")
    assert read.env == {"LANG": "C.UTF-8"}
    d = read.descriptor
    assert (d.tool_name, d.idempotent, d.needs_worktree, d.default_timeout_s) == (
        "read", True, True, 10,
    )  # fmt: skip
    assert d.side_effects == "filesystem"
    policy = read.policy
    assert (policy.privilege, policy.network) == (PrivilegeLevel.DEFAULT,
                                                  NetworkPolicy.EGRESS_RESTRICTED)  # fmt: skip
    assert (policy.budget_wall_ms, policy.allowlist) == (2000, (HostPort("pypi.org", 443),))
    (time,) = tools.mcp
    assert (time.provider_id, time.command, time.args) == (
        "time", "mcp-server-time", ("--local-timezone", "UTC"),
    )  # fmt: skip
    assert (time.startup_timeout_s, time.source) == (5.0, "config")
    assert load_config(None, {}, {}).tools.commands == ()


def command(**fields: Any) -> dict[str, Any]:
    return {"provider": "p", "name": "t", "argv": ["true"], **fields}


@pytest.mark.parametrize(
    ("table", "field"),
    [
        ({"max_retries": -1}, "tools.max_retries"),
        ({"colour": "blue"}, "tools.colour"),
        ({"preapproved": {"ROOT": ["x"]}}, "tools.preapproved.ROOT"),
        ({"preapproved": {"ELEVATED": "fs"}}, "tools.preapproved.ELEVATED"),
        ({"allowlist": ["host:http"]}, "tools.allowlist"),
        ({"commands": {"provider": "p"}}, "tools.commands"),
        ({"commands": [{"name": "t", "argv": ["x"]}]}, "tools.commands[0].provider"),
        ({"commands": [command(argv=[])]}, "tools.commands[0].argv"),
        ({"commands": [command(argv=["x", "{a.b}"])]}, "tools.commands[0].argv"),
        ({"commands": [command(input_schema="{")]}, "tools.commands[0].input_schema"),
        ({"commands": [command(name="bad name")]}, "tools.commands[0].tool_name"),
        ({"commands": [command(stdin="file")]}, "tools.commands[0].stdin"),
        ({"commands": [command(policy={"network_policy": "OPEN"})]},
         "tools.commands[0].policy.network_policy"),
        ({"commands": [command(policy={"privilege_level": "root"})]},
         "tools.commands[0].policy.privilege_level"),
        ({"commands": [command(policy={"cpu": 1})]}, "tools.commands[0].policy.cpu"),
        ({"commands": [command(), command()]}, "tools.commands[1].name"),
        ({"mcp": [{"provider": "m"}]}, "tools.mcp[0].command"),
        ({"mcp": [{"provider": "m", "command": "x", "args": "y"}]}, "tools.mcp[0].args"),
        ({"commands": [command(provider="m")], "mcp": [{"provider": "m", "command": "x"}]},
         "tools.mcp[0].provider"),
        ({"mcp": [{"provider": "m", "command": "x", "expose": "/opt"}]}, "tools.mcp[0].expose"),
        ({"mcp": [{"provider": "m", "command": "x", "expose": ["/opt", "cache"]}]},
         "tools.mcp[0].expose[1]"),
        ({"mcp": [{"provider": "m", "command": "x", "expose": ["/"]}]}, "tools.mcp[0].expose[0]"),
        ({"mcp": [{"provider": "m", "command": "x", "expose": ["~"]}]}, "tools.mcp[0].expose[0]"),
        ({"mcp": [{"provider": "m", "command": "x", "expose": ["/root"]}]},
         "tools.mcp[0].expose[0]"),
        ({"mcp": [{"provider": "m", "command": "x", "expose": ["~/.cache/"]}]},
         "tools.mcp[0].expose[0]"),
    ],
)  # fmt: skip
def test_errors_name_the_setting(table: dict[str, Any], field: str) -> None:
    with pytest.raises(ValidationError) as caught:
        tool_settings(table, "apiary.toml [tools]")
    assert caught.value.details["field"] == field
    assert caught.value.message.startswith(f"apiary.toml [tools]: {field}: ")


def test_mcp_servers_expose_directories_read_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/coordinator")
    table = {"mcp": [{
        "provider": "git", "command": "uvx", "args": ["mcp-server-git"],
        "expose": ["~/.cache/uv", "/opt/models/", "/opt/models"],
    }]}  # fmt: skip
    (git,) = tool_settings(table, "t").mcp
    assert git.expose == ("/home/coordinator/.cache/uv", "/opt/models")
    assert McpServerSpec.from_config("git", git.config()).expose == git.expose
    assert tool_settings({"mcp": [{"provider": "m", "command": "x"}]}, "t").mcp[0].expose == ()


def test_approver_roles_of_escalations_are_a_list_of_role_names() -> None:
    settings = tool_settings({"hitl_approver_roles": ["release", "release", "ops"]}, "t")
    assert settings.hitl_approver_roles == ("release", "ops")
    with pytest.raises(ValidationError) as caught:
        tool_settings({"hitl_approver_roles": "release"}, "t")
    assert caught.value.details["field"] == "tools.hitl_approver_roles"


def test_a_command_may_keep_its_input_open() -> None:
    settings = tool_settings({"commands": [command(stdin="stream")]}, "apiary.toml [tools]")
    assert settings.commands[0].stdin == "stream"
    with pytest.raises(ValidationError, match="'args', 'none' or 'stream'"):
        tool_settings({"commands": [command(stdin="pty")]}, "apiary.toml [tools]")
