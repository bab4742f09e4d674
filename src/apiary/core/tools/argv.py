"""Command tools' argument vectors: templates filled from a call's JSON arguments.

A template is a list of strings; `{name}` in an element is replaced by the argument `name`
(a string, number or boolean; `{{` and `}}` are literal braces). Each element stays one
argument: no shell ever parses the result, so an argument's spaces, quotes or `;` reach the
command as they are. Missing arguments and arguments that are objects or arrays are
VALIDATION_ERRORs naming `args.<name>`.
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping, Sequence
from typing import Any

from apiary.errors import ValidationError

_FORMATTER = string.Formatter()


def template_fields(template: Sequence[str]) -> tuple[str, ...]:
    """The argument names a template uses; ValueError for a malformed template."""
    names: list[str] = []
    for element in template:
        try:
            parsed = list(_FORMATTER.parse(element))
        except ValueError as exc:
            raise ValueError(f"argv element {element!r}: {exc}") from None
        for _, name, spec, conversion in parsed:
            if name is None:
                continue
            if not name.isidentifier() or spec or conversion:
                raise ValueError(
                    f"argv element {element!r}: placeholders are plain names like {{path}}"
                )
            names.append(name)
    return tuple(dict.fromkeys(names))


def _text(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    if isinstance(value, int | float):
        return json.dumps(value)
    raise ValidationError.for_field(
        f"args.{name}", "must be a string, number or boolean to fill the command line"
    )


def render_argv(template: Sequence[str], arguments: Any) -> list[str]:
    """The argv with every placeholder filled from `arguments` (a JSON object)."""
    fields = template_fields(template)
    if not fields:
        return [element.format_map({}) for element in template]
    if not isinstance(arguments, Mapping):
        raise ValidationError.for_field("args", "must be a JSON object")
    values: dict[str, str] = {}
    for name in fields:
        if name not in arguments:
            raise ValidationError.for_field(f"args.{name}", "is required by the command line")
        values[name] = _text(name, arguments[name])
    return [element.format_map(values) for element in template]
