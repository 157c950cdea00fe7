"""Security: the control socket lets no other user in and runs no code; malformed and oversized
messages are refused without hurting the server; payload and trace files are private (0600 in 0700
directories), unpredictably named where it matters, and never written through a planted symlink."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator

import pytest

from diag import agent
from diag.control import protocol
from diag.control.client import request
from diag.inject import payload
from diag.trace.writer import TraceFileWriter

CONNECT = """import socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as e:
    sys.exit(print("refused", e.errno))
try:
    s.sendall(b'{"cmd":"status"}\\n')
except OSError:  # the server may answer and close before reading: its reply is still there
    pass
print(s.recv(65536).decode())
"""


@pytest.fixture
def served(tmp_path, monkeypatch) -> Iterator[tuple[agent.Agent, str]]:
    """An agent with its control socket in a private runtime dir under /tmp (whose parents another
    user can traverse, unlike pytest's tmp_path); yields (agent, socket path)."""
    xdg = tempfile.mkdtemp(prefix="diag-xdg-")
    monkeypatch.setenv("XDG_RUNTIME_DIR", xdg)
    a = agent.start(str(tmp_path / "trace"), "steps", control=True)
    try:
        yield a, protocol.socket_path(os.getpid())
    finally:
        agent.stop()
        shutil.rmtree(xdg, ignore_errors=True)


@pytest.fixture
def other_user() -> Iterator[str]:
    if os.getuid() != 0 or not shutil.which("useradd") or not shutil.which("runuser"):
        pytest.skip(reason="needs root with useradd/runuser to create a second user")
    name = f"diagt{uuid.uuid4().hex[:8]}"
    res = subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/bin/sh", name], capture_output=True, text=True
    )
    if res.returncode != 0:
        pytest.skip(reason=f"cannot create a user here: {res.stderr.strip()}")
    try:
        yield name
    finally:
        subprocess.run(["userdel", name], capture_output=True)


