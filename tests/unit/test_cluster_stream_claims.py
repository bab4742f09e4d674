"""The rule of one live stream per agent across replicas (`apiary.core.cluster.streams`):
every (standing, proof) pair of the table."""

from __future__ import annotations

import pytest

from apiary.core.cluster.streams import (
    HolderStanding,
    StreamHolder,
    StreamVerdict,
    claim_stream,
    standing,
)

FREE = StreamHolder("bob", "", "", 4)
MINE = StreamHolder("bob", "a", "a1", 4)
EARLIER_START = StreamHolder("bob", "a", "a0", 4)
OTHER = StreamHolder("bob", "b", "b1", 4)


@pytest.mark.parametrize(
    ("found", "live", "expected"),
    [
        (FREE, False, HolderStanding.FREE),
        (MINE, True, HolderStanding.MINE),
        (OTHER, True, HolderStanding.LIVE_OTHER),
        (OTHER, False, HolderStanding.GONE_OTHER),
        (EARLIER_START, False, HolderStanding.GONE_OTHER),
    ],
)
def test_how_a_holder_row_stands_for_replica_a(
    found: StreamHolder, live: bool, expected: HolderStanding
) -> None:
    assert standing(found, "a", "a1", live) is expected


@pytest.mark.parametrize(
    ("found", "live", "take_over", "verdict"),
    [
        (FREE, False, False, StreamVerdict.GRANTED),
        (FREE, False, True, StreamVerdict.GRANTED),
        (MINE, True, False, StreamVerdict.GRANTED),
        (MINE, True, True, StreamVerdict.GRANTED),
        (OTHER, False, False, StreamVerdict.GRANTED),
        (OTHER, False, True, StreamVerdict.GRANTED),
        (OTHER, True, False, StreamVerdict.REFUSED),
        (OTHER, True, True, StreamVerdict.SUPERSEDES),
    ],
)
def test_every_standing_and_proof_has_its_verdict(
    found: StreamHolder, live: bool, take_over: bool, verdict: StreamVerdict
) -> None:
    claim = claim_stream(found, "a", "a1", live, take_over)
    assert claim.verdict is verdict
    assert claim.previous == found
    if verdict is StreamVerdict.REFUSED:
        assert not claim.granted and claim.holder == found
    else:
        assert claim.granted
        assert claim.holder == StreamHolder("bob", "a", "a1", found.generation + 1)
