"""`apiary` imports only what the command run needs (cli/command_tree.py, `Subcommand`):
`apiary --help` lists every command without loading any, a client command loads its own
module and the client, not the coordinator, the demo, the swarm peer or the other commands,
and `apiary serve --help` and `apiary demo --help` load what they would run only to run it.
Each is checked in a fresh interpreter, by the modules it imported."""

from __future__ import annotations

import subprocess
import sys

import pytest

from apiary.cli.main import SUBCOMMANDS

HEAVY = ("apiary.server.coordinator", "apiary.engine", "apiary.store", "apiary.demo",
         "apiary.swarm")  # fmt: skip
"""What no client command needs: the coordinator and its engine and store, the demo, the
swarm peer."""


def _run(*args: str) -> tuple[int, str, set[str]]:
    """`apiary ARGS` in a fresh interpreter: its exit code, output, and the apiary modules
    imported by then."""
    code = (
        "import sys\n"
        "from apiary.cli.main import app\n"
        "code = 0\n"
        "try:\n"
        f"    app({list(args)!r}, prog_name='apiary')\n"
        "except SystemExit as stop:\n"
        "    code = stop.code\n"
        "print('\\x00' + ' '.join(m for m in sys.modules if m.startswith('apiary')))\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60,
        env={"COLUMNS": "100", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    output, _, modules = done.stdout.rpartition("\x00")
    return done.returncode, output + done.stderr, set(modules.split())


def _heavy(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.startswith(HEAVY))


def test_the_top_help_lists_every_command_with_its_summary_and_loads_none() -> None:
    code, output, modules = _run("--help")
    assert code == 0, output
    for sub in SUBCOMMANDS:
        assert f"  {sub.name} " in output and sub.summary in output, sub.name
    commands = {m for m in modules if m.startswith("apiary.cli.")}
    assert commands == {"apiary.cli.main", "apiary.cli.command_tree"}
    assert _heavy(modules) == []


@pytest.mark.parametrize("group", ["task", "dlq", "hitl", "workflow", "negotiation"])
def test_a_client_command_loads_its_own_module_and_not_the_coordinator(group: str) -> None:
    code, output, modules = _run(group, "list", "--help")
    assert code == 0, output
    assert "--coordinator HOST:PORT" in output and "--profile NAME" in output
    assert f"apiary.cli.{group}" in modules
    others = {f"apiary.cli.{sub.name}" for sub in SUBCOMMANDS if sub.name != group}
    assert others & modules == set()
    assert _heavy(modules) == []


@pytest.mark.parametrize("command", ["serve", "demo"])
def test_the_help_of_the_commands_that_run_a_coordinator_loads_none(command: str) -> None:
    code, output, modules = _run(command, "--help")
    assert code == 0, output
    assert f"Usage: apiary {command} [OPTIONS]" in output and "--data-dir" in output
    assert f"apiary.cli.{command}" in modules
    assert f"apiary.cli.{command}_run" not in modules
    assert _heavy(modules) == []


def test_a_group_shows_its_summary_as_its_help() -> None:
    code, output, _ = _run("dlq", "--help")
    assert code == 0, output
    summary = next(sub.summary for sub in SUBCOMMANDS if sub.name == "dlq")
    assert summary in output and "requeue" in output


def test_a_misspelt_command_is_answered_with_the_one_meant() -> None:
    code, output, modules = _run("tsk", "list")
    assert code == 2
    assert "No such command 'tsk'. Did you mean 'task'?" in output
    assert "apiary.cli.task" not in modules
    code, output, _ = _run("nosuch")
    assert code == 2 and "No such command 'nosuch'." in output and "Did you mean" not in output
