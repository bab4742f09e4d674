"""Every check of apiary.testing.store_suite against every backend."""

from __future__ import annotations

import asyncio

import pytest

from apiary.testing.store_suite import CHECKS, Check, CheckNotApplicable, StoreFactory

CHECK_TIMEOUT_S = 60


@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
async def test_store_conformance(check: Check, store_factory: StoreFactory) -> None:
    try:
        await asyncio.wait_for(check(store_factory), CHECK_TIMEOUT_S)
    except CheckNotApplicable as exc:
        pytest.skip(str(exc))


def test_every_check_has_its_own_name() -> None:
    assert len({c.__name__ for c in CHECKS}) == len(CHECKS) > 20