def _as(user: str, path: str) -> str:
    res = subprocess.run(
        ["runuser", "-u", user, "--", "/usr/bin/python3", "-S", "-c", CONNECT, path],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert res.returncode == 0, res.stderr
    return res.stdout.strip()


def test_another_uid_is_refused(served, other_user) -> None:
    _, path = served
    assert _as(other_user, path).startswith("refused 13")  # EACCES: the 0700 directory stops it
    base = os.path.dirname(path)
    opened = (os.path.dirname(base), base, path)
    for p in opened:  # defence in depth: even with the directories and socket opened up ...
        os.chmod(p, 0o777)
    try:
        out = _as(other_user, path)
        reply = json.loads(out) if out.startswith("{") else {"ok": None, "error": out}
    finally:
        for p in opened:
            os.chmod(p, 0o600 if p == path else 0o700)
    assert reply["ok"] is False and "not allowed" in reply["error"], reply  # ... SO_PEERCRED: no
    assert "trace_file" not in reply and request(os.getpid(), "status")["ok"]


def _raw(path: str, data: bytes, shut: bool = True) -> bytes:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(path)
        try:
            s.sendall(data)
            if shut:
                s.shutdown(socket.SHUT_WR)
        except OSError:  # the server may close on an oversized message before reading it all
            pass
        out = b""
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionResetError:  # closed on us mid-message: refused
            return b""
        return out


@pytest.mark.parametrize(
    "data",
    [
        b'{"cmd":"exec","code":"open(\'PWNED\',\'w\')"}\n',
        b"{\"cmd\":\"__import__('os').system('touch PWNED')\"}\n",
        b'{"cmd":"set-sampling","layers_every":"open(\'PWNED\',\'w\')"}\n',
        b"\x80\x04\x95cos\nsystem\n(S'touch PWNED'\ntR.\n",  # a pickle
        b"not json\n",
        b"[1,2,3]\n",
        b"\xff\xfe\n",
        b"",
        b'{"cmd": "status"',
        b"x" * (protocol.MAX_LINE + 10),
        b'{"cmd":"status","pad":"' + b"y" * (protocol.MAX_LINE * 4) + b'"}\n',
    ],
    ids=[
        "exec",
        "import-in-cmd",
        "code-in-arg",
        "pickle",
        "not-json",
        "array",
        "bad-utf8",
        "empty",
        "unterminated",
        "oversized-line",
        "oversized-json",
    ],
)
def test_protocol_runs_no_code_and_refuses_bad_messages(served, tmp_path, monkeypatch, data) -> None:
    a, path = served
    monkeypatch.chdir(tmp_path)
    reply = _raw(path, data)
    if reply:
        assert json.loads(reply)["ok"] is False
    assert not os.path.exists(tmp_path / "PWNED")
    assert request(os.getpid(), "status")["pid"] == os.getpid()  # the server still answers
    assert a.layers_every == 0 and a.status()["collectors"] == ["steps"]


def test_a_silent_client_does_not_block_the_server(served) -> None:
    _, path = served
    with socket.socket(socket.AF_UNIX) as idle:
        idle.connect(path)  # connects, says nothing, holds the connection
        assert request(os.getpid(), "status", timeout=15)["ok"]


def test_payload_files_are_private_and_unpredictable(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    old = os.umask(0)  # even with a permissive umask
    try:
        paths = [payload.write_options(1234, {"trace_dir": "/x"}) for _ in range(2)]
    finally:
        os.umask(old)
    base = protocol.runtime_dir()
    assert stat.S_IMODE(os.lstat(base).st_mode) == 0o700
    for p in paths:
        assert os.path.dirname(p) == base and stat.S_IMODE(os.lstat(p).st_mode) == 0o600
    names = [os.path.basename(p) for p in paths]
    assert names[0] != names[1] and all(len(n) >= len("attach-1234-") + 16 for n in names)
    world = [f for f in os.listdir(base) if os.lstat(os.path.join(base, f)).st_mode & 0o002]
    assert world == []


def test_planted_symlinks_are_refused(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    victim = tmp_path / "victim"
    victim.write_text("keep")
    base = protocol.runtime_dir()
    os.symlink(victim, os.path.join(base, "planted.json"))
    with pytest.raises(FileExistsError):  # the private writer: O_EXCL | O_NOFOLLOW
        protocol.write_private("planted.json", b"evil")
    err = payload.error_file(os.getpid())  # the one predictable name: <pid>.err
    os.symlink(victim, err)
    payload._report(RuntimeError("boom"))
    trace_dir = tmp_path / "trace"
    trace_dir.mkdir()
    os.symlink(victim, trace_dir / "rank-00000.jsonl")  # the trace file's expected name
    w = TraceFileWriter(str(trace_dir), "rank-00000.jsonl")
    w.write_objects([{"k": "header"}])
    w.close()
    assert victim.read_text() == "keep"
    assert w.path.endswith("rank-00000.1.jsonl") and not os.path.islink(w.path)


def test_trace_files_are_created_0600(tmp_path) -> None:
    old = os.umask(0)
    try:
        a = agent.start(str(tmp_path / "new" / "trace"), "steps")
        path = a.status()["trace_file"]
    finally:
        agent.stop()
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700


def test_a_client_sending_a_byte_a_second_does_not_hold_the_server(served) -> None:
    """Issue 10: the old loop served one connection at a time with a per-recv timeout, so a byte
    every second held it forever and `diag status` gave up."""
    _, path = served
    with socket.socket(socket.AF_UNIX) as slow:
        slow.connect(path)
        t0 = time.monotonic()
        cut = None
        while time.monotonic() - t0 < 6:
            try:
                slow.sendall(b" ")
            except OSError:
                cut = time.monotonic() - t0
                break
            t1 = time.monotonic()
            assert request(os.getpid(), "status", timeout=3)["ok"]
            assert time.monotonic() - t1 < 2
            time.sleep(0.5)
        if cut is None:  # the server may close without our write failing yet: the reply says so
            slow.settimeout(5)
            reply = slow.recv(65536)
            assert not reply or b"not complete" in reply, reply
        else:
            assert cut < 5


def test_many_silent_connections_neither_block_status_nor_detach(served) -> None:
    """Issue 10: ten silent connections filled the backlog of 8; status and detach got EAGAIN."""
    _, path = served
    idle = []
    try:
        for _ in range(24):  # more than the old backlog and than MAX_CLIENTS
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(5)
            s.connect(path)
            idle.append(s)
        t0 = time.monotonic()
        assert request(os.getpid(), "status", timeout=3)["ok"]
        assert request(os.getpid(), "detach", timeout=3)["ok"]
        assert time.monotonic() - t0 < 3
        assert agent.current() is None and not os.path.exists(path)
    finally:
        for s in idle:
            s.close()


def test_trace_folders_created_private_whatever_the_umask(tmp_path) -> None:
    """Every folder the writer creates is 0700, not only the last one (issue 10: intermediate
    folders took the job's umask)."""
    from diag.trace.writer import TraceFileWriter

    target = tmp_path / "a" / "b" / "trace"
    old = os.umask(0o022)
    try:
        TraceFileWriter(str(target), "rank-00000.jsonl")
    finally:
        os.umask(old)
    for folder in (tmp_path / "a", tmp_path / "a" / "b", target):
        assert stat.S_IMODE(os.lstat(folder).st_mode) == 0o700, folder
