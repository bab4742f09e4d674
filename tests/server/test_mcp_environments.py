"""MCP servers installed the usual way, in environments of their own, under the DEFAULT sandbox.

Real processes end to end: a `[[tools.mcp]]` configuration, the coordinator, the official MCP
SDK's stdio client, the sandbox's launcher, and the server:

- a Python server installed in a virtual environment of its own (made here with
  `python -m venv`; the server uses the standard library only), under the host's /tmp and under
  a directory only root may enter: the sandbox must bring the venv and its base Python back into
  view, and nothing beside them;
- a Node.js server from the npm registry (`@modelcontextprotocol/server-everything`), installed
  with npm into a cache the tests reuse (~/.cache/apiary-tests/npm, keyed by version), started
  from its `node_modules/.bin`. Without node, npm or the registry it is skipped, except in CI
  (CI=true), where that fails.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NoReturn

import grpc
import pytest

from apiary.engine.assembly import Runtime
from apiary.engine.tools.mcp_bridge import McpProvider
from apiary.errors import UnavailableError
from apiary.sandbox.plan import NOBODY
from apiary.sdk.tools import ToolClient
from apiary.server.config.tools import tool_settings
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from tests.sandbox.conftest import requires_root

pytestmark = requires_root

WAIT_S = 30
EVERYTHING = "@modelcontextprotocol/server-everything"
EVERYTHING_VERSION = "2026.8.31"
NPM_CACHE = Path.home() / ".cache" / "apiary-tests" / "npm"

SERVER_MODULE = '''"""A stdio MCP server in the standard library, enough for a client."""
import json, os, sys

TOOLS = [
    {"name": "whoami", "description": "Where and as whom the server runs.",
     "inputSchema": {"type": "object", "properties": {}},
     "annotations": {"readOnlyHint": True}},
    {"name": "peek", "description": "Whether a path exists here, and what a directory holds.",
     "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}},
                     "required": ["path"]},
     "annotations": {"readOnlyHint": True}},
]


def call(name, args):
    if name == "whoami":
        return {"prefix": sys.prefix, "base_prefix": sys.base_prefix, "module": __file__,
                "uid": os.getuid()}
    path = args["path"]
    return {"exists": os.path.exists(path),
            "listing": sorted(os.listdir(path)) if os.path.isdir(path) else None}


def answer(message):
    method = message.get("method")
    if method == "initialize":
        return {"protocolVersion": message["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "venv-probe", "version": "1.0"}}
    if method == "tools/list":
        return {"tools": TOOLS}
    if method == "tools/call":
        params = message["params"]
        found = call(params["name"], params.get("arguments") or {})
        return {"content": [{"type": "text", "text": json.dumps(found)}],
                "structuredContent": found}
    if method == "ping":
        return {}
    return None


def main():
    for line in sys.stdin:
        message = json.loads(line)
        if "id" not in message:
            continue
        result = answer(message)
        if result is None:
            reply = {"jsonrpc": "2.0", "id": message["id"],
                     "error": {"code": -32601, "message": "method not found"}}
        else:
            reply = {"jsonrpc": "2.0", "id": message["id"], "result": result}
        sys.stdout.write(json.dumps(reply) + "\\n")
        sys.stdout.flush()
    return 0
'''


def install_in_a_venv(root: Path) -> Path:
    """A virtual environment of this Python at `root` with the probe server installed as pip
    installs a package: the module in site-packages, a console script in bin/. Returns it."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    scheme = sysconfig.get_paths(vars={"base": str(root), "platbase": str(root)})
    Path(scheme["purelib"], "venv_probe.py").write_text(SERVER_MODULE)
    python = root / "bin" / "python"
    # pip's console script; its /bin/sh trampoline when the path is too long for a #! line.
    if len(f"#!{python}") <= 127:
        head = f"#!{python}\n"
    else:
        head = f"#!/bin/sh\n'''exec' \"{python}\" \"$0\" \"$@\"\n' '''\n"
    script = root / "bin" / "venv-probe"
    script.write_text(head + "import sys\nfrom venv_probe import main\nsys.exit(main())\n")
    script.chmod(0o755)
    return script


@pytest.fixture
def root_only_dir() -> Iterator[Path]:
    """A directory only root may enter, outside /tmp (so only the uid hides it)."""
    path = Path(tempfile.mkdtemp(prefix="apiary-mcp-", dir="/var/tmp"))
    assert path.stat().st_mode & 0o777 == 0o700
    yield path
    shutil.rmtree(path, ignore_errors=True)


def settings(provider: str, command: Path, **extra: Any) -> dict[str, Any]:
    """The [tools] table of a configuration file with one MCP server at DEFAULT."""
    server = {"provider": provider, "command": str(command), "startup_timeout_s": WAIT_S,
              "policy": {"privilege_level": "DEFAULT"}, **extra}  # fmt: skip
    return {"mcp_health_interval_s": 0.5, "mcp": [server]}


@asynccontextmanager
async def serving(tmp_path: Path, tools: dict[str, Any]) -> AsyncIterator[ToolClient]:
    runtime = Runtime(tools=tool_settings(tools, "apiary.toml [tools]"))
    data = tmp_path / "data"
    async with open_test_coordinator(data, runtime=runtime) as coordinator:
        for spec in runtime.tools.mcp if runtime.tools else ():
            try:
                await provider(coordinator, spec.provider_id).wait_ready(WAIT_S)
            except UnavailableError as exc:
                log = data / "logs" / f"mcp-{spec.provider_id}.log"
                stderr = log.read_text()[-2000:] if log.exists() else "(no log)"
                pytest.fail(f"{exc.message}\nthe server's standard error:\n{stderr}")
        async with grpc.aio.insecure_channel(str(coordinator.grpc_address)) as channel:
            yield ToolClient(channel)


