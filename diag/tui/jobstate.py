"""Whether a followed job still runs: its ranks' processes on this host and their control sockets.

"ended": no rank process on this host is alive any more. "detached": every live rank had a control
socket (an attached agent) and none has one now. "live" otherwise, and always for ranks on other
hosts (nothing to ask there). Checked by the pump thread every `EVERY_S` seconds, live sources only.
"""

from __future__ import annotations

import os
import socket
from typing import Any

from diag.control.protocol import socket_path

EVERY_S = 2.0


class JobState:
    def __init__(self) -> None:
        self.had_socket: set[int] = set()
        self.host = socket.gethostname()

    def check(self, headers: dict[int, dict[str, Any]]) -> str:
        local = {
            int(h["pid"])
            for h in headers.values()
            if isinstance(h.get("pid"), int) and h.get("host") == self.host and not h.get("sidecar")
        }
        if not local:
            return "live"
        alive = {p for p in local if os.path.exists(f"/proc/{p}")}
        if not alive:
            return "ended"
        sockets = {p for p in alive if os.path.exists(socket_path(p))}
        self.had_socket |= sockets
        return "detached" if not sockets and alive <= self.had_socket else "live"
