"""Every gRPC method of every served service (canonical and apiary.v1) under
structure-aware fuzzing: valid, cut and corrupted encodings of its request message and raw
bytes. No answer may be UNKNOWN, INTERNAL or a refusal without Apiary's error trailer; the
coordinator still serves afterwards with its memory bounded."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.wire.services import RpcMethod
from tests.fuzz.cases import describe, grpc_case
from tests.fuzz.conftest import FUZZ_SETTINGS, RSS_GROWTH_LIMIT
from tests.fuzz.inputs import grpc_frames
from tests.fuzz.known import params, unexpected
from tests.fuzz.target import METHODS, FuzzTarget

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.mark.parametrize("method", params(METHODS, "grpc"))
@given(data=st.data())
@FUZZ_SETTINGS
async def test_no_request_makes_an_internal_error(
    target: FuzzTarget, method: RpcMethod, data: st.DataObject
) -> None:
    frames = data.draw(grpc_frames(method), label="frames")
    faults = unexpected(method, "grpc", frames, await grpc_case(target, method, frames))
    assert not faults, describe(faults)


async def test_the_coordinator_still_serves_with_bounded_memory(target: FuzzTarget) -> None:
    """Runs last in this module (pytest keeps the file's order): after every method was
    fuzzed, health is SERVING and the process grew by less than RSS_GROWTH_LIMIT."""
    await target.assert_still_serving(RSS_GROWTH_LIMIT)
