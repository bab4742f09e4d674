"""One fuzz case per kind of input: make the call(s), return the faults found (empty when
every answer was a success or a specific error). The tests and scripts/fuzz.py share them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from apiary.wire.services import RpcMethod
from tests.fuzz.target import Answer, FuzzTarget, fault

Fault = tuple[str, Answer]


def describe(faults: Sequence[Fault]) -> str:
    return "; ".join(f"{problem}: {answer}" for problem, answer in faults)


def _faults(*answers: Answer) -> list[Fault]:
    return [(problem, a) for a in answers if (problem := fault(a)) is not None]


async def grpc_case(target: FuzzTarget, method: RpcMethod, frames: Sequence[bytes]) -> list[Fault]:
    return _faults(await target.grpc(method, frames))


async def gateway_case(target: FuzzTarget, method: RpcMethod, body: bytes) -> list[Fault]:
    return _faults(await target.gateway(method, body))


async def read_case(target: FuzzTarget, values: Mapping[str, str]) -> list[Fault]:
    """The event stream, the workflow list and the console's reads with fuzzed parameters."""
    query = {k: v for k, v in values.items() if k in ("after", "keepalive")}
    headers = {"Last-Event-ID": values["Last-Event-ID"]} if "Last-Event-ID" in values else {}
    workflows = {k: v for k, v in values.items() if k in ("limit", "workflow_id")}
    history = {k: v for k, v in values.items() if k in ("kind", "id", "before", "limit")}
    finished = {k: v for k, v in values.items() if k in ("kind", "q", "before", "limit")}
    return _faults(
        await target.request("GET", "/v1/events/stream", params=query, headers=headers),
        await target.request("GET", "/console/api/workflows", params=workflows),
        await target.request("GET", "/console/api/history", params=history),
        await target.request("GET", "/console/api/finished", params=finished),
    )


async def route_case(target: FuzzTarget, verb: str, path: str, body: bytes) -> list[Fault]:
    return _faults(await target.request(verb, path, body=body))
