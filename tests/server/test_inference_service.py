"""The built-in inference engine over gRPC under both service names (RFC 9.3, INTEROP.md)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.wire import pb

r = pb.reasoning_pb2


@pytest.fixture
async def channel(tmp_path: Path) -> AsyncIterator[grpc.aio.Channel]:
    running: Coordinator
    async with (
        open_test_coordinator(tmp_path) as running,
        grpc.aio.insecure_channel(str(running.grpc_address)) as ch,
    ):
        yield ch


@pytest.mark.parametrize("stub_class", ["InferenceProxyStub", "ReasoningProxyStub"])
async def test_parallelism_is_scored_by_scope_overlap(
    channel: grpc.aio.Channel, stub_class: str
) -> None:
    module = (
        pb.reasoning_pb2_grpc if stub_class == "InferenceProxyStub" else pb.reasoning_proxy_pb2_grpc
    )
    stub = getattr(module, stub_class)(channel)
    same = await stub.CheckParallelism(
        r.ParallelismCheckRequest(scope_a="resource:db.orders", scope_b="resource:db.orders")
    )
    apart = await stub.CheckParallelism(
        r.ParallelismCheckRequest(scope_a="path:src/api/**", scope_b="path:docs/**")
    )
    assert same.confidence_score == 0.0 and "db.orders" in same.notes
    assert apart.confidence_score > 0.9


async def test_a_missing_scope_is_invalid(channel: grpc.aio.Channel) -> None:
    stub = pb.reasoning_pb2_grpc.InferenceProxyStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.CheckParallelism(r.ParallelismCheckRequest(scope_a="path:a/**"))
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "scope_b" in (caught.value.details() or "")


async def test_debate_evaluation_measures_the_agreement_of_two_proposals(
    channel: grpc.aio.Channel,
) -> None:
    stub = pb.reasoning_proxy_pb2_grpc.ReasoningProxyStub(channel)
    a, b = '{"path": "/orders", "paging": "offset"}', '{"path": "/orders", "paging": "cursor"}'
    close = await stub.EvaluateDebate(
        r.DebateEvaluateRequest(negotiation_id="n", proposal_a=a, proposal_b=b)
    )
    assert close.confidence_score == 0.5 and "/paging" in close.notes
    same = await pb.reasoning_pb2_grpc.InferenceProxyStub(channel).EvaluateDebate(
        r.DebateEvaluateRequest(negotiation_id="n", proposal_a=a, proposal_b=a)
    )
    assert same.confidence_score == 1.0
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await stub.EvaluateDebate(r.DebateEvaluateRequest(negotiation_id="n", proposal_a=a))
    assert caught.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "proposal_b" in (caught.value.details() or "")
