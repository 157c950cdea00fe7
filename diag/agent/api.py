"""What a collector may touch on the agent: the `AgentAPI` protocol, and the state it may keep there.

Collectors are written against this contract, not against `runtime.Agent`: it names the shared,
hook-updated state (step, sampling, module stack), the helpers (emit, guard, now, set_meta) and a
typed per-collector state registry. A collector keeps its own objects in `agent.state`, keyed by
their class, never as new attributes of the agent.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, TypeVar

from diag.agent.options import AgentOptions
from diag.agent.undo import Undo

T = TypeVar("T")

Record = tuple[Any, ...]  # a flat record for the ring: (kind, ...) as diag.schema lays it out


class CollectorState:
    """One object per class, held for the collectors for the agent's lifetime (the module tracker,
    the layer recorder): what one collector installed, another finds here."""

    def __init__(self) -> None:
        self._items: dict[type, object] = {}

    def get(self, kind: type[T]) -> T | None:
        item = self._items.get(kind)
        return item if isinstance(item, kind) else None

    def put(self, item: object) -> None:
        self._items[type(item)] = item

    def remove(self, kind: type) -> None:
        self._items.pop(kind, None)

    def __contains__(self, kind: type) -> bool:
        return kind in self._items


class StepListener(NamedTuple):
    """A step-boundary callback `fn(next_step)`, run inline by `begin_step` (no guard of its own: a
    layer of Python costs ~2-3 us where a hook runs cold); what it raises, and an injected fault,
    is counted under `collector`."""

    collector: str
    where: str
    fn: Callable[[int], None]


class AgentAPI(Protocol):
    """The agent as its collectors see it (implemented by `diag.agent.runtime.Agent`)."""

    options: AgentOptions
    emit: Callable[[Record], None]  # the hot path: push one record, never blocks
    step: int  # index of the step in progress (set by the steps collector)
    layers_every: int  # a per-layer sampled step every N (0: none)
    sampled: bool  # is the current step a per-layer sampled step
    module_stack: list[str]  # qualified names of the modules running now (fwd or bwd)
    step_listeners: list[StepListener]  # called with each new step index
    # called (guarded) by the writer thread at a flush after imports, until each returns True (settled)
    idle_listeners: list[Callable[[], bool | None]]
    engine: Any  # the DeepSpeed engine once seen, else None
    # by record kind, run by the writer thread on each record before it is written (never raises)
    resolvers: dict[str, Callable[[Record], Record]]
    state: CollectorState
    faults: dict[str, str]  # collector -> injected fault (tests); parts run inline trigger their own

    def now(self) -> int: ...

    def guard(
        self, collector: str, fn: Callable[..., Any], where: str | None = None
    ) -> Callable[..., Any]: ...

    def record_error(self, collector: str, where: str, exc: BaseException) -> None: ...

    def set_meta(self, key: str, value: Any) -> None: ...

    def saw_engine(self, engine: Any) -> None: ...

    def begin_step(self, step: int) -> None: ...

    def unsettle(self) -> None: ...


Installer = Callable[[AgentAPI, Undo], None]  # a collector module's `install(agent, undo)`
