"""The merger: merges an approved commit into the repository's main branch.

    apiary agent run demo_agents.merger:Merger --coordinator HOST:PORT

It runs the workflow's `merge` node. Merging into main is a privileged operation: the
`git_merge` command tool runs with privilege_level PRIVILEGED, which the coordinator never
runs without a person's approval (RFC 18.5.3): the call opens a HITL invocation with reason
TOOL_PRIVILEGE_ESCALATION and waits. An operator approves or denies it (`apiary hitl
approve|deny`, the console, or the demo's prompt); the event log records who and why. A
denial fails the call with permission_denied, and with it the node.
"""

from __future__ import annotations

from typing import Any

import apiary
from apiary.errors import ValidationError
from demo_agents.common import say


class Merger(apiary.Agent):
    agent_id = "merger"
    capabilities = ("merge",)
    description = "Merges approved changes into main (a privileged tool, approved through HITL)."

    async def on_task(self, task: apiary.TaskContext) -> object:
        params = task.json()
        if params["node_id"] != "merge":
            raise ValidationError.for_field(
                "node_id", f"the merger runs no node {params['node_id']!r}"
            )
        change: dict[str, Any] = params["input"]
        commit = change["commit"]
        message = (
            f"Merge {change['branch']} ({commit[:12]}), approved by the review room "
            f"after {change['revisions']} revision(s)"
        )
        say(f"asking to merge {commit[:12]} into main (PRIVILEGED: waits for a human)")
        result = await self.tools.call(
            "git_merge",
            {"commit": commit, "message": message},
            policy={"privilege_level": "PRIVILEGED"},
        )
        say(f"merged {commit[:12]} into main")
        return {"merged": commit, "git": result.text().strip()[-300:]}
