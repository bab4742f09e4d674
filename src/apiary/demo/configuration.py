"""The demo coordinator's configuration, written as an ordinary `apiary.toml` in the run's
directory, so that `apiary serve --config DIR/apiary.toml` reopens the run with the same
repository, tools and operator.

What it declares:

- `[[worktrees.repos]]`: the run's repository (`shop`);
- `[[tools.commands]]`: `pytest`, `ruff_check` and `ruff_fix` (provider `dev`: run in the
  caller's worktree, in the sandbox at privilege DEFAULT, no network: the worktree is mounted
  noexec, so they run as `python -m ...` with this interpreter), and `git_merge` (provider
  `git`: merges a commit into the repository's main branch; PRIVILEGED, so every call waits
  for a HITL decision);
- `[[tools.mcp]]`: the MCP time server (`mcp_server_time`), started by the coordinator's
  MCP bridge;
- `[[hitl.operators]]`: the one operator who decides the merge (the person at the terminal,
  or `demo-operator`), by the SHA-256 of a token kept in `DIR/operator-token` (the demo's
  operator authenticates by its client certificate, which names the same roles);
- the secure mode (DESIGN.md section 9): TLS on both ports with the run's own CA
  (`tls_cert`, `tls_key`, and `tls_client_ca`: every client presents a certificate, mTLS),
  `[auth] secure = true` (default-deny authorization, every call a principal's) and
  `[router] signing_required = true` (every agent registers an Ed25519 key and signs every
  envelope), so that `apiary serve --config` reopens the run in secure mode too.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from apiary.demo.sample_repo import GIT_ENV, PYTEST_ARGS, REPO_ID, RUFF_ARGS, TOOL_ENV

CONFIG_FILE = "apiary.toml"
TOKEN_FILE = "operator-token"
DEMO_OPERATOR = "demo-operator"
ROOM_POLICY = "demo-review-v1"
OPERATOR_ROLES = ("release_manager",)
"""The roles of the operator who decides the merge."""


def _q(value: str) -> str:
    """A TOML basic string (JSON's escapes are TOML's)."""
    return json.dumps(value)


def _list(values: Sequence[str]) -> str:
    return "[" + ", ".join(_q(v) for v in values) + "]"


def _table(values: dict[str, str]) -> str:
    return "{ " + ", ".join(f"{k} = {_q(v)}" for k, v in values.items()) + " }"


def _command(
    provider: str,
    name: str,
    argv: Sequence[str],
    description: str,
    env: dict[str, str],
    policy: str,
    *,
    needs_worktree: bool = True,
    side_effects: str = "read_only",
    idempotent: bool = True,
    input_schema: str = '{"type": "object"}',
) -> str:
    return f"""
[[tools.commands]]
provider = {_q(provider)}
name = {_q(name)}
argv = {_list(argv)}
description = {_q(description)}
input_schema = {_q(input_schema)}
idempotent = {str(idempotent).lower()}
needs_worktree = {str(needs_worktree).lower()}
side_effects = {_q(side_effects)}
stdin = "none"
timeout_s = 120
env = {_table(env)}
[tools.commands.policy]
privilege_level = {_q(policy)}
network_policy = "DENY_ALL"
budget_wall_ms = 120000
"""


@dataclass(frozen=True, slots=True)
class ServerTls:
    """The coordinator's TLS files: its certificate and key, and the CA its clients'
    certificates must come from."""

    cert: Path
    key: Path
    client_ca: Path


def config_text(data_dir: Path, repo: Path, operator: str, token: str, tls: ServerTls) -> str:
    """The TOML configuration of one run."""
    python = sys.executable
    base_env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "LANG": "C.UTF-8",
        "HOME": "/tmp",
    }
    tool_env = {**base_env, **TOOL_ENV}
    merge_schema = json.dumps(
        {
            "type": "object",
            "required": ["commit", "message"],
            "additionalProperties": False,
            "properties": {
                "commit": {"type": "string", "pattern": "^[0-9a-f]{40}$"},
                "message": {"type": "string", "minLength": 1, "maxLength": 300},
            },
        }
    )
    git = shutil.which("git") or "git"
    digest = hashlib.sha256(token.encode()).hexdigest()
    return f"""\
# Written by `apiary demo`: `apiary serve --config {data_dir / CONFIG_FILE}` reopens this run.
[server]
data_dir = {_q(str(data_dir))}
log_level = "WARNING"
tls_cert = {_q(str(tls.cert))}
tls_key = {_q(str(tls.key))}
tls_client_ca = {_q(str(tls.client_ca))}   # mTLS: every client presents a certificate

[auth]
secure = true                     # default deny: every call needs a principal

[router]
signing_required = true           # every envelope carries its agent's Ed25519 signature

[hitl]
timeout_s = 1800                  # the merge waits for a person this long, then is denied
timeout_action = "DENY"

[[hitl.operators]]
name = {_q(operator)}
token_sha256 = {_q(digest)}       # the token is in {TOKEN_FILE}
roles = {_list(OPERATOR_ROLES)}

[tools]
hitl_approver_roles = {_list(OPERATOR_ROLES)}   # only they approve a privileged tool call

[rooms]
version = {_q(ROOM_POLICY)}
vote_timeout_s = 300

[[worktrees.repos]]
id = {_q(REPO_ID)}
path = {_q(str(repo))}
{
        _command(
            "dev",
            "pytest",
            [python, *PYTEST_ARGS],
            "Run the test suite in the caller's worktree.",
            tool_env,
            "DEFAULT",
        )
    }
{
        _command(
            "dev",
            "ruff_check",
            [python, *RUFF_ARGS],
            "Lint the caller's worktree with ruff; findings as JSON.",
            tool_env,
            "DEFAULT",
        )
    }
{
        _command(
            "dev",
            "ruff_fix",
            [python, *RUFF_ARGS[:4], "--fix", *RUFF_ARGS[4:]],
            "Apply ruff's safe fixes in the caller's worktree; the findings left, as JSON.",
            tool_env,
            "DEFAULT",
            side_effects="filesystem",
            idempotent=False,
        )
    }
{
        _command(
            "git",
            "git_merge",
            [git, "-C", str(repo), "merge", "--no-ff", "-m", "{message}", "{commit}"],
            "Merge a commit into the repository's main branch.",
            {**base_env, **GIT_ENV, "GIT_AUTHOR_NAME": "merger", "GIT_COMMITTER_NAME": "merger"},
            "PRIVILEGED",
            needs_worktree=False,
            side_effects="filesystem",
            idempotent=False,
            input_schema=merge_schema,
        )
    }
[[tools.mcp]]
provider = "time"
command = {_q(python)}
args = ["-m", "mcp_server_time", "--local-timezone", "UTC"]
startup_timeout_s = 30
"""


NEEDED_MODULES = {"pytest": "pytest", "ruff": "ruff", "mcp_server_time": "mcp-server-time"}
"""What the run's tools run, as modules of this interpreter (`make demo` installs them)."""


def missing_tools() -> list[str]:
    """The distributions the run's tools need and this interpreter lacks."""
    return [dist for module, dist in NEEDED_MODULES.items() if find_spec(module) is None]


def write_config(data_dir: Path, repo: Path, operator: str, tls: ServerTls) -> Path:
    """Write the run's configuration and its operator's token (for `apiary hitl --token`);
    the configuration file."""
    token = secrets.token_urlsafe(24)
    token_file = data_dir / TOKEN_FILE
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    config_file = data_dir / CONFIG_FILE
    config_file.write_text(config_text(data_dir, repo, operator, token, tls))
    return config_file
