"""The `apiary` command tree as its root group (`ApiaryGroup`) sets it up once built, so
that every command reads and parses the same way:

- help is plain text (no Rich markup, which took `[...]` in help texts for style tags and
  dropped them), and names values the classic way: `--coordinator HOST:PORT`,
  `--limit INTEGER`, `--json` for a flag, `send [OPTIONS] TO` (this typer shows `<str>`
  and `<bool>` tags and `{to}` braces otherwise);
- every command that calls a coordinator (it takes `--coordinator`, cli/calls.py) takes
  `--profile` too, and the hidden `--grpc`, the older spelling of `--coordinator`;
- the root's commands are `Subcommand`s, each module imported only when its command runs
  or shows its help: `apiary task list` loads the task commands and the client, not the
  coordinator, the demo or the swarm peer (all of them took 2.8 s to import, before any
  command ran), and `apiary --help` lists every command from the summaries alone.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from difflib import get_close_matches
from typing import Any, ClassVar, Final

import typer
import typer.main
from typer.core import TyperArgument, TyperGroup, TyperOption

COORDINATOR_FLAG: Final = "--coordinator"

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
    # A command taking --coordinator came from a module that imported the calls already;
    # `apiary --help` and `apiary version` need neither (calls.py imports this module).
    from apiary.cli.calls import OLD_COORDINATOR, PROFILE  # noqa: PLC0415

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


@dataclass(frozen=True, slots=True)
class Subcommand:
    """A command of the root group, loaded when it is first asked for: `target` is
    `module:attribute`, a `typer.Typer` (a group of commands) or a command's function;
    `summary` is its line in `apiary --help` (and a group's help)."""

    name: str
    target: str
    summary: str

    def load(self) -> Any:
        """The command, built and set up (typer's click command)."""
        module, _, attribute = self.target.partition(":")
        found = getattr(importlib.import_module(module), attribute)
        command: Any
        if isinstance(found, typer.Typer):
            command = typer.main.get_group(found)
            command.help = self.summary
        else:
            one = typer.Typer(add_completion=False)
            one.command(self.name)(found)
            command = typer.main.get_command(one)
        command.short_help = self.summary
        _set_up(command)
        return command


class ApiaryGroup(TyperGroup):
    """The root group: its `subcommands` loaded on demand, and every command set up as
    it is built (module docstring)."""

    subcommands: ClassVar[Sequence[Subcommand]] = ()

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        _set_up(self)

    def list_commands(self, ctx: Any) -> list[str]:
        listed = [sub.name for sub in self.subcommands]
        return listed + [name for name in super().list_commands(ctx) if name not in listed]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        command: Any = super().get_command(ctx, cmd_name)
        if command is None:
            sub = next((s for s in self.subcommands if s.name == cmd_name), None)
            if sub is not None:
                command = sub.load()
                self.add_command(command, cmd_name)
        return command

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        """typer's, with its suggestion for a misspelt command made from every command's
        name (typer's own looks at the loaded ones only)."""
        typo = args[0] if args else ""
        if typo and not typo.startswith("-") and self.get_command(ctx, typo) is None:
            matches = get_close_matches(typo, self.list_commands(ctx))
            if matches:
                names = ", ".join(map(repr, matches))
                ctx.fail(f"No such command {typo!r}. Did you mean {names}?")
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        """Every command with its summary, none of them loaded to list it."""
        summaries = {sub.name: sub.summary for sub in self.subcommands}
        rows = []
        for name in self.list_commands(ctx):
            if name in summaries:
                rows.append((name, summaries[name]))
            elif (command := self.get_command(ctx, name)) is not None and not command.hidden:
                rows.append((name, command.get_short_help_str()))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
