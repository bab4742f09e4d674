"""A TCP proxy in front of PostgreSQL that loses the answer to one COMMIT: the commit is
forwarded, PostgreSQL commits it and answers, and the proxy drops the answer and closes the
connection on both sides, so the client sees its connection lost mid-commit (an outcome in
doubt) while the transaction is in fact committed. Which COMMIT is named by a marker: bytes
one of the transaction's statements carries (a parameter: the SQL text of a prepared
statement is not sent again), looked for from its BEGIN. The connections through the proxy must
not use TLS (`sslmode=disable`): it reads the protocol's bytes."""

from __future__ import annotations

import asyncio
from types import TracebackType

_BEGIN = b"BEGIN"
_COMMIT = b"COMMIT\x00"
_CHUNK = 1 << 16


class CommitCut:
    """The proxy (`async with`): `port` to connect to, `arm` to lose one COMMIT's answer."""

    def __init__(self, host: str, port: int) -> None:
        self._upstream = (host, port)
        self._server: asyncio.Server | None = None
        self._marker = b""
        self._done = asyncio.Event()
        self._pumps: set[asyncio.Task[None]] = set()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.sockets[0].getsockname()[1])

    def arm(self, marker: bytes) -> asyncio.Event:
        """Lose the answer to the next COMMIT of a transaction that sent `marker` (once);
        the event is set when it was lost and the connection closed."""
        self._marker = marker
        self._done = asyncio.Event()
        return self._done

    async def __aenter__(self) -> CommitCut:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:  # fmt: skip
        assert self._server is not None
        self._server.close()
        for pump in list(self._pumps):
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    async def _serve(
        self, client_in: asyncio.StreamReader, client_out: asyncio.StreamWriter
    ) -> None:
        server_in, server_out = await asyncio.open_connection(*self._upstream)
        cutting = asyncio.Event()
        ends = (client_out, server_out)
        for pump in (
            self._to_server(client_in, server_out, cutting, ends),
            self._to_client(server_in, client_out, cutting, ends),
        ):
            task = asyncio.create_task(pump)
            self._pumps.add(task)
            task.add_done_callback(self._pumps.discard)

    async def _to_server(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, cutting: asyncio.Event,
        ends: tuple[asyncio.StreamWriter, ...],
    ) -> None:  # fmt: skip
        marked = False
        try:
            while data := await source.read(_CHUNK):
                if _BEGIN in data:
                    marked = False  # a transaction begins: the marker is looked for in it
                if self._marker and self._marker in data:
                    marked = True
                if marked and self._marker and _COMMIT in data:
                    self._marker = b""
                    cutting.set()  # the next answer is the COMMIT's (the client waits for it)
                sink.write(data)
                await sink.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            _close(ends)

    async def _to_client(
        self, source: asyncio.StreamReader, sink: asyncio.StreamWriter, cutting: asyncio.Event,
        ends: tuple[asyncio.StreamWriter, ...],
    ) -> None:  # fmt: skip
        try:
            while data := await source.read(_CHUNK):
                if cutting.is_set():  # committed and answered: the answer is lost
                    _close(ends)
                    self._done.set()
                    return
                sink.write(data)
                await sink.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            _close(ends)


def _close(ends: tuple[asyncio.StreamWriter, ...]) -> None:
    for end in ends:
        end.close()
