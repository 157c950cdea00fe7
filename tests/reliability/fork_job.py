"""A job that starts diag (with its control socket), then forks: DataLoader workers that run a
module per item, or, with --follow, a raw fork whose child is followed. Prints one JSON line of
what the parent and its children saw. Run by test_fork.py in a subprocess."""

from __future__ import annotations

import json
import os
import sys
import time

import torch

from diag import agent, schema
from diag.control import protocol
from diag.control.client import request


def fds() -> dict[int, str]:
    """Open descriptors and what they refer to (the one listdir itself used is gone by then)."""
    out = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            out[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            pass
    return out


class Items(torch.utils.data.Dataset):
    """Each item runs a small module (hooked in the parent) and reports the worker's view."""

    def __init__(self, ag: agent.Agent, diag_fds: dict[int, str]) -> None:
        self.ag, self.diag_fds, self.net = ag, diag_fds, torch.nn.Linear(4, 4)

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict:
        for _ in range(50):
            self.net(torch.ones(2, 4))
        for n in range(1000):  # what a hook left in place would do
            self.ag.emit((schema.STEP, n, self.ag.now(), 1, 1, None, True))
        mine = fds()
        return {
            "pid": os.getpid(),
            "ring": len(self.ag.ring),
            "current": agent.current() is not None,
            "undo": len(self.ag.undo.labels()),
            "inherited": sorted(t for fd, t in self.diag_fds.items() if mine.get(fd) == t),
        }


def with_loader(trace_dir: str) -> dict:
    before = fds()
    ag = agent.start(trace_dir, what=("steps", "layers", "memory"), layers_every=1, control=True)
    diag_fds = {fd: t for fd, t in fds().items() if before.get(fd) != t}
    loader = torch.utils.data.DataLoader(
        Items(ag, diag_fds), batch_size=None, num_workers=2, multiprocessing_context="fork"
    )
    workers = list(loader)
    status = request(os.getpid(), "status")
    parent = {
        "socket": os.path.exists(protocol.socket_path(os.getpid())),
        "status_pid": status["pid"],
        "undo": len(ag.undo.labels()),
        "diag_fds": sorted(diag_fds.values()),
    }
    for n in range(3):
        ag.emit((schema.STEP, n, ag.now(), 1, 1, None, True))
    agent.stop()
    return {"parent": parent, "workers": workers, "files": sorted(os.listdir(trace_dir))}


def with_follow(trace_dir: str) -> dict:
    ag = agent.start(trace_dir, what=("steps",), control=True, follow_forks=True)
    pid = os.fork()
    if pid == 0:
        deadline = time.monotonic() + 20
        while agent.current() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        child = agent.current()
        if child is not None:
            child.emit((schema.STEP, 7, child.now(), 1, 1, None, True))
            agent.stop()
        os._exit(0 if child is not None and child is not ag else 3)
    _, code = os.waitpid(pid, 0)
    ag.emit((schema.STEP, 1, ag.now(), 1, 1, None, True))
    alive = os.path.exists(protocol.socket_path(os.getpid()))
    agent.stop()
    return {
        "child_exit": os.waitstatus_to_exitcode(code),
        "socket": alive,
        "child": pid,
        "files": sorted(os.listdir(trace_dir)),
    }


if __name__ == "__main__":
    mode, trace_dir = sys.argv[1], sys.argv[2]
    print(json.dumps(with_follow(trace_dir) if mode == "follow" else with_loader(trace_dir)))
