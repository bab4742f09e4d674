"""A demo agent process: `python -m apiary.demo.pingpong ROLE AGENT_ID PEER_ID COORDINATOR`.

`responder` registers, prints `ready`, answers the first DATA message it receives with a
reply, and waits for the reply to be acknowledged. `initiator` sends a greeting, collects
the responder's acknowledgements and reply, and acknowledges the reply. Each prints one
JSON report line on stdout and exits 0 on success.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from apiary.core.envelope import AckStage, Envelope, MessageType
from apiary.sdk.agent import Agent
from apiary.wire.convert import ack_from_payload

TIMEOUT_S = 30.0


def _report(**fields: Any) -> None:
    print(json.dumps(fields, sort_keys=True), flush=True)


async def responder(agent_id: str, peer: str, coordinator: str) -> None:
    async with Agent(agent_id, coordinator=coordinator, capabilities=["reply"]) as me:
        print("ready", flush=True)
        reply: Envelope | None = None
        async with asyncio.timeout(TIMEOUT_S):
            async for env in me.messages():
                if env.message_type is MessageType.DATA and reply is None:
                    await me.ack(env, AckStage.READ)
                    text = json.loads(env.payload)["text"]
                    reply = await me.send(
                        peer, {"text": f"{text} back"}, correlation_id=env.correlation_id
                    )
                    await me.ack(env, AckStage.FULFILLED, note="replied")
                elif env.message_type is MessageType.ACKNOWLEDGEMENT and reply is not None:
                    ack = ack_from_payload(env.content_type, env.payload)
                    if ack.ack_for_message_id == reply.message_id and (
                        ack.ack_stage is AckStage.FULFILLED
                    ):
                        break
        assert reply is not None
        _report(agent=agent_id, role="responder", replied=reply.message_id)


async def initiator(agent_id: str, peer: str, coordinator: str) -> None:
    async with Agent(agent_id, coordinator=coordinator) as me:
        started = time.monotonic()
        hello = await me.send(peer, {"text": "hello"})
        stages: list[str] = []
        reply_text = ""
        async with asyncio.timeout(TIMEOUT_S):
            async for env in me.messages():
                if env.message_type is MessageType.ACKNOWLEDGEMENT:
                    ack = ack_from_payload(env.content_type, env.payload)
                    if ack.ack_for_message_id == hello.message_id:
                        stages.append(ack.ack_stage.name)
                elif env.message_type is MessageType.DATA:
                    reply_text = json.loads(env.payload)["text"]
                    await me.ack(env, AckStage.FULFILLED)
                if reply_text and "FULFILLED" in stages:
                    break
        _report(
            agent=agent_id,
            role="initiator",
            sent=hello.message_id,
            ack_stages=stages,
            reply=reply_text,
            round_trip_ms=round((time.monotonic() - started) * 1000, 1),
        )


def main(argv: list[str]) -> int:
    if len(argv) != 4 or argv[0] not in ("responder", "initiator"):
        print(__doc__, file=sys.stderr)
        return 2
    role, agent_id, peer, coordinator = argv
    run = responder if role == "responder" else initiator
    asyncio.run(run(agent_id, peer, coordinator))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
