"""The `apiary` command line reads the same everywhere (cli/command_tree.py): every command's
every option and argument has a description, help names values plainly (no `<str>` or
`<bool>` type tags, no `{to}` braces, nothing dropped as markup), every command that calls a
coordinator takes `--coordinator` and `--profile`, and `apiary --version` prints the
version."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from apiary import __version__
from apiary.cli.main import app

TYPE_TAG = re.compile(
    r"<(?:str|int|float|bool|path|file|directory|datetime|list\[[^>]*\]|[\w.-]+(?:\|[\w.-]+)+)>"
)
"""typer's tags for a value's type (`<str>`, `<bool>`, `<list[str]>`, `<text|json>`)."""
USAGE_BRACES = re.compile(r"\{\w+\}")
"""typer's braces around a required argument on the usage line (`{to}`)."""
CLIENT_COMMANDS_WITHOUT_COORDINATOR = {
    "apiary serve", "apiary demo", "apiary version", "apiary agent keygen",
}  # fmt: skip
"""Commands that take no coordinator address: the server itself, local files, the demo."""
LOCAL_GROUPS = ("apiary auth", "apiary certs", "apiary swarm", "apiary cluster")
"""Groups that work on local files, swarm peers or a store (`cluster`), not on a
coordinator's gRPC port."""
HTTP_GROUPS = ("apiary runtime",)
"""Groups that call a coordinator's HTTP port (`--http`), not its gRPC port."""


def _commands(command: Any, path: str) -> Iterator[tuple[str, Any]]:
    yield path, command
    if hasattr(command, "list_commands"):  # a group: its commands, the lazy ones loaded
        context = command.make_context(path, ["--help"], resilient_parsing=True)
        for name in command.list_commands(context):
            yield from _commands(command.get_command(context, name), f"{path} {name}")


ROOT = typer.main.get_command(app)
COMMANDS = list(_commands(ROOT, "apiary"))
LEAVES = [(path, c) for path, c in COMMANDS if not getattr(c, "commands", None)]
CLIENT_LEAVES = [
    (path, c) for path, c in LEAVES
    if path not in CLIENT_COMMANDS_WITHOUT_COORDINATOR
    and not path.startswith((*LOCAL_GROUPS, *HTTP_GROUPS))
]  # fmt: skip
"""The commands that call a coordinator's gRPC port."""
HTTP_LEAVES = [(path, c) for path, c in LEAVES if path.startswith(HTTP_GROUPS)]


def _help(path: str) -> str:
    result = CliRunner().invoke(app, [*path.split()[1:], "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.parametrize(("path", "command"), LEAVES, ids=[p for p, _ in LEAVES])
def test_every_option_and_argument_is_described(path: str, command: Any) -> None:
    undescribed = [
        param.name for param in command.params
        if not getattr(param, "hidden", False) and not (param.help or "").strip()
    ]  # fmt: skip
    assert not undescribed, f"{path}: no help text for {undescribed}"


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS])
def test_help_has_no_type_tags_or_braces(path: str) -> None:
    shown = _help(path)
    assert not TYPE_TAG.findall(shown), f"{path} --help shows type tags:\n{shown}"
    usage = next(line for line in shown.splitlines() if line.startswith("Usage:"))
    assert not USAGE_BRACES.findall(usage), f"{path} --help shows braces: {usage}"


def test_help_keeps_bracketed_text_and_names_values_plainly() -> None:
    shown = _help("apiary status")
    # Rich markup would have taken `[else APIARY_COORDINATOR, ...]` for a style and dropped it.
    assert "[else APIARY_COORDINATOR" in shown
    assert "--coordinator HOST:PORT" in shown and "--profile NAME" in shown
    assert re.search(r"--json\s+One JSON object", shown)  # a flag: no type named
    send = _help("apiary send")
    assert "Usage: apiary send [OPTIONS] TO" in send and "--json TEXT" in send


@pytest.mark.parametrize(("path", "command"), CLIENT_LEAVES, ids=[p for p, _ in CLIENT_LEAVES])
def test_every_client_command_takes_the_one_coordinator_option(path: str, command: Any) -> None:
    flags = {flag: p for p in command.params for flag in getattr(p, "opts", ())}
    assert "--coordinator" in flags, f"{path} has no --coordinator"
    assert flags["--grpc"].hidden, f"{path}: --grpc is the hidden older spelling"
    if path != "apiary negotiation open":  # its --profile is a policy profile's
        assert "--profile" in flags, f"{path} has no --profile"
    assert "--grpc" not in _help(path)


@pytest.mark.parametrize(("path", "command"), HTTP_LEAVES, ids=[p for p, _ in HTTP_LEAVES])
def test_every_http_client_command_takes_the_http_address_and_a_profile(
    path: str, command: Any
) -> None:
    flags = {flag for p in command.params for flag in getattr(p, "opts", ())}
    assert {"--http", "--profile"} <= flags, f"{path} lacks --http or --profile"
    assert "--coordinator" not in flags, f"{path} calls the HTTP port, not gRPC"


def test_serve_keeps_its_own_grpc_listen_address() -> None:
    shown = _help("apiary serve")
    assert "--grpc TEXT" in shown and "--coordinator" not in shown
    assert "--log-format text|json" in shown


def test_version_flag_and_command_print_the_version() -> None:
    runner = CliRunner()
    for argv in (["--version"], ["version"]):
        result = runner.invoke(app, argv)
        assert (result.exit_code, result.output.strip()) == (0, __version__)
