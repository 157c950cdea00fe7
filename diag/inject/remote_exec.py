"""PEP 768 `sys.remote_exec` (Python 3.14+ targets): the interpreter's own safe attach point.

It must be called from a 3.14+ interpreter too, so it runs the target's own executable. The script
is read by the target at its next safe point, later than this call returns, so the file stays in
the private directory until the attach command sees the agent's socket and removes it.
"""

from __future__ import annotations

import os
import subprocess

from diag.control import protocol
from diag.inject.checks import Target, ptrace_hint
from diag.inject.failure import InjectFailed

REMOTE_EXEC_MIN = (3, 14)


def inject(target: Target, code: str) -> str | None:
    if target.version < REMOTE_EXEC_MIN:
        raise InjectFailed(f"target runs Python {target.version[0]}.{target.version[1]} (needs 3.14+)")
    script = protocol.write_private(f"inject-{target.pid}-{os.urandom(8).hex()}.py", code.encode())
    call = f"import sys; sys.remote_exec({target.pid}, {script!r})"
    proc = subprocess.run(
        [target.exe, "-I", "-S", "-c", call], capture_output=True, text=True, timeout=30, check=False
    )
    if proc.returncode != 0:
        os.unlink(script)
        err = (proc.stderr.strip().splitlines() or ["failed"])[-1]
        if "ermission" in err:
            err += f" ({ptrace_hint()})"
        raise InjectFailed(err)
    return None
