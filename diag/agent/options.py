"""Every option of the in-process agent, with its default, in one frozen dataclass.

`diag.agent.start(**kw)`, `diag run` (the DIAG_RUN environment variable), `diag attach` (the options
file) and the CLI help all go through `AgentOptions`: a typo (`layer_every=1`) or a value of the wrong
type or range is refused at that boundary with the option's name, never silently ignored in the job.
Stdlib only: this module is imported inside the training process.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from diag.agent.registry import ALL_COLLECTORS, OptionError, closest, collector_names

TRACE_DIR_NAME = "diag-trace"  # under the working directory when neither the option nor DIAG_TRACE_DIR says


@dataclass(frozen=True)
class AgentOptions:
    """What the agent collects and how often.

    trace_dir: where the rank writes its trace file (None: $DIAG_TRACE_DIR, else ./diag-trace).
    what: collectors to install (`steps` is always added: its step boundaries drive the others).
    layers_every: per-layer time and FLOPs on every Nth step (the always-on setting; 1 = every step;
        0 when the layers collector is off and the option is not given).
    attribute_every: name the running module in comms records on the job's first N steps, every Nth
        step after them, sampled steps and the step after one whose collective matched nothing
        (1 = every step, 0 = sampled steps only); other steps skip module tracking (~5 us per module
        call) and give each collective its match's module from the last tracked step.
    flops_every: count FLOPs on the first sample of each input signature and every Nth after it,
        reuse them on the others (1 = count on every sample).
    ring_capacity: records buffered before drops (at ~200 B a record the default caps the agent near
        40 MB).
    self_time: add up the time spent in diag's hooks, shown by `diag status` (~0.2 us more per hook).
    memory_reset_peak: reset the allocator's peak at each step so each step reports its own peak.
    faults: collector -> `raise` or `sleep:SECONDS`, for the no-harm tests (None: $DIAG_FAULTS).
    control: serve `diag status/detach` on a control socket (attach and `diag run` ask for it).
    follow_forks: a child forked after start gets an agent of its own (by default forked children,
        DataLoader workers, start without one: diag/agent/fork.py).
    joined: started inside a running job (`diag attach` sets it): the step under way is partial, so
        its micro-batches are not sampled for layers (a job started with the agent samples its first
        step whole).
    """

    trace_dir: str | None = None
    what: tuple[str, ...] = ALL_COLLECTORS
    layers_every: int = 50
    attribute_every: int = 100
    flops_every: int = 4
    ring_capacity: int = 200_000
    self_time: bool = False
    memory_reset_peak: bool = False
    faults: Mapping[str, str] | None = None
    control: bool = False
    follow_forks: bool = False
    joined: bool = False

    def __post_init__(self) -> None:
        names = collector_names(self.what)
        if "steps" not in names:
            names = ("steps", *names)  # step boundaries drive sampling and per-step memory
        object.__setattr__(self, "what", names)
        for name, minimum in _MINIMUM.items():
            _check_int(name, getattr(self, name), minimum)
        for name in ("self_time", "memory_reset_peak", "control", "follow_forks", "joined"):
            if not isinstance(getattr(self, name), bool):
                raise OptionError(name, f"must be true or false, got {getattr(self, name)!r}")
        if self.trace_dir is not None and not isinstance(self.trace_dir, str):
            raise OptionError("trace_dir", f"must be a path, got {self.trace_dir!r}")
        if self.faults is not None:
            if not isinstance(self.faults, Mapping) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in self.faults.items()
            ):
                raise OptionError("faults", f"must map collector names to actions, got {self.faults!r}")
            object.__setattr__(self, "faults", dict(self.faults))

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> AgentOptions:
        """The options from keyword arguments or decoded JSON: unknown keys are refused (naming the
        nearest option); a None value means the default."""
        given = {k: v for k, v in values.items() if v is not None}
        for key in given:
            if key not in _NAMES:
                raise OptionError(key, f"is not an agent option{closest(key, _NAMES)}")
        if "layers_every" not in given and "layers" not in collector_names(given.get("what")):
            given["layers_every"] = 0  # no sampled steps unless asked: the layers collector is off
        return cls(**given)

    @classmethod
    def from_json(cls, text: str) -> AgentOptions:
        """The options `to_json` wrote (DIAG_RUN, the attach options file)."""
        values = json.loads(text)
        if not isinstance(values, dict):
            raise OptionError("", f"agent options must be a JSON object, got {text[:80]!r}")
        return cls.from_mapping(values)

    def to_mapping(self) -> dict[str, Any]:
        """Every option, JSON-ready: `from_mapping(to_mapping())` gives these options back."""
        out = dataclasses.asdict(self)
        out["what"] = list(self.what)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_mapping())

    def resolved_trace_dir(self) -> str:
        return self.trace_dir or os.environ.get("DIAG_TRACE_DIR") or os.path.abspath(TRACE_DIR_NAME)


_NAMES = [f.name for f in dataclasses.fields(AgentOptions)]
_MINIMUM = {"layers_every": 0, "attribute_every": 0, "flops_every": 1, "ring_capacity": 1}


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise OptionError(name, f"must be an integer, got {value!r}")
    if value < minimum:
        raise OptionError(name, f"must be >= {minimum}, got {value}")


DEFAULTS = AgentOptions()
