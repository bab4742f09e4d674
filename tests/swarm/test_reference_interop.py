"""member_joined between Apiary and the reference implementation of the Agent Swarm Protocol
(finml-sage/agent-swarm-protocol), over real HTTPS on 127.0.0.1.

The reference side is reduced to what these tests need, shaped as its code puts things on
the wire: its master's member_joined broadcast (src/server/broadcast.py: the operation
flat in the JSON content, with the new member's endpoint and joined_at but no key, signed
over sha256(message_id + timestamp + swarm_id + recipient + type + content)), its
GET /swarm/info answer (AgentInfoResponse), and how its receiver reads a member_joined
(src/server/system_dispatch.py: the content's `endpoint`, else the sender's).
"""

from __future__ import annotations

import base64
import hashlib
import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from apiary.swarm import membership as ms
from apiary.swarm.transport import bind, open_swarm_server
from tests.swarm.peers import Peer, http, open_peer, until
from tests.swarm.pki import Pki

JOINED_AT = "2026-02-05T15:00:00.000Z"
AT = "2026-02-05T14:00:00.000Z"


def _reference_timestamp(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@dataclass
class ReferenceAgent:
    """An agent run by the reference implementation: its key, GET /swarm/info, and
    POST /swarm/message recording what arrives."""

    agent_id: str
    endpoint: str
    key: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)
    answers_as: str = ""
    """The agent_id its /info answers with ('' : its own; else an impostor's)."""
    received: list[dict[str, Any]] = field(default_factory=list)
    info_calls: int = 0

    @property
    def public_key(self) -> str:
        return base64.b64encode(self.key.public_key().public_bytes_raw()).decode()

    def envelope(self, swarm_id: str, recipient: str, kind: str, content: str) -> dict[str, Any]:
        """A message as the reference's client builds and signs it."""
        message_id = str(uuid.uuid4())
        timestamp = _reference_timestamp(datetime.now(UTC))
        text = message_id + timestamp + swarm_id + recipient + kind + content
        signature = self.key.sign(hashlib.sha256(text.encode("utf-8")).digest())
        return {
            "protocol_version": "0.1.0", "message_id": message_id, "timestamp": timestamp,
            "sender": {"agent_id": self.agent_id, "endpoint": self.endpoint},
            "recipient": recipient, "swarm_id": swarm_id, "type": kind, "content": content,
            "signature": base64.b64encode(signature).decode(),
        }  # fmt: skip

    def member_joined(self, swarm_id: str, agent_id: str, endpoint: str | None) -> dict[str, Any]:
        """The reference master's member_joined broadcast (build_broadcast_envelope)."""
        payload: dict[str, Any] = {
            "type": "system", "action": "member_joined", "swarm_id": swarm_id,
            "agent_id": agent_id, "endpoint": endpoint, "joined_at": JOINED_AT,
        }  # fmt: skip
        if endpoint is None:  # its older, local notice shape (notifications.py)
            payload = {
                "type": "system", "action": "member_joined", "swarm_id": swarm_id,
                "agent_id": agent_id, "initiated_by": None, "reason": None,
            }  # fmt: skip
        return self.envelope(swarm_id, "broadcast", "system", json.dumps(payload))

    def app(self) -> web.Application:
        async def info(_: web.Request) -> web.Response:
            self.info_calls += 1
            return web.json_response({
                "agent_id": self.answers_as or self.agent_id, "endpoint": self.endpoint,
                "public_key": self.public_key, "protocol_version": "0.1.0",
                "capabilities": ["message", "system", "notification"], "metadata": None,
            })  # fmt: skip

        async def message(request: web.Request) -> web.Response:
            body = await request.json()
            self.received.append(body)
            return web.json_response({"status": "queued", "message_id": body["message_id"]})

        app = web.Application()
        app.router.add_get("/swarm/info", info)
        app.router.add_post("/swarm/message", message)
        return app


@asynccontextmanager
async def open_reference(pki: Pki, agent_id: str, answers_as: str = "") -> AsyncIterator[
    ReferenceAgent
]:  # fmt: skip
    sock = bind("127.0.0.1", 0)
    agent = ReferenceAgent(agent_id, f"https://127.0.0.1:{sock.getsockname()[1]}/swarm",
                           answers_as=answers_as)  # fmt: skip
    async with open_swarm_server(agent.app(), sock, pki.server()):
        yield agent


