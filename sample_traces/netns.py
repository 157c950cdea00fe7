"""Two network namespaces joined by a rate-limited veth pair: a real slow link between two "nodes".

Only namespaces, interfaces and addresses this module creates are touched, and `slow_link()` removes
them on exit (deleting a namespace deletes its end of the veth pair). The kernel here has no `netem`
qdisc, so the link is slowed with a token bucket (`tbf`): bandwidth, not added latency.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass


@dataclass
class Node:
    netns: str
    ifname: str
    addr: str
    hostname: str

    def wrap(self, cmd: list[str]) -> list[str]:
        """Run `cmd` inside this node's namespace, with its own UTS namespace and hostname."""
        script = f'hostname {self.hostname} && exec "$@"'
        return ["ip", "netns", "exec", self.netns, "unshare", "--uts", "sh", "-c", script, "sh", *cmd]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=20)


def unavailable() -> str | None:
    """Why slow links cannot be built here (None when they can): root, ip, tc, unshare, tbf."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc", "unshare"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed"
    try:
        with slow_link(rate="100mbit"):
            pass
    except (subprocess.CalledProcessError, OSError) as e:
        err = getattr(e, "stderr", "") or str(e)
        return f"cannot create namespaces / veth / tbf here: {err.strip()[:200]}"
    return None


@contextlib.contextmanager
def slow_link(rate: str | None = "40mbit", tag: str | None = None) -> Iterator[tuple[Node, Node]]:
    """Yield two nodes on a `rate`-limited link (both directions; None: a plain veth, the control);
    everything is removed on exit."""
    tag = tag or f"{os.getpid() % 100000}"
    net = 100 + os.getpid() % 150
    nodes = (Node(f"diagA{tag}", f"dgA{tag}"[:15], f"10.213.{net}.1", "node-a"),
             Node(f"diagB{tag}", f"dgB{tag}"[:15], f"10.213.{net}.2", "node-b"))
    made: list[str] = []
    try:
        for n in nodes:
            _ip("netns", "add", n.netns)
            made.append(n.netns)
        _ip("link", "add", nodes[0].ifname, "type", "veth", "peer", "name", nodes[1].ifname)
        for n in nodes:
            _ip("link", "set", n.ifname, "netns", n.netns)
            _ip("-n", n.netns, "addr", "add", f"{n.addr}/24", "dev", n.ifname)
            _ip("-n", n.netns, "link", "set", n.ifname, "up")
            _ip("-n", n.netns, "link", "set", "lo", "up")
            if rate is not None:
                subprocess.run(["ip", "netns", "exec", n.netns, "tc", "qdisc", "add", "dev", n.ifname, "root",
                                "tbf", "rate", rate, "burst", "32kb", "latency", "400ms"],
                               check=True, capture_output=True, text=True, timeout=20)
        yield nodes
    finally:
        subprocess.run(["ip", "link", "del", nodes[0].ifname], capture_output=True, timeout=20)  # if left
        for ns in made:
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)
