"""The control server inside an attached job: answers `diag status/detach/...` on a private socket.

Runs on one daemon thread ("diag-control"). Only the fixed commands in `protocol.COMMANDS` exist;
each request is one JSON line, the peer must be the same uid (or root), checked with SO_PEERCRED.
No client can block it (issue 10: a byte a second held the old one-at-a-time loop forever, ten
silent connections filled its backlog of 8): connections are accepted at once and read without
blocking, side by side, each must finish its request within `CLIENT_DEADLINE_S`, and beyond
`MAX_CLIENTS` the oldest is dropped, so a `status` or `detach` always gets through.
Imports only the stdlib: it runs inside the training process. It knows the agent only through what
it is given (the agent, how to detach it, the rank), never `diag.agent` itself: the agent starts it.
"""

from __future__ import annotations

import os
import selectors
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from diag.control import protocol
from diag.thread_name import name_this_thread

ACCEPT_POLL_S = 0.25
CLIENT_DEADLINE_S = 2.0
MAX_CLIENTS = 16
BACKLOG = 64
MAX_LAYERS_EVERY = 1_000_000


def peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


class ControlServer:
    """Listens on `protocol.socket_path(os.getpid())` until `stop()` (or a `detach` request)."""

    def __init__(self, agent: Any, detach: Callable[[], list[str]], rank: Callable[[], int | None]) -> None:
        """`detach` stops the agent (through `diag.agent.stop` when it is the current one) and returns
        the undo steps that failed; `rank` reads the job's rank at each `status` (it may change)."""
        self.agent = agent
        self.detach, self.rank = detach, rank
        self.path = protocol.socket_path(os.getpid())
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._sel: selectors.BaseSelector | None = None
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
        sock.listen(BACKLOG)
        os.replace(tmp, self.path)
        sock.setblocking(False)
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name="diag-control", daemon=True)
        self._thread.start()

    def forget_in_child(self) -> None:
        """In a forked child: close this process's copies of the listening socket and the selector
        (an epoll descriptor) without touching the parent's socket file or its registrations."""
        for obj in (self._sock, self._sel):
            if obj is not None:
                obj.close()

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
        name_this_thread()
        sel = self._sel = selectors.DefaultSelector()
        clients: dict[socket.socket, _Client] = {}
        try:
            sel.register(self._sock, selectors.EVENT_READ)  # type: ignore[arg-type]
            while not self._stop.is_set():
                now = time.monotonic()
                wait = min([ACCEPT_POLL_S, *(c.deadline - now for c in clients.values())])
                for key, _ in sel.select(max(wait, 0.0)):
                    if key.fileobj is self._sock:
                        self._accept(sel, clients)
                    else:
                        self._read(sel, clients, clients[key.fileobj])  # type: ignore[index]
                now = time.monotonic()
                for client in [c for c in clients.values() if c.deadline <= now]:
                    self._finish(
                        sel,
                        clients,
                        client,
                        {"ok": False, "error": f"request not complete within {CLIENT_DEADLINE_S:.0f} s"},
                    )
        except (OSError, ValueError):
            return  # the listening socket was closed under us: stopping
        finally:
            for client in list(clients.values()):
                self._finish(sel, clients, client, None)
            sel.close()

    def _accept(self, sel: selectors.BaseSelector, clients: dict[socket.socket, _Client]) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()  # type: ignore[union-attr]
            except (BlockingIOError, InterruptedError):
                return
            conn.setblocking(False)
            client = _Client(conn, time.monotonic() + CLIENT_DEADLINE_S)
            uid = peer_uid(conn)
            if uid not in (os.getuid(), 0):
                self._reply(conn, {"ok": False, "error": f"uid {uid} not allowed"})
                conn.close()
                continue
            if len(clients) >= MAX_CLIENTS:  # the oldest idle client makes room
                oldest = min(clients.values(), key=lambda c: c.deadline)
                self._finish(sel, clients, oldest, {"ok": False, "error": "too many clients"})
            clients[conn] = client
            sel.register(conn, selectors.EVENT_READ)

    def _read(
        self, sel: selectors.BaseSelector, clients: dict[socket.socket, _Client], client: _Client
    ) -> None:
        try:
            chunk = client.conn.recv(4096)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        client.buf += chunk
        if len(client.buf) > protocol.MAX_LINE:
            reply = {"ok": False, "error": f"ValueError: message exceeds the {protocol.MAX_LINE}-byte limit"}
        elif b"\n" not in client.buf and chunk:
            return
        else:
            try:
                reply = self.handle(protocol.decode(bytes(client.buf).split(b"\n", 1)[0]))
            except Exception as exc:  # noqa: BLE001 - a bad client never hurts the job
                reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        self._finish(sel, clients, client, reply)

    def _finish(
        self,
        sel: selectors.BaseSelector,
        clients: dict[socket.socket, _Client],
        client: _Client,
        reply: dict[str, Any] | None,
    ) -> None:
        clients.pop(client.conn, None)
        try:
            sel.unregister(client.conn)
        except (KeyError, ValueError, OSError):
            pass
        if reply is not None:
            self._reply(client.conn, reply)
        client.conn.close()

    @staticmethod
    def _reply(conn: socket.socket, reply: dict[str, Any]) -> None:
        """Replies are small (well under a socket buffer): sent whole, or dropped."""
        try:
            conn.settimeout(0.5)
            conn.sendall(protocol.encode(reply))
        except (OSError, ValueError):
            pass

    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        cmd = msg.get("cmd")
        if cmd == "status":
            return {
                "ok": True,
                **self.agent.status(),
                "trace_dir": self.agent.trace_dir,
                "what": list(self.agent.what),
                "rank": self.rank(),
            }
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
            return {"ok": True, "undo_failed": self.detach()}
        return {"ok": False, "error": f"unknown command {cmd!r}; one of {', '.join(protocol.COMMANDS)}"}


@dataclass(eq=False)
class _Client:
    conn: socket.socket
    deadline: float
    buf: bytearray = field(default_factory=bytearray)
