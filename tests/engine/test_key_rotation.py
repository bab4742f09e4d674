"""The keys an agent rotated away (RFC 14 public keys; docs/security.md "Rotation"): kept
for recipients for a grace period, newest first, at most a few, never taken from the
agent's own registration."""

from __future__ import annotations

import base64
import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from apiary.core.signatures import public_bytes
from apiary.engine.registry import (
    MAX_RETIRED_KEYS,
    RETIRED_KEY_GRACE_S,
    RETIRED_KEYS,
    retired_keys_of,
)
from apiary.engine.settings import RouterSettings
from apiary.testing.engine import EngineHarness, open_test_engine


@pytest.fixture
async def h() -> AsyncIterator[EngineHarness]:
    async with open_test_engine(RouterSettings(signing_required=True)) as harness:
        yield harness


async def _register(
    h: EngineHarness, key: Ed25519PrivateKey, *, proof_by: Ed25519PrivateKey | None = None,
    **extra: Any,
) -> None:  # fmt: skip
    """Register alice under `key`; a rotation is proven by `proof_by`, the current key."""
    raw = public_bytes(key)
    descriptor = {
        "agent_id": "alice", "name": "alice", "reasoning_connectors": ["builtin://rules"],
        "modalities_supported": ["application/json"],
        "public_key": base64.b64encode(raw).decode(), **extra,
    }  # fmt: skip
    signed = b"registration of alice"
    proof = proof_by.sign(signed) if proof_by is not None else b""
    await h.engine.registry.register(descriptor, raw, signed=signed, proof=proof)


async def _retired(h: EngineHarness) -> list[bytes]:
    record = await h.engine.registry.get("alice")
    return [key for key, _ in retired_keys_of(record, h.clock.now())]


async def test_rotated_keys_are_kept_newest_first_for_a_grace_period(h: EngineHarness) -> None:
    keys = [Ed25519PrivateKey.generate() for _ in range(MAX_RETIRED_KEYS + 2)]
    await _register(h, keys[0])
    assert await _retired(h) == []
    for old, new in itertools.pairwise(keys):
        await _register(h, new, proof_by=old)
        h.clock.advance(60)
    # The newest first, and no more than MAX_RETIRED_KEYS of them.
    expected = [public_bytes(k) for k in reversed(keys[:-1])][:MAX_RETIRED_KEYS]
    assert await _retired(h) == expected
    # Re-registering under the same key (signed by it) keeps them; admission uses the
    # current key only.
    await _register(h, keys[-1], proof_by=keys[-1])
    assert await _retired(h) == expected
    assert h.engine.registry.public_key("alice") == public_bytes(keys[-1])
    # Past the grace period they vouch for nothing, and are dropped at the next registration.
    h.clock.advance(RETIRED_KEY_GRACE_S - 100)
    assert await _retired(h) == [public_bytes(keys[-2])]  # the last one, 60 s after the rest
    h.clock.advance(60)
    await _register(h, keys[-1], proof_by=keys[-1])
    assert (await h.engine.registry.get("alice")).descriptor.get(RETIRED_KEYS) is None


async def test_rotating_back_to_a_retired_key_makes_it_current_not_retired(
    h: EngineHarness,
) -> None:
    first, second = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    await _register(h, first)
    await _register(h, second, proof_by=first)
    await _register(h, first, proof_by=second)
    assert await _retired(h) == [public_bytes(second)]


async def test_a_registration_cannot_claim_retired_keys(h: EngineHarness) -> None:
    # Otherwise a key of the agent's choosing would vouch for messages it never signed
    # with its registered key.
    mine, planted = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    entry = {"public_key": base64.b64encode(public_bytes(planted)).decode(),
             "retired_at": h.clock.now()}  # fmt: skip
    await _register(h, mine, **{RETIRED_KEYS: [entry]})
    assert await _retired(h) == []
