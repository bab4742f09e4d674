"""The JSON shapes of HITL invocations and decisions (RFC 15.2), pure."""

from __future__ import annotations

import base64
import json
from typing import Any

from apiary.core.dedup import iso_utc
from apiary.core.records import HitlRecord
from apiary.errors import ValidationError


def plain_json(value: object, name: str) -> Any:
    """A plain JSON copy (no NaN or infinity), or ValidationError naming `name`."""
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValidationError.for_field(name, f"is not plain JSON ({exc})") from None


def invocation_payload(record: HitlRecord) -> dict[str, Any]:
    """The HITL_INVOCATION JSON of RFC 15.2, with the message-types spec's field names too."""
    deadline = iso_utc(record.deadline)
    return {
        "invocation_id": record.invocation_id,
        "reason_type": record.reason_type,
        "correlation_id": record.correlation_id,
        "subject": plain_json(record.subject, "subject"),
        "context": plain_json(record.context, "context"),
        "context_uri": f"sw4rm://hitl/context/{record.invocation_id}",
        "suggested_action": record.suggested_action,
        "proposed_actions": list(record.proposed_actions),
        "approver_roles": list(record.approver_roles),
        "deadline_ts": deadline,
        "approval_required_by": deadline,
        "auto_timeout_action": record.timeout_action,
        "priority": record.priority,
        "requested_by": record.requested_by,
    }


def decision_payload(record: HitlRecord) -> dict[str, Any]:
    """The HITL_DECISION JSON of RFC 15.2; ValueError for a record with no decision yet.

    `patch` is the JSON object; `patch_b64` the base64 of its compact, key-sorted JSON.
    """
    d = record.decision
    if not d:
        raise ValueError(f"HITL invocation {record.invocation_id} has no decision")
    patch = plain_json(d.get("patch"), "patch")
    encoded = None
    if patch is not None:
        raw = json.dumps(patch, separators=(",", ":"), sort_keys=True).encode()
        encoded = base64.b64encode(raw).decode()
    rest = {k: v for k, v in d.items() if k not in {"action", "rationale", "patch"}}
    return {
        "invocation_id": record.invocation_id, "decision": d.get("action"),
        "rationale": d.get("rationale"), "patch": patch, "patch_b64": encoded,
        **plain_json(rest, "decision"), "decided_at": iso_utc(float(d["decided_at"])),
        "state": record.state,
    }  # fmt: skip
