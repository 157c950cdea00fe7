"""`row_text`: a table's rows written column by column are the encoder's text, byte for byte."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from diag.report import json_report
from diag.report.records import Records, as_rows
from diag.report.row_text import rows_text


def _encoder_text(part: pd.DataFrame) -> str:
    return json.dumps(as_rows(part), indent=2, default=str, allow_nan=False)[2:-2]


def test_every_kind_of_column_as_the_encoder_writes_it():
    df = pd.DataFrame(
        {
            "rank": np.array([0, 1, 2], dtype=np.int32),
            "step": np.array([2**40, -1, 0], dtype=np.int64),
            "dur_s": [0.1, np.nan, -np.inf],
            "f32": np.array([0.1, 1e-30, 3], dtype=np.float32),
            "applied": [True, False, True],
            "name": ["all_reduce", 'a "q"\n\u00e9\u4e2d', None],
            "group": pd.Categorical(["dp", "tp", "dp"]),
            "count": pd.array([1, None, 3], dtype="Int64"),
            "mixed": [np.float64(2.5), np.int64(7), np.nan],
            "flag": [np.bool_(True), pd.NA, "x"],
            7: [np.str_("s"), 1.5e300, pd.NaT],
        }
    )
    for part in (df, df.iloc[1:2]):
        assert rows_text(part) == _encoder_text(part)


def test_a_column_of_lists_or_times_is_left_to_the_encoder():
    lists = pd.DataFrame({"rank": [0, 1], "throttle": [["SwPowerCap"], []]})
    times = pd.DataFrame({"t": pd.to_datetime(["2026-01-01", "2026-01-02"])})
    twice = pd.DataFrame([[1, 2.5]], columns=["x", "x"])
    assert rows_text(lists) is None and rows_text(times) is None and rows_text(twice) is None
    doc = {"a": Records(lists), "b": {"c": Records(times)}, "d": Records(pd.DataFrame({"x": [1.5]}))}
    out: list[str] = []

    class Sink:
        write = out.append

    json_report.write(doc, Sink())  # type: ignore[arg-type]
    assert "".join(out) == json_report.render(doc) + "\n"
