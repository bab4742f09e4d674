"""What the CLI's commands share when they call a coordinator: a call through an
`apiary.Client`, and a refusal said the same way (`apiary <command>: <code>: <message>`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import typer

from apiary.errors import ApiaryError
from apiary.sdk.client import Client
from apiary.sdk.keys import SIGNING_KEY_ENV

T = TypeVar("T")
SIGNING_KEY = typer.Option(
    None,
    "--signing-key",
    envvar=SIGNING_KEY_ENV,
    help="Ed25519 key (apiary agent keygen) when the coordinator requires signing",
)
"""The `--signing-key` option of the commands that speak as an agent."""


def refusal(program: str, exc: ApiaryError, *, with_field: bool = True) -> str:
    """The line a refused call prints; the field it names is added when the message does
    not start with it already."""
    field = exc.details.get("field") if with_field else None
    where = f" (field {field})" if field and not exc.message.startswith(f"{field}:") else ""
    return f"apiary {program}: {exc.code}: {exc.message}{where}"


def run_client(
    program: str, address: str, call: Callable[[Client], Awaitable[T]], *,
    token: str = "", with_field: bool = True,
) -> T:  # fmt: skip
    """`call` with a Client of `address` (as the operator of `token` when given); a refusal
    is printed (`refusal`) and ends the command with exit code 1."""
    metadata = {"authorization": f"Bearer {token}"} if token else None

    async def go() -> T:
        async with Client(address, metadata=metadata) as client:
            return await call(client)

    try:
        return asyncio.run(go())
    except ApiaryError as exc:
        typer.echo(refusal(program, exc, with_field=with_field), err=True)
        raise typer.Exit(1) from None
