"""The SDK in other processes: `apiary agent run module:Class` from this checkout, and the
package installed with nothing but `pip install` into a fresh virtual environment, each
talking to a real coordinator over gRPC sockets and shut down by SIGTERM."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from apiary.core.envelope import AckStage, MessageType
from apiary.engine.settings import RouterSettings
from apiary.sdk.connection import Connection
from apiary.server.coordinator import Coordinator
from apiary.server.inprocess import open_test_coordinator

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 30.0


async def _registered(
    coordinator: Coordinator, agent_id: str, process: asyncio.subprocess.Process
) -> None:
    async def poll() -> None:
        while agent_id not in {a.agent_id for a in await coordinator.registry.list()}:
            if process.returncode is not None:
                raise AssertionError(f"the agent process exited with {process.returncode}")
            await asyncio.sleep(0.05)

    await asyncio.wait_for(poll(), WAIT_S)


async def _round_trip(
    coordinator: Coordinator, agent_id: str, key: Ed25519PrivateKey | None = None
) -> dict[str, object]:
    address = str(coordinator.grpc_address)
    async with Connection("asker", coordinator=address, signing_key=key) as asker:
        request = await asker.send(agent_id, {"n": 7})

        async def reply() -> dict[str, object]:
            async for delivery in asker.deliveries():
                env = delivery.envelope
                if env.message_type is MessageType.ACKNOWLEDGEMENT:
                    continue
                await asker.ack(env, AckStage.FULFILLED)
                if env.correlation_id == request.correlation_id:
                    return dict(json.loads(env.payload))
            raise AssertionError("the stream ended without a reply")

        return await asyncio.wait_for(reply(), WAIT_S)


async def _run_agent(
    coordinator: Coordinator, argv: list[str], cwd: Path, env: dict[str, str],
    key: Ed25519PrivateKey | None = None,
    registered: Callable[[], Awaitable[None]] | None = None,
) -> tuple[dict[str, object], int, str]:  # fmt: skip
    """Run the echo agent process, check it (`registered`), ask it once (signing with `key`
    when given), stop it."""
    process = await asyncio.create_subprocess_exec(
        *argv, "--coordinator", str(coordinator.grpc_address),
        cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        await _registered(coordinator, "echo", process)
        if registered is not None:
            await registered()
        answer = await _round_trip(coordinator, "echo", key)
        process.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(process.communicate(), WAIT_S)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode is not None
    return answer, process.returncode, stderr.decode(errors="replace")


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env.pop("APIARY_COORDINATOR", None)
    return env


async def test_apiary_agent_run_serves_an_agent_class_and_stops_on_sigterm(tmp_path: Path) -> None:
    apiary_bin = Path(sys.executable).with_name("apiary")
    async with open_test_coordinator(tmp_path) as coordinator:
        answer, code, stderr = await _run_agent(
            coordinator, [str(apiary_bin), "agent", "run", "tests.e2e.sdk_agents:Echo"],
            cwd=ROOT, env=_clean_env(),
        )  # fmt: skip
        left = {a.agent_id for a in await coordinator.registry.list()}
    assert answer == {"echo": {"n": 7}, "by": "echo"}
    assert code == 0, stderr
    assert "echo" not in left  # deregistered on the way out


def _install(tmp_path: Path) -> tuple[Path, Path]:
    """A fresh venv with the package pip-installed, and a directory outside the checkout
    holding one agent module."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    install = subprocess.run(
        [str(python), "-m", "pip", "install", "--quiet", str(ROOT)],
        check=False, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert install.returncode == 0, install.stderr[-2000:]
    work = tmp_path / "elsewhere"  # nothing of the checkout on the path
    work.mkdir()
    (work / "my_agent.py").write_text(
        textwrap.dedent("""
            import apiary

            class Echo(apiary.Agent):
                agent_id = "echo"

                async def on_data(self, msg: apiary.Message) -> str:
                    await msg.reply({"echo": msg.json(), "by": "installed"})
                    return "echoed"
        """)
    )
    probe = subprocess.run(
        [str(python), "-c", "import apiary, apiary.wire.pb; print(apiary.__file__)"],
        cwd=work, env=_clean_env(), capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert str(venv) in probe.stdout  # the installed copy, not this checkout
    return venv, work


@pytest.mark.conformance("transport.proto.sdk-distribute-stubs")
async def test_the_sdk_works_from_a_plain_pip_install(tmp_path: Path) -> None:
    venv, work = await asyncio.to_thread(_install, tmp_path)
    async with open_test_coordinator(tmp_path / "coordinator") as coordinator:
        answer, code, stderr = await _run_agent(
            coordinator, [str(venv / "bin" / "apiary"), "agent", "run", "my_agent:Echo"],
            cwd=work, env=_clean_env(),
        )  # fmt: skip
    assert answer == {"echo": {"n": 7}, "by": "installed"}
    assert code == 0, stderr


def _keygen(path: Path) -> subprocess.CompletedProcess[str]:
    apiary_bin = str(Path(sys.executable).with_name("apiary"))
    return subprocess.run(
        [apiary_bin, "agent", "keygen", str(path)], capture_output=True, text=True,
        check=False, timeout=60,
    )  # fmt: skip


def test_keygen_writes_an_owner_only_key_and_never_replaces_one(tmp_path: Path) -> None:
    key_file = tmp_path / "agent.pem"
    made = _keygen(key_file)
    assert made.returncode == 0, made.stderr
    assert len(base64.b64decode(made.stdout.strip())) == 32  # the raw public key
    assert oct(key_file.stat().st_mode & 0o777) == "0o600"
    again = _keygen(key_file)
    assert again.returncode == 2 and "exists" in again.stderr
    assert "--force" in again.stderr


async def test_an_agent_process_signs_with_a_key_from_apiary_agent_keygen(
    tmp_path: Path,
) -> None:
    apiary_bin = str(Path(sys.executable).with_name("apiary"))
    key_file = tmp_path / "echo.pem"
    made = await asyncio.to_thread(_keygen, key_file)
    assert made.returncode == 0, made.stderr
    settings = RouterSettings(signing_required=True)
    async with open_test_coordinator(tmp_path / "c", router_settings=settings) as coordinator:
        # --verify-signatures: the agent checks the asker's signature itself, end to end.
        argv = [apiary_bin, "agent", "run", "tests.e2e.sdk_agents:Echo", "--signing-key",
                str(key_file), "--verify-signatures"]  # fmt: skip

        async def with_the_key_from_keygen() -> None:
            echo = await coordinator.registry.get("echo")
            assert echo.descriptor["public_key"] == made.stdout.strip()

        answer, code, stderr = await _run_agent(
            coordinator, argv, ROOT, _clean_env(), Ed25519PrivateKey.generate(),
            with_the_key_from_keygen,
        )  # fmt: skip
        left = {a.agent_id for a in await coordinator.registry.list()}
    assert answer == {"echo": {"n": 7}, "by": "echo"}
    assert code == 0, stderr
    assert "echo" not in left  # its signed deregistration was accepted
