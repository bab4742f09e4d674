"""`apiary runtime permission ...`, `resolve-permission`, `tools`, `environment`, and the
subagent commands `spawn`, `subagent-input`, `wait-subagents`, `close-subagent`,
`subagents`: the control plane's permission, inventory, environment and subagent commands
(docs/control-plane.md) on the
`apiary runtime` app, through the SDK's RuntimeClient. Each prints the command's answer
(JSON); `permission` exits 1 when the answer is not allowed (denied, or pending approval)."""

from __future__ import annotations

import json
from typing import Any

import typer

from apiary.cli.calls import PROFILE
from apiary.cli.runtime_tasks import KEY, Run, json_option


def register(app: typer.Typer, run: Run, http_option: Any, jsonrpc_option: Any) -> None:
    """Add the permission commands to `app`; `run(program, http, jsonrpc, call)` runs one."""

    @app.command("permission")
    def permission(
        thread_id: str = typer.Argument(..., help="The thread whose agent would act"),
        tool: str = typer.Option("", "--tool", help="A tool call: the tool's name"),
        provider: str = typer.Option("", "--provider", help="With --tool: its provider"),
        arguments: str = typer.Option("", "--arguments", help="With --tool: its arguments (JSON)"),
        privilege: str = typer.Option(
            "", "--privilege", help="With --tool: MINIMAL, DEFAULT, ELEVATED or PRIVILEGED"
        ),
        network: str = typer.Option(
            "",
            "--network",
            help="With --tool: DENY_ALL, EGRESS_RESTRICTED, EGRESS_UNRESTRICTED or FULL_ACCESS",
        ),
        message: str = typer.Option("", "--message", help="A message: its type (DATA, ...)"),
        to: str = typer.Option("", "--to", help="With --message: the recipient"),
        method: str = typer.Option(
            "", "--method", help="A call: a gRPC method path or a runtime command"
        ),
        subject: list[str] = typer.Option(
            [], "--subject", help="With --method: an agent the call names (repeat)"
        ),
        object_id: str = typer.Option("", "--object", help="With --method: the owned object"),
        turn_id: str = typer.Option("", "--turn", help="The turn it is for"),
        prompt: str = typer.Option("", "--prompt", help="What the approver is asked"),
        timeout_s: int = typer.Option(0, "--timeout", min=0, help="Approval deadline (seconds)"),
        key: str = KEY,
        http: str = http_option,
        jsonrpc: bool = jsonrpc_option,
        profile: str = PROFILE,
    ) -> None:
        """Whether a thread's agent may call a tool (--tool), send a message (--message) or
        make a call (--method); what needs approval waits for resolve-permission."""
        kind = "message" if message else "call" if method else "tool"
        given = json_option(arguments, "--arguments")
        answer = run(
            "permission", http, jsonrpc,
            lambda c: c.evaluate_permission(
                thread_id, action_type=kind, tool_name=tool, provider_id=provider,
                arguments=given, privilege_level=privilege, network_policy=network,
                message_type=message, recipient=to, method=method, subjects=subject,
                object_id=object_id, turn_id=turn_id, prompt=prompt,
                timeout_s=timeout_s or None, idempotency_key=key,
            ),
        )  # fmt: skip
        typer.echo(json.dumps(answer, indent=2, ensure_ascii=False))
        if answer.get("status") != "allowed":
            raise typer.Exit(1)

    @app.command("resolve-permission")
    def resolve_permission(
        permission_id: str = typer.Argument(..., help="The permission (its permissionId)"),
        decision: str = typer.Argument(..., help="approve (or allow) or deny"),
        rationale: str = typer.Option("", "--rationale", help="Why (recorded)"),
        key: str = KEY,
        http: str = http_option,
        jsonrpc: bool = jsonrpc_option,
        profile: str = PROFILE,
    ) -> None:
        """Decide a pending permission."""
        answer = run(
            "resolve-permission", http, jsonrpc,
            lambda c: c.resolve_permission(
                permission_id, decision, rationale=rationale, idempotency_key=key
            ),
        )  # fmt: skip
        typer.echo(json.dumps(answer, indent=2, ensure_ascii=False))

    @app.command("tools")
    def tools(
        thread_id: str = typer.Argument(..., help="The thread whose agent's tools to list"),
        http: str = http_option,
        jsonrpc: bool = jsonrpc_option,
        profile: str = PROFILE,
    ) -> None:
        """The tools a thread's agent may call (the catalogue as its tool ACL sees it)."""
        answer = run("tools", http, jsonrpc, lambda c: c.get_tool_inventory(thread_id))
        typer.echo(json.dumps(answer, indent=2, ensure_ascii=False))

    @app.command("environment")
    def environment(
        thread_id: str = typer.Argument(..., help="The thread whose agent's environment to show"),
        http: str = http_option,
        jsonrpc: bool = jsonrpc_option,
        profile: str = PROFILE,
    ) -> None:
        """Where a thread's agent works (its worktree) and what its tool calls run under."""
        answer = run("environment", http, jsonrpc, lambda c: c.get_execution_environment(thread_id))
        typer.echo(json.dumps(answer, indent=2, ensure_ascii=False))

    _subagents(app, run, http_option, jsonrpc_option)


