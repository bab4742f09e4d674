"""Workflow definitions (RFC 17.7 "Workflow Definition", "Workflow Nodes"): the domain form
of `sw4rm.workflow.WorkflowDefinition`, its validation, its JSON form and the options Apiary
reads from the metadata maps.

`validate_workflow` is what CreateWorkflow runs before anything is stored: ids, agent ids,
trigger types, mapping paths, node options, then the DAG (core/workflow/dag.py). Every error
is a ValidationError naming the field (`nodes.<id>.metadata.retries`), or
workflow_cycle_detected.

Node options (string values of `WorkflowNode.metadata`; the workflow's metadata gives
defaults for the ones marked *):

| key | meaning | default |
|---|---|---|
| `scope` | the task's scope (core/scope_overlap.py) | `resource:workflow.<workflow>.<node>` |
| `priority`* | task priority -19..20 (RFC 7.1) | 0 |
| `retries`* | further attempts after a failed one, 0..100 | 0 |
| `retry_delay_s`* | delay before the first retry, doubling per retry (max 1 h) | 0 |
| `on_failure`* | what a failure does to the node's dependents: `skip` or `fail` | `skip` |
| `condition` | a workflow_data path; the node is SKIPPED unless the value is truthy | none |
| `cron` | SCHEDULE nodes: a cron expression (core/cron.py), UTC; required | |
| `event_type`, `event_producer`, `event_correlation_id`, `event_match` | EVENT nodes | |

The default scope gives each node its own resource, so independent nodes never conflict in
the Scheduler (RFC 9.2) unless their definitions say they share something. Id parts that are
not `[A-Za-z0-9_-]+` are replaced by a hash, so two nodes never share a default resource.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Any, Final

from apiary.core.cron import CronSchedule, parse_cron
from apiary.core.scope_overlap import parse_scope
from apiary.core.tasks.queue import PRIORITY_HIGHEST, PRIORITY_LOWEST
from apiary.core.workflow.dag import DagReport, validate_dag
from apiary.core.workflow.data import Path, check_mapping, parse_path
from apiary.core.workflow.event import EventMatch, parse_event_match
from apiary.errors import ValidationError

MAX_ID_CHARS: Final = 256
MAX_RETRIES: Final = 100
MAX_RETRY_DELAY_S: Final = 3600.0
_SAFE_PART: Final = re.compile(r"[A-Za-z0-9_-]+")
_BAD_ID: Final = re.compile(r"[\s\x00-\x1f\x7f]")
INTERNAL_PARTICIPANTS: Final = frozenset({"scheduler", "workflow", "coordinator"})
"""Coordinator-internal participants: never a node's agent."""


class TriggerType(StrEnum):
    """How a node is activated (RFC 17.7), named and numbered as `sw4rm.workflow.TriggerType`."""

    EVENT = "EVENT"
    SCHEDULE = "SCHEDULE"
    MANUAL = "MANUAL"
    DEPENDENCY = "DEPENDENCY"


TRIGGER_NUMBERS: Final[Mapping[TriggerType, int]] = MappingProxyType(
    {
        TriggerType.EVENT: 1,
        TriggerType.SCHEDULE: 2,
        TriggerType.MANUAL: 3,
        TriggerType.DEPENDENCY: 4,
    }
)
_TRIGGER_BY_NUMBER: Final = {n: t for t, n in TRIGGER_NUMBERS.items()}


def parse_trigger(value: object, field_name: str = "trigger_type") -> TriggerType:
    """A trigger from its name (any case) or proto number; empty or 0 (unspecified) is
    DEPENDENCY, the default (RFC 17.7)."""
    if value in ("", 0, None):
        return TriggerType.DEPENDENCY
    if isinstance(value, int) and not isinstance(value, bool) and value in _TRIGGER_BY_NUMBER:
        return _TRIGGER_BY_NUMBER[value]
    if isinstance(value, str) and value.strip().upper() in TriggerType.__members__:
        return TriggerType(value.strip().upper())
    raise ValidationError.for_field(
        field_name, f"{value!r} is not EVENT, SCHEDULE, MANUAL or DEPENDENCY"
    )


