"""Which coordinator a client command calls (cli/calls.py): `--coordinator`, then
APIARY_COORDINATOR, then the client configuration's profile (or `[client]`), then the
address a running `apiary serve` recorded in the data directory (cli/serving.py), then
127.0.0.1:50051; each choice says where it came from, and a coordinator that does not answer
is named in one line."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from apiary.cli.calls import coordinator_address, credentials_of, refusal, unreachable
from apiary.cli.serving import (
    SERVING_FILE,
    Serving,
    client_data_dir,
    forget,
    reachable_address,
    record,
    recorded,
)
from apiary.errors import AgentUnavailableError, ApiaryError, ValidationError
from apiary.sdk.client import Client
from apiary.sdk.credentials import ClientCredentials
from apiary.sdk.errors import CoordinatorUnreachableError
from apiary.server.config.loader import load_config
from apiary.system import process_alive
from apiary.wire import pb


def _gone_pid() -> int:
    """The pid of a process that has exited."""
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    return int(done.stdout)


def _env(tmp_path: Path, **variables: str) -> dict[str, str]:
    return {"HOME": str(tmp_path / "home"), "APIARY_DATA_DIR": str(tmp_path / "data"),
            **variables}  # fmt: skip


def _client_config(tmp_path: Path, text: str) -> None:
    path = tmp_path / "home" / ".config" / "apiary" / "client.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_each_place_is_taken_only_when_the_ones_before_it_say_nothing(tmp_path: Path) -> None:
    env = _env(tmp_path)
    chosen = coordinator_address("", env)
    assert (chosen, chosen.source) == ("127.0.0.1:50051", "the default")

    record(tmp_path / "data", Serving("127.0.0.1:41001", "127.0.0.1:41002", os.getpid()))
    chosen = coordinator_address("", env)
    assert chosen == "127.0.0.1:41001"
    assert (
        chosen.source
        == f"the address `apiary serve` recorded in {tmp_path / 'data' / SERVING_FILE}"
    )

    _client_config(tmp_path, '[client]\ncoordinator = "file.example:1"\n\n'
                             '[profiles.lab]\ncoordinator = "lab.example:2"\n')  # fmt: skip
    assert coordinator_address("", env) == "file.example:1"
    chosen = coordinator_address("", {**env, "APIARY_PROFILE": "lab"})
    assert chosen == "lab.example:2" and chosen.source.endswith("[profiles.lab]")

    env["APIARY_COORDINATOR"] = "env.example:3"
    chosen = coordinator_address("", {**env, "APIARY_PROFILE": "lab"})
    assert (chosen, chosen.source) == ("env.example:3", "APIARY_COORDINATOR")

    chosen = coordinator_address("flag.example:4", env)
    assert (chosen, chosen.source) == ("flag.example:4", "--coordinator")


def test_a_bad_address_names_where_it_came_from(tmp_path: Path) -> None:
    with pytest.raises(ValidationError) as caught:
        coordinator_address("localhost", _env(tmp_path))
    assert caught.value.details["field"] == "coordinator"
    with pytest.raises(ValidationError) as caught:
        coordinator_address("", _env(tmp_path, APIARY_COORDINATOR="no-port"))
    assert caught.value.details["field"] == "APIARY_COORDINATOR"


def test_a_record_whose_process_is_gone_or_unreadable_is_ignored(tmp_path: Path) -> None:
    data = tmp_path / "data"
    record(data, Serving("127.0.0.1:41001", "127.0.0.1:41002", _gone_pid()))
    assert recorded(data) is None
    for no_one in (0, -1):  # a process group to kill(), not a process
        record(data, Serving("127.0.0.1:41001", "127.0.0.1:41002", no_one))
        assert recorded(data) is None
    assert coordinator_address("", _env(tmp_path)).source == "the default"
    (data / SERVING_FILE).write_text("not json")
    assert recorded(data) is None
    (data / SERVING_FILE).write_text(json.dumps({"grpc": 7, "http": "h:1", "pid": os.getpid()}))
    assert recorded(data) is None


def test_only_the_process_that_wrote_the_record_removes_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    mine = Serving("127.0.0.1:41001", "127.0.0.1:41002", os.getpid(), tls=True)
    path = record(data, mine)
    assert recorded(data) == mine
    assert (mine.http_url, mine.console_url) == (
        "https://127.0.0.1:41002", "https://127.0.0.1:41002/console",
    )  # fmt: skip
    forget(data, mine.pid + 1)
    assert path.exists()
    forget(data, mine.pid)
    assert not path.exists()
    forget(data, mine.pid)  # nothing left to remove


def test_a_port_bound_on_every_interface_is_reached_over_loopback() -> None:
    assert reachable_address("0.0.0.0", 5) == "127.0.0.1:5"
    assert reachable_address("::", 5) == "[::1]:5"
    assert reachable_address("::1", 5) == "[::1]:5"
    assert reachable_address("host.example", 5) == "host.example:5"


def test_the_data_directory_is_apiary_data_dir_else_dot_apiary() -> None:
    assert client_data_dir({}) == Path(".apiary")
    assert client_data_dir({"APIARY_DATA_DIR": "/srv/apiary"}) == Path("/srv/apiary")


@pytest.mark.parametrize("named", ["", "/srv/apiary", "~/state", "~nosuchuser/x"])
def test_clients_take_the_data_directory_as_the_server_does(named: str, tmp_path: Path) -> None:
    env = _env(tmp_path, APIARY_DATA_DIR=named)
    assert client_data_dir(env) == load_config(None, env, {}).data_dir
    # `~` is not expanded (neither does the server): an unknown user is a relative path,
    # with no record in it, not an error.
    assert coordinator_address("", env).source == "the default"


def test_process_alive_is_true_for_a_running_process_and_pid_1_only() -> None:
    assert process_alive(os.getpid()) and process_alive(1)
    assert not process_alive(_gone_pid())
    assert not process_alive(0) and not process_alive(-1)


def test_the_address_keeps_the_credentials_read_to_choose_it(tmp_path: Path) -> None:
    env = _env(tmp_path)
    _client_config(tmp_path, '[client]\ntenant = "acme"\n')
    for given in ("", "flag.example:4"):
        chosen = coordinator_address(given, env)
        known = credentials_of(chosen)
        assert known is not None and known.tenant == "acme"
        assert known == ClientCredentials.load(env, coordinator=given or None)
    assert credentials_of("127.0.0.1:50051") is None  # a plain address: the client reads them


def test_a_call_that_never_reached_the_coordinator_says_so_in_one_line(tmp_path: Path) -> None:
    address = coordinator_address("", _env(tmp_path, APIARY_COORDINATOR="10.9.9.9:50051"))
    lost = CoordinatorUnreachableError("coordinator unreachable: UNAVAILABLE: refused")
    assert refusal("dlq", lost, address=address) == (
        "apiary dlq: cannot reach the coordinator at 10.9.9.9:50051 (from APIARY_COORDINATOR)"
    )
    default = coordinator_address("", _env(tmp_path))
    line = unreachable("status", default)
    assert line.startswith("apiary status: cannot reach the coordinator at 127.0.0.1:50051 "
                           "(the default); start one with `apiary serve`")  # fmt: skip
    assert "\n" not in line
    # The coordinator's own agent_unavailable answer is not a lost connection.
    answered = AgentUnavailableError("bob is offline")
    assert refusal("send", answered, address=address) == (
        "apiary send: agent_unavailable: bob is offline"
    )


async def test_a_lost_connection_is_agent_unavailable_to_code_that_retries_on_it() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{probe.getsockname()[1]}"  # released below: nothing listens
    with pytest.raises(ApiaryError) as caught:
        async with Client(closed, credentials=ClientCredentials()) as client:
            await client.discovery.ListAgents(pb.apiary_pb2.ListAgentsRequest())
    # Code that retries on agent_unavailable (the SDK's reconnecting agents) retries it; a
    # command line tells it apart from the coordinator's own agent_unavailable answer.
    assert caught.value.code == "agent_unavailable"
    assert isinstance(caught.value, CoordinatorUnreachableError)


@pytest.mark.parametrize("status", ["CANCELLED", "UNAVAILABLE", "INTERNAL", "UNKNOWN"])
async def test_a_call_the_server_ended_unanswered_is_unreachable_not_internal(status: str) -> None:
    """A replica stopping with a call in flight ends it CANCELLED, UNAVAILABLE or (the
    connection torn mid-stream) INTERNAL without the coordinator's error trailer: the outcome
    is unknown, so code that retries on agent_unavailable (with the same idempotency token)
    retries it."""
    code = grpc.StatusCode[status]

    async def ended(request: bytes, context: grpc.aio.ServicerContext[bytes, bytes]) -> bytes:
        await context.abort(code, "stopping")

    method = grpc.unary_unary_rpc_method_handler(ended)
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "apiary.v1.DiscoveryService", {"ListAgents": method}
            ),
        )
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        with pytest.raises(ApiaryError) as caught:
            async with Client(f"127.0.0.1:{port}", credentials=ClientCredentials()) as client:
                await client.discovery.ListAgents(pb.apiary_pb2.ListAgentsRequest())
    finally:
        await server.stop(0)
    assert isinstance(caught.value, CoordinatorUnreachableError), caught.value
    assert caught.value.code == "agent_unavailable"
    assert f"{status}: stopping" in caught.value.message
