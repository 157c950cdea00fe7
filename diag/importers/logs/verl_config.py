"""verl's job layout from the config it prints at start: `trainer.nnodes` x `trainer.n_gpus_per_node` GPUs.

verl's PPO entry point pretty-prints its whole resolved config, one key per line behind Ray's prefix,
the sections in key order (`trainer` last):
    (TaskRunner pid=153792)  'trainer': {'balance_batch': True,
    (TaskRunner pid=153792)              'n_gpus_per_node': 8,
    (TaskRunner pid=153792)              'nnodes': 1,
its SFT trainer prints it on one line (`{'data': {...}, ..., 'trainer': {..., 'nnodes': 1,
'n_gpus_per_node': 8, ...}}`). Only the `trainer` section's keys count (`reward_model` has keys of the
same names for a pool of its own): the section is followed from its `'trainer': {` to its closing brace.
"""

from __future__ import annotations

import re

from diag.importers.logs.records import Records

_KEY = re.compile(r"'(nnodes|n_gpus_per_node)': (\d+)")
_OPEN = "'trainer': {"
SECTION_LINES = 200  # a section longer than this is no config dump (a truncated log: read no further)


class TrainerConfig:
    def __init__(self, rec: Records) -> None:
        self.rec = rec
        self.depth = 0  # braces open inside the `trainer` section (0: not in it)
        self.lines = 0  # lines of the section read
        self.found: dict[str, int] = {}

    def line(self, t: str) -> bool:
        """Read `t` when it is (part of) the `trainer` section."""
        if not self.depth:
            at = t.find(_OPEN)
            if at < 0:
                return False
            t, self.lines = t[at + len(_OPEN) - 1 :], 0
        self.lines += 1
        end = _close(t, self.depth)
        for key, value in _KEY.findall(t if end < 0 else t[:end]):
            self.found.setdefault(key, int(value))
        closed = end >= 0 or self.lines >= SECTION_LINES
        self.depth = 0 if closed else self.depth + t.count("{") - t.count("}")
        if len(self.found) == 2:
            self.rec.set_layout(world_size=self.found["nnodes"] * self.found["n_gpus_per_node"] or None)
        return True


def _close(t: str, depth: int) -> int:
    """Where in `t` the section (`depth` braces open before `t`) closes; -1: not in `t`."""
    for i, c in enumerate(t):
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return i
    return -1
