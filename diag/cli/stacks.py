"""Stacks of every rank (py-spy), grouped across ranks and joined with each rank's last collectives.

Names the odd rank out, the collective each rank waits in, and the ranks that never arrived. The
collective counts come from the agent's trace (found through the control socket when attached, or
--trace-dir); without them the stacks alone still say who waits in which collective.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
from concurrent.futures import ThreadPoolExecutor

from diag.errors import DiagError
from diag.procs import ranks_under
from diag.stacks.cluster import cluster, odd_ones_out
from diag.stacks.dump import RankStack, dump, rank_stack
from diag.stacks.join import Progress, describe, progress, verdict


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("pid", type=int, help="a rank's pid, or the launcher above the ranks")
    parser.add_argument("--native", action="store_true", help="include native (C/C++) frames")
    parser.add_argument("--trace-dir", help="the ranks' trace directory when they are not attached")
    parser.add_argument("--all-threads", action="store_true", help="also print non-main threads")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    ranks = ranks_under(args.pid)
    with ThreadPoolExecutor(max_workers=min(8, len(ranks))) as pool:
        dumps = list(pool.map(lambda pr: dump(pr[0], args.native), ranks))
    stacks = [rank_stack(pid, rank, d) for (pid, rank), d in zip(ranks, dumps)]
    progs = {st.pid: p for st in stacks if (p := _progress(st, args.trace_dir)) is not None}
    found = verdict(stacks, progs)
    if args.json:
        print(json.dumps(_as_json(stacks, progs, found), default=str))
    else:
        print(render(stacks, progs, found, args.all_threads))
    return 0


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


def render(stacks: list[RankStack], progs: dict[int, Progress], found: str | None,
           all_threads: bool) -> str:
    groups = cluster(stacks)
    lines = [f"{len(stacks)} rank(s), {len(groups)} distinct stack(s)"]
    odd = odd_ones_out(groups)
    if odd:
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
    lines.append("\nverdict: " + (found or "no rank is waiting on a missing peer"))
    return "\n".join(lines)


def _as_json(stacks: list[RankStack], progs: dict[int, Progress], found: str | None) -> dict:
    return {"verdict": found, "groups": [
        {"ranks": [st.rank for st in g.ranks], "pids": [st.pid for st in g.ranks],
         "describe": [describe(st, progs.get(st.pid)) for st in g.ranks],
         "frames": [fr.short() for fr in g.frames]} for g in cluster(stacks)]}
