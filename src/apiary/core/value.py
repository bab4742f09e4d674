"""`value`: records that are immutable to the type checker and cheap to build.

A frozen dataclass sets each field through `object.__setattr__` in its `__init__`: for the
records built several times per routed message (a stored message, an envelope, a state
change, an event draft, a hand-out) that was a sixth of the coordinator's event loop. A
`value` class is a plain slotted dataclass at run time, so building one costs about a sixth
as much, and frozen to mypy (`dataclass_transform(frozen_default=True)`), so assigning to a
field of one is a type error in the checked source. It hashes and compares by its fields, as
a frozen dataclass does; `dataclasses.replace` makes changed copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeVar

from typing_extensions import dataclass_transform

T = TypeVar("T")


@dataclass_transform(frozen_default=True, field_specifiers=(field,))
def value(cls: type[T]) -> type[T]:
    """Make `cls` a value record (see the module's docstring)."""
    return dataclass(slots=True, unsafe_hash=True)(cls)
