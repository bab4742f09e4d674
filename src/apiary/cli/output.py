"""Where the CLI prints its tables: on a terminal, at the terminal's width; anywhere else (a
pipe, a file, a script's capture) as wide as the rows need, so that an id or a value is never
split across lines (a console with no terminal would wrap at 80 columns)."""

from __future__ import annotations

import sys
from typing import Final

from rich.console import Console

UNBOUNDED_WIDTH: Final = 1_000_000
"""The width of a console that is not a terminal: rows are never wrapped."""


def console_for_output(*, stderr: bool = False) -> Console:
    """A console for stdout (or stderr) as the module docstring says."""
    stream = sys.stderr if stderr else sys.stdout
    if stream.isatty():
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=UNBOUNDED_WIDTH)
