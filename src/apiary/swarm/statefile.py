"""The membership state file (agent-swarm-protocol 0.1.0, "State Management"): UTF-8 JSON
conforming to schemas/membership-state.json, owner read/write only (chmod 600).

Several processes share one file (`apiary swarm serve` and the CLI's commands): every change
is a read-modify-write under an exclusive lock on a sidecar `.lock` file, and every write is
an atomic replace, so a reader without the lock still sees a whole file. Readers keep the
parsed state until the file changes (same inode, size and mtime).

Export adds `exported_at`; import validates against the schema, checks `schema_version`, drops
`exported_at`, and merges into or replaces the current state.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal, TypeVar

import jsonschema

from apiary.swarm.errors import SwarmError, SwarmFileError
from apiary.swarm.keyfile import check_private
from apiary.swarm.membership import (
    SCHEMA_VERSION,
    MembershipState,
    state_from_json,
    state_to_json,
)
from apiary.swarm.private_file import write_private
from apiary.swarm.schemas import validator
from apiary.swarm.wire import format_timestamp, is_loopback_http, parse_timestamp

T = TypeVar("T")
ImportMode = Literal["merge", "replace"]


def state_json(state: MembershipState) -> bytes:
    return json.dumps(state_to_json(state), indent=2, ensure_ascii=False).encode("utf-8") + b"\n"


def parse_state(data: bytes, source: object) -> dict[str, Any]:
    """Bytes of a state file -> its validated JSON (exported_at kept); SwarmFileError naming
    the field otherwise."""
    try:
        body = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise SwarmFileError(source, "a state file is UTF-8") from None
    except ValueError as exc:
        raise SwarmFileError(source, f"not JSON ({exc})") from None
    if not isinstance(body, dict):
        raise SwarmFileError(source, "a state file holds a JSON object")
    version = body.get("schema_version")
    if isinstance(version, str) and version.split(".")[0] != SCHEMA_VERSION.split(".")[0]:
        raise SwarmFileError(
            source, f"schema_version {version} is not supported (this Apiary reads "
            f"{SCHEMA_VERSION})", "schema_version",
        )  # fmt: skip
    errors = validator("membership-state.json").iter_errors(body)
    error = jsonschema.exceptions.best_match(e for e in errors if not _development(e))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "(top level)"
        raise SwarmFileError(source, error.message, where)
    return body


def _development(error: jsonschema.ValidationError) -> bool:
    """A loopback http:// endpoint where the schema wants https://: the one departure from
    the schema a state file may hold, written by a node set up with --insecure."""
    return error.validator == "pattern" and is_loopback_http(error.instance)


def load_state(path: Path) -> MembershipState:
    """The state at `path`; SwarmFileError when missing, too open, or invalid."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        raise SwarmFileError(path, "no state file: run `apiary swarm init`") from None
    with os.fdopen(fd, "rb") as handle:
        check_private(path, os.fstat(handle.fileno()), "state file")
        data = handle.read()
    return _state(parse_state(data, path), path)


def _state(body: Mapping[str, Any], source: object) -> MembershipState:
    try:
        return state_from_json(body)
    except SwarmError as exc:
        raise SwarmFileError(source, exc.message, exc.field) from None


def save_state(path: Path, state: MembershipState) -> None:
    write_private(path, state_json(state))


class StateFile:
    """One agent's state file, shared safely between processes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_path = path.with_name(path.name + ".lock")
        self._cached: tuple[tuple[int, int, int], MembershipState] | None = None

    def load(self) -> MembershipState:
        """The current state (parsed again only when the file changed)."""
        try:
            info = os.stat(self.path)
        except FileNotFoundError:
            raise SwarmFileError(self.path, "no state file: run `apiary swarm init`") from None
        stamp = (info.st_ino, info.st_size, info.st_mtime_ns)
        if self._cached is not None and self._cached[0] == stamp:
            return self._cached[1]
        state = load_state(self.path)
        self._cached = (stamp, state)
        return state

    def save(self, state: MembershipState) -> None:
        with self._locked():
            self._write(state)

    def update(self, change: Callable[[MembershipState], tuple[MembershipState, T]]) -> T:
        """Apply `change` to the current state under the lock; write the new state if it
        differs. `change` runs synchronously: nothing else can interleave."""
        with self._locked():
            before = self.load()
            after, result = change(before)
            if after != before:
                self._write(after)
            return result

    def _write(self, state: MembershipState) -> None:
        save_state(self.path, state)
        info = os.stat(self.path)
        self._cached = ((info.st_ino, info.st_size, info.st_mtime_ns), state)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self._lock_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock


def export_state(state: MembershipState, now: float) -> dict[str, Any]:
    """The state's JSON with `exported_at`, for backup or migration."""
    return {**state_to_json(state), "exported_at": format_timestamp(now)}


def import_state(
    data: bytes, current: MembershipState, mode: ImportMode = "merge", source: object = "import"
) -> MembershipState:
    """The state after importing an exported (or plain) state file into `current`.

    The file must be schema-valid, of a supported schema_version and of the same agent_id.
    `replace` takes it as it is; `merge` adds its swarms (an imported swarm replaces the
    current entry of the same id), unites the mute lists and keeps the more recently fetched
    of two cached keys. `exported_at` is dropped either way.
    """
    body = dict(parse_state(data, source))
    body.pop("exported_at", None)
    if body["agent_id"] != current.agent_id:
        raise SwarmFileError(
            source, f"the file is agent {body['agent_id']!r}'s state, this is "
            f"{current.agent_id!r}", "agent_id",
        )  # fmt: skip
    imported = _state(body, source)
    if mode == "replace":
        return imported
    keys = dict(current.public_keys)
    for agent, entry in imported.public_keys.items():
        mine = keys.get(agent)
        if mine is None or _when(entry.fetched_at) >= _when(mine.fetched_at):
            keys[agent] = entry
    return replace(
        current,
        swarms=MappingProxyType({**current.swarms, **imported.swarms}),
        muted_swarms=current.muted_swarms | imported.muted_swarms,
        muted_agents=current.muted_agents | imported.muted_agents,
        public_keys=MappingProxyType(keys),
    )


def _when(text: str) -> float:
    try:
        return parse_timestamp(text, "fetched_at")
    except SwarmError:
        return 0.0