def provider(coordinator: Coordinator, provider_id: str) -> McpProvider:
    assert coordinator.tools is not None
    entry = coordinator.tools.catalog.get(provider_id)
    assert entry is not None and isinstance(entry.provider, McpProvider)
    return entry.provider


@pytest.mark.parametrize("where", ["tmp", "root-only"])
async def test_a_python_server_in_its_own_venv_runs_at_default(
    tmp_path: Path, root_only_dir: Path, where: str
) -> None:
    # Under /tmp the private /tmp of the sandbox hides it (and pytest's /tmp/pytest-of-root is
    # root-only too); under /var/tmp only the directory's mode does.
    home = tmp_path if where == "tmp" else root_only_dir
    venv = home / "servers" / "probe"
    script = install_in_a_venv(venv)
    secret = home / "servers" / "other"
    secret.mkdir()
    (secret / "token").write_text("not for the server")

    async with serving(tmp_path, settings("probe", script)) as client:
        (info,) = await client.providers("probe")
        assert (info.kind, info.state) == ("mcp", "READY")
        assert sorted(t.descriptor.tool_name for t in info.tools) == ["peek", "whoami"]
        me = (await client.call("whoami", {}, provider_id="probe")).json()
        sibling = (await client.call("peek", {"path": str(secret)}, provider_id="probe")).json()
        servers = (await client.call("peek", {"path": str(venv.parent)})).json()
        root = (await client.call("peek", {"path": "/root"})).json()

    # The server runs as nobody, in its own environment: the venv and its base Python.
    assert me["uid"] == NOBODY
    assert me["prefix"] == str(venv.resolve())
    assert me["base_prefix"] == sys.base_prefix
    assert Path(me["module"]).is_relative_to(venv.resolve())
    # Least privilege: the venv's neighbours stay hidden, and of /root (where this Python
    # lives) only the interpreter's tree is there.
    assert sibling == {"exists": False, "listing": None}
    assert servers["listing"] == ["probe"]
    if sys.base_prefix.startswith("/root/"):
        assert root["listing"] == [sys.base_prefix.split("/")[2]]


async def test_exposed_directories_are_read_only_and_nothing_more(
    tmp_path: Path, root_only_dir: Path
) -> None:
    # What the server needs beyond its environment (data, a cache), named in `expose`.
    script = install_in_a_venv(tmp_path / "venv")
    data = root_only_dir / "data"
    data.mkdir()
    (data / "model.bin").write_text("weights")
    (root_only_dir / "private").mkdir()

    tools = settings("probe", script, expose=[str(data)])
    async with serving(tmp_path, tools) as client:
        shown = (await client.call("peek", {"path": str(data)})).json()
        hidden = (await client.call("peek", {"path": str(root_only_dir / "private")})).json()

    assert shown == {"exists": True, "listing": ["model.bin"]}
    assert hidden == {"exists": False, "listing": None}


@pytest.fixture(scope="session")
def everything_server() -> Path:
    """`mcp-server-everything` from the npm registry, installed once per version and reused."""
    target = NPM_CACHE / f"server-everything-{EVERYTHING_VERSION}"
    program = target / "node_modules" / ".bin" / "mcp-server-everything"
    if shutil.which("node") is None:
        unavailable("node is not installed")
    if program.exists():
        return program
    npm = shutil.which("npm")
    if npm is None:
        unavailable("npm is not installed")
    NPM_CACHE.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=NPM_CACHE))
    spec = f"{EVERYTHING}@{EVERYTHING_VERSION}"
    try:
        done = subprocess.run(
            [npm, "install", "--prefix", str(staging), "--no-audit", "--no-fund", spec],
            capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        shutil.rmtree(staging, ignore_errors=True)
        unavailable(f"npm install {spec} took more than 600 s")
    if done.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        unavailable(f"npm install {spec} failed: {done.stderr.strip()[-500:]}")
    staging.chmod(0o755)
    try:
        staging.rename(target)
    except OSError:  # another session installed it meanwhile
        shutil.rmtree(staging, ignore_errors=True)
    assert program.exists(), f"npm installed {spec} without bin/mcp-server-everything"
    return program


def unavailable(reason: str) -> NoReturn:
    """Skip locally; in CI a missing Node.js toolchain or registry is a failure."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the Node.js MCP server test cannot run: {reason}")
    pytest.skip(reason)


async def test_a_node_server_from_npm_runs_at_default(
    tmp_path: Path, everything_server: Path
) -> None:
    async with serving(tmp_path, settings("everything", everything_server)) as client:
        (info,) = await client.providers("everything")
        names = {t.descriptor.tool_name for t in info.tools}
        echoed = await client.call("echo", {"message": "hello sandbox"}, provider_id="everything")
        summed = await client.call("get-sum", {"a": 2, "b": 3}, provider_id="everything")

    assert info.state == "READY"
    assert {"echo", "get-sum"} <= names
    assert (echoed.content_type, echoed.text()) == ("text/plain", "Echo: hello sandbox")
    assert "5" in summed.text()
