"""`apiary send` as a real CLI process against a coordinator on real sockets, with an
`apiary.Agent` answering as an asyncio task of the test: --wait registers the command as the
sender while it waits and prints the reply (or the FULFILLED note), says REJECTED and no
outcome in time with their exit codes, and deregisters; a one-way send's ACKs and replies
end without dead letters; in secure mode (mTLS, signing) as in dev mode."""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import os
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

import apiary
from apiary.core.access.principal import Principal, PrincipalKind
from apiary.core.envelope import MessageType
from apiary.core.records import MessageState
from apiary.engine.settings import RouterSettings
from apiary.sdk.credentials import ClientCredentials, ClientTls
from apiary.sdk.keys import write_signing_key
from apiary.server.auth.devca import issue_dev_certificates
from apiary.server.auth.settings import AuthSettings
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator
from apiary.testing.events import wait_for_event

WAIT_S = 30.0
CLIENT_ENV = (
    "APIARY_COORDINATOR", "APIARY_PROFILE", "APIARY_API_KEY", "APIARY_TLS_CA",
    "APIARY_TLS_CERT", "APIARY_TLS_KEY", "APIARY_SIGNING_KEY", "APIARY_TOKEN",
)  # fmt: skip
"""The client settings of the environment the tests run in, which the commands must not take."""


class Echo(apiary.Agent):
    agent_id = "echo"

    async def on_data(self, msg: apiary.Message) -> str:
        body = msg.json()
        if body.get("refuse"):
            raise apiary.Rejected("validation_error", "refuse: not today")
        if body.get("quiet"):
            return "noted, no reply"
        await msg.reply(body)
        return "echoed"


@pytest.fixture
async def coordinator(tmp_path: Path) -> AsyncIterator[Coordinator]:
    async with open_test_coordinator(tmp_path / "data") as running:
        yield running


@asynccontextmanager
async def _running(agent: apiary.Agent) -> AsyncIterator[None]:
    registered = asyncio.Event()
    job = asyncio.create_task(agent.run(on_registered=registered.set))
    try:
        await asyncio.wait_for(registered.wait(), WAIT_S)
        yield
    finally:
        await agent.shutdown()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(job, WAIT_S)


async def _cli(
    coordinator: Coordinator, *args: str, env: Mapping[str, str] | None = None, home: Path
) -> tuple[int, str, str]:
    clean = {k: v for k, v in os.environ.items() if k not in CLIENT_ENV}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "apiary.cli.main", "send", *args,
        "--coordinator", str(coordinator.grpc_address),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={**clean, "HOME": str(home), **(env or {})},
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), WAIT_S * 2)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def _state(coordinator: Coordinator, message_id: str) -> MessageState:
    stored = await coordinator.store.messages.get(message_id)
    assert stored is not None
    return stored.state


def _sent_id(err: str) -> str:
    (line,) = [line for line in err.splitlines() if line.startswith("sent ")]
    return line.split()[1]


