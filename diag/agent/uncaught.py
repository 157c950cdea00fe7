"""An exception that ends the job is on record in its trace: the `uncaught` meta record.

A job whose ranks all raised before or during training left traces that read as healthy: `diag
analyze` said "No findings" for a public DDP tutorial whose ranks died on their first line with an
AttributeError (its log says why; its trace did not). The agent puts a hook in front of
`sys.excepthook` that writes what ended the main thread (exception type, first message line, the
job's innermost frame, the step in progress) and then calls the hook it replaced, so the job's
output and exit code are what they were. It is written at once: a job that started the agent
itself may exit before the writer thread wakes again. A detach restores the previous hook.
Exceptions in other threads do not end the job and are not recorded.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from types import TracebackType
from typing import Any

from diag import schema

MESSAGE_CHARS = 500
OWN = os.sep + "diag" + os.sep  # diag's own frames are not where the job failed
LIBRARY = tuple(
    p for p in {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")} if p
)


def describe(exc: BaseException, tb: TracebackType | None, step: int) -> dict[str, Any]:
    """What the record says: type, first line of the message, where it was raised (the innermost
    frame, diag's own left out), the job's own innermost frame (outside the interpreter's library,
    installed packages and generated code: what the job's author fixes), and the step."""
    frames = [f for f in traceback.extract_tb(tb) if OWN not in f.filename] if tb is not None else []
    # generated code is no one's file to fix: a dataclass's `__init__` is `<string>` (HF's
    # TrainingArguments raising in its __post_init__ read "the job's own code at <string>:117")
    own = [f for f in frames if not f.filename.startswith(LIBRARY) and not f.filename.startswith("<")]
    message = str(exc).strip().splitlines()
    return {
        "exc": type(exc).__name__,
        "message": message[0][:MESSAGE_CHARS] if message else "",
        "where": _at(frames[-1]) if frames else None,
        "job_frame": _at(own[-1]) if own else None,
        "step": step,
        "interrupted": isinstance(exc, KeyboardInterrupt),
    }


def _at(frame: traceback.FrameSummary) -> str:
    return f"{frame.filename}:{frame.lineno} in {frame.name}"


def install(agent: Any) -> None:
    """Put the recording hook in front of `sys.excepthook`; undone with the agent's other hooks."""
    previous = sys.excepthook

    def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
        try:
            agent.set_meta(schema.META_UNCAUGHT, describe(exc, tb, int(agent.step)))
            agent.write_now()  # the interpreter may end before the writer thread wakes again
        except Exception as error:  # noqa: BLE001 - the job's own hook must run whatever happens
            agent.record_error("agent", "uncaught", error)
        previous(kind, exc, tb)

    sys.excepthook = hook

    def restore() -> None:
        if sys.excepthook is hook:  # another tool put its own in front since: leave the chain be
            sys.excepthook = previous

    agent.undo.call(restore, "sys.excepthook")
