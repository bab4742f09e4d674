"""The rule of every gRPC method (Apiary's, and gRPC's health and reflection), HTTP route and
runtime command: the one table the authorizer reads (docs/security.md explains each rule). A
method, route or command missing here is refused, and a test fails for it
(tests/security/test_every_method.py), so no later surface can forget its rule."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from apiary.core.access.rules import DevMode, Role, Rule, Who

PUBLIC = Rule(Who.PUBLIC)
ANYONE = Rule(Who.PRINCIPAL)
OPERATOR = Rule(Who.OPERATOR, dev=DevMode.OPERATOR)
"""An operator in every mode: the call acts as a person (HITL decisions)."""


def _self(*fields: str, role: Role | None = Role.AGENTS) -> Rule:
    """The agent the fields name acts only as itself; `role` lets an operator act for it."""
    return Rule(Who.SELF, role, fields)


def _producer(field: str) -> Rule:
    """A message's producer: an agent or an application as itself, or an operator (whose
    messages are HITL decisions, taken by the operator's authentication, not the name)."""
    return Rule(Who.SELF, None, (field,), applications=True, operators=True)


def _role(role: Role, dev: DevMode = DevMode.TRUSTED) -> Rule:
    return Rule(Who.ROLE, role, dev=dev)


_CONFIGURED = DevMode.OPERATOR_IF_CONFIGURED


_AGENT = _self("agent_id")
_TASK_OWNER = Rule(Who.OWNER, Role.TASKS, ("task_id",), "task")
_TASK_OWNER_IF_CONFIGURED = Rule(Who.OWNER, Role.TASKS, ("task_id",), "task", dev=_CONFIGURED)

