"""The agents of `apiary demo` (docs/demo.md): six processes written with the SDK only.

Each is started as `apiary agent run demo_agents.<module>:<Class>` with this directory on
PYTHONPATH:

planner (`planner:Planner`)
    Takes the brief, starts the indexer's background index, creates and starts the
    fix -> review -> merge workflow, and reports its end.
coder (`coder:Coder`)
    Binds its worktree, reproduces the failure, asks the indexer where the function is,
    fixes it through the confined file API, stamps the CHANGELOG with the MCP time server,
    runs the tests as a tool, commits, and proposes the change to a negotiation room,
    revising it until the room approves.
critic-ruff, critic-pytest (`critics:RuffCritic`, `critics:PytestCritic`)
    Check the proposed commit out in a worktree of their own, run ruff or pytest there as
    command tools, and vote.
merger (`merger:Merger`)
    Merges the approved commit into main through a PRIVILEGED tool, which a person (or
    the demo operator) approves through HITL.
indexer (`indexer:Indexer`)
    Builds a symbol index of the repository and the standard library in a long,
    low-priority task with safe points, and answers urgent lookups, which preempt it.

The agents' decisions about the code (what the fix is) are written in their source: the demo
has no language model. Everything they do goes through the coordinator for real: worktrees,
tool calls in the sandbox, the MCP bridge, the negotiation room, HITL and the Scheduler.
"""
