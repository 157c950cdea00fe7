"""DeepSpeed's step boundary, wrapped once for every collector that reads it (steps, overflow).

Each of them used to wrap `DeepSpeedEngine._take_model_step` on its own: two wrappers and four
guarded hooks a step. In a job a hook runs cold (the job's compute between two steps evicts diag's
code and data), so each costs ~10-25 us of CPU however little it does. Here there is one wrapper and
one hook on each side of the step; each collector's part runs inline in it (`Part`), its errors and
injected faults counted under its own collector's name, so one collector failing never costs another
its record. Parts run in `order` (overflow's record is written before the step's, whose boundary
starts the next step and its listeners).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

from diag.agent import faults as _faults
from diag.agent.api import AgentAPI
from diag.agent.undo import Undo

NAME = "boundary"  # the hooks' label (self_time); a part's errors are under its collector's name


class Part(NamedTuple):
    """One collector's look at the boundary: `before(engine)` gives a token (None: nothing to do
    after), `after(engine, token)` runs once the step returned."""

    order: int
    collector: str
    before: Callable[[Any], Any]
    after: Callable[[Any, Any], None]


class DsBoundary:
    """The parts, and the one wrapper (kept in `agent.state`: the first collector to need it makes it)."""

    def __init__(self, agent: AgentAPI, undo: Undo) -> None:
        self.agent, self.undo = agent, undo
        self.parts: list[Part] = []
        self.depth = 0  # inside the wrapped step (a nested call is the outer one's: one boundary)
        self.patched: type | None = None
        self._lock = threading.Lock()  # the training thread and the writer thread both patch
        self._before = agent.guard(NAME, self._run_before, "ds-before")
        self._after = agent.guard(NAME, self._run_after, "ds-after")

    @classmethod
    def of(cls, agent: AgentAPI, undo: Undo) -> DsBoundary:
        found = agent.state.get(cls)
        if found is None:
            found = cls(agent, undo)
            agent.state.put(found)
            undo.call(lambda: agent.state.remove(cls), "boundary: state")
        return found

    def add(self, part: Part) -> None:
        self.parts = sorted([*self.parts, part], key=lambda p: p.order)  # not in place: a step may run

    def patch(self, engine_cls: type) -> None:
        """Wrap the engine class's boundary, once."""
        with self._lock:
            if self.patched is engine_cls:
                return
            self.patched = engine_cls
            name = "_take_model_step" if hasattr(engine_cls, "_take_model_step") else "step"
            self.undo.patch(engine_cls, name, self._wrap(getattr(engine_cls, name)))

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        state = self

        def wrapper(engine: Any, *args: Any, **kwargs: Any) -> Any:
            if state.depth:
                return original(engine, *args, **kwargs)
            tokens = state._before(engine)
            state.depth = 1
            try:
                out = original(engine, *args, **kwargs)
            finally:
                state.depth = 0
            if tokens is not None:  # None: the hook itself failed (counted)
                state._after(engine, tokens)
            return out

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        return wrapper

    def _run_before(self, engine: Any) -> tuple[list[Part], list[Any]]:
        tokens: list[Any] = []
        faults, parts = self.agent.faults, self.parts  # the parts of this step, also after it
        for part in parts:
            try:
                if faults and part.collector in faults:
                    _faults.trigger(faults[part.collector])
                tokens.append(part.before(engine))
            except Exception as exc:  # noqa: BLE001 - counted under the part's collector
                self.agent.record_error(part.collector, "ds-before", exc)
                tokens.append(None)
        return parts, tokens

    def _run_after(self, engine: Any, parts_tokens: tuple[list[Part], list[Any]]) -> None:
        faults = self.agent.faults
        for part, token in zip(*parts_tokens):
            if token is None:
                continue
            try:
                if faults and part.collector in faults:
                    _faults.trigger(faults[part.collector])
                part.after(engine, token)
            except Exception as exc:  # noqa: BLE001 - counted under the part's collector
                self.agent.record_error(part.collector, "ds-after", exc)
