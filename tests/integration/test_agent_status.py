"""`diag status` of a live agent: one row per collector (issue 9: `comm` and `comms` were both listed)."""

from __future__ import annotations

import sys

import torch

from diag import agent
from diag.cli.status import render


def test_status_lists_each_collector_once(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "deepspeed.runtime.engine", raising=False)
    ag = agent.start(str(tmp_path), what=("steps", "memory"))
    try:
        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(3):
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
        ag.flush()
        ag._flush(final=False)
        st = ag.status()
    finally:
        agent.stop()
    assert st["captured"].get("steps") == 3 and "step" not in st["captured"]
    lines = render({**st, "rank": 0}).splitlines()
    # the job's step count, then this attach's records: "step 3" beside "captured 3" said apart
    assert f"rank 0: at the job's step {st['step']}," in lines[0], lines[0]
    assert lines[1] == "  records since the attach, per collector:", lines
    rows = [line.split()[0] for line in lines[2:-1]]
    assert len(rows) == len(set(rows)) and {"steps", "memory"} <= set(rows), rows
