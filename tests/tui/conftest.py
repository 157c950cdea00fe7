"""Fixtures of the TUI tests: a real recorded 2-rank DeepSpeed trace (sample_traces/healthy when
the generator has produced it, else recorded here once per session with the same workload)."""

from __future__ import annotations

import asyncio
import functools
import html
import os
import re
from collections.abc import Callable, Coroutine
from typing import Any

import pytest

from tests.conftest import ROOT

RECORD_ARGS = ["--diag", "--steps", "8", "--layers-every", "2", "--dtype", "fp16", "--overflow-at", "3"]


def _has_trace(path: str) -> bool:
    return os.path.isdir(path) and any(f.startswith("rank-") for f in os.listdir(path))


@pytest.fixture(scope="session")
def real_trace(tmp_path_factory) -> str:
    sample = os.path.join(ROOT, "sample_traces", "healthy")
    if _has_trace(sample):
        return sample
    from tests.workloads import launch

    out = str(tmp_path_factory.mktemp("recorded"))
    launch.run("tests.workloads.gpt_ds", [*RECORD_ARGS, "--trace-dir", out])
    return out


async def wait_for(pilot, cond, tries: int = 200) -> None:
    """Let the worker thread and the UI catch up until `cond()` holds (no wall-time asserts)."""
    for _ in range(tries):
        if cond():
            return
        await pilot.pause(0.05)
    raise AssertionError("the app did not reach the expected state")


def sync(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async Pilot test in its own event loop (no pytest async plugin needed)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return wrapper


def settled(app: Any, table_id: str) -> Callable[[], bool]:
    """A `wait_for` condition: the table's cells are the same as at the previous check and every
    column fits them. The cells can still change once the awaited state is reached (the replay
    reads the ranks' files one after another: the last step shown before every rank's overflow
    was read, a snapshot cut the health cell "straggler, slow x1.6, " short in CI twice)."""
    from diag.tui.widgets.table import SyncTable

    seen: list[Any] = [None]

    def check() -> bool:
        table = app.query_one(f"#{table_id}", SyncTable)
        cells = [tuple(str(c) for c in table.get_column(key)) for key in table.columns]
        same, seen[0] = cells == seen[0], cells
        return same and columns_fit(app, table_id)

    return check


def screen_text(app: Any) -> str:
    """The screen's text as an SVG snapshot holds it (its lines run together)."""
    svg = app.export_screenshot()
    return html.unescape("".join(re.findall(r"<text[^>]*>(.*?)</text>", svg, re.S))).replace("\xa0", " ")


def screen_shows(app: Any, table_id: str) -> Callable[[], bool]:
    """A `wait_for` condition on what a snapshot takes: the screen, as exported, shows every cell of
    the table in full and is the same as at the previous check. The table's own state is not
    enough: a health cell was once painted cut to the column's previous width and stayed so
    (`SyncTable`'s docstring; CI at 4ec48f9 and b1394f5)."""
    from diag.tui.widgets.table import SyncTable

    seen: list[str | None] = [None]

    def check() -> bool:
        table = app.query_one(f"#{table_id}", SyncTable)
        text = screen_text(app)
        same, seen[0] = text == seen[0], text
        cells = {str(c) for key in table.columns for c in table.get_column(key)}
        return same and all(c in text for c in cells)

    return check


def columns_fit(app: Any, table_id: str) -> bool:
    """Every column of the table is as wide as its widest cell. The widths follow the cells at the
    table's next refresh: a check or a snapshot taken between the two sees a cell cut (a snapshot
    of the ranks screen lost ", overflow 1" of a health cell once under CI's load)."""
    from diag.tui.widgets.table import SyncTable

    table = app.query_one(f"#{table_id}", SyncTable)
    return all(
        col.get_render_width(table) >= max((len(str(c)) for c in table.get_column(key)), default=0) + 2
        for key, col in table.columns.items()
    )
