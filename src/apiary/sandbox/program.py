"""The directories a program needs to run: its own, its interpreter's, its environment's.

A confined tool (MINIMAL, DEFAULT) sees the host's filesystem read-only, but not all of it:
the host's /tmp is replaced by a private one, and a tool running as nobody cannot pass a
directory nobody may not search (/root, mode 0700). A program installed the usual way lives in
an environment of its own (a virtual environment, a `node_modules` tree, an interpreter under
a version manager), often in exactly those places. `needed_dirs` finds that environment from
the program's path alone, so the launcher can bring it back into view, read-only:

- the program's directory, and its real location's when the program is a symlink;
- the interpreter its `#!` line names (`#!/usr/bin/env node` is looked up on PATH; pip's
  `/bin/sh` trampoline for long interpreter paths is understood), and the installation that
  interpreter belongs to (the parent of its real `bin/`: /root/.pyenv/versions/3.12.1,
  /root/.nvm/versions/node/v22.1.0);
- the virtual environment around the program or its interpreter (the directory holding
  pyvenv.cfg) and the base installation its `home` names;
- the outermost `node_modules` directory around the program (its package and dependencies).

Nothing broad is ever returned (`broad_reason`): not /, /tmp, a home directory (/root,
/home/NAME, the launcher's own), one of their ancestors, or a directory a home shares among
everything installed in it (~/.local, ~/.local/share, ~/.cache, ~/.config); a directory that
would be one of them is left out.
"""

from __future__ import annotations

import os
import re
import shutil
from typing import Final

_SHEBANG_BYTES: Final = 1024
_SHARED_IN_HOME: Final = (".local", ".local/share", ".local/state", ".cache", ".config")
_TRAMPOLINE: Final = re.compile(rb"""^'''exec' "?([^"\s]+)"? """)
"""pip's launcher when the interpreter's path is too long for a #! line:
    #!/bin/sh
    '''exec' "/very/long/path/bin/python" "$0" "$@"
"""


def needed_dirs(program: str, search_path: str) -> list[str]:
    """The directories `program` (an executable's path) needs, real paths, broad ones left out.

    `search_path` is the tool's PATH, for `#!/usr/bin/env NAME`. Reads only the program's
    first line(s) and pyvenv.cfg files; a path that cannot be read adds nothing.
    """
    found: list[str] = []
    interpreter = shebang_interpreter(program, search_path)
    # A script needs its interpreter's installation; a program that is no script is the
    # interpreter (`command = "node"`, a venv's `bin/python`).
    interpreters = [interpreter] if interpreter is not None else [program]
    for executable in [program, *interpreters]:
        found += [os.path.dirname(executable), os.path.dirname(os.path.realpath(executable))]
        if executable in interpreters:
            found += _installation(os.path.dirname(os.path.realpath(executable)))
        venv = venv_root(executable)
        if venv is not None:
            found.append(venv)
            found += _venv_home(venv)
    for path in (program, os.path.realpath(program)):
        tree = node_modules_tree(path)
        if tree is not None:
            found.append(tree)
    real = [os.path.realpath(p) for p in found if p]
    return [p for p in dict.fromkeys(real) if broad_reason(p) is None]


def shebang_interpreter(program: str, search_path: str) -> str | None:
    """The interpreter `program`'s #! line runs (through /usr/bin/env, resolved on PATH)."""
    try:
        with open(program, "rb") as file:
            head = file.read(_SHEBANG_BYTES)
    except OSError:
        return None
    if not head.startswith(b"#!"):
        return None
    first, _, rest = head[2:].partition(b"\n")
    words = first.decode(errors="replace").split()
    if not words:
        return None
    interpreter, args = words[0], words[1:]
    if os.path.basename(interpreter) == "env":
        names = [a for a in args if not a.startswith("-") and "=" not in a]
        if not names:
            return None
        return shutil.which(names[0], path=search_path)
    if os.path.basename(interpreter) == "sh":
        match = _TRAMPOLINE.match(rest)
        if match is not None:
            return match.group(1).decode(errors="replace")
    return interpreter


def venv_root(executable: str) -> str | None:
    """The virtual environment `executable` runs in: where pyvenv.cfg is, next to it or one up
    (as the interpreter itself looks), on its path as given (a venv's python is a symlink)."""
    here = os.path.dirname(os.path.abspath(executable))
    for candidate in (here, os.path.dirname(here)):
        if os.path.isfile(os.path.join(candidate, "pyvenv.cfg")):
            return candidate
    return None


def node_modules_tree(path: str) -> str | None:
    """The outermost `node_modules` directory on `path`: Node resolves a package's
    dependencies in every node_modules above it, so the whole tree is the program."""
    parts = os.path.abspath(path).split(os.sep)
    if "node_modules" not in parts[:-1]:
        return None
    return os.sep.join(parts[: parts.index("node_modules") + 1])


def expose_problem(path: str) -> str | None:
    """Why `path` cannot be exposed to a sandbox on request (SandboxSpec.expose), or None."""
    if not os.path.isabs(path):
        return "must be an absolute path"
    return broad_reason(path)


def broad_reason(path: str) -> str | None:
    """Why `path` is too broad to bring into a sandbox's view, or None."""
    path = os.path.normpath(path)
    if path == "/":
        return "/ is the whole file system"
    if path in ("/tmp", "/home"):
        return f"{path} is shared by every user"
    homes = {"/root", os.path.realpath(os.path.expanduser("~"))}
    if os.path.dirname(path) == "/home":
        homes.add(path)
    for home in homes:
        if path == home:
            return f"{path} is a home directory"
        if home.startswith(path.rstrip(os.sep) + os.sep):
            return f"{path} holds the home directory {home}"
        if path in (os.path.join(home, shared) for shared in _SHARED_IN_HOME):
            return f"{path} is shared by everything installed in {home}"
    return None


def _installation(bin_dir: str) -> list[str]:
    """The installation a `bin/` directory belongs to: its parent (lib/, share/ beside it)."""
    real = os.path.realpath(bin_dir)
    return [os.path.dirname(real)] if os.path.basename(real) == "bin" else []


def _venv_home(venv: str) -> list[str]:
    """The base installation a virtual environment was made from (pyvenv.cfg's `home`)."""
    try:
        with open(os.path.join(venv, "pyvenv.cfg")) as file:
            lines = file.read(64 * 1024).splitlines()
    except (OSError, UnicodeDecodeError):
        return []
    for line in lines:
        key, sep, value = line.partition("=")
        if sep and key.strip() == "home" and os.path.isabs(value.strip()):
            home = value.strip()
            return [home, *_installation(home)]
    return []
