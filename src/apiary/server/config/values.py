"""Typed TOML values: the checks every table's parser shares (a value of a kind, a table,
known keys), with errors that name the setting and where it came from."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from apiary.errors import ValidationError

_T = TypeVar("_T")

_KIND_NAMES: dict[type, str] = {
    int: "an integer",
    float: "a number",
    bool: "true or false",
    str: "a string",
}


def typed(value: Any, kind: type, name: str, source: str) -> Any:
    """`value` as `kind` (int for float is fine, bool never counts as a number)."""
    if kind is float:
        if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    elif kind is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif isinstance(value, kind):
        return value
    raise ValidationError(f"{source}: {name} must be {_KIND_NAMES[kind]}", {"field": name})


def as_table(value: Any, name: str, source: str) -> dict[str, Any]:
    """`value`, which must be a TOML table."""
    if not isinstance(value, dict):
        raise ValidationError(f"{source}: {name} must be a table", {"field": name})
    return value


def check_known(values: Mapping[str, Any], known: Any, prefix: str, source: str) -> None:
    """Every key of `values` is one of `known`; the error lists them, with `prefix`."""
    for key in values:
        if key not in known:
            raise ValidationError(
                f"{source}: unknown setting {prefix}{key}; known: "
                + ", ".join(f"{prefix}{k}" for k in sorted(known)),
                {"field": f"{prefix}{key}"},
            )


def typed_fields(
    values: Mapping[str, Any], types: Mapping[str, type], prefix: str, source: str
) -> dict[str, Any]:
    """Each of `values` checked against `types`; unknown keys are errors."""
    check_known(values, types, prefix, source)
    return {k: typed(v, types[k], f"{prefix}{k}", source) for k, v in values.items()}


def built(build: Callable[..., _T], source: str, /, *args: Any, **kwargs: Any) -> _T:
    """`build(*args, **kwargs)`, its ValidationError prefixed with `source`."""
    try:
        return build(*args, **kwargs)
    except ValidationError as exc:
        raise ValidationError(f"{source}: {exc.message}", exc.details) from None
