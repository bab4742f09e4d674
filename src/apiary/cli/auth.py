"""`apiary auth create|list|rotate|revoke`: the coordinator's API keys (DESIGN.md section 9).

The commands work on the key ring file itself, not through a running coordinator: a
coordinator sharing the data directory sees each change at its next authentication.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer
from rich.table import Table

from apiary.cli.calls import refusal
from apiary.cli.output import console_for_output, utc_text
from apiary.core.access.principal import DEFAULT_TENANT
from apiary.errors import ApiaryError, ValidationError
from apiary.server.auth.keys import KeyEntry, KeyRing, KeyState, credentials_path, iso_utc
from apiary.server.config.data_dir import DATA_DIR_ENV, DEFAULT_DATA_DIR

app = typer.Typer(no_args_is_help=True)  # help: cli/main.py SUBCOMMANDS
T = TypeVar("T")
DATA_DIR = typer.Option(
    DEFAULT_DATA_DIR,
    "--data-dir",
    envvar=DATA_DIR_ENV,
    help="The coordinator's state directory (or APIARY_DATA_DIR)",
)
JSON_OUT = typer.Option(False, "--json", help="JSON instead of text")
SHOWN_ONCE = "This key will not be shown again: store it now (only its hash is kept)."

_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str, option: str, *, never: bool = False) -> float | None:
    """Seconds in `30d`, `12h`, `90m`, `45s` (or `0`); None for `never` where allowed."""
    value = text.strip().lower()
    if never and value == "never":
        return None
    if value == "0":
        return 0.0
    match = _DURATION.match(value)
    if match is None:
        forms = "30d, 12h, 90m, 45s" + (" or never" if never else " or 0")
        raise ValidationError.for_field(option, f"{text[:32]!r} is not a duration: use {forms}")
    return float(int(match[1]) * _UNIT_SECONDS[match[2]])


def _run(action: Callable[[], T]) -> T:
    try:
        return action()
    except ApiaryError as exc:
        typer.echo(refusal("auth", exc), err=True)
        raise typer.Exit(1) from None


def _when(epoch: float | None, empty: str = "") -> str:
    return empty if epoch is None else utc_text(epoch)


def key_doc(entry: KeyEntry, now: float) -> dict[str, Any]:
    """A key as `--json` prints it: the stored entry without its hash, with its state."""
    doc = entry.to_json()
    del doc["sha256"]
    doc["principal"] = entry.principal().label
    doc["state"] = entry.state(now).value
    return doc


def _show_new_key(
    entry: KeyEntry, plain: str, now: float, as_json: bool, note: str, **extra: Any
) -> None:
    """The plain key on stdout (alone, for `$(...)`), what it is on stderr."""
    if as_json:
        doc = {**key_doc(entry, now), **extra, "key": plain, "note": SHOWN_ONCE}
        typer.echo(json.dumps(doc))
        return
    typer.echo(plain)
    typer.echo(note, err=True)
    typer.echo(SHOWN_ONCE, err=True)


def _describe(entry: KeyEntry) -> str:
    roles = f", roles {','.join(entry.roles)}" if entry.roles else ""
    ends = iso_utc(entry.expires_at) if entry.expires_at is not None else "never"
    return f"key {entry.key_id} for {entry.principal().label}{roles}, expires {ends}"


@app.command()
def create(
    kind: str = typer.Argument(..., help="agent, operator or application"),
    name: str = typer.Argument(..., help="The principal's name (an agent: its agent id)"),
    tenant: str = typer.Option(DEFAULT_TENANT, "--tenant", help="The principal's tenant"),
    role: list[str] = typer.Option([], "--role", help="An operator's role (repeat)"),
    expires: str = typer.Option("never", "--expires", help="30d, 12h, 90m, or never"),
    data_dir: Path = DATA_DIR,
    as_json: bool = JSON_OUT,
) -> None:
    """Create a key for a principal and print it, once."""
    now = time.time()

    def go() -> tuple[KeyEntry, str]:
        lifetime = parse_duration(expires, "--expires", never=True)
        expires_at = None if lifetime is None else now + lifetime
        ring = KeyRing(credentials_path(data_dir))
        return ring.create(kind, name, tenant=tenant, roles=role, expires_at=expires_at, now=now)

    entry, plain = _run(go)
    _show_new_key(entry, plain, now, as_json, f"created {_describe(entry)}")


@app.command("list")
def list_keys(
    show_all: bool = typer.Option(False, "--all", help="Include revoked keys"),
    data_dir: Path = DATA_DIR,
    as_json: bool = JSON_OUT,
) -> None:
    """The keys, oldest first (revoked ones only with --all); never their secrets."""
    now = time.time()
    entries = [
        e
        for e in _run(lambda: KeyRing(credentials_path(data_dir)).entries())
        if show_all or e.state(now) is not KeyState.REVOKED
    ]
    if as_json:
        for entry in entries:
            typer.echo(json.dumps(key_doc(entry, now)))
        return
    table = Table(title=f"API keys ({len(entries)})")
    for column in ("key id", "kind", "name", "tenant", "roles", "created (UTC)",
                   "expires (UTC)", "state"):  # fmt: skip
        table.add_column(column, overflow="fold")
    for e in entries:
        table.add_row(
            e.key_id, e.kind.value, e.name, e.tenant, ",".join(e.roles), _when(e.created_at),
            _when(e.expires_at, "never"), e.state(now).value,
        )  # fmt: skip
    console_for_output().print(table)


@app.command()
def rotate(
    key_id: str = typer.Argument(..., help="The key to replace (its id, or the whole key)"),
    grace: str = typer.Option(
        "0", "--grace", help="How long the old key keeps working: 0 (revoke now), 90m, 1d"
    ),
    data_dir: Path = DATA_DIR,
    as_json: bool = JSON_OUT,
) -> None:
    """Replace a key with a new one for the same principal and print it, once."""
    now = time.time()

    def go() -> tuple[KeyEntry, str, KeyEntry | None]:
        grace_s = parse_duration(grace, "--grace") or 0.0
        ring = KeyRing(credentials_path(data_dir))
        entry, plain = ring.rotate(key_id, now=now, grace_s=grace_s)
        old = next((e for e in ring.entries() if e.replaced_by == entry.key_id), None)
        return entry, plain, old

    entry, plain, old = _run(go)
    if old is None or old.state(now) is KeyState.REVOKED:
        fate = "is revoked"
    else:
        assert old.expires_at is not None
        fate = f"works until {iso_utc(old.expires_at)}"
    note = f"created {_describe(entry)}; the old key {fate}"
    _show_new_key(entry, plain, now, as_json, note, replaces=old and key_doc(old, now))


@app.command()
def revoke(
    key_id: str = typer.Argument(..., help="The key to revoke (its id, or the whole key)"),
    data_dir: Path = DATA_DIR,
    as_json: bool = JSON_OUT,
) -> None:
    """Revoke a key: it stops working at the coordinator's next authentication."""
    now = time.time()
    entry = _run(lambda: KeyRing(credentials_path(data_dir)).revoke(key_id, now=now))
    if as_json:
        typer.echo(json.dumps(key_doc(entry, now)))
        return
    assert entry.revoked_at is not None
    typer.echo(f"revoked key {entry.key_id} of {entry.principal().label} at "
               f"{iso_utc(entry.revoked_at)}")  # fmt: skip
