"""Fold the parts each importer produced into one `Trace` (same job: a trace plus its log)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from diag.trace.model import CATEGORICAL, Trace

if TYPE_CHECKING:  # imported where frames are joined: finding the inputs needs no pandas
    import pandas as pd


class Combiner:
    """Collects per-source headers and frames; `trace()` concatenates frames kind by kind."""

    def __init__(self) -> None:
        self.result = Trace()
        self.parts: dict[str, list[pd.DataFrame]] = {}

    def add_header(self, rank: int, header: dict[str, Any]) -> None:
        merged = self.result.headers.setdefault(rank, {})
        for k, v in header.items():
            if merged.get(k) is None:
                merged[k] = v

    def add_frames(self, frames: dict[str, pd.DataFrame]) -> None:
        for kind, df in frames.items():
            if not df.empty:
                self.parts.setdefault(kind, []).append(df)

    def add_trace(self, trace: Trace) -> None:
        for rank, header in trace.headers.items():
            self.add_header(rank, header)
        self.add_frames(trace.frames)
        self.result.problems.extend(trace.problems)

    def trace(self) -> Trace:
        import pandas as pd

        while self.parts:  # drop each kind's parts as soon as they are joined (peak memory)
            kind, dfs = self.parts.popitem()
            df = dfs[0] if len(dfs) == 1 else pd.concat(dfs, ignore_index=True)
            dfs.clear()
            for col in CATEGORICAL:
                if col in df.columns and df[col].dtype == object:
                    try:
                        df[col] = df[col].astype("category")
                    except TypeError:
                        pass
            self.result.frames[kind] = df.reset_index(drop=True)
        return self.result
