"""Bring the manifest's `status` and `tests` in line with the citations in the tests.

    python -m tests.conformance.sync          # rewrite manifest.toml in place
    python -m tests.conformance.sync --check  # exit 1 if it would change anything

Citations (the `conformance` markers) are the source of truth: an entry cited by tests
becomes `tested` with exactly those node ids; an entry no test cites any more goes back to
`open` (its owner is kept). Only the `status` and `tests` lines of entries are rewritten, so
comments and layout survive.
"""

from __future__ import annotations

import argparse
import itertools
import re
import sys
from pathlib import Path

from tests.conformance.manifest import MANIFEST_PATH, scan_tests

_ENTRY = re.compile(r'^id = "(?P<id>[^"]+)"$', re.MULTILINE)


def _tests_line(nodes: list[str]) -> str:
    if not nodes:
        return "tests = []"
    inner = "".join(f'    "{n}",\n' for n in nodes)
    return f"tests = [\n{inner}]"


def _sync_entry(block: str, nodes: list[str]) -> str:
    status = "tested" if nodes else "open"
    block = re.sub(r'^status = "[a-z]+"$', f'status = "{status}"', block, count=1, flags=re.M)
    replacement = _tests_line(nodes)
    return re.sub(r"^tests = \[[^\]]*\]", lambda _m: replacement, block, count=1, flags=re.M)


def synced_text(text: str, citations: dict[str, list[str]]) -> str:
    """The manifest text with each entry's status/tests matching `citations`."""
    starts = [m.start() for m in _ENTRY.finditer(text)] + [len(text)]
    out = [text[: starts[0]]]
    for begin, end in itertools.pairwise(starts):
        block = text[begin:end]
        match = _ENTRY.match(block)
        assert match is not None
        out.append(_sync_entry(block, citations.get(match.group("id"), [])))
    return "".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    scan = scan_tests()
    citations: dict[str, list[str]] = {}
    for node, ids in scan.citations.items():
        for requirement in ids:
            citations.setdefault(requirement, []).append(node)
    for nodes in citations.values():
        nodes.sort()
    path = Path(MANIFEST_PATH)
    before = path.read_text()
    after = synced_text(before, citations)
    if args.check:
        if after != before:
            print("manifest.toml is out of date: run python -m tests.conformance.sync")
            return 1
        return 0
    path.write_text(after)
    print(f"manifest synced: {len(citations)} requirement(s) cited by tests")
    return 0


if __name__ == "__main__":
    sys.exit(main())