METHOD_RULES: Mapping[str, Rule] = MappingProxyType(
    {
        # Registry: an agent registers, beats and leaves as itself; operators with `agents`
        # create agent ids for others and revoke them.
        "/sw4rm.registry.RegistryService/RegisterAgent": _self("agent.agent_id"),
        "/sw4rm.registry.RegistryService/Heartbeat": _AGENT,
        "/sw4rm.registry.RegistryService/DeregisterAgent": _AGENT,
        # Router: a producer sends only as itself; an inbox is read only by its agent.
        "/sw4rm.router.RouterService/SendMessage": _producer("msg.producer_id"),
        "/sw4rm.router.RouterService/StreamIncoming": _self("agent_id", role=None),
        "/apiary.v1.RouterStreamService/SendStream": _producer("items[].msg.producer_id"),
        "/apiary.v1.RouterStreamService/Inbound": _self("agent_id", role=None),
        # Scheduler.
        "/sw4rm.scheduler.SchedulerService/SubmitTask": ANYONE,
        "/sw4rm.scheduler.SchedulerService/RequestPreemption": _self("agent_id", role=Role.TASKS),
        "/sw4rm.scheduler.SchedulerService/ShutdownAgent": _AGENT,
        "/sw4rm.scheduler.SchedulerService/PollActivityBuffer": _AGENT,
        "/sw4rm.scheduler.SchedulerService/PurgeActivity": _AGENT,
        "/apiary.v1.AgentControlService/Suspend": _role(Role.AGENTS),
        "/apiary.v1.AgentControlService/Resume": _role(Role.AGENTS),
        # A task is its submitter's: it reads it, waits for it, watches it and cancels it;
        # `tasks` operators act on anyone's. Its agent alone reports its outcome. A listing
        # shows each principal its own tasks (LISTING_RULES).
        "/apiary.v1.TaskQueryService/ListTasks": ANYONE,
        "/apiary.v1.TaskQueryService/GetTask": _TASK_OWNER,
        "/apiary.v1.TaskQueryService/CancelTask": _TASK_OWNER_IF_CONFIGURED,
        "/apiary.v1.TaskQueryService/SubmitTask": ANYONE,
        # Any principal submits many to a call; each item is decided under SubmitTask's rule
        # by the handler (recorded as its decision on the item), and one refused alone.
        "/apiary.v1.TaskQueryService/SubmitTasks": ANYONE,
        "/apiary.v1.TaskQueryService/WaitTask": _TASK_OWNER,
        "/apiary.v1.TaskQueryService/WatchTasks": Rule(
            Who.SELF, Role.TASKS, ("submitter",), applications=True
        ),
        # Any principal follows task ends; each task it names is decided under WaitTask's
        # rule by the handler, and one it may not wait for is refused alone.
        "/apiary.v1.TaskQueryService/FollowTasks": ANYONE,
        "/apiary.v1.TaskQueryService/CompleteTask": _self("agent_id", role=None),
        "/apiary.v1.ActivityBufferService/Register": _self("entry.agent_id"),
        "/apiary.v1.ActivityBufferService/Complete": _AGENT,
        "/apiary.v1.ActivityBufferService/List": ANYONE,
        # Negotiation policy: reading for everyone, changing for `policy` operators.
        "/sw4rm.scheduler.SchedulerPolicyService/SetNegotiationPolicy": _role(
            Role.POLICY, _CONFIGURED
        ),
        "/sw4rm.scheduler.SchedulerPolicyService/GetNegotiationPolicy": ANYONE,
        "/sw4rm.scheduler.SchedulerPolicyService/SetPolicyProfiles": _role(
            Role.POLICY, _CONFIGURED
        ),
        "/sw4rm.scheduler.SchedulerPolicyService/ListPolicyProfiles": ANYONE,
        "/sw4rm.scheduler.SchedulerPolicyService/GetEffectivePolicy": ANYONE,
        "/sw4rm.scheduler.SchedulerPolicyService/SubmitEvaluation": ANYONE,
        "/sw4rm.scheduler.SchedulerPolicyService/HitlAction": _role(Role.POLICY, DevMode.OPERATOR),
        # HITL: agents ask, operators answer (the invocation's approver roles decide which).
        "/sw4rm.hitl.HitlService/Decide": ANYONE,
        "/apiary.v1.HitlOperatorService/List": OPERATOR,
        "/apiary.v1.HitlOperatorService/Get": OPERATOR,
        "/apiary.v1.HitlOperatorService/Decide": OPERATOR,
        "/apiary.v1.HitlOperatorService/Watch": OPERATOR,
        "/apiary.v1.HitlOperatorService/Escalate": ANYONE,
        # Worktrees: an agent binds and switches its own; operators approve switches.
        "/sw4rm.worktree.WorktreeService/Bind": _AGENT,
        "/sw4rm.worktree.WorktreeService/Unbind": _AGENT,
        "/sw4rm.worktree.WorktreeService/RequestSwitch": _AGENT,
        "/sw4rm.worktree.WorktreeService/ApproveSwitch": _role(Role.WORKTREES, _CONFIGURED),
        "/sw4rm.worktree.WorktreeService/RejectSwitch": _self("agent_id", role=Role.WORKTREES),
        "/sw4rm.worktree.WorktreeService/Status": ANYONE,
        "/apiary.v1.WorktreeBindingService/List": ANYONE,
        "/apiary.v1.WorktreeBindingService/Get": ANYONE,
        "/apiary.v1.WorktreeBindingService/Bind": _AGENT,
        "/apiary.v1.WorktreeBindingService/RequestSwitch": _AGENT,
        "/apiary.v1.WorktreeBindingService/Revoke": _self("agent_id", role=Role.WORKTREES),
        # Tools: a call is the caller's; only it (or a `tools` operator) cancels it.
        "/sw4rm.tool.ToolService/Call": ANYONE,
        "/sw4rm.tool.ToolService/CallStream": ANYONE,
        "/sw4rm.tool.ToolService/Cancel": Rule(Who.OWNER, Role.TOOLS, ("call_id",), "tool_call"),
        "/sw4rm.connector.ConnectorService/RegisterProvider": ANYONE,
        "/sw4rm.connector.ConnectorService/DescribeTools": ANYONE,
        "/apiary.v1.ToolProviderService/ListProviders": ANYONE,
        "/apiary.v1.ToolProviderService/RegisterMcpServer": _role(Role.TOOLS, DevMode.OPERATOR),
        "/apiary.v1.ToolProviderService/RemoveProvider": _role(Role.TOOLS, DevMode.OPERATOR),
        # Negotiation: participants speak as themselves (from_agent).
        "/sw4rm.negotiation.NegotiationService/Open": ANYONE,
        "/sw4rm.negotiation.NegotiationService/Propose": _self("from_agent", role=None),
        "/sw4rm.negotiation.NegotiationService/Counter": _self("from_agent", role=None),
        "/sw4rm.negotiation.NegotiationService/Evaluate": _self("from_agent", role=None),
        "/sw4rm.negotiation.NegotiationService/Decide": _self("decided_by", role=Role.POLICY),
        "/sw4rm.negotiation.NegotiationService/Abort": ANYONE,
        "/apiary.v1.NegotiationOperatorService/Open": _role(Role.POLICY),
        "/apiary.v1.NegotiationOperatorService/List": ANYONE,
        "/apiary.v1.NegotiationOperatorService/Get": ANYONE,
        "/sw4rm.negotiation_room.NegotiationRoomService/SubmitProposal": _self(
            "proposal.producer_id", role=None
        ),
        "/sw4rm.negotiation_room.NegotiationRoomService/SubmitVote": _self(
            "vote.critic_id", role=None
        ),
        "/sw4rm.negotiation_room.NegotiationRoomService/GetVotes": ANYONE,
        "/sw4rm.negotiation_room.NegotiationRoomService/GetDecision": ANYONE,
        "/sw4rm.negotiation_room.NegotiationRoomService/WaitForDecision": ANYONE,
        "/apiary.v1.NegotiationRoomQueryService/ListProposals": ANYONE,
        "/apiary.v1.NegotiationRoomQueryService/GetProposal": ANYONE,
        "/apiary.v1.NegotiationRoomQueryService/ListDecisions": ANYONE,
        "/apiary.v1.NegotiationRoomQueryService/ListPolicies": ANYONE,
        # Handoff: the origin requests, the target accepts or rejects.
        "/sw4rm.handoff.HandoffService/RequestHandoff": _self("from_agent", role=None),
        "/sw4rm.handoff.HandoffService/AcceptHandoff": _self("accepting_agent", role=None),
        "/sw4rm.handoff.HandoffService/RejectHandoff": _self("accepting_agent", role=None),
        "/sw4rm.handoff.HandoffService/GetPendingHandoffs": _self("agent_id", role=None),
        "/sw4rm.handoff.HandoffService/CompleteHandoff": ANYONE,
        "/apiary.v1.HandoffQueryService/ListHandoffs": ANYONE,
        "/apiary.v1.HandoffQueryService/GetHandoff": ANYONE,
        # Workflows: applications and operators drive them.
        "/sw4rm.workflow.WorkflowService/CreateWorkflow": ANYONE,
        "/sw4rm.workflow.WorkflowService/StartWorkflow": ANYONE,
        "/sw4rm.workflow.WorkflowService/GetWorkflowState": ANYONE,
        "/sw4rm.workflow.WorkflowService/ResumeWorkflow": ANYONE,
        "/apiary.v1.WorkflowQueryService/ListWorkflows": ANYONE,
        # Cancelling ends the workflow's tasks, as CancelTask does; a run's history is the
        # event log's (its nodes' messages included), as the console's workflow data is.
        "/apiary.v1.WorkflowQueryService/CancelWorkflow": _role(Role.TASKS, _CONFIGURED),
        "/apiary.v1.WorkflowQueryService/WorkflowHistory": _role(Role.EVENTS),
        # Inference and activity artifacts.
        "/sw4rm.reasoning.InferenceProxy/CheckParallelism": ANYONE,
        "/sw4rm.reasoning.InferenceProxy/EvaluateDebate": ANYONE,
        "/sw4rm.reasoning.ReasoningProxy/CheckParallelism": ANYONE,
        "/sw4rm.reasoning.ReasoningProxy/EvaluateDebate": ANYONE,
        "/sw4rm.reasoning.ReasoningProxy/Summarize": ANYONE,
        "/sw4rm.activity.ActivityService/AppendArtifact": ANYONE,
        "/sw4rm.activity.ActivityService/ListArtifacts": ANYONE,
        # Logs and the event log: agents log as themselves; reading needs `events`.
        "/sw4rm.logging.LoggingService/Ingest": _self("agent_id", role=Role.EVENTS),
        "/apiary.v1.EventLogService/ReadEvents": _role(Role.EVENTS),
        # Discovery: listing for everyone; an agent sets its own buffer.
        "/apiary.v1.DiscoveryService/ListAgents": ANYONE,
        "/apiary.v1.DiscoveryService/GetAgent": ANYONE,
        "/apiary.v1.DiscoveryService/SetBufferCapacity": _AGENT,
        # Dead letters hold other principals' messages: `dlq` operators only.
        "/apiary.v1.DlqService/List": _role(Role.DLQ),
        "/apiary.v1.DlqService/Get": _role(Role.DLQ),
        "/apiary.v1.DlqService/Requeue": _role(Role.DLQ),
        "/apiary.v1.DlqService/Export": _role(Role.DLQ),
        # The runtime control plane over gRPC: each command is then decided by RUNTIME_RULES,
        # as over HTTP (every command there asks for a principal at least).
        "/apiary.v1.RuntimeControlService/Call": ANYONE,
    }
)

