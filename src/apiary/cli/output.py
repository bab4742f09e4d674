"""Where the CLI prints its tables: on a terminal, at the terminal's width; anywhere else (a
pipe, a file, a script's capture) as wide as the rows need, so that an id or a value is never
split across lines (a console with no terminal would wrap at 80 columns). And how its tables
show a time: UTC, to the second (`utc_text`, `stamp_text`)."""

from __future__ import annotations

import datetime as dt
import sys
from typing import Final

from rich.console import Console

UNBOUNDED_WIDTH: Final = 1_000_000
"""The width of a console that is not a terminal: rows are never wrapped."""
DATE_TIME: Final = "%Y-%m-%d %H:%M:%S"
TIME: Final = "%H:%M:%S"


def console_for_output(*, stderr: bool = False) -> Console:
    """A console for stdout (or stderr) as the module docstring says."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=UNBOUNDED_WIDTH)


def utc_text(seconds: float, layout: str = DATE_TIME) -> str:
    """`seconds` since the epoch as UTC in `layout` (date and time, or `TIME` alone)."""
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime(layout)


def stamp_text(ts: object, layout: str = DATE_TIME) -> str:
    """A protobuf Timestamp (its whole `seconds`) as `utc_text`; "" when it is unset (0)."""
    seconds = getattr(ts, "seconds", 0)
    return utc_text(seconds, layout) if seconds else ""
