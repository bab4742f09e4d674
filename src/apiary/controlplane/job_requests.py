"""The parameters of the job commands (create_job, get_job, cancel_job), read as every
command's are (controlplane/requests.py): snake_case or camelCase, each refusal a
ValidationError naming the field; an item's fields are named `items[2].agent_id`."""

from __future__ import annotations

from dataclasses import dataclass

from apiary.controlplane.requests import Params
from apiary.controlplane.settings import RuntimeSettings
from apiary.controlplane.task_requests import Keyed, optional_input
from apiary.errors import ValidationError


@dataclass(frozen=True, slots=True)
class JobItem:
    """One item: a task of the job's session, run by its agent (or the job's)."""

    task_id: str = ""
    agent_id: str = ""
    capability: str = ""
    title: str = ""
    objective: str = ""
    input_json: str = "null"

    @classmethod
    def read(cls, doc: object, where: str, settings: RuntimeSettings) -> JobItem:
        """The item `doc`; ValidationError naming its field under `where`."""
        if not isinstance(doc, dict):
            raise ValidationError.for_field(where, "must be a JSON object")
        p = Params(doc)
        try:
            found = cls(
                task_id=p.id("task_id"),
                agent_id=p.id("agent_id"),
                capability=p.id("capability"),
                title=p.text("title", settings.text_bytes),
                objective=p.text("objective", 64 * 1024),
                input_json=optional_input(p, "input", settings.max_input_bytes) or "null",
            )
            p.done()
        except ValidationError as exc:
            field = f"{where}.{exc.details.get('field', '')}"
            problem = exc.message.split(": ", 1)[-1]
            raise ValidationError.for_field(field, problem) from None
        if found.agent_id and found.capability:
            raise ValidationError.for_field(
                f"{where}.capability", "names a queue; agent_id an agent: one"
            )
        return found


@dataclass(frozen=True, slots=True)
class CreateJob(Keyed):
    job_id: str = ""
    session_id: str = ""
    agent_id: str = ""
    capability: str = ""
    title: str = ""
    objective: str = ""
    priority: int = 0
    parent_task_id: str = ""
    items: tuple[JobItem, ...] = ()

    @classmethod
    def read(cls, p: Params, settings: RuntimeSettings) -> CreateJob:
        found = cls(
            idempotency_key=p.id("idempotency_key"),
            job_id=p.id("job_id"),
            session_id=p.id("session_id"),
            agent_id=p.id("agent_id"),
            capability=p.id("capability"),
            title=p.text("title", settings.text_bytes),
            objective=p.text("objective", 64 * 1024),
            priority=p.integer("priority", minimum=-19, maximum=20) or 0,
            parent_task_id=p.id("parent_task_id"),
            items=_items(p, settings),
        )
        if found.agent_id and found.capability:
            raise ValidationError.for_field("capability", "names a queue; agent_id an agent: one")
        for n, item in enumerate(found.items):
            if not (item.agent_id or item.capability or found.agent_id or found.capability):
                raise ValidationError.for_field(
                    f"items[{n}].agent_id", "is required when the job names no agent_id (or "
                    "capability) for its items",
                )  # fmt: skip
        given = [item.task_id for item in found.items if item.task_id]
        if len(set(given)) != len(given):
            twice = next(x for x in given if given.count(x) > 1)
            raise ValidationError.for_field("items", f"name task_id {twice!r} twice")
        return found


def _items(p: Params, settings: RuntimeSettings) -> tuple[JobItem, ...]:
    """The items, their JSON at most max_input_bytes, at most max_job_items of them."""
    if not p.has("items"):
        raise ValidationError.for_field("items", "is required (an array of item objects)")
    found = p.json("items", settings.max_input_bytes)
    if not isinstance(found, list) or not found:
        raise ValidationError.for_field("items", "must be a non-empty array of item objects")
    if len(found) > settings.max_job_items:
        raise ValidationError.for_field(
            "items", f"holds {len(found)} items; a job holds at most {settings.max_job_items} "
            "(runtime.max_job_items)",
        )  # fmt: skip
    return tuple(JobItem.read(doc, f"items[{n}]", settings) for n, doc in enumerate(found))


@dataclass(frozen=True, slots=True)
class GetJob:
    job_id: str

    @classmethod
    def read(cls, p: Params) -> GetJob:
        return cls(p.id("job_id", required=True))


@dataclass(frozen=True, slots=True)
class CancelJob(Keyed):
    job_id: str = ""
    reason: str = ""

    @classmethod
    def read(cls, p: Params) -> CancelJob:
        return cls(p.id("idempotency_key"), p.id("job_id", required=True), p.text("reason"))
