"""What the control server and its clients agree on: where sockets live, how messages are framed.

Sockets live in one per-user directory (mode 0700, owned by the user, never a symlink), so no other
user can connect, plant a socket, or read the attach options written next to them. Messages are
single JSON lines capped at `MAX_LINE` bytes; the command set is fixed and never executes code.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from typing import Any

from diag.errors import FAILURE, DiagError

MAX_LINE = 64 * 1024
COMMANDS = ("status", "set-sampling", "snapshot", "detach")
SOCKET_SUFFIX = ".sock"


class UnsafeDirectory(DiagError, OSError):
    """The per-user directory exists but is not private: refusing to use it (one line, exit 1)."""


def runtime_dir(uid: int | None = None) -> str:
    """`$XDG_RUNTIME_DIR/diag` when that is ours, else `/tmp/diag-<uid>`; created 0700 and checked."""
    uid = os.getuid() if uid is None else uid
    base = runtime_base(os.environ.get("XDG_RUNTIME_DIR"), uid)
    try:
        os.mkdir(base, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(base)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o077:
        raise UnsafeDirectory(
            f"{base} is not a private directory owned by uid {uid} (mode "
            f"{stat.S_IMODE(st.st_mode):o}, owner {st.st_uid}): another user may have "
            "created it; remove it, or point XDG_RUNTIME_DIR at a private directory "
            "(the job and diag must agree on it)",
            FAILURE,
        )
    return base


def runtime_base(xdg: str | None, uid: int) -> str:
    """Where a process with this XDG_RUNTIME_DIR keeps its sockets (not created or checked)."""
    return os.path.join(xdg, "diag") if xdg and os.path.isdir(xdg) else f"/tmp/diag-{uid}"


def socket_path(pid: int, uid: int | None = None) -> str:
    return os.path.join(runtime_dir(uid), f"{pid}{SOCKET_SUFFIX}")


def listed_pids(uid: int | None = None) -> list[int]:
    """Pids that have a control socket in the user's directory (possibly stale)."""
    names = os.listdir(runtime_dir(uid))
    return sorted(
        int(n[: -len(SOCKET_SUFFIX)])
        for n in names
        if n.endswith(SOCKET_SUFFIX) and n[: -len(SOCKET_SUFFIX)].isdigit()
    )


def write_private(name: str, data: bytes) -> str:
    """Create `name` fresh (O_EXCL, no symlinks) in the private directory with mode 0600."""
    path = os.path.join(runtime_dir(), name)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def encode(obj: dict[str, Any]) -> bytes:
    data = json.dumps(obj, separators=(",", ":"), default=str).encode() + b"\n"
    if len(data) > MAX_LINE:
        raise ValueError(f"message of {len(data)} bytes exceeds the {MAX_LINE}-byte limit")
    return data


def read_message(sock: socket.socket) -> dict[str, Any]:
    """Read one JSON line (at most MAX_LINE bytes) and decode it to a dict."""
    buf = bytearray()
    while b"\n" not in buf:
        chunk = sock.recv(4096)
        if not chunk:
            break
        buf += chunk
        if len(buf) > MAX_LINE:
            raise ValueError(f"message exceeds the {MAX_LINE}-byte limit")
    return decode(bytes(buf).split(b"\n", 1)[0])


def decode(line: bytes) -> dict[str, Any]:
    """One message line (without its newline) to a dict; ValueError when it is not a JSON object."""
    obj = json.loads(line)
    if not isinstance(obj, dict):
        raise ValueError("a message must be a JSON object")
    return obj
