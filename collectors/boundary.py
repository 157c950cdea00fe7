"""DeepSpeed's step boundary, wrapped once for every collector that reads it (steps, overflow).

Each of them used to wrap `DeepSpeedEngine._take_model_step` on its own: two wrappers and four
guarded hooks a step. In a job a hook runs cold (the job's compute between two steps evicts diag's
code and data), so each costs ~10-25 us of CPU however little it does. Here there is one wrapper and
one hook on each side of the step; each collector's part runs inline in it (`Part`), its errors and
injected faults counted under its own collector's name, so one collector failing never costs another
its record. Parts run in `order` (overflow's record is written before the step's, whose boundary
starts the next step and its listeners).

Most engines need nothing before their step but its counters (`global_steps`, `global_samples`):
steps always, overflow unless the engine runs fp16 (its loss scale before the step). Once every part
said so for an engine (`PLAIN`), that engine's later steps read the counters alone before the step,
one guarded C call (`operator.attrgetter`: no Python frame, half the hook's cost where it runs
cold), and each part gets them as its token after it. The wrapper tells that engine by one identity
test; a part added since (a framework patched late) sends the next step the whole way again.
"""

from __future__ import annotations

import operator
import threading
import weakref
from collections.abc import Callable
from typing import Any, NamedTuple

from diag.agent import faults as _faults
from diag.agent.api import AgentAPI
from diag.agent.undo import Undo

NAME = "boundary"  # the hooks' label (self_time); a part's errors are under its collector's name
PLAIN = object()  # a part's `before` answer: for this engine, the counters are all it needs
COUNTERS = operator.attrgetter("global_steps", "global_samples")  # ints every DeepSpeedEngine sets


class Part(NamedTuple):
    """One collector's look at the boundary: `before(engine)` gives a token (None: nothing to do
    after; `PLAIN`: the counters), `after(engine, token)` runs once the step returned. A part
    without `before` always takes the counters, `(global_steps, global_samples)` before the step."""

    order: int
    collector: str
    before: Callable[[Any], Any] | None
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
        self.plain: Callable[[], Any] = _gone  # weak ref to the engine whose parts need only counters
        self.plain_parts: list[Part] = []  # ... the parts that said so (all of them then)
        self._counters = agent.guard(NAME, COUNTERS, "ds-before")
        self._after_plain = agent.guard(NAME, self._run_after_plain, "ds-after")

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
        self.plain = _gone  # the new part has not said what it needs: the next step asks every part

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
            plain = engine is state.plain()
            tokens = state._counters(engine) if plain else state._before(engine)
            state.depth = 1
            try:
                out = original(engine, *args, **kwargs)
            finally:
                state.depth = 0
            if tokens is not None:  # None: the hook itself failed (counted)
                (state._after_plain if plain else state._after)(engine, tokens)
            return out

        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        return wrapper

    def _run_before(self, engine: Any) -> tuple[list[Part], list[Any]]:
        tokens: list[Any] = []
        faults, parts = self.agent.faults, self.parts  # the parts of this step, also after it
        counters, plain = None, not faults  # under injected faults every step goes the whole way
        for part in parts:
            try:
                if faults and part.collector in faults:
                    _faults.trigger(faults[part.collector])
                token = PLAIN if part.before is None else part.before(engine)
                if token is PLAIN:
                    if counters is None:
                        counters = COUNTERS(engine)
                    token = counters
                else:
                    plain = False
                tokens.append(token)
            except Exception as exc:  # noqa: BLE001 - counted under the part's collector
                self.agent.record_error(part.collector, "ds-before", exc)
                tokens.append(None)
                plain = False
        if plain and parts is self.parts:
            try:
                self.plain, self.plain_parts = weakref.ref(engine), parts
            except TypeError:  # no weak references to it: every step goes the whole way
                pass
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

    def _run_after_plain(self, engine: Any, counters: tuple[int, int]) -> None:
        """After a step whose parts needed only the counters (never under injected faults)."""
        for part in self.plain_parts:
            try:
                part.after(engine, counters)
            except Exception as exc:  # noqa: BLE001 - counted under the part's collector
                self.agent.record_error(part.collector, "ds-after", exc)


def _gone() -> None:
    """A dead weak reference's answer: no engine known to need only the counters."""
    return None
