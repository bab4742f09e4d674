"""Every route of the HTTP port under fuzzing: each gateway method with proto3 JSON bodies
built from its request message (well and badly typed, bad base64, bad timestamps, unknown
fields), NDJSON frames for client streams and raw bytes; the read routes with fuzzed query
parameters and headers; and any method on any path. No answer may be a 500, internal_error,
or an error outside the one JSON shape with a snake_case code; the coordinator still serves
afterwards with its memory bounded."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from apiary.wire.services import RpcMethod
from tests.fuzz.cases import describe, gateway_case, read_case, route_case
from tests.fuzz.conftest import FUZZ_SETTINGS, RSS_GROWTH_LIMIT
from tests.fuzz.inputs import READ_QUERIES, VERBS, gateway_bodies, paths
from tests.fuzz.known import params, unexpected
from tests.fuzz.target import METHODS, FuzzTarget

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.mark.parametrize("method", params(METHODS, "http"))
@given(data=st.data())
@FUZZ_SETTINGS
async def test_no_gateway_body_makes_a_500(
    target: FuzzTarget, method: RpcMethod, data: st.DataObject
) -> None:
    body = data.draw(gateway_bodies(method), label="body")
    faults = unexpected(method, "http", body, await gateway_case(target, method, body))
    assert not faults, describe(faults)


@given(values=READ_QUERIES)
@FUZZ_SETTINGS
async def test_no_query_parameter_makes_a_500(target: FuzzTarget, values: dict[str, str]) -> None:
    faults = await read_case(target, values)
    assert not faults, describe(faults)


@given(verb=st.sampled_from(VERBS), path=paths(), body=st.binary(max_size=64))
@FUZZ_SETTINGS
async def test_no_method_on_any_path_makes_a_500(
    target: FuzzTarget, verb: str, path: str, body: bytes
) -> None:
    faults = await route_case(target, verb, path, body)
    assert not faults, describe(faults)


async def test_the_coordinator_still_serves_with_bounded_memory(target: FuzzTarget) -> None:
    """Runs last in this module (pytest keeps the file's order): after every route was
    fuzzed, health is SERVING and the process grew by less than RSS_GROWTH_LIMIT."""
    await target.assert_still_serving(RSS_GROWTH_LIMIT)
