"""The one JSON error shape of every HTTP route: `{"error": {"code", "message", "details"}}`
with the status of the error table."""

from __future__ import annotations

from aiohttp import web

from apiary.server.errormap import answer_for
from apiary.server.metrics import Metrics


def error_response(exc: BaseException, where: str, metrics: Metrics | None = None) -> web.Response:
    answer = answer_for(exc, where)
    if metrics is not None:
        metrics.rpc_done("http", where, answer.code)
    body = {"error": {"code": answer.code, "message": answer.message, "details": answer.details}}
    return web.json_response(body, status=answer.spec.http_status)
