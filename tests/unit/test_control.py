"""The control socket: private directory, fixed commands, size limit, peer check, detach."""

from __future__ import annotations

import json
import os
import socket
import stat

import pytest

from diag import agent
from diag.control import protocol
from diag.control.client import request
from diag.errors import DiagError


@pytest.fixture
def private(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path))
    return tmp_path / "diag"


@pytest.fixture
def running(private, tmp_path):
    a = agent.start(str(tmp_path / "trace"), "steps", control=True)
    yield a
    agent.stop()


def test_runtime_dir_is_private(private):
    path = protocol.runtime_dir()
    st = os.lstat(path)
    assert path == str(private) and stat.S_IMODE(st.st_mode) == 0o700 and st.st_uid == os.getuid()


def test_runtime_dir_refuses_open_or_linked_dirs(private, tmp_path):
    private.mkdir(mode=0o755)
    os.chmod(private, 0o755)
    with pytest.raises(protocol.UnsafeDirectory):
        protocol.runtime_dir()
    private.rmdir()
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    private.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(protocol.UnsafeDirectory):
        protocol.runtime_dir()


def test_status_snapshot_sampling_and_detach(running):
    path = protocol.socket_path(os.getpid())
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    st = request(os.getpid(), "status")
    assert st["pid"] == os.getpid() and st["collectors"] == ["steps"]
    assert request(os.getpid(), "snapshot")["ok"]
    assert request(os.getpid(), "set-sampling", layers_every=3)["layers_every"] == 3
    assert running.layers_every == 3
    with pytest.raises(DiagError, match="layers_every must be"):
        request(os.getpid(), "set-sampling", layers_every="__import__('os')")
    with pytest.raises(DiagError, match="unknown command 'exec'"):
        request(os.getpid(), "exec", code="print(1)")
    assert request(os.getpid(), "detach")["undo_failed"] == []
    assert agent.current() is None and not os.path.exists(path)


def _raw(payload: bytes) -> dict:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(protocol.socket_path(os.getpid()))
        s.sendall(payload)
        return protocol.read_message(s)


def test_oversized_and_malformed_messages_are_refused(running):
    big = _raw(json.dumps({"cmd": "status", "pad": "x" * (protocol.MAX_LINE + 10)}).encode() + b"\n")
    assert not big["ok"] and "limit" in big["error"]
    assert not _raw(b"not json\n")["ok"]
    assert not _raw(b"[1, 2]\n")["ok"]
    assert request(os.getpid(), "status")["ok"]  # the server is still serving


def test_peer_credentials_are_read_and_checked(running, monkeypatch):
    from diag.control import server

    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        assert server.peer_uid(a) == os.getuid()
    # another uid cannot be produced without a second user; the check itself is what is tested here
    monkeypatch.setattr(server, "peer_uid", lambda conn: 4242)
    with pytest.raises(DiagError, match="uid 4242 not allowed"):
        request(os.getpid(), "status")


def test_an_attach_starts_the_agent_as_joined_and_diag_run_does_not(private, tmp_path):
    """An attach lands mid-step, so its agent is `joined` (the step under way is not sampled for
    layers); `diag run` starts with the job through the same `start_agent`, and samples its first
    step whole (it had been marked joined too, and a 6-step run lost every layer record)."""
    from diag.inject import payload

    opts = {"trace_dir": str(tmp_path / "trace"), "what": ["steps"]}
    payload._start(payload.write_options(os.getpid(), opts))
    try:
        assert agent.current() is not None and agent.current().options.joined is True
    finally:
        agent.stop()
    started = payload.start_agent(opts)
    try:
        assert started.options.joined is False
    finally:
        agent.stop()
