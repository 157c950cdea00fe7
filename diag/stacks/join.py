"""Join stacks with the collectives each rank's agent saw complete, and state the verdict."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from diag.stacks.cluster import collective_of, user_frame
from diag.stacks.dump import RankStack


@dataclass
class Progress:
    """What a rank's trace says about its collectives so far (None: no trace for this rank)."""

    completed: int
    last_op: str | None
    last_step: int | None
    last_group: str | None = None
    pending: tuple[str, str | None, int | None] | None = None  # (op, group, step) issued, not completed


def _ts(ev: dict[str, Any]) -> int:
    ts = ev.get("ts")
    return ts if isinstance(ts, int) else 0


def progress(trace_file: str) -> Progress:
    """Completed collectives in one rank's trace file (read with the tolerant trace reader). A record
    with a null duration was issued but never completed (written when the agent gave up waiting, or
    as `comm_open` while still waited in after 1.5 s): that is the collective a rank is stuck in, not
    one it finished (kept when it is the newest)."""
    from diag import schema
    from diag.trace.reader import read_file

    _, events, _ = read_file(trace_file)
    mine = [e for e in events if e.get("k") == schema.COMM]
    written = {e.get("ts") for e in mine}
    waited = [e for e in events if e.get("k") == schema.COMM_OPEN and e.get("ts") not in written]
    comms = [e for e in mine if e.get("dur") is not None]
    last = comms[-1] if comms else {}
    newest = [*waited[-1:], *mine[-1:]]
    tail = max(newest, key=_ts) if newest else {}
    pending = (
        (str(tail.get("op")), tail.get("group"), tail.get("step"))
        if tail and tail.get("dur") is None
        else None
    )
    return Progress(len(comms), last.get("op"), last.get("step"), last.get("group"), pending)


def waits_in(st: RankStack, prog: Progress | None) -> str | None:
    """The collective a rank waits in: the one on its stack, else the one its trace says it issued
    and never completed (a collective issued from C++, DDP's reducer: no Python frame shows it)."""
    return collective_of(st.frames) or (prog.pending[0] if prog is not None and prog.pending else None)


def _where_in(prog: Progress | None) -> str:
    """The waited-in collective's group and step (its pending record), or the last completed one's."""
    if prog is None:
        return ""
    if prog.pending:
        _, group, step = prog.pending
        return "".join(f"{k} {v}, " for k, v in (("group", group), ("step", step)) if v is not None)
    if prog.last_op and prog.last_group is not None:
        return f"after {prog.last_op} in group {prog.last_group} at step {prog.last_step}, "
    return ""


def describe(st: RankStack, prog: Progress | None) -> str:
    coll = waits_in(st, prog)
    where = user_frame(st.frames)
    done = (
        ""
        if prog is None
        else (
            f"; {prog.completed} collectives completed since diag started"
            + (f", last {prog.last_op} at step {prog.last_step}" if prog.last_op else "")
        )
    )
    if coll:
        nth = f" (its collective #{prog.completed + 1} since diag started)" if prog is not None else ""
        via = "" if collective_of(st.frames) else " (issued from C++, per its trace)"
        return f"{st.label}: waiting in {coll}{via}{nth}{done}"
    return f"{st.label}: not in a collective, in {where.short() if where else '?'}{done}"


def verdict(stacks: list[RankStack], progs: dict[int, Progress]) -> str | None:
    """Who is stuck in which collective (its group and step), and who never arrived; None when
    nothing is wrong."""
    inside = {st.pid: waits_in(st, progs.get(st.pid)) for st in stacks}
    waiting = [st for st in stacks if inside[st.pid]]
    absent = [st for st in stacks if not inside[st.pid]]
    if not waiting:
        return None
    ops = sorted({op for st in waiting if (op := inside[st.pid])})
    if len(ops) > 1:
        return "ranks are in different collectives: " + "; ".join(
            f"{st.label} in {inside[st.pid]}" for st in waiting
        )
    if not absent:
        return (
            None
            if _same_count(waiting, progs)
            else "all ranks in "
            + ops[0]
            + " but at different collective counts: "
            + ", ".join(f"{st.label} #{progs[st.pid].completed + 1}" for st in waiting if st.pid in progs)
        )
    stuck = ", ".join(st.label for st in waiting)
    never = "; ".join(f"{st.label} (in {_where(st)})" for st in absent)
    nth = ""
    first = progs.get(waiting[0].pid)
    if first is not None:
        nth = f" ({_where_in(first)}collective #{first.completed + 1} since diag started)"
    return f"{stuck} stuck in {ops[0]}{nth}; never arrived: {never}"


def moving(
    before: tuple[list[RankStack], dict[int, Progress]], after: tuple[list[RankStack], dict[int, Progress]]
) -> list[str]:
    """Ranks that made progress between two samples (more collectives completed, or other functions
    on the stack; a line number alone is a rank polling in place): a rank seen once between two
    collectives, or counts read a moment apart, prove no hang."""
    (st0, pr0), (st1, pr1) = before, after
    frames0 = {st.pid: _functions(st) for st in st0}
    out = []
    for st in st1:
        p0, p1 = pr0.get(st.pid), pr1.get(st.pid)
        if p0 is not None and p1 is not None and p1.completed != p0.completed:
            out.append(f"{st.label} +{p1.completed - p0.completed} collectives")
        elif frames0.get(st.pid) != _functions(st):
            out.append(f"{st.label} moved")
    return out


def _functions(st: RankStack) -> list[tuple[str, str]]:
    return [(fr.name, fr.file) for fr in st.frames]


def _where(st: RankStack) -> str:
    fr = user_frame(st.frames)
    return fr.short() if fr else "?"


def _same_count(stacks: list[RankStack], progs: dict[int, Progress]) -> bool:
    counts = {progs[st.pid].completed for st in stacks if st.pid in progs}
    return len(counts) <= 1
