"""The fault matrix's extra cells (tests/integration/faults_extra.py): a desync, memory growth and an
input stall planted in a real 2-rank DDP job, each named with the right rank and nothing else said;
the healthy control (layers recorded every step) silent. Full matrix only: each cell is a real job
(the desync one runs until `diag watch` has spoken), too long for `make test`; DIAG_FULL_MATRIX=1 (set
by bench.faults) runs them, and DIAG_FAULT_TABLE=PATH writes their rows as markdown.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.integration.faults import FULL, Cell, render
from tests.integration.faults_extra import EXTRA_CELLS, run_extra, slow_link_unavailable
from tests.integration.runs import Runs

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not os.environ.get(FULL), reason=f"full matrix only ({FULL}=1, or python -m bench.faults): real jobs"
    ),
]
ROWS: dict[str, dict[str, Any]] = {}  # cell name -> its table row
NAMES = [c.name for c in EXTRA_CELLS]


@pytest.fixture(scope="module", autouse=True)
def _table():
    """The rows, in EXTRA_CELLS' order, beside the matrix's table (bench.faults appends them)."""
    yield
    path = os.environ.get("DIAG_FAULT_TABLE")
    if path and ROWS:
        with open(path + ".extra", "w") as f:
            f.write(render([ROWS[n] for n in sorted(ROWS, key=NAMES.index)]))


def _param(cell: Cell) -> Any:
    gap = [pytest.mark.xfail(strict=cell.strict, reason=cell.known_gap)] if cell.known_gap else []
    return pytest.param(cell, id=cell.name, marks=gap)


@pytest.mark.parametrize("cell", [_param(c) for c in EXTRA_CELLS])
def test_extra_cell(cell: Cell, runs: Runs, tmp_path) -> None:
    """Outcome.correct(): the expected rule names the rank (live within 10 s for an injected fault),
    no other rule says anything; a control gets no finding at all."""
    why = slow_link_unavailable(cell)
    if why:
        pytest.skip(f"no slow link here: {why}")
    out = run_extra(cell, runs, str(tmp_path))
    ROWS[cell.name] = out.row()
    assert out.correct(), out.row()
