"""Early validation of drafts (RFC 17.3): JSON Schema and executable examples.

A negotiation may carry `ValidationRules`: a JSON Schema every draft must satisfy and
examples. An example is an instance the draft, read as a JSON Schema itself, must accept
(`"valid": true`, the default) or refuse: the way to test drafts that are API contracts, as
in Appendix D C.9 (`/api/v3/orders`), against sample requests.

`check_draft` runs every check and reports them; `refusal` says whether the draft is refused
under a policy, which happens before the draft takes a round:
- a draft whose content type is JSON (or unstated) but that does not parse is always refused;
- a schema failure refuses it when `require_schema_valid`, an example failure when
  `require_examples_pass`; otherwise failures only lower the draft's check score.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import jsonschema
from jsonschema.exceptions import SchemaError

from apiary.core.negotiation.delta import parse_json, pointer
from apiary.core.negotiation.policy import NegotiationPolicy
from apiary.errors import ValidationError

MAX_ERRORS: Final = 10
MAX_EXAMPLES: Final = 100


@dataclass(frozen=True, slots=True)
class Example:
    name: str
    instance: Any
    valid: bool = True


@dataclass(frozen=True, slots=True)
class ValidationRules:
    """What drafts of one negotiation are checked against (empty: only JSON well-formedness)."""

    schema: Mapping[str, Any] | None = None
    examples: tuple[Example, ...] = ()

    @property
    def empty(self) -> bool:
        return self.schema is None and not self.examples

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {}
        if self.schema is not None:
            doc["schema"] = dict(self.schema)
        if self.examples:
            doc["examples"] = [
                {"name": e.name, "instance": e.instance, "valid": e.valid} for e in self.examples
            ]
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any] | None) -> ValidationRules:
        """Rules from `to_json`'s shape; a schema that is not a valid JSON Schema, or a
        malformed example, raises ValidationError naming it."""
        if not doc:
            return cls()
        if not isinstance(doc, Mapping):
            raise ValidationError.for_field("validation", "must be a JSON object")
        unknown = set(doc) - {"schema", "examples"}
        if unknown:
            raise ValidationError.for_field(f"validation.{sorted(unknown)[0]}", "is not known")
        schema = doc.get("schema")
        if schema is not None:
            _check_schema(schema, "schema")
        return cls(schema, _examples(doc.get("examples") or []))


def _check_schema(schema: object, name: str) -> None:
    if not isinstance(schema, Mapping | bool):
        raise ValidationError.for_field(name, "must be a JSON Schema (an object)")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)  # type: ignore[arg-type]
    except SchemaError as exc:
        raise ValidationError.for_field(
            name, f"is not a valid JSON Schema: {exc.message}"
        ) from None


def _examples(items: object) -> tuple[Example, ...]:
    if not isinstance(items, Sequence) or isinstance(items, str | bytes):
        raise ValidationError.for_field("examples", "must be a list of objects")
    if len(items) > MAX_EXAMPLES:
        raise ValidationError.for_field("examples", f"at most {MAX_EXAMPLES} examples")
    found: list[Example] = []
    for index, item in enumerate(items):
        where = f"examples[{index}]"
        if not isinstance(item, Mapping) or "instance" not in item:
            raise ValidationError.for_field(where, 'must be an object with an "instance"')
        name = item.get("name", f"example {index + 1}")
        valid = item.get("valid", True)
        if not isinstance(name, str) or not isinstance(valid, bool):
            raise ValidationError.for_field(where, "name must be a string and valid a boolean")
        found.append(Example(name, item["instance"], valid))
    return tuple(found)


@dataclass(frozen=True, slots=True)
class DraftCheck:
    """What the deterministic checks found in one draft."""

    is_json: bool
    parse_error: bool
    """The content type says JSON (or nothing) but the payload does not parse."""
    schema_valid: bool | None
    """None when the negotiation has no schema."""
    examples_passed: int = 0
    examples_total: int = 0
    errors: tuple[str, ...] = ()

    @property
    def score(self) -> float:
        """The fraction of checks passed (1.0 with no checks): the draft's check score."""
        total = self.examples_total + (self.schema_valid is not None)
        if self.parse_error:
            return 0.0
        if not total:
            return 1.0
        passed = self.examples_passed + (self.schema_valid is True)
        return round(passed / total, 6)

    def to_json(self) -> dict[str, Any]:
        return {
            "is_json": self.is_json,
            "schema_valid": self.schema_valid,
            "examples_passed": self.examples_passed,
            "examples_total": self.examples_total,
            "check_score": self.score,
            "errors": list(self.errors),
        }


def check_draft(rules: ValidationRules, content_type: str, payload: bytes) -> DraftCheck:
    """Run every deterministic check of `rules` on one draft."""
    is_json, value = parse_json(content_type, payload)
    base = content_type.split(";", 1)[0].strip().lower()
    declared_json = not base or base == "application/json" or base.endswith("+json")
    if not is_json:
        if declared_json:
            broken = ("/: the draft is not valid JSON",)
            return DraftCheck(False, True, False if rules.schema is not None else None,
                              0, len(rules.examples), broken)  # fmt: skip
        failed = ("/: the draft is not JSON; schema and examples cannot apply",)
        has_checks = rules.schema is not None
        return DraftCheck(False, False, False if has_checks else None, 0, len(rules.examples),
                          failed if not rules.empty else ())  # fmt: skip
    errors: list[str] = []
    schema_valid: bool | None = None
    if rules.schema is not None:
        found = _errors(rules.schema, value)
        schema_valid = not found
        errors.extend(found)
    passed = 0
    for example in rules.examples:
        outcome = _example(value, example)
        if outcome:
            errors.append(outcome)
        else:
            passed += 1
    return DraftCheck(True, False, schema_valid, passed, len(rules.examples),
                      tuple(errors[:MAX_ERRORS]))  # fmt: skip


def refusal(check: DraftCheck, policy: NegotiationPolicy) -> str:
    """Why `check`'s draft is refused under `policy` ('' when it is admitted)."""
    if check.parse_error:
        return "the draft is not valid JSON"
    if policy.require_schema_valid and check.schema_valid is False:
        return "the draft does not satisfy the negotiation's schema: " + "; ".join(check.errors)
    if policy.require_examples_pass and check.examples_passed < check.examples_total:
        failed = check.examples_total - check.examples_passed
        return f"{failed} of {check.examples_total} examples failed: " + "; ".join(check.errors)
    return ""


def _errors(schema: Any, instance: Any) -> list[str]:
    validator = jsonschema.validators.validator_for(schema)(schema)
    found = sorted(validator.iter_errors(instance), key=lambda e: list(e.absolute_path))
    return [f"{pointer(tuple(e.absolute_path)) or '/'}: {e.message}" for e in found]


def _example(draft: Any, example: Example) -> str:
    """'' when the example passes, else why not."""
    try:
        _check_schema(draft, "draft")
    except ValidationError:
        return f"example {example.name!r}: the draft is not a JSON Schema"
    accepted = not _errors(draft, example.instance)
    if accepted == example.valid:
        return ""
    expected = "accept" if example.valid else "refuse"
    return f"example {example.name!r}: the draft should {expected} it"
