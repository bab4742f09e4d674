"""`RuntimeClient`: an application's client of a coordinator's runtime control plane over its
HTTP port (docs/control-plane.md), typed with the contract's own types (core/runtime/).

    async with RuntimeClient("http://127.0.0.1:8080") as runtime:
        turn = await runtime.submit_turn({"ask": "fix bug 7"}, agent_id="coder", turn_id="t-1")
        async for item in runtime.events(turn.session_id):   # snapshot first, then events
            ...
        done = await runtime.wait_turn(turn.session_id, turn.turn_id, timeout=60)

Each command is one POST of its parameters to /runtime/v1/<command> (or, with
`transport="jsonrpc"`, one JSON-RPC 2.0 call to /runtime/v1/rpc); a refusal raises the
`apiary.errors` exception of its protocol error code. Calls present the client credentials
(`ClientCredentials.load()`: an API key as `authorization: Bearer`, the tenant, TLS).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field, replace
from types import TracebackType
from typing import Any, Final, Literal

import aiohttp

from apiary.core.access.principal import TENANT_KEY
from apiary.core.runtime.events import RuntimeEvent, RuntimeEventType
from apiary.core.runtime.records import TurnState
from apiary.core.runtime.snapshot import RuntimeSnapshot, TaskView, TurnView
from apiary.errors import ApiaryError, DeadlineExceededError, error_for_code
from apiary.sdk.credentials import AUTHORIZATION, BEARER, ClientCredentials, ClientTls
from apiary.sdk.errors import CoordinatorUnreachableError
from apiary.sdk.runtime_exports import RuntimeExportCommands
from apiary.sdk.runtime_jobs import RuntimeJobCommands
from apiary.sdk.runtime_permissions import RuntimePermissionCommands
from apiary.sdk.runtime_processes import RuntimeProcessCommands
from apiary.sdk.runtime_tasks import RuntimeTaskCommands

PREFIX: Final = "/runtime/v1"
TURN_ENDS: Final = frozenset({RuntimeEventType.TURN_COMPLETED, RuntimeEventType.TURN_FAILED})

Transport = Literal["http", "jsonrpc"]


@dataclass(frozen=True, slots=True)
class SubmittedTurn:
    """submit_turn's answer: the ids, and whether this call created the turn (False: the
    turn_id named a turn submitted before, which this is)."""

    created: bool
    session_id: str
    thread_id: str
    turn_id: str
    task_id: str
    status: str
    turn: TurnView


@dataclass(frozen=True, slots=True)
class ChannelInfo:
    channel_id: str
    session_id: str
    acknowledged_sequence: int
    expires_at: str
    resume_token: str = ""
    """Given when the channel is opened; keep it to resume and acknowledge."""

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], token: str = "") -> ChannelInfo:
        return cls(
            str(doc["channelId"]), str(doc["sessionId"]), int(doc["acknowledgedSequence"]),
            str(doc["expiresAt"]), str(doc.get("resumeToken") or token),
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class SessionRead:
    """get_session's answer."""

    session: Mapping[str, Any]
    snapshot: RuntimeSnapshot
    cursor: int


@dataclass(frozen=True, slots=True)
class ChannelReplay:
    """reconnect_channel's answer: the snapshot first, then the events after the position
    (`more`: others follow; go on from `cursor`)."""

    channel: ChannelInfo
    snapshot: RuntimeSnapshot
    events: list[RuntimeEvent]
    cursor: int
    more: bool


@dataclass(frozen=True, slots=True)
class StreamSnapshot:
    """The first item of an event stream: the channel, the snapshot and the position whose
    following events come next."""

    channel: ChannelInfo
    snapshot: RuntimeSnapshot
    after: int


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    """How a turn ended (`wait_turn`): its last event and, when it completed, its result."""

    turn_id: str
    status: str
    event: RuntimeEvent
    result: Any = None
    error: Mapping[str, Any] = field(default_factory=dict)


