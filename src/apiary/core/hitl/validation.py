"""Checks of the fields a HITL request carries (RFC 15): what opening an invocation and an
operator's decision accept. Each failure is a ValidationError naming the field."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from apiary.core.hitl.payloads import plain_json
from apiary.core.hitl.vocabulary import HitlAction, parse_action
from apiary.errors import ValidationError

_T = TypeVar("_T")


def checked_patch(action: HitlAction, patch: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The patch of a modify decision as plain JSON; None for any other action, which must
    carry none."""
    if action is HitlAction.MODIFY:
        if patch is None:
            raise ValidationError.for_field("patch", "a modify decision needs a patch")
        return json_object(patch, "patch")
    if patch is not None:
        raise ValidationError.for_field(
            "patch", f"only a modify decision carries one, not {action}"
        )
    return None


def suggestion(value: object) -> str:
    """A suggested action (approve, deny or modify), "" for none."""
    if value == "":
        return ""
    found = parse_action(value, "suggested_action")
    if found is HitlAction.DEFER:
        raise ValidationError.for_field("suggested_action", "must be approve, deny or modify")
    return found.value


def required(value: object, name: str) -> str:
    """A non-blank string."""
    if not isinstance(value, str) or not value.strip():
        raise ValidationError.for_field(name, "is required")
    return value


def typed(value: object, kind: type[_T], name: str) -> _T:
    """`value` when it is a `kind` (never a bool standing in for a number)."""
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValidationError.for_field(name, f"must be a {kind.__name__}")
    return value


def strings(values: Iterable[str], name: str) -> tuple[str, ...]:
    """Non-blank strings, each once, in their first order."""
    if isinstance(values, str):
        raise ValidationError.for_field(name, "must be a list of strings")
    items = tuple(values)
    for item in items:
        required(item, name)
    return tuple(dict.fromkeys(items))


def json_object(value: object, name: str) -> dict[str, Any]:
    """A plain JSON copy of a mapping; {} for None."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValidationError.for_field(name, "must be a JSON object")
    plain: dict[str, Any] = plain_json(value, name)
    return plain


def number(value: object) -> bool:
    """Whether `value` is an int or a float (a bool is not a number here)."""
    return isinstance(value, int | float) and not isinstance(value, bool)
