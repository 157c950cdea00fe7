"""A fork server of agent targets under load, for the SIGKILL trials (one process start for 20 kills).

`python -m tests.reliability.crash_target`: imports torch, the agent and its collectors once, then for
each line `TRACE_DIR` on stdin forks a child that starts the agent (steps, layers on every step,
memory) and trains a small torch model forever while a second thread floods the ring with comm
records, so the writer's batches are large (multi-page writes that a SIGKILL can cut). The server
prints `pid <child>` once the child's agent runs, then `exit <status>` when the child is gone.
"""

from __future__ import annotations

import os
import sys
import threading

import diag.collectors.layers
import diag.collectors.memory
import diag.collectors.steps
import torch

from diag import agent, schema


def _flood(a: agent.Agent) -> None:
    emit, now, i = a.emit, a.now, 0
    while True:
        for _ in range(200):
            i += 1
            emit(
                (
                    schema.COMM,
                    a.step,
                    "all_reduce",
                    4096 + i,
                    "float32",
                    "pg0",
                    2,
                    None,
                    now(),
                    1000,
                    "blocks.0.mlp",
                    False,
                )
            )
        threading.Event().wait(0.01)


def child(trace_dir: str, ready: int) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    a = agent.start(trace_dir, what="steps,layers,memory", layers_every=1)
    threading.Thread(target=_flood, args=(a,), daemon=True).start()
    os.write(ready, b"1")
    while True:
        loss = model(torch.randn(16, 32)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()


def main() -> None:
    torch.set_num_threads(1)
    diag.collectors.layers._warm_up()  # the 1-3 s first use of a dispatch mode, paid once before forking
    for line in sys.stdin:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                child(line.strip(), w)
            finally:
                os._exit(1)
        os.close(w)
        os.read(r, 1)
        os.close(r)
        print(f"pid {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"exit {status}", flush=True)


if __name__ == "__main__":
    main()
