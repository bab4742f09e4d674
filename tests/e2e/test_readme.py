"""The README's quickstart, JSON gateway and agent examples, run as written: its shell blocks
as real processes in a temporary directory (`apiary serve`, the Echo agent from its Python
block, `apiary send`), each printed answer compared with the block that shows it, and its
curl examples posted to the gateway with the same bodies. Then nothing is in the DLQ. The
"Writing an agent" section runs the same way beside its own coordinator: the agent of its
first Python block, the submitter of its second (a task handle's result), `apiary task
submit --wait`.

Only the addresses differ from the page: the coordinator takes free ports (APIARY_GRPC and
APIARY_HTTP, which `apiary serve` reads), the client commands find them where it records
them, the curl examples' `localhost:8080` becomes the port it took and a Python client's
`127.0.0.1:50051` the gRPC one."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import shlex
import signal
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

README = Path(__file__).resolve().parents[2] / "README.md"
APIARY = [sys.executable, "-m", "apiary.cli.main"]
WAIT_S = 60.0
CLIENT_ENV = re.compile(r"APIARY_.*")
"""Every Apiary setting of the environment the tests run in: the README's commands run with
none of them (and a HOME of their own, so no client.toml either)."""
_BLOCK = re.compile(r"^```(\w*)\n(.*?)^```\n", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True, slots=True)
class Block:
    lang: str
    text: str


def section(heading: str) -> str:
    """The README's text under `heading` (a line starting with it), up to the next heading
    of the same level."""
    text = README.read_text()
    level = heading.split(" ", maxsplit=1)[0]
    start = text.index(f"\n{heading}") + 1
    end = text.find(f"\n{level} ", start + len(heading))
    return text[start : end if end >= 0 else len(text)]


def blocks(text: str) -> list[Block]:
    return [Block(m[1], m[2]) for m in _BLOCK.finditer(text)]


def commands(block: Block) -> list[list[str]]:
    """The commands of a shell block, with `.venv/bin/apiary` and `.venv/bin/python` as this
    interpreter's."""
    out = []
    for line in block.text.replace("\\\n", " ").splitlines():
        argv = shlex.split(line, comments=True)
        if argv and argv[0] == ".venv/bin/apiary":
            argv = APIARY + argv[1:]
        elif argv and argv[0] == ".venv/bin/python":
            argv = [sys.executable, *argv[1:]]
        if argv:
            out.append(argv)
    return out


@dataclass
class Background:
    """A long-running command of the page, its output lines collected as they come."""

    proc: asyncio.subprocess.Process
    lines: list[str] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    readers: list[asyncio.Task[None]] = field(default_factory=list)

    def start_reading(self) -> None:
        for stream in (self.proc.stdout, self.proc.stderr):
            assert stream is not None
            self.readers.append(asyncio.create_task(self._read(stream)))

    async def _read(self, stream: asyncio.StreamReader) -> None:
        while raw := await stream.readline():
            self.lines.append(raw.decode().rstrip("\n"))
            self.changed.set()
        self.changed.set()

    async def line(self, wanted: Callable[[str], bool]) -> str:
        """The first output line for which `wanted` holds (waiting for it)."""

        async def find() -> str:
            while True:
                found = next((x for x in self.lines if wanted(x)), None)
                if found is not None:
                    return found
                assert self.proc.returncode is None, f"exited: {self.lines}"
                self.changed.clear()
                await self.changed.wait()

        return await asyncio.wait_for(find(), WAIT_S)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), WAIT_S)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        for reader in self.readers:
            reader.cancel()


@dataclass
class Page:
    """The directory the README's commands run in and what they left running."""

    directory: Path
    env: dict[str, str]
    running: list[Background] = field(default_factory=list)
    http: str = ""
    grpc: str = ""

    async def start(self, argv: list[str]) -> Background:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=self.directory, env=self.env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        started = Background(proc)
        started.start_reading()
        self.running.append(started)
        return started

    async def run(self, argv: list[str]) -> str:
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=self.directory, env=self.env, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), WAIT_S)
        assert proc.returncode == 0, (argv, proc.returncode, err.decode())
        return out.decode()


@asynccontextmanager
async def open_page(tmp_path: Path) -> AsyncIterator[Page]:
    env = {k: v for k, v in os.environ.items() if not CLIENT_ENV.fullmatch(k)}
    env.update(HOME=str(tmp_path), APIARY_GRPC="127.0.0.1:0", APIARY_HTTP="127.0.0.1:0")
    page = Page(tmp_path, env)
    try:
        yield page
    finally:
        for started in reversed(page.running):  # the agent first, then the coordinator
            await started.stop()


async def run_quickstart(page: Page) -> str:
    """Every block of the quickstart in order; returns the message id of its one-way send."""
    quickstart = section("## Quickstart")
    assert "`echo_agent.py`" in quickstart
    printed = one_way = ""
    for block in blocks(quickstart):
        if block.lang == "python":
            (page.directory / "echo_agent.py").write_text(block.text)
        elif block.lang == "text":
            assert printed == block.text, (printed, block.text)
        else:
            assert block.lang == "sh", block
            for argv in commands(block):
                printed = await run_command(page, argv)
                if "send" in argv and "--wait" not in argv:
                    one_way = printed.strip()
    assert one_way
    return one_way