class FailurePolicy(StrEnum):
    """What a node's failure does to its dependents, which can no longer run (RFC 17.7)."""

    SKIP = "skip"
    """Dependents become SKIPPED; the rest of the workflow goes on."""
    FAIL = "fail"
    """Dependents become FAILED (error upstream_failed); the rest of the workflow goes on."""


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One `WorkflowNode`."""

    node_id: str
    agent_id: str
    dependencies: tuple[str, ...] = ()
    trigger: TriggerType = TriggerType.DEPENDENCY
    input_mapping: Mapping[str, str] = field(default_factory=dict)
    output_mapping: Mapping[str, str] = field(default_factory=dict)
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class WorkflowSpec:
    """One `WorkflowDefinition`; `nodes` keeps the definition's order."""

    workflow_id: str
    nodes: Mapping[str, NodeSpec]
    created_at: float = 0.0
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NodeOptions:
    """A node's options from its and its workflow's metadata (module docstring)."""

    scope: str
    priority: int = 0
    max_attempts: int = 1
    retry_delay_s: float = 0.0
    on_failure: FailurePolicy = FailurePolicy.SKIP
    cron: CronSchedule | None = None
    event: EventMatch | None = None
    condition: Path | None = None
    condition_text: str = ""

    def retry_delay(self, attempts: int) -> float:
        """The delay before the next attempt after `attempts` failed ones (doubling)."""
        if self.retry_delay_s <= 0:
            return 0.0
        delay = self.retry_delay_s * float(2 ** max(0, attempts - 1))
        return min(delay, MAX_RETRY_DELAY_S)


def _check_id(value: object, field_name: str) -> str:
    if not isinstance(value, str) or not value:
        raise ValidationError.for_field(field_name, "is required")
    if len(value) > MAX_ID_CHARS:
        raise ValidationError.for_field(field_name, f"must be at most {MAX_ID_CHARS} characters")
    if _BAD_ID.search(value):
        raise ValidationError.for_field(field_name, "must not contain whitespace or controls")
    return value


def _resource_part(value: str) -> str:
    if _SAFE_PART.fullmatch(value):
        return value
    return "h" + hashlib.sha256(value.encode()).hexdigest()[:16]


def default_scope(workflow_id: str, node_id: str) -> str:
    """A resource of the node's own (module docstring)."""
    return f"resource:workflow.{_resource_part(workflow_id)}.{_resource_part(node_id)}"


def _setting(spec: WorkflowSpec, node: NodeSpec, key: str) -> tuple[str, str] | None:
    """The value of an inheritable option and the field it came from, or None."""
    if key in node.metadata:
        return node.metadata[key], f"nodes.{node.node_id}.metadata.{key}"
    if key in spec.metadata:
        return spec.metadata[key], f"metadata.{key}"
    return None


def _int_option(text: str, where: str, low: int, high: int) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise ValidationError.for_field(where, f"{text!r} is not an integer") from None
    if not low <= value <= high:
        raise ValidationError.for_field(where, f"must be between {low} and {high}")
    return value


def node_options(spec: WorkflowSpec, node: NodeSpec) -> NodeOptions:
    """The node's options; ValidationError naming the metadata field that is wrong."""
    prefix = f"nodes.{node.node_id}.metadata"
    scope = node.metadata.get("scope", "").strip() or default_scope(spec.workflow_id, node.node_id)
    try:
        parse_scope(scope)
    except ValidationError as exc:
        raise ValidationError.for_field(f"{prefix}.scope", exc.message) from None
    options: dict[str, Any] = {"scope": scope}
    if (found := _setting(spec, node, "priority")) is not None:
        options["priority"] = _int_option(found[0], found[1], PRIORITY_HIGHEST, PRIORITY_LOWEST)
    if (found := _setting(spec, node, "retries")) is not None:
        options["max_attempts"] = 1 + _int_option(found[0], found[1], 0, MAX_RETRIES)
    if (found := _setting(spec, node, "retry_delay_s")) is not None:
        options["retry_delay_s"] = _delay(*found)
    if (found := _setting(spec, node, "on_failure")) is not None:
        try:
            options["on_failure"] = FailurePolicy(found[0].strip().lower())
        except ValueError:
            raise ValidationError.for_field(found[1], "must be 'skip' or 'fail'") from None
    if "condition" in node.metadata:
        options["condition_text"] = node.metadata["condition"]
        options["condition"] = parse_path(node.metadata["condition"], f"{prefix}.condition")
    if node.trigger is TriggerType.SCHEDULE:
        options["cron"] = parse_cron(node.metadata.get("cron", ""), f"{prefix}.cron")
    elif "cron" in node.metadata:
        raise ValidationError.for_field(f"{prefix}.cron", "applies to SCHEDULE nodes only")
    if node.trigger is TriggerType.EVENT:
        options["event"] = parse_event_match(node.metadata, prefix)
    return NodeOptions(**options)


