"""The coordinator's data directory as a client command finds it without `--data-dir`:
the one setting the client commands share with `apiary serve`, kept apart from the rest of
the configuration so that reading it imports nothing else."""

from __future__ import annotations

from pathlib import Path
from typing import Final

DATA_DIR_ENV: Final = "APIARY_DATA_DIR"
DEFAULT_DATA_DIR: Final = Path(".apiary")