STANDARD_RULES: Mapping[str, Rule] = MappingProxyType(
    {
        # gRPC's own services beside Apiary's: health carries no data and is what load
        # balancers and orchestrators probe without credentials (as GET /healthz);
        # reflection describes every service and message type, so it takes a principal.
        "/grpc.health.v1.Health/Check": PUBLIC,
        "/grpc.health.v1.Health/List": PUBLIC,
        "/grpc.health.v1.Health/Watch": PUBLIC,
        "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo": ANYONE,
        "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo": ANYONE,
    }
)
"""Rules of the standard gRPC services the server also serves (grpc.health.v1, reflection)."""

HTTP_RULES: Mapping[str, Rule] = MappingProxyType(
    {
        # Probes and the console's own files carry no data.
        "GET /healthz": PUBLIC,
        "GET /readyz": PUBLIC,
        "GET /console": PUBLIC,
        "GET /console/": PUBLIC,
        "GET /console/{name}": PUBLIC,
        "GET /v1": PUBLIC,
        "GET /metrics": _role(Role.METRICS),
        # The console's data and live stream are the event log.
        "GET /console/api/workflows": _role(Role.EVENTS),
        "GET /console/api/history": _role(Role.EVENTS),
        "GET /console/api/finished": _role(Role.EVENTS),
        "GET /v1/events/stream": _role(Role.EVENTS),
        # Gateway calls are decided per method by METHOD_RULES.
        "POST /v1/{service}/{method}": PUBLIC,
        # The runtime control plane: each command is decided by RUNTIME_RULES, over HTTP
        # JSON, JSON-RPC and the event stream (reconnect_channel's) alike.
        "GET /runtime/v1": PUBLIC,
        "POST /runtime/v1/rpc": PUBLIC,
        "POST /runtime/v1/{command}": PUBLIC,
        "GET /runtime/v1/sessions/{session_id}/events": PUBLIC,
        "GET /runtime/v1/sessions/{session_id}/socket": PUBLIC,
        # The swarm endpoint authenticates every request by its own signatures
        # (agent-swarm-protocol section 5): the swarm's members are not Apiary principals.
        "POST /swarm/message": PUBLIC,
        "POST /swarm/join": PUBLIC,
        "GET /swarm/health": PUBLIC,
        "GET /swarm/info": PUBLIC,
    }
)
"""Rules of the HTTP routes, by 'METHOD canonical-path' (HEAD follows GET)."""