def _delay(text: str, where: str) -> float:
    try:
        value = float(text.strip())
    except ValueError:
        raise ValidationError.for_field(where, f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or not 0 <= value <= MAX_RETRY_DELAY_S:
        raise ValidationError.for_field(where, f"must be between 0 and {MAX_RETRY_DELAY_S:g} s")
    return value


def validate_workflow(spec: WorkflowSpec) -> DagReport:
    """Everything CreateWorkflow checks (module docstring); the DAG report when valid."""
    _check_id(spec.workflow_id, "workflow_id")
    for key, node in spec.nodes.items():
        where = f"nodes.{key}"
        _check_id(key, "nodes")
        if node.node_id != key:
            raise ValidationError.for_field(
                f"{where}.node_id", f"{node.node_id!r} differs from its key {key!r} in nodes"
            )
        _check_id(node.agent_id, f"{where}.agent_id")
        if node.agent_id in INTERNAL_PARTICIPANTS:
            raise ValidationError.for_field(
                f"{where}.agent_id", f"{node.agent_id!r} is a coordinator participant, not an agent"
            )
        check_mapping(node.input_mapping, f"{where}.input_mapping")
        check_mapping(node.output_mapping, f"{where}.output_mapping")
        node_options(spec, node)
    return validate_dag({key: node.dependencies for key, node in spec.nodes.items()})


# ---------------------------------------------------------------------------- JSON form


def spec_to_json(spec: WorkflowSpec) -> dict[str, Any]:
    """The definition as a JSON object (the store's and the CLI's form)."""
    return {
        "workflow_id": spec.workflow_id,
        "created_at": spec.created_at,
        "metadata": dict(spec.metadata),
        "nodes": {
            key: {
                "node_id": node.node_id,
                "agent_id": node.agent_id,
                "dependencies": list(node.dependencies),
                "trigger_type": node.trigger.value,
                "input_mapping": dict(node.input_mapping),
                "output_mapping": dict(node.output_mapping),
                "metadata": dict(node.metadata),
            }
            for key, node in spec.nodes.items()
        },
    }


def spec_from_json(doc: object) -> WorkflowSpec:
    """A definition from its JSON object (as `spec_to_json` writes it, or a file written by
    hand: `node_id` may be left out, metadata values that are not strings are stored as their
    JSON text, `trigger_type` defaults to DEPENDENCY). ValidationError naming the field."""
    if not isinstance(doc, dict):
        raise ValidationError.for_field("definition", "must be a JSON object")
    nodes_doc = doc.get("nodes")
    if not isinstance(nodes_doc, dict):
        raise ValidationError.for_field("nodes", "must be an object of node_id -> node")
    nodes: dict[str, NodeSpec] = {}
    for key, body in nodes_doc.items():
        where = f"nodes.{key}"
        if not isinstance(body, dict):
            raise ValidationError.for_field(where, "must be an object")
        dependencies = body.get("dependencies", [])
        if not isinstance(dependencies, list) or not all(isinstance(d, str) for d in dependencies):
            raise ValidationError.for_field(f"{where}.dependencies", "must be a list of node ids")
        nodes[key] = NodeSpec(
            node_id=str(body.get("node_id", key)),
            agent_id=_string(body.get("agent_id", ""), f"{where}.agent_id"),
            dependencies=tuple(dependencies),
            trigger=parse_trigger(body.get("trigger_type", ""), f"{where}.trigger_type"),
            input_mapping=_strings(body.get("input_mapping"), f"{where}.input_mapping"),
            output_mapping=_strings(body.get("output_mapping"), f"{where}.output_mapping"),
            metadata=_metadata(body.get("metadata"), f"{where}.metadata"),
        )
    created = doc.get("created_at", 0.0)
    if isinstance(created, bool) or not isinstance(created, int | float):
        raise ValidationError.for_field("created_at", "must be a number (epoch seconds)")
    return WorkflowSpec(
        workflow_id=_string(doc.get("workflow_id", ""), "workflow_id"),
        nodes=nodes,
        created_at=float(created),
        metadata=_metadata(doc.get("metadata"), "metadata"),
    )


def _string(value: object, where: str) -> str:
    if not isinstance(value, str):
        raise ValidationError.for_field(where, "must be a string")
    return value


def _strings(value: object, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ValidationError.for_field(where, "must be an object of strings")
    return dict(value)


def _metadata(value: object, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ValidationError.for_field(where, "must be an object")
    return {k: v if isinstance(v, str) else json.dumps(v) for k, v in value.items()}
