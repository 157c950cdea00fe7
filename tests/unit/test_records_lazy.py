"""The document's tables as sequences of rows made as they are read (`Records`): the renderers read
them so (the terminal report's `materialize` of every per-(rank, step) table doubled a 256-rank x
2,000-step run's peak RSS), and what they print must be what the plain document gives."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from diag.analyzers import run_all
from rich.console import Console

from diag.importers import load_inputs
from diag.metrics.stage import Metrics
from diag.report import html, markdown, model, records, terminal
from diag.report.records import Records, materialize

SAMPLES = Path(__file__).resolve().parents[2] / "sample_traces"


def test_rows_read_as_a_list_of_them_reads():
    frame = pd.DataFrame(
        {
            "rank": np.arange(10, dtype=np.int32),
            "dur_s": [0.5, np.nan, *range(8)],
            "name": ["a", None, *"bcdefghi"],
        }
    )
    table, rows = Records(frame), Records(frame).rows()
    assert len(rows) == 10 and rows[1] == {"rank": 1, "dur_s": None, "name": None}
    assert len(table) == 10 and bool(table) and not Records(frame.iloc[:0])
    assert list(table) == rows
    for at in (0, 3, 9, -1, -10):
        assert table[at] == rows[at]
    for cut in (slice(2, 5), slice(None, 3), slice(-2, None), slice(None, None, 3), slice(8, 2)):
        assert table[cut] == rows[cut]
    for at in (10, -11):
        with pytest.raises(IndexError):
            table[at]
    assert rows[4] in table and table.index(rows[4]) == 4


def test_rows_are_made_a_chunk_at_a_time(monkeypatch):
    monkeypatch.setattr(records, "CHUNK", 3)
    table = Records(pd.DataFrame({"step": range(8)}))
    made: list[int] = []
    real = records.as_rows
    monkeypatch.setattr(records, "as_rows", lambda part: made.append(len(part)) or real(part))
    seen = iter(table)
    assert [next(seen)["step"] for _ in range(4)] == [0, 1, 2, 3]
    assert made == [3, 3]  # the second chunk, not the whole table


@pytest.mark.parametrize("sample", ["zero3", "overflow_storm", "kineto_gpt_ds_fp16"])
def test_the_renderers_print_from_the_tables_read_lazily_what_the_plain_document_gives(sample):
    trace = load_inputs([str(SAMPLES / sample)])
    metrics = Metrics(trace)
    findings, failures = run_all(trace, metrics=metrics)
    doc = model.document(trace, findings, failures, metrics)
    assert records.lazy(doc)  # the per-(rank, step) tables are Records, not lists

    def printed(d: dict) -> tuple[str, str, str]:
        out = io.StringIO()
        terminal.render(d, Console(file=out, width=120), quiet=False)
        return out.getvalue(), markdown.render(d), html.render(d)

    assert printed(doc) == printed(materialize(doc))
