"""The calls other replicas of the cluster forward to this one (`core.cluster.forwarding`;
docs/security.md, "Cluster mode"): the principal the forwarding replica established is
accepted when the call is signed with the cluster's forwarding key, is recent, and its nonce
has not been seen; anything else is refused as unauthenticated."""

from __future__ import annotations

from collections.abc import Callable

from apiary.core.access.principal import Principal
from apiary.core.cluster.forwarding import FORWARD_KEY, WINDOW_MS, Forwarded, read_forward
from apiary.errors import UnauthenticatedError
from apiary.server.auth.replay import ReplayWindow


class ForwardedCalls:
    """Checks forwarded calls against the cluster's forwarding key."""

    def __init__(self, key: str, now: Callable[[], float]) -> None:
        self._key = key
        self._now = now
        self._replays = ReplayWindow(WINDOW_MS / 1000)

    def principal(self, text: str, method: str) -> Principal:
        """The principal a forwarded call acts as; UnauthenticatedError otherwise."""
        now = self._now()
        found = read_forward(self._key, method, text, int(now * 1000))
        if not isinstance(found, Forwarded):
            raise UnauthenticatedError(found, {"field": FORWARD_KEY})
        refused = self._replays.accept(
            f"{found.replica_id}\0{found.nonce}".encode(), found.unix_ms / 1000, now
        )
        if refused is not None:
            raise UnauthenticatedError(f"{FORWARD_KEY}: {refused}", {"field": FORWARD_KEY})
        return found.principal


def not_clustered(text: str, method: str) -> Principal:
    """Outside cluster mode no call is forwarded: the metadata is refused."""
    raise UnauthenticatedError(
        f"{FORWARD_KEY} is for calls forwarded between the replicas of a cluster; this "
        "coordinator is not in cluster mode",
        {"field": FORWARD_KEY},
    )
