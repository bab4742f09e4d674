"""Agents for the SDK process tests, run with `apiary agent run tests.e2e.sdk_agents:Echo`."""

from __future__ import annotations

import apiary


class Echo(apiary.Agent):
    agent_id = "echo"
    description = "Answers every DATA message with its payload."

    async def on_data(self, msg: apiary.Message) -> str:
        await msg.reply({"echo": msg.json(), "by": self.agent_id})
        return "echoed"
