"""`apiary demo` (docs/demo.md): an embedded coordinator, a real git repository with a failing
test and six real agent processes (examples/demo_agents) that fix it, review it, merge it
with a person's approval and, meanwhile, show a cooperative preemption.

`job` runs it, `sample_repo` makes and checks the repository, `configuration` writes the
run's apiary.toml, `processes` starts the agents, `operator` decides HITL invocations,
`timeline` folds the event log into what the live view shows, `verdict` judges the run from
the event log and the repository, and `view` draws it in a terminal.
"""
