"""`Trace`: every rank's events as one pandas frame per kind, plus headers and load problems.

The same type carries what the Kineto and log importers produce (extra kinds such as `kernel`), so
analyzers take a `Trace` whatever the source.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from diag import schema

if TYPE_CHECKING:  # imported where a frame is built: following live files needs no pandas
    import pandas as pd

# Columns whose values repeat a lot: stored as pandas categoricals (interned strings).
CATEGORICAL = (
    "module",
    "phase",
    "op",
    "dtype",
    "group",
    "device",
    "source",
    "collector",
    "where",
    "exc",
    "key",
    "name",
    "cat",
)


_EMPTY: dict[str, pd.DataFrame] = {}  # kind -> the empty frame `Trace.frame` copies


@dataclass
class LoadProblem:
    """Something the reader had to skip or could not read; `str()` is the one-line message."""

    path: str
    message: str
    line: int | None = None
    truncated: bool = False

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line is not None else self.path
        return f"{where}: {self.message}"


@dataclass
class Trace:
    """All ranks of one job. `headers[rank]` is that rank's header merged with its `meta` events."""

    headers: dict[int, dict[str, Any]] = field(default_factory=dict)
    frames: dict[str, pd.DataFrame] = field(default_factory=dict)
    problems: list[LoadProblem] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)

    def frame(self, kind: str) -> pd.DataFrame:
        """The frame of one kind, with at least the schema's columns (empty if none recorded)."""
        df = self.frames.get(kind)
        if df is not None:
            return df
        empty = _EMPTY.get(kind)
        if empty is None:
            import pandas as pd

            cols = ["rank", *schema.FIELDS.get(kind, ())]
            empty = _EMPTY[kind] = pd.DataFrame({c: pd.Series(dtype="object") for c in cols})
        # a shallow copy: a caller adding a column changes its copy only (building a frame of
        # object Series anew costs ~2 ms, and the rules and report ask for absent kinds ~40 times)
        return empty.copy(deep=False)

    @property
    def ranks(self) -> list[int]:
        return sorted(self.headers)

    @property
    def steps(self) -> pd.DataFrame:
        return self.frame(schema.STEP)

    @property
    def layers(self) -> pd.DataFrame:
        return self.frame(schema.LAYER)

    @property
    def comms(self) -> pd.DataFrame:
        return self.frame(schema.COMM)

    @property
    def memory(self) -> pd.DataFrame:
        return self.frame(schema.MEMORY)

    @property
    def overflow(self) -> pd.DataFrame:
        return self.frame(schema.OVERFLOW)

    @property
    def errors(self) -> pd.DataFrame:
        return self.frame(schema.ERROR)

    @property
    def stats(self) -> pd.DataFrame:
        return self.frame(schema.STATS)

    @property
    def gpu(self) -> pd.DataFrame:
        return self.frame(schema.GPU)

    @property
    def truncated(self) -> list[LoadProblem]:
        return [p for p in self.problems if p.truncated]

    def layout(self) -> dict[str, Any]:
        """The job's layout as the headers agree on it (from the lowest rank that knows)."""
        keys = (
            "world_size",
            "tp",
            "pp",
            "dp",
            "cp",
            "ep",
            "zero_stage",
            "dtype",
            "micro_batch",
            "global_batch",
            "grad_accum",
            "ds_config",
            "host",
            "device_name",
            "model",
        )
        out: dict[str, Any] = {}
        groups: dict[str, Any] = {}  # every rank's process groups by name (role, size, ranks)
        for rank in self.ranks:
            for k in keys:
                if k not in out and self.headers[rank].get(k) is not None:
                    out[k] = self.headers[rank][k]
            seen = self.headers[rank].get("groups")
            if isinstance(seen, dict):
                groups.update({k: v for k, v in seen.items() if k not in groups})
        if groups:
            out["groups"] = dict(sorted(groups.items()))
        return out

    def hosts(self) -> dict[int, str]:
        """rank -> host name from the headers ("?" where a header does not say)."""
        return {r: str(h.get("host") or "?") for r, h in self.headers.items()}
