"""The Scheduler: task submission, queues, dispatch to agents, duplicate jobs, preemption."""
