"""The collectors the agent can install, by name: the one list, and the one check of a user's names.

A name maps to the module that holds its `install(agent, undo)`; the agent imports only modules named
here, never a module built from user input. Adding a collector means adding a line here.
"""

from __future__ import annotations

COLLECTORS: dict[str, str] = {
    "steps": "diag.collectors.steps",
    "layers": "diag.collectors.layers",
    "comms": "diag.collectors.comms",
    "memory": "diag.collectors.memory",
    "overflow": "diag.collectors.overflow",
}
ALL_COLLECTORS: tuple[str, ...] = tuple(COLLECTORS)


class OptionError(ValueError):
    """A bad agent option: `key` names the option, `problem` says what is wrong with it (the CLI
    spells the key as its flag)."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key} {problem}" if key else problem)
        self.key = key
        self.problem = problem


def closest(word: str, choices: tuple[str, ...] | list[str]) -> str:
    """`; did you mean X?` for the nearest valid choice, or nothing when none is near."""
    import difflib  # only on a bad option: the agent's import stays light

    near = difflib.get_close_matches(word, choices, n=1)
    return f"; did you mean {near[0]}?" if near else ""


def collector_names(what: str | tuple[str, ...] | list[str] | None) -> tuple[str, ...]:
    """The collectors asked for (a comma-separated string or a sequence; None or empty: all), checked
    against the registry."""
    if isinstance(what, str):
        what = [w.strip() for w in what.split(",") if w.strip()]
    elif what is not None and not isinstance(what, (list, tuple)):
        raise OptionError("what", f"must be collector names, got {what!r}")
    names = tuple(what or ALL_COLLECTORS)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise OptionError("what", f"must name collectors as strings, got {bad[0]!r}")
    unknown = [n for n in names if n not in COLLECTORS]
    if unknown:
        hint = closest(unknown[0], ALL_COLLECTORS) if len(unknown) == 1 else ""
        raise OptionError(
            "", f"unknown collector(s) {', '.join(unknown)}; choose from {', '.join(ALL_COLLECTORS)}{hint}"
        )
    return names
