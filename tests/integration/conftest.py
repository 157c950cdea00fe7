"""Session-wide cache of real training runs (see runs.py)."""

from __future__ import annotations

import pytest

from tests.integration.installed import build_venv
from tests.integration.runs import Runs


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(str(tmp_path_factory.mktemp("jobs")))


@pytest.fixture(scope="session")
def venv(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """diag's wheel in a venv of its own (installed.py), built once for both modules that run it: a
    module-scoped fixture imported into the second module was a second build."""
    return build_venv(tmp_path_factory.mktemp("installed"))