class RuntimeClient(
    RuntimeTaskCommands,
    RuntimePermissionCommands,
    RuntimeExportCommands,
    RuntimeJobCommands,
    RuntimeProcessCommands,
):
    """The runtime control plane of one coordinator (module docstring). `base_url` is its
    HTTP address (`http://host:port`, or HOST:PORT: https when the credentials carry TLS)."""

    def __init__(
        self,
        base_url: str,
        *,
        credentials: ClientCredentials | None = None,
        transport: Transport = "http",
        headers: Mapping[str, str] | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        credentials = credentials or ClientCredentials.load()
        if "://" not in base_url:
            scheme = "https" if credentials.tls is not None else "http"
            base_url = f"{scheme}://{base_url}"
        self.base_url = base_url.rstrip("/")
        self._transport = transport
        self._headers = dict(headers or {})
        if credentials.api_key and AUTHORIZATION not in self._headers:
            self._headers[AUTHORIZATION] = BEARER + credentials.api_key
        if credentials.tenant:
            self._headers.setdefault(TENANT_KEY, credentials.tenant)
        https = self.base_url.startswith("https")
        self._ssl: ssl.SSLContext | bool = _ssl_context(credentials.tls) if https else True
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._session: aiohttp.ClientSession | None = None
        self._ids = 0

    async def __aenter__(self) -> RuntimeClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:  # fmt: skip
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers)
        return self._session

    # ------------------------------------------------------------------ calls

    async def call(self, command: str, **params: Any) -> dict[str, Any]:
        """Run `command` with `params` (None values left out); its result."""
        given = {k: v for k, v in params.items() if v is not None}
        try:
            if self._transport == "jsonrpc":
                return await self._rpc(command, given)
            url = f"{self.base_url}{PREFIX}/{command}"
            async with self._http().post(
                url, json=given, ssl=self._ssl, timeout=self._timeout
            ) as response:
                doc = await _json(response)
                if response.status >= 400:
                    raise _error(doc, response.status)
                return dict(doc)
        except aiohttp.ClientConnectionError as exc:
            raise CoordinatorUnreachableError(f"coordinator unreachable: {exc}") from None

    async def _rpc(self, command: str, params: dict[str, Any]) -> dict[str, Any]:
        self._ids += 1
        call = {"jsonrpc": "2.0", "id": self._ids, "method": command, "params": params}
        async with self._http().post(
            f"{self.base_url}{PREFIX}/rpc", json=call, ssl=self._ssl, timeout=self._timeout
        ) as response:
            doc = await _json(response)
        if response.status >= 400:
            raise _error(doc, response.status)
        if "error" in doc:
            error = doc["error"]
            data = error.get("data") or {}
            details = {str(k): str(v) for k, v in (data.get("details") or {}).items()}
            code = str(data.get("code") or "internal_error")
            raise error_for_code(code, str(error.get("message")), details)
        return dict(doc["result"])

    # ------------------------------------------------------------------ commands

    async def submit_turn(
        self, input: Any, *, agent_id: str = "", session_id: str = "", thread_id: str = "",
        turn_id: str = "", queue_policy: str | None = None, scope: str = "", priority: int = 0,
        title: str = "", capability: str = "",
    ) -> SubmittedTurn:  # fmt: skip
        """Queue a turn (a new thread needs `agent_id`, or `capability`: a shared queue any
        capable agent takes its turns from); retrying with the same `turn_id` answers the
        same turn."""
        doc = await self.call(
            "submit_turn", input=input, agent_id=agent_id or None, capability=capability or None,
            session_id=session_id or None, thread_id=thread_id or None, turn_id=turn_id or None,
            queue_policy=queue_policy, scope=scope or None, priority=priority or None,
            title=title or None,
        )  # fmt: skip
        return SubmittedTurn(
            bool(doc["created"]), doc["sessionId"], doc["threadId"], doc["turnId"],
            doc["taskId"], doc["status"], TurnView.from_json(doc["turn"]),
        )  # fmt: skip

    async def interrupt_turn(
        self, *, thread_id: str = "", turn_id: str = "", clear_queue: bool = False,
        reason: str = "", close_subagents: bool = True, idempotency_key: str = "",
    ) -> dict[str, Any]:  # fmt: skip
        """Stop the thread's running turn (or the turn `turn_id` names); the subagents
        spawned with it are closed too (`closedSubagents`) unless `close_subagents` is
        false. A retry under `idempotency_key` answers the first interrupt's answer."""
        return await self.call(
            "interrupt_turn", thread_id=thread_id or None, turn_id=turn_id or None,
            queued="clear" if clear_queue else None, reason=reason or None,
            propagate=None if close_subagents else False,
            idempotency_key=idempotency_key or None,
        )  # fmt: skip

    async def remove_queued_turn(
        self, turn_id: str, *, reason: str = "", idempotency_key: str = ""
    ) -> dict[str, Any]:
        return await self.call(
            "remove_queued_turn", turn_id=turn_id, reason=reason or None,
            idempotency_key=idempotency_key or None,
        )  # fmt: skip

    async def promote_queued_turn(
        self, turn_id: str, *, before_turn_id: str = "", idempotency_key: str = ""
    ) -> dict[str, Any]:
        """Move a queued turn ahead in its thread's queue (to the head, or ahead of
        `before_turn_id`); the answer has the queue in its new order (`queuedTurns`)."""
        return await self.call(
            "promote_queued_turn", turn_id=turn_id, before_turn_id=before_turn_id or None,
            idempotency_key=idempotency_key or None,
        )  # fmt: skip

    async def resume_thread(
        self, thread_id: str, *, turn_id: str = "", reason: str = "", idempotency_key: str = ""
    ) -> dict[str, Any]:
        """Continue a thread explicitly: `mode` says what the runtime did (following,
        reconciled, resubmitted: a turn whose task was lost runs again as `turnId`,
        started, or idle)."""
        return await self.call(
            "resume_thread", thread_id=thread_id, turn_id=turn_id or None,
            reason=reason or None, idempotency_key=idempotency_key or None,
        )  # fmt: skip

    async def get_session(self, session_id: str, *, turns: int | None = None) -> SessionRead:
        doc = await self.call("get_session", session_id=session_id, turns=turns)
        snapshot = RuntimeSnapshot.from_json(doc["snapshot"])
        return SessionRead(doc["session"], snapshot, int(doc["cursor"]["sequence"]))

    async def get_thread_read(self, thread_id: str, *, turns: int | None = None) -> RuntimeSnapshot:
        return RuntimeSnapshot.from_json(
            await self.call("get_thread_read", thread_id=thread_id, turns=turns)
        )

    async def list_tasks(self, *, session_id: str = "", thread_id: str = "") -> list[TaskView]:
        doc = await self.call(
            "list_tasks", session_id=session_id or None, thread_id=thread_id or None
        )
        return [TaskView.from_json(t) for t in doc["tasks"]]

    async def get_task(self, task_id: str) -> TaskView:
        return TaskView.from_json((await self.call("get_task", task_id=task_id))["task"])

    async def reconnect_channel(
        self, session_id: str, *, channel_id: str = "", resume_token: str = "",
        last_acknowledged_sequence: int | None = None, limit: int | None = None,
    ) -> ChannelReplay:  # fmt: skip
        """Open a channel (no `channel_id`) or resume one: the snapshot, then the events."""
        doc = await self.call(
            "reconnect_channel", session_id=session_id, channel_id=channel_id or None,
            resume_token=resume_token or None,
            last_acknowledged_sequence=last_acknowledged_sequence, limit=limit,
        )  # fmt: skip
        return ChannelReplay(
            ChannelInfo.from_json(doc["channel"], resume_token),
            RuntimeSnapshot.from_json(doc["snapshot"]),
            [RuntimeEvent.from_json(e) for e in doc["events"]],
            int(doc["cursor"]["sequence"]), bool(doc["more"]),
        )  # fmt: skip

    async def ack_events(self, channel_id: str, resume_token: str, sequence: int) -> ChannelInfo:
        doc = await self.call(
            "ack_events", channel_id=channel_id, resume_token=resume_token, sequence=sequence
        )
        return ChannelInfo.from_json(doc, resume_token)

    async def commands(self) -> list[dict[str, Any]]:
        """Every command of the contract: its name, whether it is served, what it does."""
        try:
            async with self._http().get(
                f"{self.base_url}{PREFIX}", ssl=self._ssl, timeout=self._timeout
            ) as response:
                doc = await _json(response)
        except aiohttp.ClientConnectionError as exc:
            raise CoordinatorUnreachableError(f"coordinator unreachable: {exc}") from None
        if response.status >= 400:
            raise _error(doc, response.status)
        return [dict(item) for item in doc["commands"]]

    # ------------------------------------------------------------------ the event stream

    async def events(
        self, session_id: str, *, channel_id: str = "", resume_token: str = "",
        after: int | None = None,
    ) -> AsyncIterator[StreamSnapshot | RuntimeEvent]:  # fmt: skip
        """The session's server-sent events: a `StreamSnapshot` first, then every event
        after its position, live, until the caller stops or the coordinator ends the stream
        (a refusal mid-stream raises its error)."""
        query: dict[str, str] = {}
        if channel_id:
            query.update(channel_id=channel_id, resume_token=resume_token)
        if after is not None:
            query["after"] = str(after)
        url = f"{self.base_url}{PREFIX}/sessions/{session_id}/events"
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self._timeout.total)
        try:
            async with self._http().get(url, params=query, ssl=self._ssl, timeout=timeout) as r:
                if r.status >= 400:
                    raise _error(await _json(r), r.status)
                async for kind, data in _sse(r):
                    if kind == "snapshot":
                        yield StreamSnapshot(
                            ChannelInfo.from_json(data["channel"], resume_token),
                            RuntimeSnapshot.from_json(data["snapshot"]), int(data["after"]),
                        )  # fmt: skip
                    elif kind == "error":
                        raise error_for_code(str(data.get("code")), str(data.get("message")))
                    else:
                        yield RuntimeEvent.from_json(data)
        except aiohttp.ClientConnectionError as exc:
            raise CoordinatorUnreachableError(f"coordinator unreachable: {exc}") from None

    async def _with_result(self, ended: TurnOutcome) -> TurnOutcome:
        """A completed turn's outcome with its result, read from its task."""
        task_id = ended.event.task_id
        if ended.status != TurnState.COMPLETED or not task_id:
            return ended
        task = await self.get_task(task_id)
        return replace(ended, result=task.extra.get("result"))

    async def wait_turn(
        self,
        session_id: str,
        turn_id: str,
        *,
        timeout: float | None = None,  # noqa: ASYNC109
    ) -> TurnOutcome:
        """Follow the session's events until the turn ends (DeadlineExceededError after
        `timeout` seconds). A turn that ended before the call is answered from its thread's
        last outcome, without waiting."""

        async def follow() -> TurnOutcome:
            async for item in self.events(session_id):
                if isinstance(item, StreamSnapshot):
                    ended = _ended_in(item.snapshot, turn_id)
                    if ended is not None:
                        return await self._with_result(ended)
                    continue
                if item.turn_id == turn_id and item.type in TURN_ENDS:
                    payload = item.payload if isinstance(item.payload, Mapping) else {}
                    return TurnOutcome(
                        turn_id, item.status or "", item, payload.get("result"),
                        payload.get("error") or {},
                    )  # fmt: skip
            raise DeadlineExceededError(f"the event stream ended before turn {turn_id} did")

        try:
            async with asyncio.timeout(timeout):
                return await follow()
        except TimeoutError:
            raise DeadlineExceededError(
                f"turn {turn_id} did not end within {timeout} s", {"turn_id": turn_id}
            ) from None


