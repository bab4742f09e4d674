"""The [swarm] table: a swarm peer inside the coordinator (PeerSettings; docs/swarm.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from apiary.errors import ValidationError
from apiary.server.config.values import typed_fields
from apiary.swarm.settings import PeerSettings


def swarm_settings(values: Mapping[str, Any], source: str) -> PeerSettings:
    """PeerSettings from the [swarm] table: home (required), listen, cert, key, bridge_agent,
    wake, insecure; relative paths are taken from the current directory."""
    known = {f.name: bool if f.name == "insecure" else str for f in fields(PeerSettings)}
    changes = typed_fields(values, known, "swarm.", source)
    if not changes.get("home"):
        raise ValidationError(f"{source}: swarm.home is required", {"field": "swarm.home"})
    tls = changes.get("cert") and changes.get("key")
    if changes.get("listen") and not tls and not changes.get("insecure"):
        raise ValidationError(
            f"{source}: swarm.listen needs swarm.cert and swarm.key (TLS), or swarm.insecure "
            "= true for plain HTTP on a loopback address (local development)",
            {"field": "swarm.cert"},
        )
    return PeerSettings(**{**changes, "home": Path(changes["home"])})
