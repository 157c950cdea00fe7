"""The looks at the ranks' processes, from a process of their own.

A killed rank's exit status is readable only while it is a zombie: until its launcher reaps it
(torchrun polls every 0.1 s). The follower's looking thread shares the GIL with its analyses, whose
pandas calls hold it without a break: on a loaded 2-core host the thread's looks were up to 0.8 s
apart during an analysis (10 gaps over 0.1 s in 30 s), and `diag top` once missed a SIGKILLed rank's
status and named no death at all. This process does nothing but look: every `LOOK_S`, and at once
when a rank's process ends (a pidfd turns readable), writing each look as a JSON line to its
stdout; the follower reads them when it can, each look stamped with when it was taken.

Run by path with `python -I -S` (no site, no sitecustomize: 10-20 ms to start, nothing of the
user's environment imported), so it imports the standard library only. stdin: a JSON line
`{rank: pid}` each time the ranks to look at change; it ends when stdin closes (its follower is
gone). The /proc readers are here too, so that the follower's own looks read the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from typing import IO, Any

LOOK_S = 0.02  # how often each rank's process is looked at (/proc reads, ~30 us a rank)


def status_fields(pid: int) -> dict[str, str] | None:
    """/proc/<pid>/status as a dict (State, TracerPid, ...), None when the process is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    return {k: v.strip() for k, _, v in (ln.partition(":") for ln in lines)}


def exit_status(pid: int) -> int | None:
    """A zombie's wait status (/proc/<pid>/stat's last field), None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return int(f.read().rsplit(")", 1)[1].split()[-1])
    except (OSError, ValueError, IndexError):
        return None


def fact_of(pid: int, now_ns: int) -> dict[str, Any]:
    """One look at a process: its state letter (R, S, T: stopped), or "gone" (exited, or a zombie:
    then its wait status as `exit` while it can be read)."""
    fields = status_fields(pid)
    state = "gone" if fields is None else fields.get("State", "?")[:1]
    fact: dict[str, Any] = {"pid": pid, "state": state, "checked_ns": now_ns}
    if state in ("Z", "X"):  # dead, not reaped yet by its launcher
        fact["state"], status = "gone", exit_status(pid)
        if status is not None:
            fact["exit"] = status
    return fact


def _pidfd(pid: int) -> int | None:
    """A descriptor that turns readable when `pid` ends (Linux 5.3+), None where there is none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _lines(fd: int, buf: bytearray) -> list[bytes] | None:
    """The whole lines read from `fd` now (None: closed), the rest kept in `buf`."""
    chunk = os.read(fd, 65536)
    if not chunk:
        return None
    buf += chunk
    *lines, rest = bytes(buf).split(b"\n")
    buf[:] = rest
    return lines


class Looker:
    """The follower's handle on a looker process: the ranks to look at go in, the looks come out."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        self.buf = bytearray()
        self.sent: dict[int, int] | None = None
        self.ended = False  # its stdin refused a write: it is gone (killed)

    def want(self, pids: dict[int, int]) -> None:
        """Look at these {rank: pid} from now on (sent only when they changed)."""
        if pids != self.sent and not self.ended:
            stdin: IO[bytes] = self.proc.stdin  # type: ignore[assignment]
            try:
                stdin.write(json.dumps(pids).encode() + b"\n")
                stdin.flush()
            except (OSError, ValueError):
                self.ended = True
            self.sent = dict(pids)

    def looks(self, timeout: float) -> list[dict[int, dict[str, Any]]] | None:
        """The looks taken since the last call, waiting up to `timeout` for one; None: the looker
        ended (a broken pipe, or it was killed)."""
        out: IO[bytes] = self.proc.stdout  # type: ignore[assignment]
        if self.ended:
            return None
        ready, _, _ = select.select([out], [], [], timeout)
        lines = _lines(out.fileno(), self.buf) if ready else []
        if lines is None:
            return None
        return [{int(r): f for r, f in json.loads(line)["facts"].items()} for line in lines]

    def close(self) -> None:
        """Its stdin closed, it ends (killed if it has not within a second)."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C in the follower's terminal is its own
    stdin, out = sys.stdin.fileno(), sys.stdout
    buf = bytearray()
    pids: dict[str, int] = {}
    ends: dict[str, int] = {}  # rank -> pidfd while its process lives
    while True:
        ready, _, _ = select.select([stdin, *ends.values()], [], [], LOOK_S)
        if stdin in ready:
            lines = _lines(stdin, buf)
            if lines is None:
                return
            if lines:
                for end in ends.values():
                    os.close(end)
                pids = {str(r): int(p) for r, p in json.loads(lines[-1]).items()}
                ends = {r: fd for r, p in pids.items() if (fd := _pidfd(p)) is not None}
        if not pids:  # no rank of this host (yet): nothing to say, nothing to wake the follower for
            continue
        now = time.time_ns()
        facts = {r: fact_of(p, now) for r, p in pids.items()}
        for r in [r for r in ends if facts[r]["state"] == "gone"]:  # readable for good now
            os.close(ends.pop(r))
        try:
            out.write(json.dumps({"facts": facts}) + "\n")
            out.flush()
        except (BrokenPipeError, ValueError):  # the follower is gone
            return


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
