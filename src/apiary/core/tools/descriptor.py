"""MCP-like tool descriptors (RFC 18, 18.1) and the providers that offer them.

A `ToolDescriptor` mirrors `sw4rm.connector.ToolDescriptor` plus a human description (MCP's
`description`, kept by Apiary for listings). `validate_tools` is the registration rule every
provider passes, whatever its kind:

- `tool_name`: 1-128 characters of letters, digits, `_ . -` (MCP's tool-name alphabet), unique
  within the provider.
- `input_schema`, `output_schema`: empty, or a JSON Schema document (an object or a boolean)
  that the JSON Schema meta-schema it declares (`$schema`; draft 2020-12 by default) accepts.
  A URL is not a schema: the coordinator validates arguments itself and fetches nothing.
  The text is read by `core.json_reader` (at most `document_bytes`, nesting `json_depth`).
- `side_effects`: the side-effect classes, comma-separated (`none`, `read_only`, `filesystem`,
  `network`, `process`, `gpu`, or any other lower-case name); `none` stands alone.

Errors are ValidationError naming the field, with `details["tool_name"]` and
`details["index"]` (the tool's position in the request).

The capability requirements a descriptor states (RFC 18.1: filesystem, network egress,
process spawn, GPU...) are its side-effect classes and, for `needs_worktree`, `worktree`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Final

from jsonschema import SchemaError
from jsonschema.validators import validator_for

from apiary.core.json_reader import read_document
from apiary.errors import ValidationError

MAX_TOOL_NAME_LENGTH: Final = 128
MAX_TOOLS_PER_PROVIDER: Final = 1000
MAX_PROVIDER_ID_LENGTH: Final = 128
_TOOL_NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")
_PROVIDER_ID: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@-]*")
_EFFECT: Final = re.compile(r"[a-z][a-z0-9_-]*")
NO_SIDE_EFFECTS: Final = "none"
KNOWN_SIDE_EFFECTS: Final = ("none", "read_only", "filesystem", "network", "process", "gpu")
"""The classes Apiary's docs describe; other lower-case names are accepted as they are."""
WORKTREE_CAPABILITY: Final = "worktree"


class ProviderKind(StrEnum):
    """Where a provider's tools run."""

    AGENT = "agent"
    """A registered agent answers TOOL_CALL envelopes routed to it."""
    COMMAND = "command"
    """Commands declared in the configuration, run in the sandbox."""
    MCP = "mcp"
    """An MCP stdio server the coordinator starts and bridges."""


@dataclass(frozen=True, slots=True)
class ToolDescriptor:
    """One tool's metadata and schemas (connector.proto ToolDescriptor + a description)."""

    tool_name: str
    input_schema: str = ""
    """JSON Schema text for the arguments; empty: any arguments."""
    output_schema: str = ""
    """JSON Schema text for the result; empty: any result."""
    idempotent: bool = False
    needs_worktree: bool = False
    default_timeout_s: int = 0
    max_concurrency: int = 0
    """Calls of this tool running at once; 0: no limit."""
    side_effects: str = ""
    description: str = ""

    @property
    def effect_classes(self) -> tuple[str, ...]:
        return tuple(e for e in (p.strip() for p in self.side_effects.split(",")) if e)

    @property
    def capabilities(self) -> tuple[str, ...]:
        """The capability requirements: side-effect classes (not `none`) and `worktree`."""
        found = [e for e in self.effect_classes if e != NO_SIDE_EFFECTS]
        if self.needs_worktree:
            found.append(WORKTREE_CAPABILITY)
        return tuple(found)


@dataclass(frozen=True, slots=True)
class ToolProviderRecord:
    """A provider and its tools, as stored (the `tools` aggregate)."""

    provider_id: str
    kind: str
    """A ProviderKind value."""
    registered_at: float
    updated_at: float
    tools: tuple[ToolDescriptor, ...] = ()
    registered_by: str = ""
    """The agent or operator that registered it; 'config' for the configuration file."""
    config: Mapping[str, Any] = field(default_factory=dict)
    """How to start it again (an MCP server's command, args and env); JSON values."""


def _tool_error(index: int, name: str, field_name: str, problem: str) -> ValidationError:
    label = f"tool {name!r}" if name else f"tools[{index}]"
    return ValidationError(
        f"{label}: {field_name}: {problem}",
        {"field": field_name, "tool_name": name, "index": str(index)},
    )


def check_provider_id(provider_id: str) -> str:
    """`provider_id` when it is a usable id; ValidationError naming provider_id otherwise."""
    if not provider_id:
        raise ValidationError.for_field("provider_id", "is required")
    if len(provider_id) > MAX_PROVIDER_ID_LENGTH or not _PROVIDER_ID.fullmatch(provider_id):
        raise ValidationError.for_field(
            "provider_id",
            f"{provider_id[:64]!r} is not an id (letters, digits and _ . : @ -, at most "
            f"{MAX_PROVIDER_ID_LENGTH} characters)",
        )
    return provider_id


