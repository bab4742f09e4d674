"""A swarm agent's home directory (default ~/.swarm, or $APIARY_SWARM_HOME):

    node.json       who this agent is: agent_id, endpoint (with /swarm), and options
    identity.key    its Ed25519 private key (PKCS#8 PEM, mode 0600)
    state.json      its memberships, mutes and cached keys (schemas/membership-state.json)
    apiary.db       its inbox and outbox (SQLite) unless node.json names another store

Every file is the owner's only (0600, the directory 0700).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from apiary.swarm.errors import SwarmError, SwarmFileError
from apiary.swarm.keyfile import load_identity, save_identity
from apiary.swarm.keys import Identity
from apiary.swarm.membership import MembershipState
from apiary.swarm.private_file import write_private
from apiary.swarm.statefile import StateFile, save_state
from apiary.swarm.wire import check_endpoint

HOME_ENV = "APIARY_SWARM_HOME"


def default_home() -> Path:
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".swarm")


@dataclass(frozen=True, slots=True)
class NodeConfig:
    agent_id: str
    endpoint: str
    """This agent's public endpoint, /swarm included: https://host:port/swarm."""
    ca_file: str = ""
    """CA certificates to trust when calling peers (a private CA); empty: the system's."""
    store: str = ""
    """Store URL for the inbox and outbox; empty: SQLite apiary.db in the home directory."""
    wake: str = ""
    """A command run for every stored message, with its JSON on stdin (see swarm/wake.py)."""
    bridge_agent: str = ""
    """The local SW4RM agent that swarm messages go to when no metadata names one."""
    insecure: bool = False
    """Local development: the endpoint may be plain http:// to a loopback address, and so may
    peers' (`apiary swarm init --insecure`). Never set for a node other machines reach."""

    def to_json(self) -> dict[str, str | bool]:
        return {k: v for k, v in asdict(self).items() if v or k in ("agent_id", "endpoint")}

    @classmethod
    def from_json(cls, body: object, source: object) -> NodeConfig:
        if not isinstance(body, dict):
            raise SwarmFileError(source, "the node configuration is a JSON object")
        known = {f.name for f in fields(cls)}
        values: dict[str, Any] = {}
        for name, value in body.items():
            if name not in known:
                raise SwarmFileError(source, f"unknown setting (known: {sorted(known)})", name)
            kind = bool if name == "insecure" else str
            if not isinstance(value, kind):
                raise SwarmFileError(source, f"must be a {kind.__name__}", name)
            values[name] = value
        for name in ("agent_id", "endpoint"):
            if not values.get(name):
                raise SwarmFileError(source, "is required", name)
        return check_config(cls(**values), source)


def check_config(config: NodeConfig, source: object = "node configuration") -> NodeConfig:
    if not config.agent_id.strip() or config.agent_id != config.agent_id.strip():
        raise SwarmFileError(source, "must be a non-empty id without surrounding spaces",
                             "agent_id")  # fmt: skip
    try:
        check_endpoint(config.endpoint, "endpoint", insecure=config.insecure)
    except SwarmError as exc:
        raise SwarmFileError(source, exc.message.partition(": ")[2], "endpoint") from None
    return config


class SwarmHome:
    def __init__(self, path: Path | None = None) -> None:
        self.path = (path or default_home()).expanduser().resolve()

    @property
    def config_path(self) -> Path:
        return self.path / "node.json"

    @property
    def key_path(self) -> Path:
        return self.path / "identity.key"

    @property
    def state_path(self) -> Path:
        return self.path / "state.json"

    def init(self, config: NodeConfig, *, force: bool = False) -> Identity:
        """Create the home: configuration, a new key (kept if one exists) and an empty state
        (kept if one exists for the same agent). Refuses to change the agent_id of an
        existing home unless `force`."""
        config = check_config(config, self.config_path)
        if self.config_path.exists() and not force:
            current = self.config()
            if current.agent_id != config.agent_id:
                raise SwarmFileError(
                    self.config_path, f"this home is agent {current.agent_id!r}'s; use "
                    "another --home, or --force to start over", "agent_id",
                )  # fmt: skip
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.path, 0o700)
        if self.key_path.exists() and not force:
            identity = load_identity(self.key_path)
        else:
            identity = Identity.generate()
            save_identity(self.key_path, identity)
        if (
            force
            or not self.state_path.exists()
            or self.states().load().agent_id != config.agent_id
        ):
            save_state(self.state_path, MembershipState(config.agent_id))
        self.save_config(config)
        return identity

    def save_config(self, config: NodeConfig) -> None:
        text = json.dumps(config.to_json(), indent=2) + "\n"
        write_private(self.config_path, text.encode())

    def config(self) -> NodeConfig:
        try:
            data = self.config_path.read_bytes()
        except FileNotFoundError:
            raise SwarmFileError(
                self.config_path, "not a swarm home: run `apiary swarm init` first"
            ) from None
        try:
            body: Any = json.loads(data)
        except ValueError as exc:
            raise SwarmFileError(self.config_path, f"not JSON ({exc})") from None
        return NodeConfig.from_json(body, self.config_path)

    def identity(self) -> Identity:
        return load_identity(self.key_path)

    def states(self) -> StateFile:
        return StateFile(self.state_path)