async def test_wait_prints_the_reply_and_leaves_no_dead_letter(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    async with _running(Echo(coordinator=str(coordinator.grpc_address))):
        code, out, err = await _cli(
            coordinator, "echo", "--json", '{"hello": "world"}', "--wait", home=tmp_path
        )
    assert (code, out) == (0, '{"hello": "world"}\n'), err
    assert err.strip().endswith("FULFILLED by echo: echoed")
    message_id = _sent_id(err)
    assert await _state(coordinator, message_id) is MessageState.FULFILLED
    # The reply reached the command, which acknowledged it; the sender is gone again.
    # (Echo's ACKs forwarded while the command's stream was not live are kept in its inbox
    # too: only DATA is a reply.)
    replies = [m for m in await coordinator.store.messages.inbox("cli", 0, 100)
               if m.producer_id == "echo" and m.message_type == MessageType.DATA]  # fmt: skip
    assert [m.state for m in replies] == [MessageState.FULFILLED]
    assert await coordinator.registry.find("cli") is None
    assert await coordinator.store.dlq.list() == []


async def test_wait_prints_the_fulfilled_note_when_no_reply_comes(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    async with _running(Echo(coordinator=str(coordinator.grpc_address))):
        code, out, err = await _cli(
            coordinator, "echo", "--json", '{"quiet": true}', "--wait", home=tmp_path
        )
    assert (code, out) == (0, "noted, no reply\n"), err


async def test_wait_says_rejected_with_exit_1(coordinator: Coordinator, tmp_path: Path) -> None:
    async with _running(Echo(coordinator=str(coordinator.grpc_address))):
        code, out, err = await _cli(
            coordinator, "echo", "--json", '{"refuse": true}', "--wait", home=tmp_path
        )
    assert (code, out) == (1, "")
    message_id = _sent_id(err)
    assert err.strip().endswith(
        f"apiary send: {message_id} to echo REJECTED by echo: validation_error: refuse: not today"
    )


async def test_wait_without_an_outcome_in_time_exits_3(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    # A registered recipient that never connects: its message waits, nothing acknowledges it.
    await coordinator.registry.register(
        {"agent_id": "sleeper", "name": "sleeper", "reasoning_connectors": ["builtin://rules"]}
    )
    code, out, err = await _cli(
        coordinator, "sleeper", "--json", "{}", "--wait", "--timeout", "0.5", home=tmp_path
    )
    assert (code, out) == (3, "")
    message_id = _sent_id(err)
    assert f"apiary send: no outcome for {message_id} within 0.5 s (last: accepted" in err
    assert "apiary events --correlation-id" in err
    assert await _state(coordinator, message_id) is MessageState.RECEIVED
    assert await coordinator.registry.find("cli") is None


async def test_a_one_way_send_fulfills_without_dead_letters(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    # The command is no registered agent: echo's ACKs end at the coordinator and its reply is
    # refused (no_route, logged), while the message itself is handled and FULFILLED.
    echo = Echo(coordinator=str(coordinator.grpc_address))
    async with _running(echo):
        code, out, err = await _cli(coordinator, "echo", "--json", '{"n": 1}', home=tmp_path)
        assert code == 0, err
        message_id = out.strip()
        await wait_for_event(
            coordinator.events,
            lambda e: (
                e.details.get("message_id") == message_id and e.details.get("to") == "FULFILLED"
            ),
            timeout_s=WAIT_S,
        )
    refused = [e for e in await coordinator.events.read(limit=1000)
               if e.event_type == "message.rejected"]  # fmt: skip
    assert [(e.actor, e.agent_id, e.details["error_code"]) for e in refused] == [
        ("echo", "cli", "no_route")
    ]
    assert coordinator.router.stats.admission_refused == {"no_route": 1}
    assert await coordinator.store.dlq.list() == []


async def test_wait_refuses_to_register_over_a_running_agent(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    async with _running(Echo(coordinator=str(coordinator.grpc_address))):
        code, _, err = await _cli(
            coordinator, "echo", "--from", "echo", "--json", "{}", "--wait", home=tmp_path
        )
        assert await coordinator.registry.find("echo") is not None
    assert code == 2
    assert err.startswith("apiary send: --from echo names a registered agent; --wait")


async def test_a_timeout_that_is_not_positive_is_refused(
    coordinator: Coordinator, tmp_path: Path
) -> None:
    code, _, err = await _cli(
        coordinator, "echo", "--json", "{}", "--wait", "--timeout", "0", home=tmp_path
    )
    assert (code, err) == (2, "apiary send: --timeout must be more than 0 seconds, not 0.0\n")


async def test_wait_works_in_secure_mode(tmp_path: Path) -> None:
    # mTLS for both, message signing: the command registers cli with its key while it waits.
    cli, echo = (Principal(PrincipalKind.AGENT, name, "default") for name in ("cli", "echo"))
    certs = issue_dev_certificates(tmp_path / "certs", [cli, echo], now=dt.datetime.now(dt.UTC))
    cli_cert, echo_cert = certs.clients
    key_file = tmp_path / "keys" / "cli.pem"
    write_signing_key(key_file)
    async with open_test_coordinator(
        tmp_path / "data", tls_cert=certs.server_cert, tls_key=certs.server_key,
        tls_client_ca=certs.ca_cert, auth=AuthSettings(secure=True),
        router_settings=RouterSettings(signing_required=True),
    ) as coordinator:  # fmt: skip
        tls = ClientTls(certs.ca_cert, echo_cert.cert, echo_cert.key)
        agent = Echo(
            coordinator=str(coordinator.grpc_address), credentials=ClientCredentials(tls=tls),
            signing_key=Ed25519PrivateKey.generate(),
        )  # fmt: skip
        env = {"APIARY_TLS_CA": str(certs.ca_cert), "APIARY_TLS_CERT": str(cli_cert.cert),
               "APIARY_TLS_KEY": str(cli_cert.key)}  # fmt: skip
        async with _running(agent):
            code, out, err = await _cli(
                coordinator, "echo", "--json", '{"hello": "secure"}', "--wait",
                "--signing-key", str(key_file), env=env, home=tmp_path,
            )  # fmt: skip
            assert (code, out) == (0, '{"hello": "secure"}\n'), err
            # One way, cli has no registered key to verify its signature by: refused, and
            # the command says what would do.
            code, _, err = await _cli(
                coordinator, "echo", "--json", "{}", "--signing-key", str(key_file), env=env,
                home=tmp_path,
            )  # fmt: skip
        assert code == 1
        assert "--wait registers it (with --signing-key) while it waits" in err
        assert await coordinator.store.dlq.list() == []
