"""The `apiary` command tree as its root group (`ApiaryGroup`) sets it up once built, so
that every command reads and parses the same way:

- help is plain text (no Rich markup, which took `[...]` in help texts for style tags and
  dropped them), and names values the classic way: `--coordinator HOST:PORT`,
  `--limit INTEGER`, `--json` for a flag, `send [OPTIONS] TO` (this typer shows `<str>`
  and `<bool>` tags and `{to}` braces otherwise);
- every command that calls a coordinator (it takes `--coordinator`, cli/calls.py) takes
  `--profile` too, and the hidden `--grpc`, the older spelling of `--coordinator`.
"""

from __future__ import annotations

from typing import Any, Final

import typer
import typer.main
from typer.core import TyperArgument, TyperGroup, TyperOption

from apiary.cli.calls import COORDINATOR_FLAG, OLD_COORDINATOR, PROFILE

_TYPE_WORDS: Final = {
    "str": "TEXT", "int": "INTEGER", "float": "NUMBER", "bool": "BOOLEAN", "path": "PATH",
    "file": "FILE", "directory": "DIR", "datetime": "DATETIME",
}  # fmt: skip


class _PlainOption(TyperOption):
    """An option whose value is named by its metavar, else a word for its type; a flag's
    by nothing."""

    def display_type_rich(self, ctx: Any) -> str | None:
        if self.metavar is not None:
            return self.metavar
        if self.is_flag or self.count:
            return None
        return _plain(super().display_type(ctx))


class _PlainArgument(TyperArgument):
    """An argument named in capitals (`TO`, `[TASK_ID]`, `ENTRY_IDS...`), without a type."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return None

    def get_usage_pieces(self, ctx: Any) -> list[str]:
        name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
        return [f"{name}..." if self.nargs != 1 else name]


def _plain(label: str) -> str:
    """typer's `<str>`, `<list[int]>`, `<a|b>` as TEXT, INTEGER, a|b."""
    inner = label.strip("<>")
    if inner.startswith("list[") and inner.endswith("]"):
        inner = inner[5:-1]
    return inner if "|" in inner else _TYPE_WORDS.get(inner, inner.upper())


def _client_options() -> list[Any]:
    """Fresh `--profile` and `--grpc` parameters (as typer builds them) for one command."""
    options = typer.Typer(add_completion=False)

    @options.command()
    def client(profile: str = PROFILE, old_flag: str = OLD_COORDINATOR) -> None:
        """The options that go with --coordinator."""

    return list(typer.main.get_command(options).params)


def _add_client_options(params: list[Any]) -> None:
    """`--profile` and `--grpc` beside a `--coordinator`, each unless the command has an
    option of that name already (`negotiation open --profile` is a policy profile's)."""
    taken = {name for p in params for name in getattr(p, "opts", ())}
    if COORDINATOR_FLAG in taken:
        params.extend(p for p in _client_options() if not taken.intersection(p.opts))


def _set_up(command: Any) -> None:
    """Plain help for `command` and everything under it; the client options beside each
    `--coordinator`."""
    command.rich_markup_mode = None
    params = command.params
    _add_client_options(params)
    for param in params:
        if isinstance(param, TyperArgument):
            if param.metavar is None and param.name:
                param.metavar = param.name.upper()
            param.__class__ = _PlainArgument
        elif isinstance(param, TyperOption):
            param.__class__ = _PlainOption
    for sub in getattr(command, "commands", {}).values():
        _set_up(sub)


class ApiaryGroup(TyperGroup):
    """The root group: sets up the whole tree once it is built (module docstring)."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        _set_up(self)
