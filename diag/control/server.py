"""The control server inside an attached job: answers `diag status/detach/...` on a private socket.

Runs on one daemon thread ("diag-control"). Only the fixed commands in `protocol.COMMANDS` exist;
each request is one JSON line, the peer must be the same uid (or root), checked with SO_PEERCRED.
Imports only the stdlib: it runs inside the training process.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
from typing import Any

from diag.control import protocol

ACCEPT_POLL_S = 0.25
MAX_LAYERS_EVERY = 1_000_000


def peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


class ControlServer:
    """Listens on `protocol.socket_path(os.getpid())` until `stop()` (or a `detach` request)."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self.path = protocol.socket_path(os.getpid())
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        # Bound, 0600 and listening under a temporary name, then renamed into place (replacing a
        # stale socket of an earlier agent in this pid): a client that sees the path can connect
        # (attach waits for the path). No umask change: it is process-wide, the job's files would
        # get it; the directory is private (0700) anyway.
        tmp = f"{self.path}.{os.urandom(6).hex()}.new"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(tmp)
        os.chmod(tmp, 0o600)
        sock.listen(8)
        os.replace(tmp, self.path)
        sock.settimeout(ACCEPT_POLL_S)
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name="diag-control", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Close and remove the socket; join the thread unless called from it (a `detach`)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        if self._sock is not None:
            self._sock.close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()  # type: ignore[union-attr]
            except TimeoutError:
                continue
            except OSError:
                return
            with conn:
                self._one(conn)

    def _one(self, conn: socket.socket) -> None:
        conn.settimeout(2.0)
        try:
            uid = peer_uid(conn)
            if uid not in (os.getuid(), 0):
                conn.sendall(protocol.encode({"ok": False, "error": f"uid {uid} not allowed"}))
                return
            reply = self.handle(protocol.read_message(conn))
        except Exception as exc:  # noqa: BLE001 - a bad client never hurts the job
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        try:
            conn.sendall(protocol.encode(reply))
        except (OSError, ValueError):
            pass

    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        cmd = msg.get("cmd")
        if cmd == "status":
            return {"ok": True, **self.agent.status(), "trace_dir": self.agent.trace_dir,
                    "what": list(self.agent.what), "rank": _rank()}
        if cmd == "set-sampling":
            every = msg.get("layers_every")
            if not isinstance(every, int) or not 0 <= every <= MAX_LAYERS_EVERY:
                return {"ok": False, "error": "layers_every must be an integer >= 0"}
            self.agent.layers_every = every
            return {"ok": True, "layers_every": every}
        if cmd == "snapshot":
            self.agent.flush()
            return {"ok": True}
        if cmd == "detach":
            from diag import agent as agent_module

            failed = agent_module.stop() if agent_module.current() is self.agent else self.agent.stop()
            return {"ok": True, "undo_failed": failed}
        return {"ok": False, "error": f"unknown command {cmd!r}; one of {', '.join(protocol.COMMANDS)}"}


def _rank() -> int | None:
    from diag.agent.header import rank_and_world

    return rank_and_world()[0]
