from __future__ import annotations

from pathlib import Path

import pytest

from tests.swarm.pki import Pki, make_pki


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """The tests' private CA and a server certificate for 127.0.0.1 / localhost."""
    return make_pki(Path(tmp_path_factory.mktemp("pki")))
