"""The tool service (RFC 18): the catalogue, and every call from request to final frame.

Providers register (agents through ConnectorService.RegisterProvider, commands and MCP
servers from the configuration, MCP servers also at runtime) and are described by the
catalogue. A call is checked before anything runs, in this order: the tool exists, the
execution policy's values are known (VALIDATION_ERROR naming the field), the arguments
match the input schema (VALIDATION_ERROR naming the JSON path), and a tool that needs a
worktree is called by an agent bound to one (worktree_not_bound). The coordinator assigns
the call_id when the request has none.

Then the policy is approved (`core.tool_policy.approval`): ELEVATED is logged every time,
PRIVILEGED and FULL_ACCESS at WARN; all three ask HITL (TOOL_PRIVILEGE_ESCALATION) unless
the configuration pre-approved the provider or tool for that level. Anything but approve
answers PERMISSION_DENIED and nothing runs. `engine/tools/execution.py` runs what is approved.

Every call is in the event log: `tool.call_started`, `tool.privilege`, `tool.call_retry`,
`tool.cancel_requested` and `tool.call_finished` with the outcome, the frame count and the
byte total (RFC 19).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from itertools import groupby
from typing import Any

from apiary.core.clock import Clock
from apiary.core.hitl.vocabulary import HitlReason
from apiary.core.ids import IdGenerator
from apiary.core.tools.calls import (
    ToolCallEffect,
    ToolCallInput,
    ToolCallState,
    ToolFrame,
    cancel_answer,
)
from apiary.core.tools.descriptor import (
    ProviderKind,
    ToolDescriptor,
    ToolProviderRecord,
    check_provider_id,
    validate_tools,
)
from apiary.core.tools.policy import ExecutionPolicy, approval
from apiary.core.tools.requests import RequestedPolicy, effective_policy
from apiary.core.tools.schema import check_arguments
from apiary.engine.eventlog import EventRecorder
from apiary.engine.hitl import Hitl
from apiary.engine.notices import TOOLS, NoticeFactory
from apiary.engine.registry import Registry
from apiary.engine.router.router import Router
from apiary.engine.tools.agent_tools import AgentToolLink, AgentToolProvider, policy_json
from apiary.engine.tools.calls import CallTable, PendingCall
from apiary.engine.tools.catalog import ProviderEntry, ToolCatalog
from apiary.engine.tools.command_tools import CommandToolProvider
from apiary.engine.tools.execution import CallRunner, Prepared, RetrySettings
from apiary.engine.tools.launch import Launcher, SandboxLauncher
from apiary.engine.tools.mcp_bridge import McpProvider, McpServerSpec
from apiary.engine.tools.observers import CallObservers
from apiary.engine.tools.providers import RESTARTING, STARTING, NoWorktrees, WorktreeBindings
from apiary.engine.tools.settings import ToolSettings
from apiary.errors import (
    AlreadyCompletedError,
    AlreadyExistsError,
    ApiaryError,
    NotFoundError,
    PermissionDeniedError,
    ValidationError,
    WorktreeNotBoundError,
)
from apiary.stopping import stop_tasks
from apiary.store.protocols import ToolStore

log = logging.getLogger("apiary.tools")
ARGS_EXCERPT = 2000
"""How much of a call's arguments a HITL invocation shows the operator."""
CLOSE_WAIT_S = 2.0


@dataclass(frozen=True, slots=True)
class CallRequest:
    """A ToolCall as the service takes it (`wire/tools.py` converts the proto)."""

    tool_name: str
    provider_id: str = ""
    call_id: str = ""
    args: bytes = b""
    content_type: str = ""
    policy: RequestedPolicy = field(default_factory=RequestedPolicy)
    stream: bool = False
    caller: str = ""
    """The invoking agent (gRPC metadata sw4rm-agent-id); '' when unknown."""
    correlation_id: str = ""


@dataclass(frozen=True, slots=True)
class CancelAnswer:
    """The Cancel RPC's ToolError: CANCELLED, NOT_FOUND or ALREADY_COMPLETED (RFC 18.6)."""

    call_id: str
    error_code: str
    message: str


