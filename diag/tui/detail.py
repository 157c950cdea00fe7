"""The drill-in text of one rank (pure; the app calls it under the model's lock)."""

from __future__ import annotations

from diag.ranks import rank_name
from diag.tui import fmt
from diag.tui.model import JobModel


def rank_detail(m: JobModel, rank: int) -> str:
    who = rank_name(rank)
    st = m.ranks.get(rank)
    if st is None:
        return f"{who}: no data"
    h = m.headers.get(rank, {})
    pid = f"pid {st.pid}" if rank >= 0 else "no rank"  # a process without a rank is named by its pid
    lines = [
        f"{who} on {st.host}, {pid}, local rank {h.get('local_rank', '-')}",
        f"argv: {' '.join(str(a) for a in h.get('argv') or [])}",
        f"versions: torch {h.get('torch')}, deepspeed {h.get('deepspeed')}, megatron {h.get('megatron')}",
        "",
    ]
    steps = list(st.steps)[-10:]
    lines.append("last steps (ms): " + ", ".join(f"{s}:{d / 1e6:.1f}" for s, d in steps))
    lines.append(f"comm share of last step: {fmt.pct(st.comm_share())}")
    lines.append(f"memory peak / capacity: {fmt.mem(st.mem_peak, st.mem_capacity)}")
    lines.append(f"overflows {st.overflows}, dropped events {st.dropped}, collector errors {st.errors}")
    lines += ["", "collectives of this rank (group / op: count, bytes, mean ms, busbw GB/s):"]
    stats = sorted(m.rank_comms.get(rank, {}).values(), key=lambda c: -c.dur)
    for c in stats:
        lines.append(
            f"  {c.group} / {c.op}: {c.count}, {fmt.nbytes(c.bytes)}, "
            f"{c.mean_latency / 1e6:.3f}, {c.busbw:.3f}"
        )
    if not stats:
        lines.append("  none recorded")
    return "\n".join(lines)
