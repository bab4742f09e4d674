"""Conversions between the tool protos (tool.proto, connector.proto, apiary.v1 tools) and the
core's tool values."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from apiary.core.tools.descriptor import ToolDescriptor, ToolProviderRecord
from apiary.core.tools.requests import RequestedPolicy
from apiary.wire import pb
from apiary.wire.convert import float_to_timestamp

connector = pb.connector_pb2
tool_pb2 = pb.tool_pb2
apiary_pb2 = pb.apiary_pb2


def descriptor_from_proto(message: connector.ToolDescriptor) -> ToolDescriptor:
    return ToolDescriptor(
        tool_name=message.tool_name,
        input_schema=message.input_schema,
        output_schema=message.output_schema,
        idempotent=message.idempotent,
        needs_worktree=message.needs_worktree,
        default_timeout_s=message.default_timeout_s,
        max_concurrency=message.max_concurrency,
        side_effects=message.side_effects,
    )


def descriptor_to_proto(tool: ToolDescriptor) -> connector.ToolDescriptor:
    return connector.ToolDescriptor(
        tool_name=tool.tool_name,
        input_schema=tool.input_schema,
        output_schema=tool.output_schema,
        idempotent=tool.idempotent,
        needs_worktree=tool.needs_worktree,
        default_timeout_s=tool.default_timeout_s,
        max_concurrency=tool.max_concurrency,
        side_effects=tool.side_effects,
    )


def tool_info(provider_id: str, tool: ToolDescriptor) -> apiary_pb2.ToolInfo:
    return apiary_pb2.ToolInfo(
        descriptor=descriptor_to_proto(tool),
        provider_id=provider_id,
        description=tool.description,
        capabilities=list(tool.capabilities),
    )


def provider_info(
    record: ToolProviderRecord, state: str, detail: str = ""
) -> apiary_pb2.ToolProviderInfo:
    return apiary_pb2.ToolProviderInfo(
        provider_id=record.provider_id,
        kind=record.kind,
        state=state,
        tools=[tool_info(record.provider_id, t) for t in record.tools],
        registered_at=float_to_timestamp(record.registered_at),
        registered_by=record.registered_by,
        detail=detail,
    )


def requested_policy(message: tool_pb2.ExecutionPolicy) -> RequestedPolicy:
    """The policy fields as sent (empty and zero mean "the tool's default")."""
    timeout_ms = 0
    if message.HasField("timeout"):
        timeout_ms = message.timeout.seconds * 1000 + message.timeout.nanos // 1_000_000
    return RequestedPolicy(
        timeout_ms=max(timeout_ms, 0),
        max_retries=message.max_retries,
        backoff=message.backoff,
        worktree_required=message.worktree_required,
        network_policy=message.network_policy,
        privilege_level=message.privilege_level,
        budget_cpu_ms=message.budget_cpu_ms,
        budget_wall_ms=message.budget_wall_ms,
    )


def frame_to_proto(
    call_id: str, frame_no: int, final: bool, content_type: str, data: bytes,
    summary: Mapping[str, Any],
) -> tool_pb2.ToolFrame:  # fmt: skip
    """A ToolFrame; the summary travels as JSON bytes (empty when there is none)."""
    return tool_pb2.ToolFrame(
        call_id=call_id,
        frame_no=frame_no,
        final=final,
        content_type=content_type,
        data=data,
        summary=json.dumps(dict(summary), separators=(",", ":")).encode() if summary else b"",
    )