async def run_command(page: Page, argv: list[str]) -> str:
    """One command of the page: the coordinator and the agent are started and left running
    once ready; any other runs to its end. Returns what it printed on stdout."""
    if argv[: len(APIARY)] != APIARY:  # another program of the page's (python script.py)
        return await page.run(argv)
    if argv[len(APIARY)] == "serve":
        served = await page.start(argv)
        page.http = (await served.line(lambda x: x.startswith("http="))).partition("=")[2]
        page.grpc = (await served.line(lambda x: x.startswith("grpc="))).partition("=")[2]
        return ""
    if argv[len(APIARY) : len(APIARY) + 2] == ["agent", "run"]:
        agent = await page.start(argv)
        await agent.line(lambda x: "connected to the coordinator" in x)
        return ""
    return await page.run(argv)


async def until_fulfilled(page: Page, message_id: str) -> None:
    """Wait (on the event log, as it grows) for `message_id` to be FULFILLED."""
    # --after: the events logged so far too (sequence 1 is the coordinator's start).
    follow = await page.start([
        *APIARY, "events", "--follow", "--after", "1", "--json", "--type", "message.state",
        "--correlation-id", message_id,
    ])  # fmt: skip

    def fulfilled(line: str) -> bool:
        if not line.startswith("{"):
            return False
        details = json.loads(line).get("details", {})
        return bool(details.get("message_id") == message_id and details.get("to") == "FULFILLED")

    await follow.line(fulfilled)
    await follow.stop()


def curl_examples() -> list[tuple[Block, Block]]:
    """Each curl block of the gateway section with the JSON answer shown after it."""
    found = blocks(section("### HTTP JSON gateway"))
    pairs = [(a, b) for a, b in itertools.pairwise(found) if a.text.startswith("curl")]
    assert pairs and all(b.lang == "json" for _, b in pairs)
    return pairs


async def post_curl(http: aiohttp.ClientSession, block: Block, address: str) -> Any:
    """What the gateway answers the request of a curl block: the same URL, on the port the
    coordinator took, and the same body."""
    argv = shlex.split(block.text.replace("\\\n", " "))
    assert argv[:2] == ["curl", "-s"] and "-d" in argv, argv
    body = argv[argv.index("-d") + 1]
    (url,) = [a for a in argv[2:] if "/v1/" in a]
    assert url.startswith("localhost:8080/v1/")
    async with http.post(f"http://{address}{url.removeprefix('localhost:8080')}", data=body) as r:
        assert r.status == 200, await r.text()
        return await r.json()


def shown(expected: Any, got: Any) -> bool:
    """Whether `got` is the answer the page shows: the same fields and values, where numbers
    in text may differ (`offset 3`) and a text ending with `...` is a beginning."""
    if isinstance(expected, dict):
        return (
            isinstance(got, dict)
            and set(expected) == set(got)
            and all(shown(v, got[k]) for k, v in expected.items())
        )
    if isinstance(expected, str) and isinstance(got, str):
        if expected.endswith("..."):
            return got.startswith(expected[:-3])
        return re.sub(r"\d+", "N", expected) == re.sub(r"\d+", "N", got)
    return bool(expected == got and type(expected) is type(got))


async def test_the_readme_runs_as_written(tmp_path: Path) -> None:
    async with open_page(tmp_path) as page:
        one_way = await run_quickstart(page)
        await until_fulfilled(page, one_way)
        async with aiohttp.ClientSession() as http:
            for request, answer in curl_examples():
                got = await post_curl(http, request, page.http)
                assert shown(json.loads(answer.text), got), (request.text, got)
        letters = await page.run([*APIARY, "dlq", "list", "--json"])
        assert letters == ""


AGENT_FILES = ("doubler.py", "submit.py")
"""What the "Writing an agent" section saves its Python blocks as, in order."""


async def test_the_agent_example_returns_its_result_through_the_handle(tmp_path: Path) -> None:
    text = section("## Writing an agent")
    assert all(f"save this as `{name}`" in text.lower() for name in AGENT_FILES)
    async with open_page(tmp_path) as page:
        await run_command(page, [*APIARY, "serve"])
        files, printed, ran = iter(AGENT_FILES), "", 0
        for block in blocks(text):
            if block.lang == "python":
                source = block.text.replace("127.0.0.1:50051", page.grpc)
                (page.directory / next(files)).write_text(source)
            elif block.lang == "text":
                assert printed == block.text, (printed, block.text)
            else:
                assert block.lang == "sh", block
                for argv in commands(block):
                    printed = await run_command(page, argv)
                    ran += 1
        assert ran == 3 and next(files, None) is None
        letters = await page.run([*APIARY, "dlq", "list", "--json"])
        assert letters == ""