def _ended_in(snapshot: RuntimeSnapshot, turn_id: str) -> TurnOutcome | None:
    """The outcome of a turn the snapshot shows ended (its result not read yet)."""
    for thread in snapshot.threads:
        for turn in thread.turns or ():
            if turn.turn_id == turn_id and TurnState(turn.status).terminal:
                event = RuntimeEvent(
                    RuntimeEventType.SNAPSHOT_UPDATED, f"snapshot:{turn_id}",
                    snapshot.updated_at or "1970-01-01T00:00:00Z", session_id=snapshot.session_id,
                    turn_id=turn_id, task_id=turn.task_id, status=turn.status,
                )  # fmt: skip
                error = turn.extra.get("error") or {}
                return TurnOutcome(turn_id, turn.status, event, None, error)
    return None


async def _sse(response: aiohttp.ClientResponse) -> AsyncIterator[tuple[str, Any]]:
    """(event type, data) of each server-sent event ('message' when it names none)."""
    kind, data = "message", list[str]()
    async for raw in response.content:
        line = raw.decode("utf-8").rstrip("\r\n")
        if not line:
            if data:
                yield kind, json.loads("\n".join(data))
            kind, data = "message", []
        elif line.startswith("event:"):
            kind = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())


async def _json(response: aiohttp.ClientResponse) -> dict[str, Any]:
    try:
        doc = await response.json(content_type=None)
    except (json.JSONDecodeError, aiohttp.ContentTypeError):
        text = (await response.text())[:200]
        raise error_for_code("internal_error", f"HTTP {response.status}: {text}") from None
    if not isinstance(doc, dict):
        raise error_for_code("internal_error", f"HTTP {response.status}: not a JSON object")
    return doc


def _error(doc: Mapping[str, Any], status: int) -> ApiaryError:
    error = doc.get("error") or {}
    details = {str(k): str(v) for k, v in (error.get("details") or {}).items()}
    message = str(error.get("message") or f"HTTP {status}")
    return error_for_code(str(error.get("code") or "internal_error"), message, details)


def _ssl_context(tls: ClientTls | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(tls.ca) if tls and tls.ca else None)
    if tls is not None and tls.cert is not None and tls.key is not None:
        context.load_cert_chain(str(tls.cert), str(tls.key))
    return context
