"""Helper interpreters that attach starts import nothing from the working directory (issue 10).

`python -m mod` and `python -c code` put the working directory first on sys.path: run by root from a
directory another user can write, a planted `diag/__init__.py` or `pyinjector.py` ran as root.
Helpers therefore run in isolated mode (`-I`: no working directory or script directory on the
path, no PYTHON* variables, no user site) without `site` (`-S`), and are handed exactly the files
they need by absolute path, each checked to be owned by root or us and writable by no one else, up
to `/`.
"""

from __future__ import annotations

import importlib.machinery
import os
import stat
import sys

ISOLATED = ("-I", "-S")


class Untrusted(Exception):
    """A file a helper would run can be changed by another user (the message names it and why)."""


def untrusted_reason(path: str) -> str | None:
    """Why `path` (after resolving symlinks) could be changed by another user, else None.

    The file and every directory above it must be owned by root or by us and not writable by group
    or others; a sticky world-writable directory (/tmp) is fine: others cannot replace its entries."""
    me = os.geteuid()
    p = os.path.realpath(path)
    leaf = True
    while True:
        try:
            st = os.stat(p)
        except OSError as e:
            return f"{p}: {e.strerror}"
        sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and not leaf
        if st.st_uid not in (0, me):
            return f"{p} is owned by uid {st.st_uid}"
        if st.st_mode & 0o022 and not sticky_dir:
            return f"{p} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
        parent = os.path.dirname(p)
        if parent == p:
            return None
        p, leaf = parent, False


def checked(path: str) -> str:
    """`path` resolved, or Untrusted when another user could change it."""
    why = untrusted_reason(path)
    if why is not None:
        raise Untrusted(f"refusing to run {path}: {why}")
    return os.path.realpath(path)


def script_command(script: str, *args: str) -> list[str]:
    """Run one of diag's own stdlib-only scripts by its checked path, isolated."""
    return [sys.executable, *ISOLATED, checked(script), *args]


def package_dir(name: str) -> str:
    """The directory that holds the importable top-level `name` (to put on an isolated helper's
    path): the first match on our sys.path, skipping the working directory ('') and any match
    another user could have planted or changed."""
    skipped = []
    for entry in sys.path:
        if not entry or not os.path.isdir(entry):
            continue
        spec = importlib.machinery.PathFinder.find_spec(name, [entry])
        if spec is None or spec.origin is None:
            continue
        found = spec.submodule_search_locations[0] if spec.submodule_search_locations else spec.origin
        why = untrusted_reason(found)
        if why is None:
            return os.path.realpath(entry)
        skipped.append(why)
    detail = f" (skipped: {'; '.join(skipped)})" if skipped else ""
    raise Untrusted(f"the {name} package is not installed{detail}")
