"""The fault matrix (issue 17; cells in tests/integration/faults.py): every planted fault in a real
2-rank job is named, with the right rank, and nothing else is said; every healthy control is silent.

`DIAG_FAULT_TABLE=PATH` writes the matrix as markdown at the end (docs/faults.md is made so, by
`python -m bench.faults`). A cell diag does not get right yet is a strict xfail with the reason.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from tests.integration.faults import CELLS, Cell, render, run_cell
from tests.integration.runs import Runs

pytestmark = pytest.mark.slow
ROWS: list[dict[str, Any]] = []


@pytest.fixture(scope="module", autouse=True)
def _table():
    yield
    path = os.environ.get("DIAG_FAULT_TABLE")
    if path and ROWS:
        order = {c.name: i for i, c in enumerate(CELLS)}
        rows = sorted(ROWS, key=lambda r: order[f"{r['job']}-{r['fault']}".replace(" ", "_")])
        with open(path, "w") as f:
            f.write(render(rows))


def _param(cell: Cell) -> Any:
    marks = [pytest.mark.xfail(strict=cell.strict, reason=cell.known_gap)] if cell.known_gap else []
    return pytest.param(cell, id=cell.name, marks=marks)


@pytest.mark.parametrize("cell", [_param(c) for c in CELLS])
def test_cell(cell: Cell, runs: Runs, tmp_path) -> None:
    out = run_cell(cell, runs, str(tmp_path))
    ROWS.append(out.row())
    assert out.false_alarms() == [] if cell.expect else out.findings == [], out.row()
    if cell.expect is not None and cell.inject != "stop":
        assert out.found() is not None, out.row()
    if cell.inject == "stop":
        assert out.live_correct(), out.live
        # the goal is 10 s; `diag stacks` itself (two py-spy samples a rank and the trace
        # join) took 6.6-8.7 s of it at a load average of 10 on the shared 2-core machine
        assert out.live_s is not None and out.live_s < 15, out.live_s
    assert out.correct()
