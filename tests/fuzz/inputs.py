"""What a client sends, per transport, drawn from the message strategies: gRPC request
frames, gateway bodies, query parameters, headers and paths."""

from __future__ import annotations

import json
import urllib.parse
from typing import Any

from hypothesis import strategies as st

from apiary.wire.services import RpcMethod
from tests.fuzz.strategies import SPECIAL_STRINGS, encodings, request_documents

ROUTES = (
    "/healthz", "/readyz", "/metrics", "/v1", "/console", "/console/", "/console/index.html",
    "/console/api/workflows", "/console/api/history", "/console/api/finished",
    "/v1/events/stream", "/v1/sw4rm.router.RouterService/SendMessage",
    "/v1/a/b", "/", "/swarm/info",
)  # fmt: skip
"""Every route of the HTTP port but the gateway's methods (fuzzed by their bodies), and a
few that do not exist."""
SUBJECTS = ("agent", "task", "workflow", "room", "negotiation", "hitl")
VERBS = ("GET", "POST", "PUT", "DELETE", "PATCH", "HEAD", "OPTIONS")
NUMBERS = (
    "0", "1", "-1", "²", "٣", "1.5", "1e3", " 7 ", "nan", "inf", str(2**63), str(2**64),
    "9" * 2000,
)  # fmt: skip
LINE_SAFE = tuple(s for s in SPECIAL_STRINGS if len(s) < 1000)
"""Query values and headers stay within aiohttp's 8190-byte request line and header limits:
past them its HTTP parser refuses the request before any route is chosen (a plain-text
400 that no application code sees)."""


def grpc_frames(method: RpcMethod) -> st.SearchStrategy[list[bytes]]:
    """Request frames of `method`: one, or up to three for a client stream."""
    return st.lists(encodings(method), min_size=1, max_size=3 if method.client_streaming else 1)


def _encode(document: Any, ascii_only: bool) -> bytes:
    return json.dumps(document, ensure_ascii=ascii_only).encode("utf-8", "surrogatepass")


def gateway_bodies(method: RpcMethod) -> st.SearchStrategy[bytes]:
    """Request bodies of `method`: JSON documents (NDJSON lines for a client stream) and
    raw bytes."""
    documents = request_documents(method)
    if method.client_streaming:
        encoded = st.lists(st.tuples(documents, st.booleans()), max_size=3).map(
            lambda items: b"\n".join(_encode(d, a) for d, a in items)
        )
    else:
        encoded = st.tuples(documents, st.booleans()).map(lambda v: _encode(*v))
    return st.one_of(encoded, encoded, encoded, st.binary(max_size=256))


def query_values() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(NUMBERS), st.sampled_from(LINE_SAFE), st.text(max_size=40))


def header_values() -> st.SearchStrategy[str]:
    """Values a client can put in a header (aiohttp's client refuses line breaks itself)."""
    printable = st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f")
    return st.one_of(st.sampled_from(NUMBERS), st.text(printable, max_size=30))


def paths() -> st.SearchStrategy[str]:
    """The routes, and paths of fuzzed segments (percent-encoded, as a client sends them)."""
    segment = st.one_of(st.sampled_from(LINE_SAFE), st.text(max_size=12))
    made = st.lists(segment, min_size=1, max_size=4).map(
        lambda parts: "/" + "/".join(urllib.parse.quote(p, safe="") for p in parts)
    )
    return st.one_of(st.sampled_from(ROUTES), made)


READ_QUERIES = st.fixed_dictionaries(
    {},
    optional={
        "after": query_values(),
        "keepalive": query_values(),
        "limit": query_values(),
        "Last-Event-ID": header_values(),
        "kind": st.one_of(st.sampled_from(SUBJECTS), query_values()),
        "id": query_values(),
        "before": query_values(),
        "q": query_values(),
        "workflow_id": query_values(),
    },
)
"""The read routes' parameters: the event stream's query and Last-Event-ID header, the
workflow list's limit and id, the console's history and finished work (kind, id, before, q,
limit)."""
