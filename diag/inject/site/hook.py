"""Boots `diag run`'s agent even when a job's own sitecustomize shadows diag's (issue 9.6).

`diag run` puts its sitecustomize first on PYTHONPATH, but a launch script that prepends the job's
directory (`export PYTHONPATH=$PWD:$PYTHONPATH`) makes the job's sitecustomize the one Python
imports, and the agent silently never started. A wheel install ships `diag-run.pth` into
site-packages; Python runs it before any sitecustomize, and when DIAG_RUN is set it calls `arm()`.
arm() puts a one-shot finder first on sys.meta_path: whichever sitecustomize Python then finds runs
unchanged, and the agent boots right after it (the job's shims are in place before the agent).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

NAME = "sitecustomize"
Spec = importlib.machinery.ModuleSpec
OURS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "sitecustomize.py")


def _boot() -> None:
    try:
        from diag.inject.site import sitecustomize

        sitecustomize.boot()
    except Exception as exc:  # noqa: BLE001 - the job runs on without diag
        print(f"diag: agent not started in pid {os.getpid()}: {type(exc).__name__}: {exc}", file=sys.stderr)


class _ThenBoot(importlib.abc.Loader):
    """Runs the job's sitecustomize as its own loader would, then boots the agent."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)  # type: ignore[no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        try:
            self.inner.exec_module(module)
        finally:
            _boot()

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ... for tracebacks
        return getattr(self.inner, name)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Spec | None:
        if name != NAME:
            return None
        disarm()
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:  # PYTHONPATH replaced by a launcher: load ours (it boots, finds none to chain)
            if sys.flags.isolated or sys.flags.ignore_environment:
                return None
            return importlib.util.spec_from_file_location(NAME, OURS)
        if spec.loader is None or (spec.origin and os.path.abspath(spec.origin) == OURS):
            return spec  # ours comes first: it boots and chains to the job's itself
        spec.loader = _ThenBoot(spec.loader)
        return spec


_FINDER = _Finder()


def arm() -> None:
    """Called from diag-run.pth at interpreter start when DIAG_RUN is set; never raises."""
    if NAME not in sys.modules and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def disarm() -> None:
    while _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
