"""Talk to the control server of an attached process (used by status, detach, stacks, attach)."""

from __future__ import annotations

import os
import socket
from typing import Any

from diag.control import protocol
from diag.errors import FAILURE, DiagError


def request(pid: int, cmd: str, timeout: float = 10.0, **args: Any) -> dict[str, Any]:
    """Send one command and return the reply; a DiagError when the process is not attached."""
    path = _socket_of(pid)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(path)
            try:
                sock.sendall(protocol.encode({"cmd": cmd, **args}))
            except BrokenPipeError:
                pass  # refused before reading (peer check): its one-line reason is still readable
            reply = protocol.read_message(sock)
        except (OSError, ValueError) as e:
            if not _alive(pid):
                _remove_stale(path)
                raise DiagError(f"pid {pid} has exited (removed its stale control socket)", FAILURE) from None
            raise DiagError(f"pid {pid}: control socket did not answer ({e})", FAILURE) from None
    if not reply.get("ok"):
        raise DiagError(f"pid {pid}: {cmd} failed: {reply.get('error')}", FAILURE)
    return reply


def send(pid: int, cmd: str, **args: Any) -> None:
    """Send one command without waiting for its reply: a stopped process reads it (the socket holds
    it) and acts on it when resumed. A DiagError when the process is not attached."""
    path = _socket_of(pid)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2.0)
        try:
            sock.connect(path)
            sock.sendall(protocol.encode({"cmd": cmd, **args}))
        except OSError as e:
            raise DiagError(f"pid {pid}: could not send {cmd} ({e})", FAILURE) from None


def _socket_of(pid: int) -> str:
    """The process' control socket; a DiagError when it has none (not attached)."""
    path = protocol.socket_path(pid)
    if not os.path.exists(path):
        raise DiagError(f"pid {pid} is not attached (no control socket {path})", FAILURE)
    return path


def attached_pids() -> list[int]:
    """Pids with a live control socket; stale sockets of exited processes are removed."""
    out = []
    for pid in protocol.listed_pids():
        if _alive(pid):
            out.append(pid)
        else:
            _remove_stale(protocol.socket_path(pid))
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
