"""Session-wide cache of real training runs (see runs.py)."""

from __future__ import annotations

import pytest

from tests.integration.runs import Runs


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(str(tmp_path_factory.mktemp("jobs")))
