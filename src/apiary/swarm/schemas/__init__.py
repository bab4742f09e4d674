"""The protocol's JSON Schemas (agent-swarm-protocol 0.1.0, `schemas/`), shipped as they are.

`validator(name)` checks a body against one of them, resolving its `$ref`s among the others.
"""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

import jsonschema
from referencing import Registry, Resource


@cache
def _registry() -> Registry[Any]:
    root = resources.files(__name__)
    registry: Registry[Any] = Registry()
    for folder in (root, root / "types", root / "operations"):
        for item in folder.iterdir():
            if item.name.endswith(".json"):
                schema = json.loads(item.read_text(encoding="utf-8"))
                registry = registry.with_resource(schema["$id"], Resource.from_contents(schema))
    return registry


@cache
def validator(name: str) -> jsonschema.protocols.Validator:
    """The validator of `name` ('membership-state.json', 'message.json', 'types/member.json')."""
    schema = json.loads((resources.files(__name__) / name).read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    return cls(schema, registry=_registry(), format_checker=cls.FORMAT_CHECKER)