RUNTIME_RULES: Mapping[str, Rule] = MappingProxyType(
    {
        # Any principal drives sessions of its own (docs/control-plane.md): a session,
        # thread, turn or channel another principal owns answers as a missing one, except
        # to operators with `tasks`, who act on anyone's (as on tasks).
        "submit_turn": ANYONE,
        "interrupt_turn": ANYONE,
        "remove_queued_turn": ANYONE,
        "promote_queued_turn": ANYONE,
        "resume_thread": ANYONE,
        "get_session": ANYONE,
        "get_thread_read": ANYONE,
        "list_tasks": ANYONE,
        "get_task": ANYONE,
        "export_evidence": ANYONE,
        "export_replay": ANYONE,
        "export_review": ANYONE,
        "reconnect_channel": ANYONE,
        "ack_events": ANYONE,
        # Agent tasks are their owner's (and operators' with `tasks`); the task's assigned
        # agent may also report progress and complete or fail it.
        "create_task": ANYONE,
        "update_task": ANYONE,
        "start_task": ANYONE,
        "append_task_progress": ANYONE,
        "pause_task": ANYONE,
        "resume_task": ANYONE,
        "cancel_task": ANYONE,
        "retry_task": ANYONE,
        "complete_task": ANYONE,
        "fail_task": ANYONE,
        "link_tasks": ANYONE,
        "unlink_tasks": ANYONE,
        # An action is decided by its session's owner (operators with `tasks` too); the
        # HITL engine then checks the invocation's approver roles.
        "respond_action": ANYONE,
        # A permission is evaluated for a thread of the caller's (its agent's rights, not the
        # caller's) and resolved by the thread's session owner (operators with `tasks`
        # too); the HITL engine then checks the invocation's approver roles.
        "evaluate_permission": ANYONE,
        "resolve_permission": ANYONE,
        # What a thread's agent may call and where it works: read by the thread's owner.
        "get_tool_inventory": ANYONE,
        "get_execution_environment": ANYONE,
        # Subagents are child threads of the caller's session: its owner's, as threads are.
        "spawn_subagent": ANYONE,
        "send_subagent_input": ANYONE,
        "wait_subagents": ANYONE,
        "close_subagent": ANYONE,
        "list_subagents": ANYONE,
        # Jobs are their owner's (and operators' with `tasks`), as their item tasks are.
        "create_job": ANYONE,
        "get_job": ANYONE,
        "cancel_job": ANYONE,
        # A process (a tool call of a thread's agent) is its session owner's to write to and
        # terminate (operators with `tasks` too); anyone else is answered as if it did not
        # exist.
        "write_process_stdin": ANYONE,
        "terminate_process": ANYONE,
    }
)
"""Rules of the runtime control plane's commands, by name."""