def _listed(peer: Peer, swarm_id: str, *members: ms.Member) -> None:
    """Record `members` in `peer`'s view of the swarm, as its join answer would have."""

    def change(state: ms.MembershipState) -> tuple[ms.MembershipState, None]:
        swarm = state.swarm(swarm_id)
        return state.with_swarm(replace(swarm, members=(*swarm.members, *members))), None

    peer.node.states.update(change)


def _member(agent: ReferenceAgent) -> ms.Member:
    return ms.Member(agent.agent_id, agent.endpoint, agent.public_key, AT)


def _in_reference_swarm(peer: Peer, master: ReferenceAgent, *others: ReferenceAgent) -> str:
    """`peer` as a member of a swarm `master` runs (what its join answer recorded)."""
    swarm_id = str(uuid.uuid4())
    me = ms.Member(peer.agent_id, peer.endpoint, peer.node.identity.public_key, AT)
    members = [_member(master), me, *(_member(o) for o in others)]
    peer.node.states.update(
        lambda s: (ms.joined(s, swarm_id, "mixed", master.agent_id, members, AT).state, None)
    )
    return swarm_id


async def _post(pki: Pki, peer: Peer, body: dict[str, Any]) -> tuple[int, str]:
    headers = {"X-Agent-ID": body["sender"]["agent_id"], "X-Swarm-Protocol": "0.1.0"}
    answer = await http(pki, "POST", f"{peer.endpoint}/message", body, headers=headers)
    return answer.status, answer.code


# ----------------------------------------------------------------- reference master -> Apiary


async def test_a_reference_masters_flat_member_joined_lets_the_new_member_in(
    tmp_path: Path, pki: Pki
) -> None:
    async with (
        open_reference(pki, "ref-master") as master,
        open_reference(pki, "ref-carol") as carol,
        open_peer(tmp_path, "beta", pki) as beta,
    ):
        sid = _in_reference_swarm(beta, master)
        hello = carol.envelope(sid, "beta", "message", "hello from carol")
        assert await _post(pki, beta, hello) == (403, "NOT_MEMBER")

        notice = master.member_joined(sid, "ref-carol", carol.endpoint)
        assert await _post(pki, beta, notice) == (200, "")
        # The key came from the member's own /info, the endpoint from the master's notice.
        assert carol.info_calls == 1
        assert beta.node.state.swarm(sid).member("ref-carol") == ms.Member(
            "ref-carol", carol.endpoint, carol.public_key, JOINED_AT
        )
        assert beta.node.state.public_keys["ref-carol"].public_key == carol.public_key

        again = carol.envelope(sid, "beta", "message", "hello again")
        assert await _post(pki, beta, again) == (200, "")
        got = [e.mail for e in await beta.store.swarm.list_recent(sid) if e.mail.sender_id
               == "ref-carol"]  # fmt: skip
        assert [m.content for m in got] == ["hello again"]
        # The notice itself is in the inbox, as any system message.
        notices = [e.mail for e in await beta.store.swarm.list_recent(sid)
                   if e.mail.message_type == "system"]  # fmt: skip
        assert [m.message_id for m in notices] == [notice["message_id"]]


async def test_forged_or_unusable_member_joined_notices_let_no_one_in(
    tmp_path: Path, pki: Pki
) -> None:
    async with (
        open_reference(pki, "ref-master") as master,
        open_reference(pki, "ref-mallory") as mallory,
        open_reference(pki, "ref-carol") as carol,
        open_reference(pki, "ref-dave", answers_as="someone-else") as impostor,
        open_peer(tmp_path, "beta", pki) as beta,
    ):
        sid = _in_reference_swarm(beta, master, mallory)

        # A member who is not the master announces carol: accepted as a message, not obeyed.
        forged = mallory.member_joined(sid, "ref-carol", carol.endpoint)
        assert await _post(pki, beta, forged) == (200, "")
        # The master's signature over other content, carol put in afterwards: 401.
        tampered = master.member_joined(sid, "ref-erin", carol.endpoint)
        tampered["content"] = tampered["content"].replace("ref-erin", "ref-carol")
        assert await _post(pki, beta, tampered) == (401, "INVALID_SIGNATURE")
        # The operation only at the top level, outside what the signature covers.
        unsigned = master.envelope(sid, "broadcast", "system", "member news")
        unsigned.update(action="member_joined", agent_id="ref-carol", endpoint=carol.endpoint)
        assert await _post(pki, beta, unsigned) == (200, "")
        assert carol.info_calls == 0  # nothing above made beta ask for a key
        # The master names an endpoint whose /info answers for another agent.
        answered = master.member_joined(sid, "ref-dave", impostor.endpoint)
        assert await _post(pki, beta, answered) == (200, "")
        assert impostor.info_calls == 1
        # The master names an endpoint nobody answers at.
        gone = master.member_joined(sid, "ref-frank", "https://127.0.0.1:9/swarm")
        assert await _post(pki, beta, gone) == (200, "")
        # The reference's older local notice shape: no endpoint to ask.
        bare = master.member_joined(sid, "ref-grace", None)
        assert await _post(pki, beta, bare) == (200, "")

        assert beta.members(sid) == ["beta", "ref-mallory", "ref-master"]
        assert set(beta.node.state.public_keys) <= {"ref-master", "ref-mallory"}
        hello = carol.envelope(sid, "beta", "message", "let me in")
        assert await _post(pki, beta, hello) == (403, "NOT_MEMBER")


