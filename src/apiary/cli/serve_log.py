"""Where `apiary serve` logs.

`--log-format text` (the default): every log line (the event log's JSON lines, the HTTP
access lines, the rest) goes to `DATA_DIR/apiary.log` (rotated at 10 MB, three kept), and
the terminal shows only warnings and errors, so that what a person reads there is the
summary `apiary serve` prints. `--log-format json`: every line on stderr, for a supervisor
that collects a process's output (systemd, a container runtime).

A data directory where the log cannot be written (read-only, say) logs on stderr instead,
and the summary says why.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from enum import StrEnum
from logging.handlers import RotatingFileHandler
from pathlib import Path
from typing import Final

LOG_FILE: Final = "apiary.log"
LINE_FORMAT: Final = "%(asctime)s %(name)s %(message)s"
TERMINAL_FORMAT: Final = "apiary serve: %(levelname)s %(name)s: %(message)s"
MAX_LOG_BYTES: Final = 10 * 1024 * 1024
KEPT_LOGS: Final = 3
FILE_ONLY: Final = ("apiary.events", "aiohttp.access")
"""Loggers whose lines stay in the file even at WARNING (events are JSON for tools)."""


class LogFormat(StrEnum):
    TEXT = "text"
    JSON = "json"


@dataclass(frozen=True, slots=True)
class LogTarget:
    """Where the lines went: a file, or stderr (`file` None; `problem`: why not the file)."""

    file: Path | None
    problem: str = ""


def configure_logging(level: str, data_dir: Path, log_format: LogFormat) -> LogTarget:
    """Set up the process's logging for `apiary serve` as the module docstring says."""
    if log_format is LogFormat.JSON:
        return _to_stderr(level)
    path = data_dir / LOG_FILE
    try:
        # The store makes the directory 0700 as well (it holds every message).
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        to_file = RotatingFileHandler(
            path, maxBytes=MAX_LOG_BYTES, backupCount=KEPT_LOGS, encoding="utf-8"
        )
    except OSError as exc:
        return _to_stderr(level, f"cannot write {path}: {exc.strerror or exc}")
    to_file.setFormatter(logging.Formatter(LINE_FORMAT))
    terminal = logging.StreamHandler(sys.stderr)
    terminal.setLevel(logging.WARNING)
    terminal.addFilter(lambda record: not record.name.startswith(FILE_ONLY))
    terminal.setFormatter(logging.Formatter(TERMINAL_FORMAT))
    logging.basicConfig(level=level, handlers=[to_file, terminal])
    return LogTarget(path)


def _to_stderr(level: str, problem: str = "") -> LogTarget:
    logging.basicConfig(level=level, stream=sys.stderr, format=LINE_FORMAT)
    return LogTarget(None, problem)