LISTING_RULES: Mapping[str, Rule] = MappingProxyType(
    {
        # Who sees every task; any other principal sees the tasks it submitted, and an
        # agent those given to it when it lists its own (`agent_id` its name).
        "/apiary.v1.TaskQueryService/ListTasks": _role(Role.TASKS),
    }
)
"""Rules of the listings whose rows are narrowed per principal: who their rule allows sees
every row, any other principal its own (the listing's handler says which rows are)."""


def describe(rule: Rule) -> str:
    """Who a rule lets call, in words (the rule table in docs/security.md)."""
    role = f"`{rule.role.value}`" if rule.role is not None else ""
    if rule.who is Who.PUBLIC:
        return "anyone (no credential needed)"
    if rule.who is Who.PRINCIPAL:
        return "any principal"
    if rule.who is Who.OPERATOR:
        return "any operator" + _dev_note(rule)
    if rule.who is Who.ROLE:
        return f"operators with {role}" + _dev_note(rule)
    fields = ", ".join(f"`{s}`" for s in rule.subjects)
    if rule.who is Who.OWNER:
        owned = f"the owner of the {rule.owner} `{rule.subjects[0]}`"
        return f"{owned}, or operators with {role}" + _dev_note(rule)
    kinds = "the agent or application" if rule.applications else "the agent"
    text = f"{kinds} {fields} names, as itself"
    if rule.operators:
        text += "; any operator"
    elif role:
        text += f"; operators with {role}"
    return text


def _dev_note(rule: Rule) -> str:
    if rule.dev is DevMode.OPERATOR:
        return " (an operator in dev mode too)"
    if rule.dev is DevMode.OPERATOR_IF_CONFIGURED:
        return " (in dev mode, an operator once operators are configured)"
    return ""


def markdown() -> str:
    """The rule of every method, route and runtime command as Markdown tables."""
    lines = ["| gRPC method | who may call |", "|---|---|"]
    lines += [f"| `{path}` | {describe(rule)} |" for path, rule in METHOD_RULES.items()]
    lines += [f"| `{path}` | {describe(rule)} |" for path, rule in STANDARD_RULES.items()]
    lines += ["", "| HTTP route | who may call |", "|---|---|"]
    lines += [f"| `{route}` | {describe(rule)} |" for route, rule in HTTP_RULES.items()]
    lines += ["", "| runtime command | who may call |", "|---|---|"]
    lines += [f"| `{name}` | {describe(rule)} |" for name, rule in RUNTIME_RULES.items()]
    lines += ["", "| listing | who sees every row (any other principal: its own) |", "|---|---|"]
    lines += [f"| `{path}` | {describe(rule)} |" for path, rule in LISTING_RULES.items()]
    return "\n".join(lines) + "\n"
