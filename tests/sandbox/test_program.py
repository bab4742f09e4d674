"""What the sandbox brings into view for a program: its interpreter and environment, no more.

Fake installations on disk (files with the right names and #! lines), nothing executed; the
real-process tests are tests/server/test_mcp_environments.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from apiary.core.tools.policy import ExecutionPolicy
from apiary.errors import PermissionDeniedError, ValidationError
from apiary.sandbox import Outcome, SandboxSpec, mounts, run, wrap_argv
from apiary.sandbox.plan import LaunchPlan
from apiary.sandbox.program import expose_problem, needed_dirs, shebang_interpreter
from tests.sandbox.conftest import python, requires_root


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A home directory of the test's own, so that the launcher's home is known."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def executable(path: Path, text: str = "\x7fELF") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def venv(root: Path, base: Path) -> Path:
    """A virtual environment made from the installation `base` (as `python -m venv` does)."""
    interpreter = executable(base / "bin" / "python3.12")
    (root / "bin").mkdir(parents=True)
    (root / "bin" / "python").symlink_to(interpreter)
    (root / "lib" / "python3.12" / "site-packages").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text(f"home = {base / 'bin'}\nversion = 3.12.1\n")
    return root


def test_a_console_script_needs_its_venv_and_the_base_python(tmp_path: Path) -> None:
    base = tmp_path / "pythons" / "3.12.1"
    env = venv(tmp_path / "servers" / "git", base)
    script = executable(env / "bin" / "mcp-server-git", f"#!{env}/bin/python\nimport x\n")
    (tmp_path / "servers" / "secrets").mkdir()

    found = needed_dirs(str(script), "/usr/bin")

    assert set(found) == {str(env), str(env / "bin"), str(base), str(base / "bin")}


def test_a_script_symlinked_onto_path_is_followed_to_its_environment(tmp_path: Path) -> None:
    # `uv tool install` and pipx: ~/.local/bin/NAME -> ~/.local/share/.../NAME/bin/NAME.
    base = tmp_path / "uv" / "python" / "cpython-3.12"
    env = venv(tmp_path / "uv" / "tools" / "mcp-server-git", base)
    script = executable(env / "bin" / "mcp-server-git", f"#!{env}/bin/python\n")
    on_path = tmp_path / "local" / "bin" / "mcp-server-git"
    on_path.parent.mkdir(parents=True)
    on_path.symlink_to(script)

    found = needed_dirs(str(on_path), "/usr/bin")

    assert str(env) in found and str(base) in found
    assert str(on_path.parent) in found  # where the symlink itself is


def test_env_shebangs_are_looked_up_on_the_tools_path(tmp_path: Path) -> None:
    node = executable(tmp_path / "nvm" / "versions" / "node" / "v22.1.0" / "bin" / "node")
    package = tmp_path / "app" / "node_modules" / "@scope" / "server"
    entry = executable(package / "dist" / "index.js", "#!/usr/bin/env -S node --no-warnings\n")
    bin_link = tmp_path / "app" / "node_modules" / ".bin" / "mcp-server"
    bin_link.parent.mkdir()
    bin_link.symlink_to(os.path.relpath(entry, bin_link.parent))

    assert shebang_interpreter(str(bin_link), str(node.parent)) == str(node)
    found = needed_dirs(str(bin_link), str(node.parent))

    assert str(tmp_path / "app" / "node_modules") in found  # the package and its dependencies
    assert str(node.parent.parent) in found  # the Node.js installation
    assert str(tmp_path / "app") not in found
    assert needed_dirs(str(bin_link), "/nowhere") == [  # no node on PATH: only the package
        str(bin_link.parent), str(entry.parent), str(tmp_path / "app" / "node_modules"),
    ]  # fmt: skip


def test_pips_trampoline_for_long_interpreter_paths(tmp_path: Path) -> None:
    env = venv(tmp_path / ("deep" * 40) / "env", tmp_path / "base")
    python = f"{env}/bin/python"
    script = executable(
        env / "bin" / "server", f"#!/bin/sh\n'''exec' \"{python}\" \"$0\" \"$@\"\n' '''\n"
    )
    assert shebang_interpreter(str(script), "/usr/bin") == python
    assert str(env) in needed_dirs(str(script), "/usr/bin")


def test_an_interpreter_given_as_the_command_brings_its_installation(tmp_path: Path) -> None:
    base = tmp_path / "pythons" / "3.12.1"
    env = venv(tmp_path / "env", base)
    found = needed_dirs(str(env / "bin" / "python"), "/usr/bin")
    assert {str(env), str(base)} <= set(found)


def test_nothing_broad_is_ever_brought_into_view(home: Path) -> None:
    # An interpreter right in the home directory, another in ~/.local/bin, a script in ~:
    # their directories would be the home, or a directory every program of it shares.
    in_home = executable(home / "bin" / "python")
    in_local = executable(home / ".local" / "bin" / "node")
    script = executable(home / "tool", f"#!{in_local}\n")

    assert needed_dirs(str(in_home), "/usr/bin") == [str(home / "bin")]
    assert needed_dirs(str(script), "/usr/bin") == [str(home / ".local" / "bin")]


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("relative/dir", "must be an absolute path"),
        ("/", "is the whole file system"),
        ("/tmp", "is shared by every user"),
        ("/home", "is shared by every user"),
        ("/root", "is a home directory"),
        ("/home/someone", "is a home directory"),
        ("HOME", "is a home directory"),
        ("HOME/..", "holds the home directory"),
        ("HOME/.cache", "is shared by everything installed in"),
        ("HOME/.local/share/", "is shared by everything installed in"),
    ],
)
def test_exposing_a_broad_directory_is_refused(home: Path, path: str, problem: str) -> None:
    path = path.replace("HOME", str(home))
    reason = expose_problem(path)
    assert reason is not None and problem in reason
    with pytest.raises(ValidationError) as caught:
        wrap_argv(["server"], ExecutionPolicy(), expose=[path])
    assert caught.value.details == {"field": "expose", "path": path}


def test_exposed_directories_travel_in_the_plan(home: Path) -> None:
    argv = wrap_argv(["server"], ExecutionPolicy(), expose=[f"{home}/.cache/uv", "/opt/x"])
    assert LaunchPlan.decode(argv[3]).expose == (f"{home}/.cache/uv", "/opt/x")
    assert expose_problem(f"{home}/.cache/uv") is None


@requires_root
async def test_an_exposed_directory_that_is_missing_fails_the_start(tmp_path: Path) -> None:
    missing = str(tmp_path / "not-there")
    result = await run(SandboxSpec(python("print('ran')"), ExecutionPolicy(), expose=(missing,)))
    assert result.outcome is Outcome.SPAWN_FAILED
    assert result.stdout == b""
    assert result.stderr.decode() == f"expose: {missing}: no such directory"


@requires_root
async def test_an_exposed_symlink_to_a_home_is_refused_where_it_leads(tmp_path: Path) -> None:
    link = tmp_path / "innocent"
    link.symlink_to("/root")
    with pytest.raises(PermissionDeniedError) as caught:
        await run(SandboxSpec(python("print('ran')"), ExecutionPolicy(), expose=(str(link),)))
    assert caught.value.message == f"expose: {link}: /root is a home directory"


def test_only_the_outermost_directories_are_attached() -> None:
    paths = ["/a/venv/bin", "/a/venv", "/a/venvs", "/b", "/a/venv"]
    assert mounts.outermost(paths) == ["/a/venv", "/a/venvs", "/b"]