def parse_schema(text: str) -> dict[str, Any] | bool | None:
    """The schema document `text` holds, None when empty; ValueError says what is wrong
    (the JSON reader's limits on size and depth included)."""
    if not text.strip():
        return None
    # Kept as the text it came as, never written back from the parsed value: syntax, depth
    # and size are what matter here.
    schema = read_document(text, kept=False)
    if isinstance(schema, bool):
        return schema  # true and false are schemas (any value, no value)
    if not isinstance(schema, dict):
        raise ValueError("must be a JSON Schema object or boolean")
    try:
        validator_for(schema).check_schema(schema)
    except SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        raise ValueError(f"is not a valid JSON Schema at {where}: {exc.message}") from None
    return schema


def normalise_side_effects(text: str) -> str:
    """`text` as a canonical comma-separated list; ValueError when a class is malformed."""
    classes = [p.strip().lower() for p in text.split(",") if p.strip()]
    for name in classes:
        if not _EFFECT.fullmatch(name):
            raise ValueError(
                f"{name!r} is not a side-effect class (lower-case letters, digits, _ -)"
            )
    if NO_SIDE_EFFECTS in classes and len(classes) > 1:
        raise ValueError("'none' cannot be combined with other classes")
    return ",".join(dict.fromkeys(classes))


def validate_tool(tool: ToolDescriptor, index: int = 0) -> ToolDescriptor:
    """The descriptor with its side effects normalised, or ValidationError naming the field."""
    name = tool.tool_name
    if not name:
        raise _tool_error(index, name, "tool_name", "is required")
    if len(name) > MAX_TOOL_NAME_LENGTH or not _TOOL_NAME.fullmatch(name):
        raise _tool_error(
            index, name, "tool_name",
            f"must be 1-{MAX_TOOL_NAME_LENGTH} letters, digits, '_', '.' or '-'",
        )  # fmt: skip
    for field_name in ("input_schema", "output_schema"):
        try:
            parse_schema(getattr(tool, field_name))
        except ValueError as exc:
            raise _tool_error(index, name, field_name, str(exc)) from None
    try:
        effects = normalise_side_effects(tool.side_effects)
    except ValueError as exc:
        raise _tool_error(index, name, "side_effects", str(exc)) from None
    for field_name in ("default_timeout_s", "max_concurrency"):
        if getattr(tool, field_name) < 0:
            raise _tool_error(index, name, field_name, "must not be negative")
    return ToolDescriptor(
        tool_name=name, input_schema=tool.input_schema, output_schema=tool.output_schema,
        idempotent=tool.idempotent, needs_worktree=tool.needs_worktree,
        default_timeout_s=tool.default_timeout_s, max_concurrency=tool.max_concurrency,
        side_effects=effects, description=tool.description,
    )  # fmt: skip


def validate_tools(tools: Sequence[ToolDescriptor]) -> tuple[ToolDescriptor, ...]:
    """Every descriptor checked (`validate_tool`), names unique within the provider."""
    if len(tools) > MAX_TOOLS_PER_PROVIDER:
        raise ValidationError.for_field(
            "tools", f"{len(tools)} tools; a provider may offer at most {MAX_TOOLS_PER_PROVIDER}"
        )
    checked: dict[str, ToolDescriptor] = {}
    for index, tool in enumerate(tools):
        valid = validate_tool(tool, index)
        if valid.tool_name in checked:
            raise _tool_error(index, valid.tool_name, "tool_name", "appears twice in one provider")
        checked[valid.tool_name] = valid
    return tuple(checked.values())


def descriptor_to_json(tool: ToolDescriptor) -> dict[str, Any]:
    """The descriptor as a JSON object (storage, CLI output)."""
    return {
        "tool_name": tool.tool_name,
        "input_schema": tool.input_schema,
        "output_schema": tool.output_schema,
        "idempotent": tool.idempotent,
        "needs_worktree": tool.needs_worktree,
        "default_timeout_s": tool.default_timeout_s,
        "max_concurrency": tool.max_concurrency,
        "side_effects": tool.side_effects,
        "description": tool.description,
    }


def descriptor_from_json(doc: Mapping[str, Any]) -> ToolDescriptor:
    """The inverse of `descriptor_to_json` (missing keys take their defaults)."""
    return ToolDescriptor(
        tool_name=str(doc["tool_name"]),
        input_schema=str(doc.get("input_schema", "")),
        output_schema=str(doc.get("output_schema", "")),
        idempotent=bool(doc.get("idempotent", False)),
        needs_worktree=bool(doc.get("needs_worktree", False)),
        default_timeout_s=int(doc.get("default_timeout_s", 0)),
        max_concurrency=int(doc.get("max_concurrency", 0)),
        side_effects=str(doc.get("side_effects", "")),
        description=str(doc.get("description", "")),
    )