class ToolService:
    def __init__(
        self,
        store: ToolStore,
        router: Router,
        registry: Registry,
        hitl: Hitl,
        events: EventRecorder,
        clock: Clock,
        ids: IdGenerator,
        settings: ToolSettings | None = None,
        *,
        launcher: Launcher | None = None,
        worktrees: WorktreeBindings | None = None,
    ) -> None:
        self.settings = settings or ToolSettings()
        self._registry = registry
        self._hitl = hitl
        self._events = events
        self._clock = clock
        self._ids = ids
        self.launcher: Launcher = launcher or SandboxLauncher()
        self.worktrees: WorktreeBindings = worktrees or NoWorktrees()
        self.link = AgentToolLink(router, NoticeFactory(clock, ids, TOOLS), events)
        self._router = router
        self.catalog = ToolCatalog(store, events, clock)
        self.calls = CallTable()
        self.observers = CallObservers()
        self._runner = CallRunner(
            events,
            RetrySettings(self.settings.retry_base_s, self.settings.retry_cap_s),
            self.settings.cancel_grace_s,
            self.observers,
        )
        self._policies: dict[tuple[str, str], ExecutionPolicy] = {}
        self._slots: dict[tuple[str, str], asyncio.Semaphore] = {}
        self._background: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------------ lifetime

    async def load(self) -> None:
        """Serve the stored catalogue and the configured providers (at start-up)."""
        await self.link.load()
        stored = {r.provider_id: r for r in await self.catalog.stored()}
        configured: set[str] = set()
        commands = sorted(self.settings.commands, key=lambda s: s.provider_id)
        for provider_id, group in groupby(commands, key=lambda s: s.provider_id):
            specs = list(group)
            for spec in specs:
                self._policies[(provider_id, spec.descriptor.tool_name)] = spec.policy
            tools = validate_tools([s.descriptor for s in specs])
            provider = CommandToolProvider(provider_id, specs, self.launcher)
            await self.catalog.put(provider, tools, registered_by="config", config={})
            configured.add(provider_id)
        for server in self.settings.mcp:
            previous = stored.get(server.provider_id)
            tools = previous.tools if previous and previous.kind == ProviderKind.MCP else ()
            await self._put_mcp(server, tools, "config")
            configured.add(server.provider_id)
        for record in stored.values():
            if record.provider_id not in configured:
                await self._adopt(record)

    async def _adopt(self, record: ToolProviderRecord) -> None:
        if record.kind == ProviderKind.AGENT:
            provider = AgentToolProvider(record.provider_id, record.tools, self.link,
                                         self._registry)  # fmt: skip
            self.catalog.adopt(record, provider)
        elif record.kind == ProviderKind.MCP and record.config.get("source") == "runtime":
            spec = McpServerSpec.from_config(record.provider_id, record.config)
            self._policies[(spec.provider_id, "")] = spec.policy
            self.catalog.adopt(record, self._mcp_provider(spec, record.tools))
        else:  # the configuration no longer declares it
            await self.catalog.remove(record.provider_id)

    def start(self) -> None:
        """Start the MCP servers (in the background: a slow server delays nothing)."""
        for entry in self.catalog.entries():
            if isinstance(entry.provider, McpProvider):
                entry.provider.start()

    async def close(self) -> None:
        """Stop calls in progress and every provider's processes."""
        for call in self.calls.live():
            await self.cancel(call.call_id, "coordinator shutdown")
        if self._background:  # the providers' stop requests, briefly
            await asyncio.wait(set(self._background), timeout=CLOSE_WAIT_S)
        for entry in self.catalog.entries():
            await entry.provider.close()
        await stop_tasks(list(self._background), "the tool service's background work")

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------ registration

    async def register_agent_provider(
        self, provider_id: str, tools: Sequence[ToolDescriptor], caller: str = ""
    ) -> ToolProviderRecord:
        """An agent offers `tools` (RegisterProvider): provider_id is its agent id."""
        provider_id = check_provider_id(provider_id or caller)
        if caller and caller != provider_id:
            raise PermissionDeniedError(
                f"agent {caller!r} may register tools only as provider {caller!r}, "
                f"not {provider_id!r}",
                {"provider_id": provider_id},
            )
        existing = self.catalog.get(provider_id)
        if existing is not None and existing.record.kind != ProviderKind.AGENT:
            raise PermissionDeniedError(
                f"provider {provider_id!r} is a {existing.record.kind} provider of the "
                "coordinator's configuration",
                {"provider_id": provider_id},
            )
        try:  # (in cluster mode the store is asked too: registered through another replica)
            await self._registry.get(provider_id)
        except NotFoundError:
            raise ValidationError.for_field(
                "provider_id", f"no registered agent {provider_id!r}: register the agent first"
            ) from None
        checked = validate_tools(tools)
        provider = AgentToolProvider(provider_id, checked, self.link, self._registry)
        entry = await self.catalog.put(provider, checked, registered_by=caller or provider_id)
        return entry.record

    async def register_mcp_server(self, spec: McpServerSpec, by: str) -> ProviderEntry:
        """Start an MCP server and serve its tools; waits until it listed them."""
        check_provider_id(spec.provider_id)
        if not spec.command:
            raise ValidationError.for_field("command", "is required")
        existing = self.catalog.get(spec.provider_id)
        if existing is not None:
            runtime_mcp = existing.record.kind == ProviderKind.MCP and (
                existing.record.config.get("source") == "runtime"
            )
            if not runtime_mcp:
                raise AlreadyExistsError(
                    f"provider {spec.provider_id!r} exists ({existing.record.kind})",
                    {"provider_id": spec.provider_id},
                )
            await existing.provider.close()
        entry = await self._put_mcp(replace(spec, source="runtime"), (), by)
        provider = entry.provider
        assert isinstance(provider, McpProvider)
        provider.start()
        try:
            await provider.wait_ready(spec.startup_timeout_s)
        except ApiaryError:
            await self.remove_provider(spec.provider_id)
            raise
        found = self.catalog.get(spec.provider_id)
        assert found is not None
        return found

    async def _put_mcp(
        self, spec: McpServerSpec, tools: tuple[ToolDescriptor, ...], by: str
    ) -> ProviderEntry:
        self._policies[(spec.provider_id, "")] = spec.policy
        provider = self._mcp_provider(spec, tools)
        return await self.catalog.put(provider, tools, registered_by=by, config=spec.config())

    def _mcp_provider(self, spec: McpServerSpec, tools: tuple[ToolDescriptor, ...]) -> McpProvider:
        return McpProvider(
            spec, self.launcher, self._events, self.catalog.update_tools, tools=tools,
            health_interval_s=self.settings.mcp_health_interval_s,
            log_dir=self.settings.log_dir,
        )  # fmt: skip

    async def remove_provider(self, provider_id: str) -> bool:
        entry = await self.catalog.remove(provider_id)
        if entry is None:
            return False
        await entry.provider.close()
        return True

    # ------------------------------------------------------------------ calls

    def prepare(self, request: CallRequest) -> Prepared:
        """Everything checked before a call may run (module docstring, in that order)."""
        entry, tool = self.catalog.resolve(request.provider_id, request.tool_name)
        provider_id = entry.record.provider_id
        if not self.settings.permits(request.caller, provider_id, tool.tool_name):
            who = repr(request.caller) if request.caller else "an anonymous caller"
            raise PermissionDeniedError(
                f"the tool ACL does not let {who} call {provider_id}/{tool.tool_name}",
                {"provider_id": provider_id, "tool_name": tool.tool_name,
                 "agent_id": request.caller, "reason": "acl"},
            )  # fmt: skip
        default = self._policies.get(
            (provider_id, tool.tool_name), self._policies.get((provider_id, ""))
        )
        policy = effective_policy(
            request.policy, default or ExecutionPolicy(), default_timeout_s=tool.default_timeout_s,
            needs_worktree=tool.needs_worktree, allowlist=self.settings.allowlist,
            max_retries_cap=self.settings.max_retries,
        )  # fmt: skip
        arguments = check_arguments(tool.input_schema, request.content_type, request.args)
        cwd = None
        if policy.worktree_required:
            cwd = self.worktrees.bound_root(request.caller) if request.caller else None
            if cwd is None:
                who = repr(request.caller) if request.caller else "the caller (no sw4rm-agent-id)"
                raise WorktreeNotBoundError(
                    f"{provider_id}/{tool.tool_name} needs a worktree, and {who} is not bound "
                    "to one",
                    {"provider_id": provider_id, "tool_name": tool.tool_name,
                     "agent_id": request.caller},
                )  # fmt: skip
        return Prepared(entry, tool, policy, request.args, arguments,
                        request.content_type, cwd)  # fmt: skip

    async def _listed(self, request: CallRequest) -> None:
        """A call naming a tool its MCP server has not listed while the server is starting
        (the coordinator's start, before it first listed its tools): the call waits for the
        server, up to its startup_timeout_s (UnavailableError naming the server's state
        after that), then resolves as any call. Without the wait, a call made right after
        the start was refused not_found for a tool the server offers."""
        entry = self.catalog.get(request.provider_id) if request.provider_id else None
        if entry is None or entry.tool(request.tool_name) is not None:
            return
        server = entry.provider
        if isinstance(server, McpProvider) and server.state in (STARTING, RESTARTING):
            await server.wait_ready(server.spec.startup_timeout_s)

    async def call(self, request: CallRequest) -> AsyncGenerator[ToolFrame, None]:
        """Run a call: frames, ending with exactly one final frame (or an ApiaryError)."""
        await self._listed(request)
        try:
            prepared = self.prepare(request)
        except PermissionDeniedError as exc:
            if exc.details.get("reason") == "acl":
                # An access decision: logged (the calls let through are tool.call_started).
                await self._events.record(
                    "acl.denied", request.caller or "anonymous", agent_id=request.caller,
                    kind="tool", provider_id=exc.details["provider_id"],
                    tool_name=exc.details["tool_name"], field="tool_name",
                )  # fmt: skip
            raise
        generated = self._ids.new_id()
        call_id = request.call_id or f"call-{generated}"
        # The call's messages to an agent-provided tool carry its correlation id: with strict
        # correlation ids a generated one is the bare UUIDv4 (a call id need not be one).
        correlation_id = self._router.check_flow_id("correlation_id", request.correlation_id)
        if not correlation_id:
            strict = self._router.settings.strict_correlation_ids
            correlation_id = generated if strict else call_id
        call = self.calls.open(
            PendingCall(
                call_id=call_id, provider_id=prepared.provider_id,
                tool_name=prepared.tool.tool_name, caller=request.caller,
                stream=request.stream, correlation_id=correlation_id,
                started_at=self._clock.now(), provider=prepared.entry.provider,
            )
        )  # fmt: skip
        await self._events.record(
            "tool.call_started", call.caller or "anonymous", correlation_id=call.correlation_id,
            agent_id=call.caller, call_id=call_id, provider_id=call.provider_id,
            tool_name=call.tool_name, stream=call.stream, policy=policy_json(prepared.policy),
        )  # fmt: skip
        try:
            await self._approve(call, prepared)
            if call.cancelled:
                yield self._runner.cancelled_frame(call)
                return
            async with self._slot(prepared, call):
                if call.cancelled:
                    yield self._runner.cancelled_frame(call)
                    return
                call.apply(ToolCallInput.START)
                self.observers.started(call)
                async with contextlib.aclosing(self._runner.run(call, prepared)) as frames:
                    async for frame in frames:
                        yield frame
        except Exception as exc:  # an unexpected one is internal_error (the server logs it)
            call.error_code = exc.code if isinstance(exc, ApiaryError) else "internal_error"
            if call.allows(ToolCallInput.FAIL):
                call.apply(ToolCallInput.FAIL)
            raise
        finally:
            if not call.state.terminal:  # the caller went away, or something unexpected
                await self._abandon(call)
            await self._finished(call)

    async def _approve(self, call: PendingCall, prepared: Prepared) -> None:
        preapproved = self.settings.preapproves(prepared.policy, call.provider_id, call.tool_name)
        decision = approval(prepared.policy, preapproved=preapproved)
        if decision.reasons:
            level = logging.WARNING if decision.log_level == "warning" else logging.INFO
            log.log(level, "tool call %s (%s/%s) for %s runs with %s%s", call.call_id,
                    call.provider_id, call.tool_name, call.caller or "an anonymous caller",
                    ", ".join(decision.reasons),
                    " (pre-approved)" if preapproved else "")  # fmt: skip
            await self._events.record(
                "tool.privilege", call.caller or "anonymous", correlation_id=call.correlation_id,
                agent_id=call.caller, call_id=call.call_id, provider_id=call.provider_id,
                tool_name=call.tool_name, reasons=list(decision.reasons),
                log_level=decision.log_level, preapproved=preapproved, hitl=decision.hitl,
            )  # fmt: skip
        if not decision.hitl:
            return
        call.apply(ToolCallInput.ESCALATE)
        opened = await self._hitl.open(
            HitlReason.TOOL_PRIVILEGE_ESCALATION.value,
            self._context(call, prepared, decision.reasons), requested_by=call.caller or TOOLS,
            subject={"call_id": call.call_id, "provider_id": call.provider_id,
                     "tool_name": call.tool_name},
            proposed_actions=("approve", "deny"), timeout_s=self.settings.hitl_timeout_s,
            approver_roles=self.settings.hitl_approver_roles, correlation_id=call.correlation_id,
        )  # fmt: skip
        call.approval_id = opened.invocation_id
        record = await self._hitl.wait(opened.invocation_id)
        if call.cancelled:
            return  # withdrawn by Cancel
        action = str(record.decision.get("action", "deny"))
        if action == "approve":
            return
        call.apply(ToolCallInput.DENY)
        raise PermissionDeniedError(
            f"HITL invocation {record.invocation_id} ({record.state}) answered {action} "
            f"for {call.provider_id}/{call.tool_name}: {record.decision.get('rationale', '')}",
            {"invocation_id": record.invocation_id, "decision": action,
             "reasons": ", ".join(decision.reasons)},
        )  # fmt: skip

    @staticmethod
    def _context(call: PendingCall, prepared: Prepared, reasons: Sequence[str]) -> dict[str, Any]:
        args = prepared.args[:ARGS_EXCERPT].decode("utf-8", "replace")
        return {
            "call_id": call.call_id, "provider_id": call.provider_id, "tool_name": call.tool_name,
            "caller": call.caller, "reasons": list(reasons), "policy": policy_json(prepared.policy),
            "args_excerpt": args, "args_bytes": len(prepared.args),
            "idempotent": prepared.tool.idempotent,
            "capabilities": list(prepared.tool.capabilities),
            "risk": "the tool asks for " + " and ".join(reasons),
        }  # fmt: skip

    @contextlib.asynccontextmanager
    async def _slot(self, prepared: Prepared, call: PendingCall) -> AsyncIterator[None]:
        """One of the tool's max_concurrency slots, or none once the call is cancelled while
        it waits (the caller then sees `call.cancelled`)."""
        limit = prepared.tool.max_concurrency
        if limit <= 0:
            yield
            return
        key = (prepared.provider_id, prepared.tool.tool_name)
        semaphore = self._slots.setdefault(key, asyncio.Semaphore(limit))
        acquire = asyncio.ensure_future(semaphore.acquire())
        stopped = asyncio.ensure_future(call.stop_requested.wait())
        try:
            await asyncio.wait({acquire, stopped}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # the caller went away while waiting: nothing runs
            stopped.cancel()
            if not acquire.cancel():
                semaphore.release()
            raise
        stopped.cancel()
        # cancel() is False for a finished acquire: then the slot is ours to release.
        held = not acquire.cancel()
        try:
            yield
        finally:
            if held:
                semaphore.release()

    async def _abandon(self, call: PendingCall) -> None:
        call.cancel_reason = call.cancel_reason or "the caller went away"
        effects = call.apply(ToolCallInput.CANCEL) if call.allows(ToolCallInput.CANCEL) else ()
        self._signal(call, effects)
        if call.allows(ToolCallInput.STOPPED):
            call.apply(ToolCallInput.STOPPED)

    async def _finished(self, call: PendingCall) -> None:
        self.calls.close(call)
        self.observers.finished(call)
        await self._events.record(
            "tool.call_finished", call.caller or "anonymous", correlation_id=call.correlation_id,
            agent_id=call.caller, call_id=call.call_id, provider_id=call.provider_id,
            tool_name=call.tool_name, state=call.state.value, error_code=call.error_code,
            stream=call.stream, frames=call.frames, bytes=call.bytes, attempts=call.attempts,
            duration_ms=round((self._clock.now() - call.started_at) * 1000),
        )  # fmt: skip

    # ------------------------------------------------------------------ input

    async def write_stdin(
        self, call_id: str, data: bytes, *, eof: bool = False, by: str = ""
    ) -> None:
        """Write to the standard input of the running call `call_id`, a command tool's with
        `stdin = "stream"` (docs/tools.md); `eof` closes it after `data`. NotFoundError for
        a call never seen (or long forgotten), AlreadyCompletedError for one that ended or
        whose input is closed, ValidationError naming call_id for a call that takes no input."""
        call = self.calls.get(call_id)
        if call is None or call.state.terminal:
            state = self.calls.state_of(call_id)
            if state is None:
                raise NotFoundError(f"no tool call {call_id!r}", {"call_id": call_id})
            raise AlreadyCompletedError(
                f"tool call {call_id} has ended ({state.value})",
                {"call_id": call_id, "state": state.value},
            )
        if not isinstance(call.provider, CommandToolProvider):
            raise ValidationError.for_field(
                "call_id", f"{call_id} calls {call.provider_id}/{call.tool_name}, which takes no "
                'input: only a command tool with stdin = "stream" does',
            )  # fmt: skip
        await call.provider.write_stdin(call_id, data, eof=eof)
        await self._events.record(
            "tool.stdin_written", by or "anonymous", correlation_id=call.correlation_id,
            agent_id=call.caller, call_id=call_id, bytes=len(data), eof=eof,
        )  # fmt: skip

    # ------------------------------------------------------------------ cancel

    def owner_of(self, call_id: str) -> str | None:
        """Who made the call `call_id` while it runs (the access guard lets only it, or a
        `tools` operator, cancel it); None when no such call runs."""
        call = self.calls.get(call_id)
        return None if call is None or call.state.terminal else call.caller

    async def cancel(self, call_id: str, by: str = "") -> CancelAnswer:
        """Cancel (RFC 18.6): best effort; the call's stream ends with its final frame."""
        if not call_id:
            raise ValidationError.for_field("call_id", "is required")
        call = self.calls.get(call_id)
        if call is None or call.state.terminal:
            code = cancel_answer(self.calls.state_of(call_id))
            text = "no such call" if code == "NOT_FOUND" else "the call has already ended"
            return CancelAnswer(call_id, code, f"{call_id}: {text}")
        call.cancel_reason = f"cancelled by {by or 'a caller'}"
        effects = call.apply(ToolCallInput.CANCEL)
        self._signal(call, effects)
        await self._events.record(
            "tool.cancel_requested", by or "anonymous", correlation_id=call.correlation_id,
            call_id=call_id, state=call.state.value,
        )  # fmt: skip
        return CancelAnswer(call_id, cancel_answer(ToolCallState.RUNNING),
                            f"{call_id}: cancellation initiated ({call.state.value})")  # fmt: skip

    def _signal(self, call: PendingCall, effects: Sequence[ToolCallEffect]) -> None:
        call.stop_requested.set()
        if ToolCallEffect.SIGNAL_PROVIDER in effects:
            loop = asyncio.get_running_loop()
            call.cancel_deadline = loop.time() + self.settings.cancel_grace_s
            if call.scope is not None:
                current = call.scope.when()
                call.scope.reschedule(
                    call.cancel_deadline if current is None else min(current, call.cancel_deadline)
                )
            if call.provider is not None:
                self._spawn(_quietly(call.provider.cancel(call.call_id), call.call_id))
        if ToolCallEffect.WITHDRAW_APPROVAL in effects and call.approval_id:
            self._spawn(_quietly(
                self._hitl.cancel(call.approval_id, by="tools", reason=call.cancel_reason),
                call.call_id,
            ))  # fmt: skip


async def _quietly(work: Awaitable[Any], call_id: str) -> None:
    try:
        await work
    except Exception:  # best effort: the grace period ends the call regardless
        log.warning("cancelling tool call %s: a clean-up step failed", call_id, exc_info=True)
