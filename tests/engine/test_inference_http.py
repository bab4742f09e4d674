"""The OpenAI-compatible Inference Engine connector (engine/inference_http.py; RFC 9.2, 9.3).

A real language model cannot run here, so a local aiohttp server on 127.0.0.1 speaking the
same HTTP API (POST /v1/chat/completions) stands in for it: the connector's requests go
through a real socket, and the server answers what each test needs (a verdict, an HTTP 500,
garbage, nothing in time).
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from apiary.engine.hitl import HitlSettings
from apiary.engine.inference import InferenceSettings, RuleInference, consult
from apiary.engine.inference_http import (
    InferenceError,
    OpenAICompatibleInference,
    build_inference,
    parse_completion,
)
from apiary.engine.operators import OperatorEntry, token_digest
from apiary.engine.scheduler.scheduler import Submission
from apiary.engine.settings import SchedulerSettings
from apiary.errors import ValidationError
from apiary.testing.engine import EngineHarness, open_test_engine

MODEL = "local-test-model"
OPERATORS = HitlSettings(operators=(OperatorEntry("olivia", token_digest("t"), ("admin",)),))
"""An operator is configured, so CONFLICT invocations stay PENDING until someone decides."""


@dataclass
class FakeLLM:
    """What the stand-in endpoint answers, and what it was asked."""

    base_url: str = ""
    status: int = 200
    content: str = json.dumps({"confidence_score": 0.9, "notes": "disjoint paths"})
    raw_body: str | None = None
    """When set, the whole response body (instead of a chat completion around `content`)."""
    delay_s: float = 0.0
    requests: list[dict[str, Any]] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.Response:
        self.headers.append(dict(request.headers))
        self.requests.append(await request.json())
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if self.status != 200:
            return web.json_response({"error": {"message": "model crashed"}}, status=self.status)
        if self.raw_body is not None:
            return web.Response(text=self.raw_body, content_type="application/json")
        return web.json_response(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "model": MODEL,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": self.content},
                        "finish_reason": "stop",
                    }
                ],
            }
        )


@pytest.fixture
async def llm() -> AsyncIterator[FakeLLM]:
    fake = FakeLLM()
    app = web.Application()
    app.router.add_post("/v1/chat/completions", fake.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.1)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    fake.base_url = f"http://{host}:{port}/v1"
    try:
        yield fake
    finally:
        await runner.cleanup()


def _closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def _connector(llm: FakeLLM, **options: Any) -> OpenAICompatibleInference:
    return OpenAICompatibleInference(llm.base_url, MODEL, **options)


# --- the connector against the stand-in endpoint ----------------------------------------------


async def test_a_good_answer_becomes_the_verdict(llm: FakeLLM) -> None:
    engine = _connector(llm)
    verdict = await engine.check_parallelism("repo:app path:src/api", "repo:app path:docs/*.md")
    assert verdict.confidence_score == 0.9
    assert verdict.notes == "disjoint paths"
    (body,) = llm.requests
    assert body["model"] == MODEL
    assert body["response_format"] == {"type": "json_object"}
    system, user = body["messages"]
    assert system["role"] == "system" and "path:<glob>" in system["content"]
    assert "confidence_score" in system["content"]
    # the scopes travel as data, in their canonical form
    assert json.loads(user["content"]) == {
        "task_a_scope": "repo:app path:src/api/**",
        "task_b_scope": "repo:app path:docs/*.md/**",
    }
    assert "Authorization" not in llm.headers[0]  # no key configured, none sent


async def test_the_api_key_is_sent_as_a_bearer_token(llm: FakeLLM) -> None:
    engine = build_inference(
        InferenceSettings(kind="openai", url=llm.base_url, model=MODEL, api_key_env="LLM_KEY"),
        env={"LLM_KEY": "sk-local-123"},
    )
    assert isinstance(engine, OpenAICompatibleInference)
    await engine.check_parallelism("path:a", "path:b")
    assert llm.headers[0]["Authorization"] == "Bearer sk-local-123"


async def test_a_fenced_json_answer_is_accepted(llm: FakeLLM) -> None:
    llm.content = '```json\n{"confidence_score": 0.25, "notes": "both write src"}\n```'
    verdict = await _connector(llm).check_parallelism("path:src", "path:src/a")
    assert (verdict.confidence_score, verdict.notes) == (0.25, "both write src")


async def test_http_500_is_an_error(llm: FakeLLM) -> None:
    llm.status = 500
    with pytest.raises(InferenceError, match="HTTP 500"):
        await _connector(llm).check_parallelism("path:a", "path:b")


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ("I think they are fine to run together.", "not JSON"),
        ("[0.9]", "not a JSON object"),
        ('{"notes": "no score"}', "confidence_score"),
        ('{"confidence_score": "high", "notes": ""}', "confidence_score"),
        ('{"confidence_score": true, "notes": ""}', "confidence_score"),
        ('{"confidence_score": 1.5, "notes": ""}', "outside 0..1"),
        ('{"confidence_score": -0.1, "notes": ""}', "outside 0..1"),
        ('{"confidence_score": 0.5, "notes": 7}', "notes"),
    ],
)
async def test_garbage_content_is_an_error(llm: FakeLLM, content: str, match: str) -> None:
    llm.content = content
    with pytest.raises(InferenceError, match=match):
        await _connector(llm).check_parallelism("path:a", "path:b")


@pytest.mark.parametrize(
    "body", ["<html>oops</html>", "{}", '{"choices": []}', '{"choices": [{"message": {}}]}']
)
async def test_a_body_that_is_no_chat_completion_is_an_error(llm: FakeLLM, body: str) -> None:
    llm.raw_body = body
    with pytest.raises(InferenceError, match="not a chat completion"):
        await _connector(llm).check_parallelism("path:a", "path:b")


async def test_an_unreachable_endpoint_is_an_error() -> None:
    engine = OpenAICompatibleInference(f"http://127.0.0.1:{_closed_port()}/v1", MODEL)
    with pytest.raises(InferenceError, match="failed"):
        await engine.check_parallelism("path:a", "path:b")


@pytest.mark.conformance("concurrency.inference.unavailable-conservative")
async def test_a_slow_server_times_out_into_unavailable(llm: FakeLLM) -> None:
    llm.delay_s = 2.0
    # the consultation's bound fires first
    verdict, reason = await consult(_connector(llm, timeout_s=10.0), "path:a", "path:b", 0.2)
    assert verdict is None
    assert "timed out" in reason and MODEL in reason
    # the connector's own HTTP timeout fires first
    verdict, reason = await consult(_connector(llm, timeout_s=0.2), "path:a", "path:b", 10.0)
    assert verdict is None
    assert "timeout" in reason


async def test_failures_become_unavailable_in_consult(llm: FakeLLM) -> None:
    llm.status = 503
    verdict, reason = await consult(_connector(llm), "path:a", "path:b", 5.0)
    assert verdict is None and "HTTP 503" in reason


def test_parse_completion_reads_choices_message_content() -> None:
    body = {"choices": [{"message": {"content": '{"confidence_score": 1, "notes": "ok"}'}}]}
    verdict = parse_completion(json.dumps(body))
    assert (verdict.confidence_score, verdict.notes) == (1.0, "ok")


# --- configuration and the factory ------------------------------------------------------------


def test_build_inference_defaults_to_the_rules() -> None:
    assert isinstance(build_inference(InferenceSettings()), RuleInference)
    assert SchedulerSettings().inference.kind == "rules"


def test_a_configured_key_variable_must_be_set() -> None:
    settings = InferenceSettings(kind="openai", url="http://h/v1", model="m", api_key_env="NOPE")
    with pytest.raises(ValidationError, match=r"scheduler\.inference\.api_key_env"):
        build_inference(settings, env={})


# --- through the Scheduler --------------------------------------------------------------------


def _openai(url: str, **options: Any) -> SchedulerSettings:
    return SchedulerSettings(
        inference=InferenceSettings(kind="openai", url=url, model=MODEL, **options),
        inference_timeout_s=5.0,
    )


async def _two_overlapping_tasks(h: EngineHarness) -> None:
    """t1 runs on agent a over src/**; t2 for agent b over src/api/** meets the conflict gate."""
    for agent in ("a", "b"):
        await h.register(agent)
        await h.take(agent)  # opening the stream makes the agent RUNNABLE
    first = await h.engine.scheduler.submit(
        Submission("a", "t1", params=b"{}", scope="repo:app path:src/**")
    )
    assert first.accepted and h.engine.scheduler.running("a") is not None
    second = await h.engine.scheduler.submit(
        Submission("b", "t2", params=b"{}", scope="repo:app path:src/api/**")
    )
    assert second.accepted


@pytest.mark.conformance(
    "concurrency.conflict.conservative-fallback",
    "concurrency.inference.unavailable-conservative",
    "concurrency.inference.unavailable-escalate",
    "defaults.inference-unreachable.escalate-hitl",
)
async def test_an_unreachable_connector_escalates_the_conflict_to_hitl() -> None:
    settings = _openai(f"http://127.0.0.1:{_closed_port()}/v1")
    async with open_test_engine(scheduler=settings, hitl=OPERATORS) as h:
        assert h.engine.scheduler.gate.inference.name == f"openai:{MODEL}"
        await _two_overlapping_tasks(h)
        assert h.engine.scheduler.running("b") is None  # t2 waits for the decision
        (conflict,) = await h.events("scheduler.conflict")
        assert conflict.details["outcome"] == "ESCALATE"
        assert "unavailable" in conflict.details["reason"]
        assert conflict.details["confidence_score"] is None
        (invocation,) = await h.engine.hitl.list()
        assert invocation.reason_type == "CONFLICT"
        assert invocation.invocation_id == conflict.details["invocation_id"]
        assert invocation.subject["task_id"] == "t2"
        assert invocation.context["engine"] == f"openai:{MODEL}"
        assert "failed" in invocation.context["notes"]
        assert h.engine.scheduler.gate.stats["engine_unavailable"] == 1


@pytest.mark.conformance("concurrency.conflict.consult-inference")
async def test_the_scheduler_consults_the_configured_endpoint(
    llm: FakeLLM, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("APIARY_TEST_LLM_KEY", "sk-engine")
    llm.content = json.dumps({"confidence_score": 0.95, "notes": "api is separate"})
    settings = _openai(llm.base_url, api_key_env="APIARY_TEST_LLM_KEY")
    async with open_test_engine(scheduler=settings) as h:
        await _two_overlapping_tasks(h)
        (conflict,) = await h.events("scheduler.conflict")
        assert conflict.details["outcome"] == "PARALLEL"
        assert conflict.details["confidence_score"] == 0.95
        assert h.engine.scheduler.running("b") is not None  # both run
    (body,) = llm.requests
    assert json.loads(body["messages"][1]["content"]) == {
        "task_a_scope": "repo:app path:src/api/**",  # the task meeting the gate
        "task_b_scope": "repo:app path:src/**",  # the running task
    }
    assert llm.headers[0]["Authorization"] == "Bearer sk-engine"


@pytest.mark.conformance("concurrency.inference.threshold-configurable")
async def test_the_endpoint_verdict_below_the_threshold_escalates(llm: FakeLLM) -> None:
    llm.content = json.dumps({"confidence_score": 0.6, "notes": "api lives under src"})
    async with open_test_engine(scheduler=_openai(llm.base_url), hitl=OPERATORS) as h:
        await _two_overlapping_tasks(h)
        (conflict,) = await h.events("scheduler.conflict")
        assert conflict.details["outcome"] == "ESCALATE"
        (invocation,) = await h.engine.hitl.list()
        assert invocation.context["notes"] == "api lives under src"


@pytest.mark.conformance(
    "concurrency.conflict.conservative-fallback", "defaults.inference-unreachable.deny-parallelism"
)
async def test_without_a_hitl_operator_the_unavailable_engine_serializes() -> None:
    settings = _openai(f"http://127.0.0.1:{_closed_port()}/v1")
    async with open_test_engine(scheduler=settings) as h:
        await _two_overlapping_tasks(h)
        for _ in range(50):  # the gate's waiter applies the policy's decision
            if await h.events("scheduler.conflict_decided"):
                break
            await asyncio.sleep(0.01)
        (decided,) = await h.events("scheduler.conflict_decided")
        assert decided.details["outcome"] == "SERIALIZE"
        assert h.engine.scheduler.running("b") is None
        assert h.engine.scheduler.get("t2") is not None  # still waiting, not lost
