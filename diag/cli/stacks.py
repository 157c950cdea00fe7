"""Stacks of every rank (py-spy), grouped across ranks and joined with each rank's last collectives.

Names the odd rank out, the collective each rank waits in, and the ranks that never arrived. The
collective counts come from the agent's trace (found through the control socket when attached, or
--trace-dir); without them the stacks alone still say who waits in which collective. Every rank is
sampled twice, --interval apart: a verdict is given only when no rank moved in between (one sample
of a healthy job catches ranks between collectives, and counts read a moment apart differ).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from diag.errors import USAGE, DiagError
from diag.procs import ranks_under
from diag.stacks.cluster import cluster, odd_ones_out
from diag.stacks.dump import RankStack, dump, rank_stack
from diag.stacks.join import Progress, describe, moving, progress, verdict


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pid", type=int, help="a rank's pid, or the launcher above the ranks")
    parser.add_argument("--native", action="store_true", help="include native (C/C++) frames")
    parser.add_argument("--trace-dir", help="the ranks' trace directory when they are not attached")
    parser.add_argument("--all-threads", action="store_true", help="also print non-main threads")
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument(
        "--interval", type=float, default=1.0, help="seconds between the two samples (default 1)"
    )


def run(args: argparse.Namespace) -> int:
    if args.interval < 0:
        raise DiagError("--interval must be >= 0", USAGE)
    ranks = ranks_under(args.pid)
    first = _sample(ranks, args)
    time.sleep(args.interval)
    stacks, progs = _sample(ranks, args)
    moved = moving(first, (stacks, progs))
    found = None if moved else verdict(stacks, progs)
    if args.json:
        print(json.dumps({**_as_json(stacks, progs, found), "moving": moved}, default=str))
    else:
        print(render(stacks, progs, found, args.all_threads, moved))
    return 0


def _sample(
    ranks: list[tuple[int, int | None]], args: argparse.Namespace
) -> tuple[list[RankStack], dict[int, Progress]]:
    """Every rank's stack, then its trace's count right after it (as close to the same instant)."""

    def one(pr: tuple[int, int | None]) -> tuple[RankStack, Progress | None]:
        st = rank_stack(pr[0], pr[1], dump(pr[0], args.native))
        return st, _progress(st, args.trace_dir)

    with ThreadPoolExecutor(max_workers=min(8, len(ranks))) as pool:
        got = list(pool.map(one, ranks))
    return [st for st, _ in got], {st.pid: p for st, p in got if p is not None}


def _progress(st: RankStack, trace_dir: str | None) -> Progress | None:
    path = _trace_file(st, trace_dir)
    return progress(path) if path and os.path.exists(path) else None


def _trace_file(st: RankStack, trace_dir: str | None) -> str | None:
    if trace_dir is None:
        from diag.control.client import request

        try:
            return request(st.pid, "status", timeout=3.0).get("trace_file")
        except DiagError:
            return None
    stem = f"rank-{st.rank:05d}" if st.rank is not None else f"pid-{st.pid}"
    files = sorted(glob.glob(os.path.join(trace_dir, f"{stem}*.jsonl")), key=os.path.getmtime)
    return files[-1] if files else None


def render(
    stacks: list[RankStack],
    progs: dict[int, Progress],
    found: str | None,
    all_threads: bool,
    moved: list[str] | None = None,
) -> str:
    groups = cluster(stacks)
    lines = [f"{len(stacks)} rank(s), {len(groups)} distinct stack(s)"]
    odd = odd_ones_out(groups) if found else []  # a healthy job's ranks are at different points
    if odd:  # of a step: "odd one(s) out" on its own read as a fault (a PP stage in compute)
        lines.append("odd one(s) out: " + ", ".join(r.label for r in odd))
    for g in groups:
        lines.append(f"\n[{g.labels}]")
        lines.extend("  " + describe(st, progs.get(st.pid)) for st in g.ranks)
        lines.extend(f"    {fr.short()}" for fr in g.frames)
        if all_threads:
            for st in g.ranks:
                for name, frames in st.other_threads.items():
                    lines.append(f"  {st.label} thread {name}:")
                    lines.extend(f"    {fr.short()}" for fr in frames)
    if moved:
        lines.append("\nprogress between the two samples: " + ", ".join(moved))
    lines.append("\nverdict: " + (found or "no rank is waiting on a missing peer"))
    return "\n".join(lines)


def _as_json(stacks: list[RankStack], progs: dict[int, Progress], found: str | None) -> dict[str, Any]:
    return {
        "verdict": found,
        "groups": [
            {
                "ranks": [st.rank for st in g.ranks],
                "pids": [st.pid for st in g.ranks],
                "describe": [describe(st, progs.get(st.pid)) for st in g.ranks],
                "frames": [fr.short() for fr in g.frames],
            }
            for g in cluster(stacks)
        ],
    }