def _subagents(app: typer.Typer, run: Run, http_option: Any, jsonrpc_option: Any) -> None:
    def show(answer: Any) -> None:
        typer.echo(json.dumps(answer, indent=2, ensure_ascii=False))

    @app.command("spawn")
    def spawn(
        thread_id: str = typer.Argument(..., help="The parent thread"),
        agent_id: str = typer.Argument(..., help="The agent the subagent's turns run on"),
        subagent_id: str = typer.Option("", "--id", help="The subagent's thread id"),
        turn_id: str = typer.Option("", "--turn", help="The parent's turn it works for"),
        role: str = typer.Option("", "--role", help="What it does for its parent"),
        given: str = typer.Option("", "--input", help="Its first turn's input (JSON)"),
        key: str = KEY,
        http: str = http_option,
        jsonrpc: bool = jsonrpc_option,
        profile: str = PROFILE,
    ) -> None:
        """Spawn a subagent: a child thread bound to another agent."""
        value = json_option(given, "--input")
        show(run("spawn", http, jsonrpc, lambda c: c.spawn_subagent(
            thread_id, agent_id, subagent_id=subagent_id, turn_id=turn_id, role=role,
            input=value, idempotency_key=key,
        )))  # fmt: skip

    @app.command("subagent-input")
    def subagent_input(
        subagent_id: str = typer.Argument(..., help="The subagent"),
        given: str = typer.Argument(..., help="The input (JSON)"),
        turn_id: str = typer.Option("", "--turn-id", help="The new turn's id"),
        key: str = KEY,
        http: str = http_option,
        jsonrpc: bool = jsonrpc_option,
        profile: str = PROFILE,
    ) -> None:
        """Send input to a subagent: a turn on its thread."""
        value = json_option(given, "input")
        show(run("subagent-input", http, jsonrpc, lambda c: c.send_subagent_input(
            subagent_id, value, turn_id=turn_id, idempotency_key=key,
        )))  # fmt: skip

    @app.command("wait-subagents")
    def wait_subagents(
        subagent_ids: list[str] = typer.Argument(None, help="The subagents (else --thread's)"),
        thread_id: str = typer.Option("", "--thread", help="Every subagent of this thread"),
        timeout_s: int = typer.Option(60, "--timeout", min=0, help="Seconds at most"),
        any_one: bool = typer.Option(False, "--any", help="Return once one settled"),
        http: str = http_option,
        jsonrpc: bool = jsonrpc_option,
        profile: str = PROFILE,
    ) -> None:
        """Wait until subagents settle; exit 1 at the timeout."""
        answer = run("wait-subagents", http, jsonrpc, lambda c: c.wait_subagents(
            subagent_ids or (), thread_id=thread_id, timeout_s=timeout_s,
            mode="any" if any_one else "all",
        ))  # fmt: skip
        show(answer)
        if answer.get("timedOut"):
            raise typer.Exit(1)

    @app.command("close-subagent")
    def close_subagent(
        subagent_id: str = typer.Argument(..., help="The subagent"),
        reason: str = typer.Option("", "--reason", help="Why (recorded)"),
        key: str = KEY,
        http: str = http_option,
        jsonrpc: bool = jsonrpc_option,
        profile: str = PROFILE,
    ) -> None:
        """Close a subagent: its work interrupted, its thread closed to new turns."""
        show(run("close-subagent", http, jsonrpc, lambda c: c.close_subagent(
            subagent_id, reason=reason, idempotency_key=key,
        )))  # fmt: skip

    @app.command("subagents")
    def subagents(
        thread_id: str = typer.Option("", "--thread", help="A thread's subagents"),
        session_id: str = typer.Option("", "--session", help="A session's subagents"),
        http: str = http_option,
        jsonrpc: bool = jsonrpc_option,
        profile: str = PROFILE,
    ) -> None:
        """The parent-child graph of subagents, each child's state."""
        show(run("subagents", http, jsonrpc, lambda c: c.list_subagents(
            thread_id=thread_id, session_id=session_id,
        )))  # fmt: skip
