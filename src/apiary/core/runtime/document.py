"""Reading and writing the contract's JSON documents (events, snapshots) field by field.

The contract's schemas allow any further property on every object (`additionalProperties`),
so a type names the properties it knows and keeps the rest as they came (`Fields.rest`):
a document read and written again is the same JSON. A property of the wrong JSON type is a
ValidationError naming its path (`threads[0].status`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from apiary.errors import ValidationError

T = TypeVar("T")
JsonObject = Mapping[str, Any]


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


class Fields:
    """The properties of one JSON object, read by typed getters (each refuses a value of the
    wrong type, naming its path); `rest()` is what no getter read."""

    __slots__ = ("_doc", "_read", "_where")

    def __init__(self, doc: object, where: str = "") -> None:
        if not isinstance(doc, Mapping):
            problem = f"must be an object, not {_kind(doc)}"
            raise ValidationError.for_field(where or "document", problem)
        self._doc: Mapping[str, Any] = doc
        self._where = where
        self._read: set[str] = set()

    def path(self, key: str) -> str:
        """The path of property `key` in error messages."""
        return f"{self._where}.{key}" if self._where else key

    def _take(self, key: str) -> Any:
        self._read.add(key)
        return self._doc.get(key)

    def _refuse(self, key: str, wanted: str, value: object) -> ValidationError:
        return ValidationError.for_field(self.path(key), f"must be {wanted}, not {_kind(value)}")

    def text(self, key: str, *, required: bool = False, nonempty: bool = False) -> str | None:
        """A string property (None when absent; `required`: absence is refused)."""
        value = self._take(key)
        if value is None:
            if required:
                raise ValidationError.for_field(self.path(key), "is required")
            return None
        if not isinstance(value, str):
            raise self._refuse(key, "a string", value)
        if nonempty and not value:
            raise ValidationError.for_field(self.path(key), "must not be empty")
        return value

    def required_text(self, key: str, *, nonempty: bool = False) -> str:
        value = self.text(key, required=True, nonempty=nonempty)
        assert value is not None
        return value

    def integer(self, key: str, *, minimum: int | None = None) -> int | None:
        value = self._take(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise self._refuse(key, "an integer", value)
        if minimum is not None and value < minimum:
            raise ValidationError.for_field(self.path(key), f"must be at least {minimum}")
        return value

    def boolean(self, key: str) -> bool | None:
        value = self._take(key)
        if value is None:
            return None
        if not isinstance(value, bool):
            raise self._refuse(key, "a boolean", value)
        return value

    def obj(self, key: str) -> JsonObject | None:
        """An object property, as it came."""
        value = self._take(key)
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise self._refuse(key, "an object", value)
        return value

    def objects(self, key: str) -> tuple[JsonObject, ...] | None:
        """An array of objects, as they came."""
        return self.items(key, _object)

    def texts(self, key: str) -> tuple[str, ...] | None:
        return self.items(key, _string)

    def items(self, key: str, parse: Callable[[object, str], T]) -> tuple[T, ...] | None:
        """An array property, each item read by `parse(item, path)`."""
        value = self._take(key)
        if value is None:
            return None
        if not isinstance(value, list | tuple):
            raise self._refuse(key, "an array", value)
        return tuple(parse(item, f"{self.path(key)}[{i}]") for i, item in enumerate(value))

    def present(self, key: str) -> bool:
        return key in self._doc

    def raw(self, key: str) -> Any:
        """Any JSON value, as it came (None when absent)."""
        return self._take(key)

    def rest(self) -> dict[str, Any]:
        """The properties no getter read, as they came."""
        return {k: v for k, v in self._doc.items() if k not in self._read}


def _object(item: object, path: str) -> JsonObject:
    if not isinstance(item, Mapping):
        raise ValidationError.for_field(path, f"must be an object, not {_kind(item)}")
    return item


def _string(item: object, path: str) -> str:
    if not isinstance(item, str):
        raise ValidationError.for_field(path, f"must be a string, not {_kind(item)}")
    return item


def put(out: dict[str, Any], key: str, value: object) -> None:
    """Set `key` unless `value` is None (an absent property); arrays become lists."""
    if value is None:
        return
    if isinstance(value, tuple):
        value = [_plain(item) for item in value]
    out[key] = _plain(value)


def _plain(value: object) -> Any:
    """A value ready for json.dumps: the contract types' own `to_json`, mappings as dicts."""
    to_json = getattr(value, "to_json", None)
    if callable(to_json):
        return to_json()
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    return value


def merged(known: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """The known properties, then the kept ones (a kept one never replaces a known one)."""
    out = dict(known)
    for key, value in extra.items():
        out.setdefault(key, value)
    return out


def texts_of(values: Sequence[str] | None) -> tuple[str, ...] | None:
    return None if values is None else tuple(values)
