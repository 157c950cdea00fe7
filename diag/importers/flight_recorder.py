"""PyTorch Flight Recorder dumps: the last collectives each rank issued, written when a job hangs.

torch writes one file per rank (`TORCH_NCCL_DEBUG_INFO_TEMP_FILE` / `TORCH_FR_DUMP_TEMP_FILE`, default
prefix `/tmp/nccl_trace_rank_`, the rank at the end of the name) on a watchdog timeout with
`TORCH_NCCL_DUMP_ON_TIMEOUT=1`, or on demand (`torch._C._distributed_c10d._dump_fr_trace[_json]()`). The
content is a dict (`version`, `pg_config`: group name -> {name, desc, ranks}, `pg_status`: group id ->
last enqueued / started / completed sequence number, `entries`: one per collective with
`collective_seq_id`, `profiling_name` like `nccl:all_reduce`, `input_sizes`, `output_sizes`, dtypes,
`state`, `retired`, `time_created_ns`, `timeout_ms`, `is_p2p`), pickled or as JSON (torch's
`tools/flight_recorder` / `torch.distributed.flight_recorder` read the same fields).

A pickle from a hung cluster is untrusted input: it is read with an unpickler that refuses every
global (a dump holds only dicts, lists, tuples, strings, numbers, booleans and None), so a crafted
file cannot run code. The frames: `fr_entry` (one row per recorded collective), `fr_group` (each
rank's view of its groups: members), `fr_status` (the sequence numbers torch reports per group).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
from typing import TYPE_CHECKING, Any

from diag.importers.errors import ImportProblem
from diag.trace import safeio

if TYPE_CHECKING:  # imported where the frames are built: detecting a dump needs no pandas
    import pandas as pd

PICKLE_MARK = (b"pg_config", b"entries")
JSON_MARK = b'"comm_lib_version"'
_RANK = re.compile(r"(\d+)(?:\.json)?$")
ENTRY_COLUMNS = [
    "rank",
    "pg",
    "pg_desc",
    "seq",
    "p2p_seq",
    "is_p2p",
    "op",
    "in_sizes",
    "out_sizes",
    "in_dtypes",
    "out_dtypes",
    "state",
    "retired",
    "ts",
    "timeout_ms",
    "where",
]


class _NoGlobals(pickle.Unpickler):
    """Only plain containers and scalars: any class or function reference is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused {module}.{name}: a Flight Recorder dump holds no objects")


def is_dump(head: bytes) -> bool:
    """Does a file's head look like a Flight Recorder dump (pickle or JSON)?"""
    if head[:1] == b"\x80":
        return all(m in head for m in PICKLE_MARK)
    return head.lstrip()[:1] == b"{" and (
        JSON_MARK in head or (b'"entries"' in head and b'"collective_seq_id"' in head)
    )


def load(path: str) -> dict[str, Any]:
    """The dump's dict; `ImportProblem` (one line) for anything else."""
    try:
        with safeio.open_regular(path) as f:
            raw = f.read(safeio.max_input_bytes() + 1)
    except safeio.InputError as e:
        raise ImportProblem(str(e)) from None
    if len(raw) > safeio.max_input_bytes():
        raise ImportProblem(safeio.too_big("is larger than", safeio.max_input_bytes()))
    try:
        dump = (
            _NoGlobals(io.BytesIO(raw)).load()
            if raw[:1] == b"\x80"
            else json.loads(raw.decode("utf-8", errors="replace"))
        )
    except (
        pickle.UnpicklingError,
        EOFError,
        ValueError,
        TypeError,
        IndexError,
        KeyError,
        AttributeError,
        RecursionError,
        MemoryError,
    ) as e:
        raise ImportProblem(f"not a readable Flight Recorder dump ({str(e)[:120]})") from None
    if not isinstance(dump, dict) or not isinstance(dump.get("entries"), list):
        raise ImportProblem("not a Flight Recorder dump: no `entries` list")
    return dump


def rank_of(path: str) -> int:
    """torch names each rank's dump by appending its global rank to the prefix."""
    m = _RANK.search(os.path.basename(path))
    if m is None:
        raise ImportProblem(
            "Flight Recorder dump without the rank at the end of its name (torch writes <prefix><rank>)"
        )
    return int(m.group(1))


def _sizes(v: Any) -> str:
    return json.dumps(v, separators=(",", ":")) if v is not None else ""


def _caller(frames: Any) -> str:
    """The first frame outside torch (the job's own call of the collective), `file:line function`."""
    for f in frames if isinstance(frames, list) else ():
        name = str(f.get("filename", "")) if isinstance(f, dict) else ""
        if name and "/torch/" not in name and not name.startswith("<"):
            return f"{name}:{f.get('line')} {f.get('name', '')}".strip()
    return ""


def import_dump(path: str) -> tuple[int, dict[str, Any], dict[str, pd.DataFrame]]:
    """(rank, header, frames) of one rank's dump."""
    import pandas as pd

    dump, rank = load(path), rank_of(path)
    rows = []
    for e in dump["entries"]:
        if not isinstance(e, dict):
            continue
        pg = e.get("process_group") or ("", "")
        name = str(e.get("profiling_name") or "")
        rows.append(
            {
                "rank": rank,
                "pg": str(pg[0]),
                "pg_desc": str(pg[1]) if len(pg) > 1 else "",
                "seq": e.get("collective_seq_id"),
                "p2p_seq": e.get("p2p_seq_id"),
                "is_p2p": bool(e.get("is_p2p")),
                "op": name.split(":", 1)[-1],
                "in_sizes": _sizes(e.get("input_sizes")),
                "out_sizes": _sizes(e.get("output_sizes")),
                "in_dtypes": _sizes(e.get("input_dtypes")),
                "out_dtypes": _sizes(e.get("output_dtypes")),
                "state": e.get("state"),
                "retired": e.get("retired"),
                "ts": e.get("time_created_ns"),
                "timeout_ms": e.get("timeout_ms"),
                "where": _caller(e.get("frames")),
            }
        )
    groups = [
        {
            "rank": rank,
            "pg": str(k),
            "name": str((v or {}).get("name", k)),
            "desc": str((v or {}).get("desc", "")),
            "ranks": str((v or {}).get("ranks", "")),
        }
        for k, v in (dump.get("pg_config") or {}).items()
    ]
    status = [
        {
            "rank": rank,
            "pg": str(k),
            **{f: (v or {}).get(f"last_{f}_collective") for f in ("enqueued", "started", "completed")},
        }
        for k, v in (dump.get("pg_status") or {}).items()
    ]
    frames = {
        "fr_entry": pd.DataFrame(rows, columns=ENTRY_COLUMNS),
        "fr_group": pd.DataFrame(groups, columns=["rank", "pg", "name", "desc", "ranks"]),
        "fr_status": pd.DataFrame(status, columns=["rank", "pg", "enqueued", "started", "completed"]),
    }
    header = {"rank": rank, "source": "flight_recorder", "fr_version": str(dump.get("version", ""))}
    return rank, header, {k: v for k, v in frames.items() if not v.empty}