# ----------------------------------------------------------------- Apiary master -> reference


def reference_reads(body: dict[str, Any]) -> tuple[str, str, str] | None:
    """What the reference's receiver takes from a member_joined (system_dispatch.py):
    (agent_id, endpoint, joined_at), the endpoint falling back to the sender's."""
    if body.get("type") != "system":
        return None
    payload = json.loads(body["content"])
    if not isinstance(payload, dict) or payload.get("action") != "member_joined":
        return None
    endpoint = payload.get("endpoint") or body["sender"]["endpoint"]
    joined_at = payload.get("joined_at") or body["timestamp"]
    return payload["agent_id"], endpoint, joined_at


def reference_verifies(body: dict[str, Any], public_key: str) -> bool:
    """The reference's signature check (client/crypto.py verify_signature)."""
    text = (body["message_id"] + body["timestamp"] + body["swarm_id"] + body["recipient"]
            + body["type"] + body["content"])  # fmt: skip
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key))
    try:
        key.verify(base64.b64decode(body["signature"]), hashlib.sha256(text.encode()).digest())
    except Exception:
        return False
    return True


async def test_apiarys_member_joined_reads_right_in_the_reference(tmp_path: Path, pki: Pki) -> None:
    async with (
        open_peer(tmp_path, "alpha", pki) as alpha,
        open_peer(tmp_path, "gamma", pki) as gamma,
        open_reference(pki, "ref-bob") as bob,
    ):
        sid = alpha.node.create("mixed").swarm_id
        _listed(alpha, sid, _member(bob))  # bob joined earlier
        assert (await gamma.node.join(alpha.node.invite(sid).url)).status == "accepted"
        await until(lambda: bob.received)
        (notice,) = bob.received
        assert reference_verifies(notice, alpha.node.identity.public_key)
        # The new member's endpoint, not the master's (the sender's) that it fell back to.
        listed = alpha.node.state.swarm(sid).member("gamma")
        assert listed is not None
        assert reference_reads(notice) == ("gamma", gamma.endpoint, listed.joined_at)
        assert gamma.endpoint != alpha.endpoint
        # It then asks that endpoint's /info for the key, as the reference does.
        connector = aiohttp.TCPConnector(ssl=pki.client())
        headers = {"X-Agent-ID": "ref-bob", "X-Swarm-Protocol": "0.1.0"}
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.get(f"{gamma.endpoint}/info", headers=headers) as response,
        ):
            info = await response.json()
        assert (info["agent_id"], info["public_key"]) == ("gamma", gamma.node.identity.public_key)
        # Apiary's own nested member rides along, for Apiary members.
        content = json.loads(notice["content"])
        assert content["member"]["public_key"] == gamma.node.identity.public_key


async def test_a_joined_apiary_member_talks_with_the_reference_member(
    tmp_path: Path, pki: Pki
) -> None:
    """After the join, gamma (Apiary) lists bob (reference) from the master's answer, and
    bob's messages reach gamma signed the reference's way."""
    async with (
        open_peer(tmp_path, "alpha", pki) as alpha,
        open_peer(tmp_path, "gamma", pki) as gamma,
        open_reference(pki, "ref-bob") as bob,
    ):
        sid = alpha.node.create("mixed").swarm_id
        _listed(alpha, sid, _member(bob))
        await gamma.node.join(alpha.node.invite(sid).url)
        assert gamma.members(sid) == ["alpha", "gamma", "ref-bob"]
        hello = bob.envelope(sid, "gamma", "message", "welcome")
        assert await _post(pki, gamma, hello) == (200, "")
        _, rows = await gamma.node.send(sid, "ref-bob", "thanks")
        assert [r.status for r in rows] == ["delivered"]
        assert bob.received[-1]["content"] == "thanks"
